"""llama.cpp's ``-c N`` / ``--ctx-size N`` (and LLAMA_ARG_CTX_SIZE, its environment variable) below a bundle's context
is the run's context, as llama.cpp makes it (a Pi user's ``-c 512`` caps the KV cache): ``run``, ``serve`` and
``embed`` refused every size but 0 and the bundle's own. Now N up to the bundle's context is what every bound reads (a
prompt past it refused, a chat's oldest exchanges left out at it, serve's /props ``n_ctx``, Ollama's ``num_ctx``
default), the fused backend's KV buffers never grow past it, and only a size past the bundle's is refused, with the
rebuild. Real bundles built by the pipeline, the real CLI and a real server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.session import context_limits, open_runtime
from tests._utils.serve_command import serve_command
from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")

LONG = "The quick brown fox jumps over the lazy dog. " * 3  # 85 tokens of the tiny tokenizer: past 64, within 256


def flat(text: str) -> str:
    return " ".join(text.split())


def _run(bundle, *args, **kwargs):
    return invoke("run", bundle.path, "-t", 1, "--temp", 0, *args, **kwargs)


@pytest.fixture(scope="module")
def long_bundle(tiny_model_dir, tmp_path_factory):
    """A tiny bundle whose context (512) is past the fused backend's first KV buffers (256 tokens), so that a capped
    context shows in how far they grow."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    return build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path_factory.mktemp("ctx") / "b512",
                             export=ExportConfig(max_context=512), progress=False))


# --- run -----------------------------------------------------------------------------------------------------------


def test_run_takes_a_smaller_ctx_size_as_the_context_a_prompt_is_held_to(tiny_bundle):
    assert_ok(_run(tiny_bundle, "-p", LONG, "-n", 1))  # fits the bundle's 256
    for flag in ("-c", "--ctx-size"):
        result = _run(tiny_bundle, "-p", LONG, "-n", 1, flag, 64)
        assert result.exit_code == 1, result.output
        assert "past this run's context, 64 (-c), of the bundle's 256" in flat(result.stderr)  # at -c, not at 256
    short = _run(tiny_bundle, "-p", "hi", "-n", 200, "--ignore-eos", "--stats", "-c", 48)
    assert_ok(short)
    assert "stop: max_context" in short.stderr  # the answer stopped where the 48 were full


def test_run_takes_llama_arg_ctx_size_as_c_and_says_one_it_cannot_hold(tiny_bundle):
    held = _run(tiny_bundle, "-p", LONG, "-n", 1, env={"LLAMA_ARG_CTX_SIZE": "64"})
    assert held.exit_code == 1, held.output
    assert "this run's context, 64 (LLAMA_ARG_CTX_SIZE), of the bundle's 256" in flat(held.stderr)
    assert "is not read" not in held.stderr  # taken, as llama-cli takes it
    over = _run(tiny_bundle, "-p", "hi", "-n", 1, env={"LLAMA_ARG_CTX_SIZE": "4096"})
    assert_ok(over)
    assert "LLAMA_ARG_CTX_SIZE='4096' is not read: the context of" in flat(over.stderr)
    assert "set LLAMA_ARG_CTX_SIZE to at most 256" in flat(over.stderr)
    command_line = _run(tiny_bundle, "-p", LONG, "-n", 1, "-c", 0, env={"LLAMA_ARG_CTX_SIZE": "64"})
    assert_ok(command_line)  # -c 0 goes over it: the bundle's 256
    assert "LLAMA_ARG_CTX_SIZE is set, but -c on the command line goes over it" in command_line.stderr


def test_run_refuses_a_ctx_size_past_the_bundle_s_with_the_rebuild(tiny_bundle):
    result = _run(tiny_bundle, "-p", "hi", "-n", 1, "-c", 300)
    assert result.exit_code == 2
    said = flat(result.stderr)
    assert "'-c' (llama.cpp's --ctx-size): is 300, and the context of" in said
    assert "is 256 tokens, fixed when it was built" in said
    assert "pass -c 256 or less (0: the bundle's)" in said
    assert "'edgesdk build --max-context 300'" in said


def test_a_chat_leaves_out_its_oldest_exchanges_at_the_ctx_size(tiny_bundle):
    lines = "".join(f"{word} {word} {word} {word} {word}\n" for word in ("alpha", "bravo", "charlie", "delta"))
    result = _run(tiny_bundle, "--history", "-n", 4, "-c", 64, input=lines)
    assert_ok(result)
    assert "the conversation outgrew the context (64 tokens): left out its 1 oldest exchange" in flat(result.stderr)
    assert "outgrew" not in _run(tiny_bundle, "--history", "-n", 4, input=lines).stderr  # 256 holds them all


