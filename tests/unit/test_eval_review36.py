"""Faults in ``edgesdk eval`` and edgesdk/evaluate.py: each test failed before its fix."""

from __future__ import annotations

import json
import math

import pytest

from tests.unit.test_cli import assert_ok, invoke

torch = pytest.importorskip("torch")

# Words the tiny tokenizer splits into many tokens: a paragraph past the tiny bundle's max_context of 256.
LONG_PARAGRAPH = " ".join(["extraordinarily complicated"] * 30) + " and then it slept ."


def test_last_word_with_reference_cuts_a_long_paragraph_for_both_models(tiny_bundle, tmp_path):
    """A paragraph longer than the bundle's max_context was cut to its last tokens for the bundle only; the
    PyTorch reference scored the whole paragraph, so the two word perplexities compared different text. Both
    now score the same window, and a float32-accurate bundle agrees with its source."""
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    assert len(runtime.tokenizer.encode(LONG_PARAGRAPH, add_special_tokens=False)) > runtime.backend.max_context + 1
    text = tmp_path / "long.txt"
    text.write_text(LONG_PARAGRAPH + "\n", encoding="utf-8")
    answer = invoke("eval", tiny_bundle.path, "--text", text, "--last-word", "--reference", "--json",
                    "--context", 128, "--threads", 1)
    assert_ok(answer)
    report = json.loads(answer.stdout)
    ours, theirs = report["last_word"], report["reference_last_word"]
    assert ours["documents"] == theirs["documents"] == 1
    # mean log-likelihood of the word: 1e-6 nats apart on the same window, 5e-3 on the whole paragraph
    assert math.log(theirs["word_perplexity"]) == pytest.approx(math.log(ours["word_perplexity"]), abs=1e-4)
