"""The tiny tied test models (tests/_utils/tiny.py, ``echo_free``) answer from their context: a greedy answer that repeated the last
token whatever the KV cache held could not catch a corrupted cache, and greedy-parity tests across the suite rest on
this."""

from __future__ import annotations

import pytest

from tests._utils.tiny import tiny_llama

torch = pytest.importorskip("torch")

PROMPTS, NEW = 8, 8


def _greedy(model, ids):
    out = model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    answer = out[0, ids.shape[1]:]  # [NEW]
    assert len(answer) == NEW
    return answer


@pytest.mark.parametrize("kind", [{}, {"model_type": "qwen3"}, {"model_type": "gemma3_text"}],
                         ids=["llama", "qwen3", "gemma3"])
def test_greedy_answers_neither_echo_nor_ignore_the_context(kind):
    model = tiny_llama(**kind)
    generator = torch.Generator().manual_seed(1)
    echoed = changed = 0
    for _ in range(PROMPTS):
        ids = torch.randint(3, model.config.vocab_size, (1, 8), generator=generator)  # [1, 8]
        answer = _greedy(model, ids)
        echoed += int((answer == ids[0, -1]).all())
        other = ids.clone()
        other[0, 0] = (other[0, 0] + 17) % model.config.vocab_size  # only the first prompt token differs
        changed += int(not torch.equal(_greedy(model, other), answer))
    assert echoed == 0  # the echoing model repeated the last token in every answer
    assert changed >= PROMPTS // 3  # the echoing model's answers never changed
