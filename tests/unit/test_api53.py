"""Review of the Python API (53rd stop), on the tiny bundle:

- ``load(backend=[...])`` (a chain of backends, as a profile holds one) is refused naming ``backend``; it raised
  ``TypeError: unhashable type: 'list'``;
- ``create_chat_completion`` with ``max_tokens`` beside ``max_completion_tokens`` (an OpenAI client sending the old
  and the new name) answers with that limit where the two agree and names both where they differ; it was refused as
  "takes no field 'max_tokens' (did you mean 'max_completion_tokens'?)";
- NumPy scalars (``np.int64``, ``np.True_``) are the numbers and flags they hold in ``perplexity``'s ``context``,
  ``stride`` and ``max_chars``, ``embed``'s ``truncate`` and ``return_count`` and ``load``'s ``ignore_target`` and
  ``watch_thermal``, as in the request fields; they were refused with "context is np.int64(32); expected a whole
  number".
"""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.errors import EdgeSDKError

MESSAGES = [{"role": "user", "content": "hi"}]
TEXT = "the quick brown fox jumps over the lazy dog " * 12


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=6) as loaded:
        yield loaded


def test_a_chain_of_backends_is_refused_naming_backend(tiny_bundle):
    with pytest.raises(EdgeSDKError) as caught:
        edgesdk.load(tiny_bundle.path, backend=["ort-cpu", "ort-cuda"])
    assert "backend=['ort-cpu', 'ort-cuda']" in caught.value.problem
    assert "expected one of ort-cpu" in caught.value.problem
    assert "leave backend out" in caught.value.fix


@pytest.mark.parametrize("both", [(2, 2), (np.int64(2), 2)])
def test_max_tokens_beside_the_same_max_completion_tokens_is_that_limit(model, both):
    older, newer = both
    answer = model.create_chat_completion(MESSAGES, max_tokens=older, max_completion_tokens=newer, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 2


def test_max_tokens_beside_another_max_completion_tokens_names_both(model):
    with pytest.raises(RequestError) as caught:
        model.create_chat_completion(MESSAGES, max_tokens=3, max_completion_tokens=2)
    assert caught.value.param == "max_tokens"
    assert "max_tokens=3 and max_completion_tokens=2 disagree" in str(caught.value)
    assert "takes no field" not in str(caught.value)


def test_max_tokens_beside_a_null_max_completion_tokens_is_read(model):
    answer = model.create_chat_completion(MESSAGES, max_tokens=2, max_completion_tokens=None, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 2


def test_numpy_scalars_are_the_perplexity_arguments_they_hold(model):
    plain = model.perplexity(TEXT, context=32, stride=16, max_chars=200)
    assert model.perplexity(TEXT, context=np.int64(32), stride=np.int32(16), max_chars=np.int64(200)) == plain
    assert model.perplexity(TEXT, context=np.int64(32)) == model.perplexity(TEXT, context=32)


def test_numpy_flags_are_embed_s_flags(model):
    vector, tokens = model.embed("hello there", truncate=np.True_, return_count=np.True_)
    assert (vector, tokens) == model.embed("hello there", truncate=True, return_count=True)
    assert model.embed("hello there", return_count=np.False_) == vector


def test_numpy_flags_are_load_s_flags(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, ignore_target=np.True_, watch_thermal=np.False_) as loaded:
        assert loaded.tokenize("hi")


def test_the_same_limit_under_both_names_is_judged_as_that_one_value():
    """max_tokens=0 beside max_completion_tokens=0 is one value: the parser's refusal of max_completion_tokens names
    what is wrong with it, not a disagreement between the two names."""
    from edgesdk.api_checks import chat_limits

    assert chat_limits({"max_tokens": 0, "max_completion_tokens": 0}) == {"max_completion_tokens": 0}


@pytest.mark.parametrize("newer", [1, 50])
def test_a_flag_under_max_tokens_is_refused_beside_a_limit(newer):
    from edgesdk.api import RequestError
    from edgesdk.api_checks import chat_limits

    with pytest.raises(RequestError, match="max_tokens=True is a flag"):
        chat_limits({"max_tokens": True, "max_completion_tokens": newer})
