"""Runtime backends and embeddings, review 57 (edgesdk/runtime/backend.py, embedding.py): token ids as Python gives
them."""

from __future__ import annotations

import re

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.backend import checked_decode_id, checked_token_ids
from edgesdk.runtime.embedding import EmbeddingError, fitted

VOCAB = 320


@pytest.mark.parametrize(("given", "named", "at"), [([2**64], 2**64, 0), ([-1, 2**63], -1, 0), ([7, 2**63], 2**63, 1),
                                                     ([[5, 2**70]], 2**70, 1)])
def test_python_ints_past_int64_are_named_as_the_ids_they_are(given, named, at):
    """numpy makes [2**64] an object array and [-1, 2**63] a float64 one: both were refused as token ids of "dtype
    object" / "dtype float64" that were to be "whole numbers", which they are; the id out of the vocabulary went
    unnamed."""
    with pytest.raises(RuntimeBackendError, match=rf"prefill with token id {named} at position {at}: expected an id "
                                                  rf"from 0 to {VOCAB - 1}"):
        checked_token_ids(given, VOCAB, "prefill")
    with pytest.raises(RuntimeBackendError, match=rf"decode with token id {2**64} at position 0"):
        checked_decode_id(2**64, VOCAB)


@pytest.mark.parametrize("given", [[1.5], [True], np.array([None], dtype=object), [-1.5, 2**63]])
def test_ids_that_are_no_whole_numbers_are_still_refused_by_their_dtype(given):
    with pytest.raises(RuntimeBackendError, match=r"token ids of dtype \w+ .*: expected whole numbers"):
        checked_token_ids(given, VOCAB, "prefill")


def test_whole_numbers_in_an_object_array_are_the_ids_they_hold():
    ids = checked_token_ids(np.array([5, np.int64(7)], dtype=object), VOCAB, "prefill")
    assert ids.dtype == np.int64
    assert ids.tolist() == [[5, 7]]


@pytest.mark.parametrize(("given", "shown"), [([4, 3.7], "3.7 (float) at position 1"), ([True, 5], "True (bool) "
                                                "at position 0"), ([5, "6"], "'6' (str) at position 1"),
                                                (np.array([2.0, 3.0]), f"{np.float64(2.0)!r} (float64) at position 0")])
def test_token_ids_to_embed_that_are_no_whole_numbers_are_refused_not_cut(given, shown):
    """``fitted`` (embed_tokens) read each id with int(): 3.7 became the id 3, True 1 and "6" 6, so another text was
    embedded without a word, where the backends' hidden_states refuse such ids."""
    with pytest.raises(EmbeddingError, match=re.escape(f"the input to embed holds {shown}: expected a whole-number token id")):
        fitted(given, 32)


def test_whole_token_ids_to_embed_fit_as_before():
    assert fitted(np.array([5, 9, 11]), 2, truncate=True) == ([5, 9], True)
    assert fitted((n for n in [3, 4]), 8) == ([3, 4], False)  # any iterable, read once
