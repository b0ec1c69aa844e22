"""Review 48 of the cache area: --prompt-cache files, the prompt cache, logprobs, FIM and prompt lookup."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from edgesdk.runtime.ort_backend import OrtDecoderBase
from tests.unit.test_cli import assert_ok, invoke

LONG = "The tower was built for the fair of 1889 and named after its engineer. " * 3
SHARING = "The tower was built for the fair of 1889. What else happened that year in Paris and beyond?"


@pytest.fixture
def python_handles_sigint():
    """SIGINT raises KeyboardInterrupt, as in a fresh ``edgesdk run``; the handler before is put back after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_before_prefill(monkeypatch) -> None:
    """A real SIGINT just before the prompt's prefill runs (where a thermal guard's wait before it, or a slow start,
    takes the Ctrl-C): the KV cache then holds only the part of the prompt the file shared with it."""
    real_prefill = OrtDecoderBase.prefill

    def prefill(self, token_ids, keep_logits=1):
        signal.raise_signal(signal.SIGINT)
        return real_prefill(self, token_ids, keep_logits)

    monkeypatch.setattr(OrtDecoderBase, "prefill", prefill)


@pytest.mark.parametrize("mode", [["--prompt-cache-all"], []])
def test_ctrl_c_before_the_prefill_leaves_the_cache_file_whole(tiny_bundle, tmp_path, monkeypatch,
                                                                python_handles_sigint, mode):
    """llama-cli writes --prompt-cache at the first sample and, stopped by Ctrl-C, exits without writing: a Ctrl-C
    before the prompt was prefilled leaves the file as it was. With --prompt-cache-all it was rewritten with the few
    tokens the new prompt shared with it, throwing the rest of the file (prompt and answer) away."""
    path = tmp_path / "prompt.cache"
    assert_ok(invoke("run", tiny_bundle.path, "--prompt", LONG, "--raw", "-n", 8, "--threads", 1,
                     "--prompt-cache", path, "--prompt-cache-all"))
    before = path.read_bytes()
    with np.load(path) as data:
        held = data["tokens"].shape[0]
    _interrupt_before_prefill(monkeypatch)
    stopped = invoke("run", tiny_bundle.path, "--prompt", SHARING, "--raw", "-n", 8, "--threads", 1,
                     "--prompt-cache", path, *mode)
    monkeypatch.undo()
    assert stopped.exit_code != 0  # the Ctrl-C still ends the run
    with np.load(path) as data:
        assert data["tokens"].shape[0] == held
    assert path.read_bytes() == before
    assert "is not rewritten: the answer was stopped before its prompt was prefilled" in stopped.stderr


# ------------------------------------------------------------------------ the infill sampler's texts of FIM tokens


def _qwen_coder_like(folder):
    """A byte-level tokenizer whose FIM tokens are added tokens with ``special`` false, as Qwen2.5-Coder's
    tokenizer.json has them (``<|fim_prefix|>``, ``<|fim_middle|>``, ``<|fim_suffix|>``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from edgesdk.runtime.text import ChatTokenizer
    from tests._utils.tiny import CORPUS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False)
                          for text in ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>")])
    tokenizer.save(str(folder / "tokenizer.json"))
    return ChatTokenizer(folder / "tokenizer.json", {"eos_token_ids": [0], "eos_token": "<|endoftext|>"}, None)


def test_the_infill_sampler_does_not_merge_a_fim_token_with_text_it_begins_with(tmp_path):
    """llama.cpp's vocab loader makes the FIM tokens it finds by their text control tokens, which the infill
    sampler's token_to_piece(special=false) renders as nothing: ``<`` (p 0.4) is no prefix of ``<|fim_middle|>``
    (p 0.6) there, and both stay (each above 1/3). Merged, ``<`` was dropped and ``<|fim_middle|>`` took p 1."""
    from edgesdk.runtime.infill_sampler import infill_apply, vocabulary_of

    tokenizer = _qwen_coder_like(tmp_path)
    fim = tokenizer.fim_tokens()
    assert fim.can_infill
    vocabulary = vocabulary_of(tokenizer)
    assert [vocabulary.texts[token] for token in (fim.pre, fim.mid, fim.suf)] == [None, None, None]
    less_than = tokenizer.token_id("<")
    assert vocabulary.texts[less_than] == b"<"
    ids, _, p = infill_apply([less_than, fim.mid], [np.log(0.4), np.log(0.6)], vocabulary.texts, vocabulary.eog,
                             vocabulary.eot)
    assert ids.tolist() == [fim.mid, less_than]
    assert p.tolist() == pytest.approx([0.6, 0.4])
    # JSON mode and grammars keep reading the FIM tokens' text (llama.cpp's grammar reads pieces with special on)
    assert tokenizer.token_bytes()[fim.mid] == b"<|fim_middle|>"
