"""Perplexity, divergence and the last-word task give a model whose tokenizer puts BOS in front of every text
(Gemma) its BOS at the start of each window, as llama-perplexity and lm-evaluation-harness do; a tokenizer
that adds none (SmolLM2's byte-level BPE here) is scored as before."""

from __future__ import annotations

import numpy as np
import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import CORPUS, save_tiny_model_dir

torch = pytest.importorskip("torch")

GEMMA3 = {"model_type": "gemma3_text", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32, "layers": 2,
          "intermediate": 128, "vocab_size": 384, "tokenizer": "gemma"}
RECIPE = "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
TEXT = " ".join(CORPUS[:4]) * 3


@pytest.fixture(scope="module")
def gemma_runtime(tmp_path_factory):
    from edgesdk.runtime.session import open_runtime

    root = tmp_path_factory.mktemp("gemma")
    bundle = build_tiny_bundle(root, RECIPE, "host", model_dir=save_tiny_model_dir(root / "model", **GEMMA3))
    return open_runtime(bundle.path, threads=1), root / "model"


def test_the_leading_bos_is_read_from_the_tokenizer(gemma_runtime, runtime):
    from edgesdk.evaluate import leading_bos

    gemma, _ = gemma_runtime
    assert leading_bos(gemma.tokenizer) == gemma.tokenizer.token_id("<bos>") == 2
    assert leading_bos(runtime.tokenizer) is None  # SmolLM2-style byte-level BPE adds none


def test_every_window_starts_with_bos_and_the_scored_tokens_are_unchanged(gemma_runtime):
    from edgesdk.evaluate import PerplexityConfig, bundle_perplexity, bundle_scorer, perplexity

    runtime, _ = gemma_runtime
    config = PerplexityConfig(context=24, stride=16)
    seen = []
    score = bundle_scorer(runtime)

    def recording(window):
        seen.append(window.copy())
        return score(window)

    ids = runtime.tokenizer.encode(TEXT, add_special_tokens=False)
    with_bos = perplexity(recording, ids, config, bos_id=2)
    assert seen
    assert all(window[0] == 2 for window in seen)
    assert all(np.array_equal(window[1:], ids[start + 1: start + len(window)])
               for window, start in zip(seen, range(0, len(ids), 16), strict=False))
    without = perplexity(score, ids, config)
    assert with_bos.tokens_scored == without.tokens_scored
    assert with_bos.perplexity != pytest.approx(without.perplexity, rel=1e-3)
    assert bundle_perplexity(runtime, TEXT, config).perplexity == pytest.approx(with_bos.perplexity, rel=1e-9)


def test_eval_reference_gives_pytorch_the_same_bos(gemma_runtime, tmp_path):
    """`edgesdk eval --reference --kl-divergence` on a float32 Gemma bundle: the bundle and PyTorch score the same
    windows (BOS in both), so they agree to float rounding; without BOS in one of them they would not."""
    import json

    from click.testing import CliRunner

    from edgesdk.cli import main

    runtime, _ = gemma_runtime
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    result = CliRunner().invoke(main, ["eval", str(runtime.bundle.path), "--text", str(text), "--context", "24",
                                       "--reference", "--kl-divergence", "--json", "--ignore-target"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert abs(report["relative_difference"]) < 1e-4
    assert report["divergence"]["mean_kld"] < 1e-6


def test_the_last_word_task_puts_bos_in_front_of_both_encodings():
    from edgesdk.evaluate import last_word_accuracy

    fed = []

    def score(window):
        fed.append(window.tolist())
        return np.zeros((len(window), 8), np.float32)

    encode = lambda text: [3 + len(word) % 4 for word in text.split()]  # noqa: E731
    last_word_accuracy(score, encode, [("one two three", "four")], bos_id=1)
    assert fed == [[1, 6, 6, 4, 3]]  # BOS, the context's tokens, the word's (the target)
