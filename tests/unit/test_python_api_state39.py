"""Model.save_prompt_cache / load_prompt_cache (edgesdk/api.py): the KV cache kept in a file between processes, as
llama-cpp-python's save_state / load_state keep it in memory and ``edgesdk run --prompt-cache`` (llama-cli's
``--prompt-cache``) keeps it in a file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import edgesdk
from edgesdk.api import LoadedPromptCache, RequestError
from tests.unit.test_python_api_hardening39 import no_thermal_zones

SYSTEM = "You answer questions about the harbour town, its boats, its tides and its lighthouse. " * 2
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "When does the ferry leave?"}]


def cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_another_process_loads_the_saved_cache_and_answers_the_same(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.cache"
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        first = model.create_chat_completion(CHAT, max_tokens=8, ignore_eos=True)
        assert cached(first) == 0
        usage = first["usage"]
        written = model.save_prompt_cache(path)
        # prompt and answer, but the answer's last token, which was never fed back (llama-cli's --prompt-cache-all)
        assert written == usage["prompt_tokens"] + usage["completion_tokens"] - 1
        assert [name.name for name in tmp_path.iterdir()] == ["prompt.cache"]  # no temporary file left beside it
        again = model.create_chat_completion(CHAT, max_tokens=8, ignore_eos=True)
        assert cached(again) == usage["prompt_tokens"] - 1  # the save left the live cache to the next answer
    script = textwrap.dedent(f"""
        import json, edgesdk
        with edgesdk.load({str(tiny_bundle.path)!r}, threads=1) as model:
            loaded = model.load_prompt_cache({str(path)!r})
            answer = model.create_chat_completion({CHAT!r}, max_tokens=8, ignore_eos=True)
        print(json.dumps({{"loaded": list(loaded), "answer": answer}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["loaded"] == [written, None]
    second = result["answer"]
    assert cached(second) == usage["prompt_tokens"] - 1  # all but the prompt's last token, whose logits are needed
    assert second["choices"] == first["choices"]
    assert second["usage"]["completion_tokens"] == usage["completion_tokens"]


def test_the_file_is_the_one_edgesdk_run_prompt_cache_keeps(tiny_bundle, tmp_path):
    from tests.unit.test_cache_file import PROMPT, _run

    path = tmp_path / "run.cache"
    _run(tiny_bundle, "--prompt-cache", path)
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        loaded = model.load_prompt_cache(path)
        with np.load(path) as data:
            assert loaded == LoadedPromptCache(data["tokens"].shape[0], None)
        answer = model(PROMPT, max_tokens=8)
        assert cached(answer) == answer["usage"]["prompt_tokens"] - 1
        assert model.save_prompt_cache(path) > 0
    assert "tokens loaded" in _run(tiny_bundle, "--prompt-cache", path).stderr


def test_a_missing_file_loads_nothing_and_a_file_that_does_not_fit_is_refused_then_replaced(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.cache"
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        assert model.load_prompt_cache(path) == (0, None)  # llama-cli: "session file does not exist, will create"
        fresh = model.create_chat_completion(CHAT, max_tokens=6)
        assert model.save_prompt_cache(path) > 0
        with np.load(path) as data:
            arrays = {name: data[name] for name in data.files}
        arrays["bundle_id"] = np.array("0123456789abcdef")
        with open(path, "wb") as out:
            np.savez(out, **arrays)
        loaded = model.load_prompt_cache(path)
        assert loaded.tokens == 0
        assert loaded.refused.startswith("it was written with another bundle (id 0123456789abcdef, this one ")
        answer = model.create_chat_completion(CHAT, max_tokens=6)
        assert cached(answer) == 0  # the cache the model held was replaced: nothing of it is reused
        assert answer["choices"] == fresh["choices"]
        assert model.save_prompt_cache(path) > 0  # the refused file is replaced, as edgesdk run rewrites it
        assert model.load_prompt_cache(path).tokens > 0
        path.write_bytes(b"not a cache")
        loaded = model.load_prompt_cache(path)
        assert loaded.tokens == 0
        assert loaded.refused.startswith("it cannot be read as a cache file")


def test_nothing_is_written_where_the_cache_holds_nothing(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.cache"
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        assert model.save_prompt_cache(path) == 0  # nothing answered yet
        assert not path.exists()
        model.create_chat_completion(CHAT, max_tokens=4)
        written = model.save_prompt_cache(path)
        model.perplexity("The tide came in over the harbour wall. " * 4, context=16)
        assert model.save_prompt_cache(path) == written  # perplexity leaves the answer's cache as it found it
        assert model.load_prompt_cache(path).tokens == written


def test_a_path_that_cannot_be_written_is_named_and_the_cache_stays(tiny_bundle, tmp_path):
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        first = model.create_chat_completion(CHAT, max_tokens=4)
        with pytest.raises(edgesdk.EdgeSDKError, match=r"save_prompt_cache: cannot write the prompt cache "
                                                       r".*none/prompt.cache \(No such file or directory\)"):
            model.save_prompt_cache(tmp_path / "none" / "prompt.cache")
        assert cached(model.create_chat_completion(CHAT, max_tokens=4)) == first["usage"]["prompt_tokens"] - 1


def test_a_closed_model_and_a_path_that_is_not_one_are_refused_by_name(tiny_bundle, tmp_path):
    model = edgesdk.load(tiny_bundle.path, threads=1)
    with pytest.raises(RequestError, match=r"save_prompt_cache \(path\): path is 42; expected a file path"):
        model.save_prompt_cache(42)
    with pytest.raises(RequestError, match=r"load_prompt_cache \(path\): path is b'x'"):
        model.load_prompt_cache(b"x")
    model.close()
    for method in (model.save_prompt_cache, model.load_prompt_cache):
        with pytest.raises(RequestError, match="the model is closed") as caught:
            method(tmp_path / "prompt.cache")
        assert caught.value.status == 503
    assert not (tmp_path / "prompt.cache").exists()


def test_a_model_without_a_prompt_cache_or_a_host_copy_of_it_is_refused(tiny_bundle, tmp_path, monkeypatch):
    from tests._utils.builds import build_tiny_jetson_bundle

    with edgesdk.load(tiny_bundle.path, threads=1, prompt_cache=False) as model:
        with pytest.raises(edgesdk.EdgeSDKError, match=r"save_prompt_cache: this model was loaded with "
                                                       r"prompt_cache=False") as caught:
            model.save_prompt_cache(tmp_path / "prompt.cache")
        assert "without prompt_cache=False" in caught.value.fix
    # the Triton backend keeps its cache as torch tensors (here on its kernels' PyTorch twins)
    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    sparse = build_tiny_jetson_bundle(tmp_path / "sparse")
    with edgesdk.load(sparse.path, backend="triton", ignore_target=True, threads=1) as model:
        model("The sea", max_tokens=2)
        with pytest.raises(edgesdk.EdgeSDKError, match="load_prompt_cache: the triton backend keeps no host copy "
                                                       "of its KV cache") as caught:
            model.load_prompt_cache(tmp_path / "prompt.cache")
        assert "backend='ort-cpu'" in caught.value.fix
    assert not (tmp_path / "prompt.cache").exists()


def test_a_save_while_a_stream_generates_in_another_thread_writes_its_whole_answer(tiny_bundle, tmp_path,
                                                                                  monkeypatch):
    """The save waits for the answer that holds the board's turn: the file holds that answer's prompt and all its
    tokens, and the answer is not disturbed."""
    no_thermal_zones(tmp_path, monkeypatch)
    path = tmp_path / "prompt.cache"
    model = edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True)
    hook = model._thermal.hook
    stepping, go_on = threading.Event(), threading.Event()
    step = hook.before_step

    def held_step(kind: str) -> float:  # the answer's first step waits until the save has asked for its turn
        if not stepping.is_set():
            stepping.set()
            go_on.wait()
        return step(kind)

    monkeypatch.setattr(hook, "before_step", held_step)
    outcome = {}

    def read() -> None:
        outcome["chunks"] = list(model.create_chat_completion(CHAT, stream=True, max_tokens=12, ignore_eos=True,
                                                              stream_options={"include_usage": True}))

    def save() -> None:
        outcome["written"] = model.save_prompt_cache(path)

    reader, saver = threading.Thread(target=read), threading.Thread(target=save)
    try:
        reader.start()
        assert stepping.wait(60)
        saver.start()
        while saver.is_alive() and model._completer._turn.queued < 2:
            saver.join(0.01)
        go_on.set()
        saver.join(60)
        reader.join(60)
        usage = outcome["chunks"][-1]["usage"]
        assert usage["completion_tokens"] == 12
        assert outcome["written"] == usage["prompt_tokens"] + 12 - 1
        with np.load(path) as data:
            assert data["tokens"].tolist() == model._completer.prompt_cache.tokens
    finally:
        go_on.set()
        model.close()
