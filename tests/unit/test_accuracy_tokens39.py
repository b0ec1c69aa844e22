"""The tokens llama-perplexity's accuracy tasks score (edgesdk/accuracy.py): each task's text tokenized as
``common_tokenize(ctx, text, true)`` tokenizes it in tools/perplexity/perplexity.cpp, special tokens' text read as
plain text (``parse_special`` false), checked against llama.cpp's own tokenizer on the bundle exported to GGUF."""

from __future__ import annotations

import pytest

from edgesdk.accuracy import (
    HELLASWAG,
    WINOGRANDE,
    bundle_accuracy,
    parse_hellaswag,
    parse_winogrande,
    plain_text_encoder,
    reference_accuracy,
)
from tests.unit.test_accuracy_scoring39 import (
    _bundle_logits,
    _expected_choice,
    _expected_winogrande,
    _torch_logits,
)

torch = pytest.importorskip("torch")

# special tokens' text inside the task texts: llama.cpp reads it as plain text, never as the special token
SPECIAL_HELLASWAG = (
    "Chatting: A bot writes <|im_start|>assistant and then\n"
    "1\n"
    "stops at <|im_end|> at once.\n"
    "ends the text with <|endoftext|> here.\n"
    "keeps writing plain words.\n"
    "says <|im_end|><|endoftext|> twice.\n"
)
SPECIAL_WINOGRANDE = "0,The bot wrote <|im_start|> before _ ended its turn with <|im_end|> again.,it,the user,1\n"


def _texts(hellaswag, winogrande):
    texts = [f"{task.context} {ending}" for task in hellaswag for ending in task.endings]
    for task in winogrande:
        texts += [task.first + choice + task.second for choice in task.choices]
        texts += [task.first + choice for choice in task.choices]  # n_base1 / n_base2
    return texts


def test_special_token_text_in_a_task_is_scored_as_plain_text(runtime, tiny_model_dir):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    hellaswag, winogrande = parse_hellaswag(SPECIAL_HELLASWAG), parse_winogrande(SPECIAL_WINOGRANDE)
    plain = plain_text_encoder(runtime)
    specials = {runtime.tokenizer.token_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    for text in _texts(hellaswag, winogrande):
        assert not specials & set(plain(text))
    # the bundle's tokenizer as it encodes a prompt reads them as the special tokens: not llama-perplexity's tokens
    assert specials <= {t for text in _texts(hellaswag, winogrande)
                        for t in runtime.tokenizer.encode(text, add_special_tokens=False)}

    result = bundle_accuracy(runtime, HELLASWAG, hellaswag)
    expected = _expected_choice(lambda s: _bundle_logits(runtime, s), plain, hellaswag)
    assert [list(s) for s in result.scores] == [pytest.approx(means, abs=1e-9) for means, _ in expected]
    assert list(result.picks) == [pick for _, pick in expected]
    wino = bundle_accuracy(runtime, WINOGRANDE, winogrande)
    expected = _expected_winogrande(lambda s: _bundle_logits(runtime, s), plain, winogrande)
    assert [list(s) for s in wino.scores] == [pytest.approx(means, abs=1e-9) for means, *_ in expected]

    model = load_model(resolve_model(str(tiny_model_dir)), progress=False).model.eval()
    reference = reference_accuracy(model, runtime, HELLASWAG, hellaswag)
    expected = _expected_choice(lambda s: _torch_logits(model, s), plain, hellaswag)
    assert [list(s) for s in reference.scores] == [pytest.approx(means, abs=1e-9) for means, _ in expected]


def test_llama_cpp_tokenizes_each_task_text_into_the_ids_scored(tiny_bundle, runtime, tmp_path):
    """llama.cpp's tokenizer for the bundle exported to GGUF, called as common_tokenize(ctx, text, true) calls it
    (add_special, parse_special false), gives the ids the scorers score for every text of a task: the whole
    context-and-ending text (the join tokenized as one text) and Winogrande's first-part-and-choice texts."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from edgesdk.evaluate import leading_bos
    from edgesdk.export.gguf_export import export_gguf
    from tests.unit.test_accuracy_files39 import HELLASWAG_TEXT
    from tests.unit.test_accuracy_scoring39 import WINOGRANDE_ROWS

    report = export_gguf(tiny_bundle.path, tmp_path / "model.gguf")
    vocab = llama_cpp.Llama(str(report.path), vocab_only=True, verbose=False)
    lead = [] if leading_bos(runtime.tokenizer) is None else [leading_bos(runtime.tokenizer)]
    plain = plain_text_encoder(runtime)
    texts = _texts(parse_hellaswag(SPECIAL_HELLASWAG + HELLASWAG_TEXT),
                   parse_winogrande(SPECIAL_WINOGRANDE + WINOGRANDE_ROWS))
    for text in texts:
        assert vocab.tokenize(text.encode(), add_bos=True, special=False) == lead + plain(text), text