# --- embed ---------------------------------------------------------------------------------------------------------


def test_embed_holds_its_inputs_to_the_ctx_size(tiny_bundle):
    assert_ok(invoke("embed", tiny_bundle.path, "-p", LONG, "-t", 1))
    result = invoke("embed", tiny_bundle.path, "-p", LONG, "-t", 1, "-c", 32)
    assert result.exit_code != 0
    assert "maximum context length is 32 tokens" in flat(result.stderr), result.stderr
    cut = invoke("embed", tiny_bundle.path, "-p", LONG, "-t", 1, "-c", 32, "--truncate")
    assert_ok(cut)
    assert "its first 32 were embedded" in flat(cut.stderr)


# --- serve ---------------------------------------------------------------------------------------------------------


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=120) as answer:
        return json.load(answer)


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.load(answer)


def _post_error(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=120)
    return refused.value.code, json.load(refused.value)


def test_serve_reports_and_holds_to_the_ctx_size(tiny_bundle, tmp_path):
    with serve_command(tiny_bundle.path, tmp_path, "-c", "64") as url:
        props = _get(f"{url}/props")
        assert props["default_generation_settings"]["n_ctx"] == 64
        meta = _get(f"{url}/v1/models")["data"][0]["meta"]
        assert meta["n_ctx_train"] == 512  # the model's trained context stays its own
        name = _get(f"{url}/api/tags")["models"][0]["name"]
        answer = _post(f"{url}/api/generate", {"model": name, "prompt": LONG, "stream": False,
                                               "options": {"num_predict": 1}})
        assert 32 < answer["prompt_eval_count"] <= 63  # Ollama's num_ctx default, the 64, cuts the prompt to fit
        status, error = _post_error(f"{url}/api/generate", {"model": name, "prompt": LONG, "stream": False,
                                                            "truncate": False, "options": {"num_predict": 1}})
        assert status == 400
        assert "within this run's context, 64 (-c), of the bundle's 256" in error["error"], error
        status, error = _post_error(f"{url}/completion", {"prompt": LONG, "n_predict": 1})
        assert status == 400
        assert "maximum context length is 64 tokens" in error["error"]["message"]


def test_serve_refuses_a_ctx_size_past_a_bundle_s(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "-c", 512, "--host", "")
    assert result.exit_code == 2
    assert "is 512, and the context of" in flat(result.stderr)
    env = invoke("serve", tiny_bundle.path, "--host", "", env={"LLAMA_ARG_CTX_SIZE": "512"})
    assert env.exit_code == 2
    assert "set LLAMA_ARG_CTX_SIZE to at most 256" in flat(env.stderr)


# --- the runtime ---------------------------------------------------------------------------------------------------


def test_the_fused_kv_buffers_grow_no_further_than_the_context(long_bundle):
    prompt = list(range(3, 3 + 290))  # past the first 256-token buffers
    capped = open_runtime(long_bundle.path, threads=1, context=300)
    whole = open_runtime(long_bundle.path, threads=1)
    try:
        assert capped.backend.max_context == 300
        assert whole.backend.max_context == 512
        assert "context 300 tokens (the bundle's 512)" in capped.notes
        for runtime in (capped, whole):
            runtime.backend.prefill(prompt)
        assert [buffer.shape[2] for buffer in capped.backend._buffers] == [300] * len(capped.backend._buffers)
        assert whole.backend._buffers[0].shape[2] == 512  # doubled: the memory -c saves
        with pytest.raises(EdgeSDKError, match=r"exceeds this run's context, 300 \(-c\), of the bundle's 512"):
            capped.backend.prefill(list(range(3, 3 + 11)))
    finally:
        capped.backend.close()
        whole.backend.close()


def test_cap_context_only_lowers(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1)
    try:
        for size in (0, 257, -5, 2.5, True):
            with pytest.raises(EdgeSDKError, match="expected a whole number from 1 to the 256 it holds"):
                runtime.cap_context(size)
        runtime.cap_context(100)
        with pytest.raises(EdgeSDKError, match="held to 100 of the bundle.s 256, and a runtime.s context can only be lowered"):
            runtime.cap_context(200)  # a captured CUDA graph, a sized profile: never raised again
        assert runtime.backend.max_context == 100
    finally:
        runtime.backend.close()


def test_context_limits_hold_while_they_run_and_go_after(tiny_bundle):
    with context_limits({tiny_bundle.path: 80}):
        held = open_runtime(tiny_bundle.path, threads=1)
        held.backend.close()
        assert held.backend.max_context == 80
    after = open_runtime(tiny_bundle.path, threads=1)
    after.backend.close()
    assert after.backend.max_context == 256
