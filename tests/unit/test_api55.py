"""edgesdk/api.py: Model.save_prompt_cache refuses a path it must not write and leaves it as it is, as ``edgesdk run
--prompt-cache`` leaves it (edgesdk/cli_prompt_cache.py), and a write that fails says how to fix its cause; an answer's
``model`` is the request's, as llama-cpp-python's create_completion answers."""

from __future__ import annotations

import errno
import os

import pytest

import edgesdk

CHAT = [{"role": "user", "content": "When does the ferry leave?"}]


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        loaded.create_chat_completion(CHAT, max_tokens=3)
        yield loaded


def test_a_read_only_cache_file_is_refused_and_left_as_it_is(model, tmp_path):
    path = tmp_path / "prompt.cache"
    assert model.save_prompt_cache(path) > 0
    path.chmod(0o444)
    before = path.read_bytes(), os.stat(path).st_ino
    with pytest.raises(edgesdk.EdgeSDKError, match=r"prompt\.cache is read-only \(mode 0444\)") as caught:
        model.save_prompt_cache(path)
    assert "chmod u+w" in caught.value.fix
    assert (path.read_bytes(), os.stat(path).st_ino) == before  # not replaced by a new file


def test_a_file_that_is_no_cache_file_is_refused_and_kept(model, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("the harbour's tide table\n")
    with pytest.raises(edgesdk.EdgeSDKError, match=r"notes\.txt is not a prompt cache file") as caught:
        model.save_prompt_cache(notes)
    assert "remove that file" in caught.value.fix
    assert notes.read_text() == "the harbour's tide table\n"


def test_a_directory_and_a_fifo_are_refused_with_a_fix_for_each(model, tmp_path):
    with pytest.raises(edgesdk.EdgeSDKError, match="is a directory") as caught:
        model.save_prompt_cache(tmp_path)
    assert str(tmp_path / "prompt.cache") in caught.value.fix
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(edgesdk.EdgeSDKError, match=r"is a FIFO") as caught:
        model.save_prompt_cache(fifo)
    assert "regular file" in caught.value.fix


def test_a_missing_directory_is_named_in_the_fix(model, tmp_path):
    missing = tmp_path / "none"
    with pytest.raises(edgesdk.EdgeSDKError, match=r"No such file or directory") as caught:
        model.save_prompt_cache(missing / "prompt.cache")
    assert f"mkdir -p {missing}" in caught.value.fix


@pytest.mark.parametrize(("code", "words"), [(errno.ENOSPC, "free space"), (errno.EROFS, "read-only file system"),
                                             (errno.EACCES, "may write to")])
def test_a_failed_write_s_fix_follows_its_cause(tmp_path, code, words):
    from edgesdk.cli_prompt_cache import write_fix

    fix = write_fix(OSError(code, os.strerror(code)), tmp_path / "prompt.cache", another="a path")
    assert words in fix
    assert str(tmp_path) in fix


def test_an_answer_names_the_model_the_request_names(model):
    """llama-cpp-python: ``model_name = model if model is not None else self.model_path``, whole or streamed."""
    assert model("The sea", max_tokens=2, model="harbour-bot")["model"] == "harbour-bot"
    chat = model.create_chat_completion(CHAT, max_tokens=2, model="harbour-bot")
    assert chat["model"] == "harbour-bot"
    chunks = list(model.create_chat_completion(CHAT, max_tokens=2, model="harbour-bot", stream=True))
    assert {chunk["model"] for chunk in chunks} == {"harbour-bot"}
    assert model("The sea", max_tokens=2)["model"] == model.model_name  # left out: the bundle's
    assert model("The sea", max_tokens=2, model=None)["model"] == model.model_name


def test_a_prompt_past_the_context_is_refused_in_python_s_terms(model):
    ids = model.tokenize("The tide came in. " * 60, add_special=False)
    assert len(ids) > model.n_ctx()
    for call in (lambda: model(ids, max_tokens=2), lambda: model("The tide came in. " * 60, max_tokens=2, stream=True),
                 lambda: model.create_chat_completion([{"role": "user", "content": "The tide came in. " * 60}])):
        with pytest.raises(edgesdk.RequestError, match="maximum context length is 256 tokens") as caught:
            list(call())
        assert "POST /tokenize" not in str(caught.value)  # an HTTP route, where model.tokenize() counts them
        assert "build_bundle(..., max_context=512)" in caught.value.fix  # the tiny model's max_position_embeddings
        assert "model.tokenize(text)" in caught.value.fix
