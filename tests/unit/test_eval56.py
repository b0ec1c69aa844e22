"""Evaluation review 56 (edgesdk/evaluate.py, edgesdk/accuracy.py); each test failed before its change.

- ``last_word_documents`` took a paragraph's last word only where it was ASCII letters: a paragraph ending in "café"
  or "Москва" was dropped, and a text in any other script was refused as having "no paragraph to score", where
  lm-evaluation-harness's lambada takes the last word whatever its letters. A word of letters of any script counts.
- An accuracy task whose model gave -inf for every token at a scored position (log-softmax NaN) was refused as
  "the model gave NaN logits", naming logits it did not give; the refusal now names that case too.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.accuracy import ChoiceTask, choice_score
from edgesdk.errors import EdgeSDKError
from edgesdk.evaluate import last_word_documents

BODY = " ".join(["the miller kept a ledger of every sack"] * 6)  # 48 words


@pytest.mark.parametrize("word", ["café", "Москва", "naïve", "Zürich-Nord"])
def test_a_last_word_of_any_script_is_scored(word):
    assert last_word_documents(f"{BODY} {word} .") == [(BODY, word)]


@pytest.mark.parametrize("last", ["1990", "x_y", "ab"])
def test_a_last_word_of_digits_underscores_or_two_letters_is_still_passed_over(last):
    assert last_word_documents(f"{BODY} {last} .") == []


def test_logits_of_minus_inf_for_every_token_are_named_as_such():
    def no_token_possible(window: np.ndarray) -> np.ndarray:
        return np.full((len(window), 8), -np.inf, np.float32)  # (T, V)

    task = ChoiceTask("ab", ("cd", "ef"), (1, 0), "line 1")
    with np.errstate(invalid="ignore"), pytest.raises(EdgeSDKError) as raised:
        choice_score(no_token_possible, lambda text: [ord(c) % 8 for c in text], [task], bos_id=0)
    assert "-inf for every token" in str(raised.value)
