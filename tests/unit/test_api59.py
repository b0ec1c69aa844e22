"""edgesdk/api.py and edgesdk/api_checks.py as a caller of llama-cpp-python's Llama or transformers' pipeline uses
them: an empty path is refused by name, not read as the working directory; a request's ``model`` that is no name is
refused as ``edgesdk serve`` refuses it; another API's names of a field (transformers' ``do_sample``, Ollama's
``num_predict``) are named with the field to pass; and ``with`` refuses a closed model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import edgesdk
from edgesdk.api import RequestError

MESSAGES = [{"role": "user", "content": "hi"}]


def test_load_refuses_an_empty_path_by_name(tiny_bundle, monkeypatch):
    # an unset variable's value: Path("") is the working directory, a bundle there loaded and any other refused as
    # bundle ".", a name the caller never wrote
    monkeypatch.chdir(tiny_bundle.path)  # even where the working directory is a bundle, "" names none
    with pytest.raises(edgesdk.EdgeSDKError, match=r"load\(\): path='': expected the bundle's directory \(a "
                                                   r"non-empty str") as refused:
        edgesdk.load("")
    assert "edgesdk.load('bundles/" in refused.value.fix


def test_load_refuses_an_empty_draft_path_by_name(tiny_bundle, monkeypatch):
    monkeypatch.chdir(tiny_bundle.path)  # a draft of "" was the working directory: here the bundle itself
    with pytest.raises(edgesdk.EdgeSDKError, match=r"load\(\): draft='': expected a draft bundle's directory"):
        edgesdk.load(tiny_bundle.path, threads=1, draft="")


def test_load_still_takes_the_bundle_in_the_working_directory_as_dot(tiny_bundle, monkeypatch):
    monkeypatch.chdir(tiny_bundle.path)
    with edgesdk.load(".", threads=1) as model:
        assert Path(os.fspath(model.runtime.bundle.path)).resolve() == Path(tiny_bundle.path).resolve()


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=2) as loaded:
        yield loaded


@pytest.mark.parametrize("method", ["create_completion", "create_chat_completion"])
@pytest.mark.parametrize("name", [5, ["tiny"], b"tiny"])
def test_a_model_that_is_no_name_is_refused_as_serve_and_create_embedding_refuse_it(model, method, name):
    # taken without a word before, the answer naming the bundle: serve answers 400, create_embedding refuses it
    call = getattr(model, method)
    with pytest.raises(RequestError, match=rf"{method} \(model\): model is .*; expected the name the answer carries") \
            as refused:
        call("Once" if method == "create_completion" else MESSAGES, model=name)
    assert refused.value.param == "model"
    assert "leave model out" in refused.value.fix
    with pytest.raises(RequestError, match=r"\(model\)"):
        call("Once" if method == "create_completion" else MESSAGES, model=name, stream=True)


@pytest.mark.parametrize("name", [None, "", "my-model"])
def test_a_model_name_or_none_is_still_taken(model, name):
    answer = model.create_completion("Once", model=name)
    assert answer["model"] == (name or model.model_name)
    chat = model.create_chat_completion(MESSAGES, model=name)
    assert chat["model"] == (name or model.model_name)


@pytest.mark.parametrize(("method", "field", "value", "hint"), [
    ("create_completion", "do_sample", False, "pass temperature=0 for greedy answers (transformers' do_sample"),
    ("create_chat_completion", "do_sample", True, "pass temperature=0 for greedy answers"),
    ("create_completion", "num_predict", 3, "pass max_tokens=N (Ollama's num_predict)"),
    ("create_completion", "n_predict", 3, "pass max_tokens=N (llama-server's n_predict)"),
    ("create_chat_completion", "n_predict", 3, "pass max_tokens=N (llama-server's n_predict)"),
    ("create_chat_completion", "max_new_tokens", 3, "pass max_tokens=N (transformers' max_new_tokens)"),
    ("create_completion", "stop_strings", ["\n"], "pass stop=[...] (transformers' stop_strings)"),
    ("create_chat_completion", "stop_sequences", ["\n"], "pass stop=[...] (Anthropic's stop_sequences)"),
])
def test_another_apis_name_of_a_field_names_the_field_to_pass(model, method, field, value, hint):
    # do_sample was answered "did you mean 'samplers'?", n_predict and num_predict with no hint at all
    call = getattr(model, method)
    with pytest.raises(RequestError, match=rf"takes no field '{field}' \(another API's name: ") as refused:
        call("Once" if method == "create_completion" else MESSAGES, **{field: value})
    assert hint in str(refused.value)
    assert "samplers" not in str(refused.value).split("fix:")[0]
    assert refused.value.param == field


@pytest.mark.parametrize(("setting", "hint"), [
    ("do_sample", "do_sample: pass temperature=0 for greedy answers"),
    ("num_predict", "num_predict: pass max_tokens=N (Ollama's num_predict)"),
    ("stop_strings", "stop_strings: pass stop=[...] (transformers' stop_strings) to create_completion / "
                     "create_chat_completion"),
])
def test_load_names_the_setting_for_another_apis_name(tiny_bundle, setting, hint):
    with pytest.raises(edgesdk.EdgeSDKError, match=rf"load\(\) got the setting\(s\) '{setting}'") as refused:
        edgesdk.load(tiny_bundle.path, threads=1, **{setting: 1})
    assert hint in str(refused.value)
    assert "did you mean" not in str(refused.value)


def test_with_refuses_a_closed_model_at_once(tiny_bundle):
    model = edgesdk.load(tiny_bundle.path, threads=1, max_tokens=2)
    with model:
        assert model("Once")["usage"]["completion_tokens"] <= 2
    entered = []
    with pytest.raises(RequestError, match=r"with: the model is closed") as refused:
        with model:
            entered.append(model.notes)  # ran before: a block reading what the closed model holds
    assert not entered
    assert refused.value.status == 503
    assert "load the bundle again" in refused.value.fix
    model.close()  # closing again is still no error


def test_a_model_closed_inside_its_with_block_leaves_it_quietly(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=2) as model:
        model.close()
    with pytest.raises(RequestError, match="the model is closed"):
        model("Once")
