"""The Python API and the bench, checked against what llama-cpp-python's ``Llama`` and llama-bench do (review 45)."""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=4) as loaded:
        yield loaded


def test_logit_bias_takes_int_token_ids_as_llama_cpp_python_passes_them(model):
    """llama-cpp-python's ``logit_bias`` is a ``Dict[int, float]``; over HTTP the JSON object's keys are strings. An
    int key (a numpy one too) is the token id its string is, not a TypeError from the parser."""
    token = model.tokenize("Q", add_special=False)[0]
    plain = model("Q", max_tokens=3)["choices"][0]["text"]
    as_json = model("Q", logit_bias={str(token): 100}, max_tokens=3)["choices"][0]["text"]
    assert as_json == "QQQ" != plain  # the bias acts: "Q" at each step, which the tiny model does not answer without it
    assert model("Q", logit_bias={token: 100}, max_tokens=3)["choices"][0]["text"] == as_json
    assert model("Q", logit_bias={np.int64(token): 100}, max_tokens=3)["choices"][0]["text"] == as_json
    chat = [{"role": "user", "content": "hi"}]
    expected = model.create_chat_completion(chat, logit_bias={str(token): False}, max_tokens=3)
    answer = model.create_chat_completion(chat, logit_bias={token: False}, max_tokens=3)
    assert answer["choices"] == expected["choices"]


def test_a_bad_logit_bias_key_is_still_refused_naming_the_field(model):
    with pytest.raises(edgesdk.RequestError, match="logit_bias") as caught:
        model("Q", logit_bias={-1: 5}, max_tokens=2)
    assert caught.value.param == "logit_bias"
    with pytest.raises(edgesdk.RequestError, match=r"create_completion \(logit_bias\): logit_bias key \(1, 2\)"):
        model("Q", logit_bias={(1, 2): 5}, max_tokens=2)
    # a float key is the text JSON writes for it, as the route reads {"1.5": 5} over HTTP (text to tokenize)
    text = model("Q", logit_bias={"1.5": -100}, max_tokens=3)["choices"]
    assert model("Q", logit_bias={1.5: -100}, max_tokens=3)["choices"] == text


def test_draft_settings_without_a_draft_are_noted_not_silently_dropped(tiny_bundle):
    """``edgesdk serve --draft-max 8`` without ``--draft`` says the option is not used; load() says so in its
    notes, and says nothing where they are left out."""
    with edgesdk.load(tiny_bundle.path, threads=1, draft_max=8, draft_p_min=0.5) as loaded:
        assert "draft_max: not used: it works with draft=BUNDLE" in loaded.notes
        assert "draft_p_min: not used: it works with draft=BUNDLE" in loaded.notes
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        assert not any(note.startswith("draft") for note in loaded.notes)


def test_build_bundle_warns_of_data_skip_chars_without_data(tmp_path):
    """``edgesdk build --data-skip-chars N`` without ``--data`` warns that it is not used; build_bundle said
    nothing. The target is one no board has, so the build stops right after the warning, naming it."""
    with pytest.warns(UserWarning, match="data_skip_chars=100 is not used"), \
            pytest.raises(edgesdk.EdgeSDKError, match="no-such-board"):
        edgesdk.build_bundle("no-such-board", data_skip_chars=100, out=tmp_path / "bundle", progress=False)


def test_parallel_tool_calls_is_read_by_chat_and_refused_by_completions(model):
    """``parallel_tool_calls`` lets a chat answer make several tool calls (edgesdk/serve/tools.py), so it is no
    longer a field taken and left unread: a plain completion, which has no tools, names it as unused."""
    chat = model.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=2, parallel_tool_calls=False)
    assert chat["usage"]["completion_tokens"] <= 2
    with pytest.raises(edgesdk.EdgeSDKError, match="parallel_tool_calls"):
        model.create_completion("The sea", max_tokens=2, parallel_tool_calls=True)
