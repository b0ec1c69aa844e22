"""Evaluation review 58 (edgesdk/accuracy.py); each test failed before its fix.

- A Winogrande sentence that starts with its blank, scored without BOS and with too few tokens after the choice
  for llama.cpp to skip it, leaves the choices' first token with nothing to predict it; the task was refused as "a
  choice leaves no token to score", with the fix "the sentence needs words after the blank, or choices that
  differ", which it has. The refusal now names what is missing and how to fix it.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.accuracy import parse_winogrande, winogrande_score
from edgesdk.errors import EdgeSDKError

VOCAB = 256


def _encode(text: str) -> list[int]:
    """One token a byte: no BOS, and a text's tokens are its bytes."""
    return list(text.encode("utf-8"))


def _score(ids: np.ndarray) -> np.ndarray:
    return np.random.default_rng(int(ids.sum())).normal(size=(len(ids), VOCAB))  # (T, V)


def test_a_sentence_starting_with_its_blank_is_refused_for_what_it_lacks():
    tasks = parse_winogrande("0,_.,Jo,Al,1\n")  # "Jo." / "Al.": no shared first token, 3 tokens after it
    with pytest.raises(EdgeSDKError) as refused:
        winogrande_score(_score, _encode, tasks)
    said = str(refused.value)
    assert "share no first token" in said
    assert "no BOS" in said
    assert "words before the blank" in said
    assert "leaves no token to score" not in said


def test_the_same_sentence_with_bos_in_front_is_scored():
    result = winogrande_score(_score, _encode, parse_winogrande("0,_.,Jo,Al,1\n"), bos_id=1)
    assert result.tasks == 1


def test_a_choice_leaving_no_token_is_still_refused_as_such():
    tasks = parse_winogrande("0,I saw _,Jo,Jo!,1\n")  # "I saw Jo" leads "I saw Jo!": nothing past the prefix
    with pytest.raises(EdgeSDKError, match="a choice leaves no token to score"):
        winogrande_score(_score, _encode, tasks)
