"""The per-stage held-out perplexity scores windows that start with BOS where the tokenizer adds one
(Gemma, Llama 2), as ``edgesdk eval`` does; a tokenizer without BOS (SmolLM2's) keeps its plain ids."""

from __future__ import annotations

import torch

from edgesdk.build.registry import BuildContext
from edgesdk.compress.data import DataConfig
from edgesdk.compress.measure import HELDOUT_WINDOW, heldout_perplexity, windows_after_bos
from tests._utils.tiny import tiny_gemma_tokenizer, tiny_llama, tiny_tokenizer

TEXT = ("The tower is 324 metres tall, about the same height as an 81-storey building, and the tallest "
        "structure in Paris. Its base is square, measuring 125 metres on each side. ") * 40


def test_windows_after_bos_start_every_window_with_it_and_keep_the_text_in_order():
    ids = list(range(10, 30))
    laid_out = windows_after_bos(ids, 2, length=6)
    assert laid_out == [2, 10, 11, 12, 13, 14, 2, 15, 16, 17, 18, 19, 2, 20, 21, 22, 23, 24,
                        2, 25, 26, 27, 28, 29]
    assert windows_after_bos(ids, None, length=6) == ids


def context(tokenizer, tmp_path) -> BuildContext:
    data = tmp_path / "text.txt"
    data.write_text(TEXT + "trained on from here", encoding="utf-8")
    return BuildContext(profile=None, work_dir=tmp_path, tokenizer=tokenizer,
                        data_config=DataConfig(files=(str(data),), skip_chars=len(TEXT)))


def test_stage_windows_start_with_bos_for_a_tokenizer_that_adds_one(tmp_path):
    tokenizer = tiny_gemma_tokenizer()
    bos = tokenizer.bos_token_id
    ids = context(tokenizer, tmp_path).eval_ids()
    assert ids.numel() > 2 * HELDOUT_WINDOW
    windows = ids[: ids.numel() // HELDOUT_WINDOW * HELDOUT_WINDOW].reshape(-1, HELDOUT_WINDOW)  # (W, 256)
    assert (windows[:, 0] == bos).all()
    assert (windows[:, 1:] != bos).all()
    text_ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert windows[:, 1:].reshape(-1).tolist() == text_ids[: windows[:, 1:].numel()]


def test_stage_windows_of_a_tokenizer_without_bos_are_its_plain_ids(tmp_path):
    tokenizer = tiny_tokenizer()
    ids = context(tokenizer, tmp_path).eval_ids()
    assert ids.tolist() == tokenizer(TEXT)["input_ids"][:8192]


def test_heldout_perplexity_scores_the_text_after_bos(tmp_path):
    """With BOS first in each window, every text token of the window is a target."""
    tokenizer = tiny_gemma_tokenizer()
    ids = context(tokenizer, tmp_path).eval_ids()[: 2 * HELDOUT_WINDOW]
    model = tiny_llama(vocab_size=len(tokenizer), model_type="gemma3_text").eval()
    windows = ids.reshape(2, HELDOUT_WINDOW)  # (2, 256)
    with torch.no_grad():
        logits = model(windows).logits[:, :-1]  # (2, 255, V)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 windows[:, 1:].reshape(-1)).exp()
    assert abs(heldout_perplexity(model, ids) - float(expected)) < 1e-3 * float(expected)
