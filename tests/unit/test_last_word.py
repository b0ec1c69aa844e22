"""The last-word accuracy task (edgesdk/evaluate.py): documents from WikiText-form text, and scoring as
lm-evaluation-harness scores a loglikelihood request, checked by hand on a real (tiny) bundle."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.evaluate import bundle_scorer, last_word_accuracy, last_word_documents
from edgesdk.runtime.logprobs import log_softmax

PARAGRAPH = " ".join(["the quick brown fox jumps over the lazy dog"] * 5) + " and then it slept ."


def test_documents_are_paragraphs_of_40_to_150_words_ending_in_a_word_and_a_full_stop():
    text = "\n".join([" = Heading = ", PARAGRAPH, "too short to count .", PARAGRAPH.replace(" .", " !"),
                      " ".join(["word"] * 160) + " end ."])
    assert last_word_documents(text) == [(PARAGRAPH[: -len(" slept .")], "slept")]


def test_accuracy_and_word_perplexity_by_hand(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)

    def encode(text):
        return runtime.tokenizer.encode(text, add_special_tokens=False)

    documents = last_word_documents(PARAGRAPH)
    result = last_word_accuracy(bundle_scorer(runtime), encode, documents)
    context, word = documents[0]
    prefix, whole = encode(context), encode(f"{context} {word}")
    runtime.backend.reset()
    rows = log_softmax(runtime.backend.prefill(np.asarray(whole), keep_logits=len(whole)))
    expected = sum(rows[i - 1][whole[i]] for i in range(len(prefix), len(whole)))
    greedy = all(int(rows[i - 1].argmax()) == whole[i] for i in range(len(prefix), len(whole)))
    assert result.documents == 1
    assert result.word_perplexity == pytest.approx(np.exp(-expected), rel=1e-5)
    assert result.accuracy == float(greedy)
    assert result.to_json()["documents"] == 1


def test_text_without_a_paragraph_to_score_is_a_named_error():
    with pytest.raises(EdgeSDKError, match="no paragraph to score"):
        last_word_accuracy(lambda ids: None, lambda text: [], last_word_documents("short ."))


def test_eval_last_word_reports_the_task(tiny_bundle, tmp_path):
    import json

    from tests.unit.test_cli import assert_ok, invoke

    text = tmp_path / "paragraphs.txt"
    text.write_text("\n".join([PARAGRAPH, PARAGRAPH.replace("slept", "jumped")]), encoding="utf-8")
    result = invoke("eval", tiny_bundle.path, "--text", text, "--last-word", "--json", "--context", 128, "--threads", 1)
    assert_ok(result)
    body = json.loads(result.stdout)
    assert body["last_word"]["documents"] == 2
    assert 0 <= body["last_word"]["accuracy"] <= 1
    assert body["last_word"]["word_perplexity"] > 1
    plain = invoke("eval", tiny_bundle.path, "--text", text, "--last-word", "--context", 128, "--threads", 1)
    assert "last word (bundle)" in plain.stdout
    assert "(2 paragraphs)" in plain.stdout
