"""A run held below its bundle's context names what held it. Every refusal past the held context said "this run's
context, 64 (-c), of the bundle's 256" and told its user to "raise -c", also where llama.cpp's LLAMA_ARG_CTX_SIZE
held it (no -c was passed) and where the Python API's ``load(..., n_ctx=64)`` did. Now the cap keeps its source
(Runtime.cap_context's ``source``, the backend's ``context_source``): LLAMA_ARG_CTX_SIZE, or n_ctx, is named, and
is what the fix raises; a plain ``-c 64`` reads as before. Real bundles built by the pipeline, a real ONNX Runtime
session, the real CLI and a real server."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from edgesdk.bundle import CTX_SIZE_SOURCE, capped_context, context_fix
from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.session import context_limits, open_runtime
from tests._utils.serve_command import serve_command
from tests.unit.test_cli import invoke

pytest.importorskip("torch")

LONG = "The quick brown fox jumps over the lazy dog. " * 3  # 85 tokens of the tiny tokenizer: past 64, within 256
ENV = {"LLAMA_ARG_CTX_SIZE": "64"}


def flat(text: str) -> str:
    return " ".join(text.split())


def names_c(text: str) -> bool:
    """Whether ``text`` names the option -c (not --max-context, which holds the same two characters)."""
    return re.search(r"(?<![\w-])-c\b", text) is not None


def _run(bundle, *args, **kwargs):
    return invoke("run", bundle.path, "-t", 1, "--temp", 0, *args, **kwargs)


# --- the words -----------------------------------------------------------------------------------------------------


def test_the_variable_is_llama_cpp_s_name_for_c():
    from edgesdk.cli_llama import CTX_SIZE_ENV

    assert CTX_SIZE_SOURCE == CTX_SIZE_ENV


def test_capped_context_and_its_fix_name_the_source():
    assert capped_context(64, 256) == "this run's context, 64 (-c), of the bundle's 256"  # as before
    assert capped_context(64, 256, "LLAMA_ARG_CTX_SIZE") == \
        "this run's context, 64 (LLAMA_ARG_CTX_SIZE), of the bundle's 256"
    assert capped_context(64, 256, "n_ctx") == "this run's context, 64 (n_ctx), of the bundle's 256"
    assert context_fix("shorten the prompt", 64, 512, 98, built=256) == \
        "shorten the prompt, or raise -c to 98 or more, up to the bundle's 256 (-c 0: all of it)"  # as before
    assert context_fix("shorten the prompt", 64, 512, 98, built=256, source="-c") == \
        "shorten the prompt, or raise -c to 98 or more, up to the bundle's 256 (-c 0: all of it)"
    assert context_fix("shorten the prompt", 64, 512, 98, built=256, source="LLAMA_ARG_CTX_SIZE") == \
        ("shorten the prompt, or raise LLAMA_ARG_CTX_SIZE to 98 or more, up to the bundle's 256 "
         "(LLAMA_ARG_CTX_SIZE=0 or unset: all of it)")
    past = context_fix("shorten the prompt", 64, 512, 300, built=256, source="LLAMA_ARG_CTX_SIZE")
    assert past.startswith("shorten the prompt (raising LLAMA_ARG_CTX_SIZE up to the bundle's 256 holds fewer than "
                           "300 tokens)"), past
    assert not names_c(past), past
    assert "load(..., n_ctx=98)" in context_fix("shorten it", 64, 512, 98, built=256, source="n_ctx")


# --- the command line ----------------------------------------------------------------------------------------------


def test_run_held_by_llama_arg_ctx_size_names_it_and_raises_it(tiny_bundle):
    result = _run(tiny_bundle, "-p", LONG, "-n", 1, env=ENV)
    assert result.exit_code == 1, result.output
    said = flat(result.stderr)
    match = re.search(r"the prompt has (\d+) tokens, past this run's context, 64 \(LLAMA_ARG_CTX_SIZE\), of the "
                      r"bundle's 256", said)
    assert match, said
    assert (f"raise LLAMA_ARG_CTX_SIZE to {match[1]} or more, up to the bundle's 256 (LLAMA_ARG_CTX_SIZE=0 or "
            "unset: all of it)") in said
    assert "(-c)" not in said
    assert "raise -c" not in said


def test_a_system_message_past_llama_arg_ctx_size_names_it(tiny_bundle):
    result = _run(tiny_bundle, "-sys", LONG, "-p", "hi", "-n", 1, env=ENV)
    assert result.exit_code == 2, result.output
    said = flat(result.stderr)
    assert "and this run's context, 64 (LLAMA_ARG_CTX_SIZE), of the bundle's 256: it leaves no room" in said, said
    assert re.search(r"shorten --system, or raise LLAMA_ARG_CTX_SIZE to \d+ or more, up to the bundle's 256", said)
    assert "raise -c" not in said


def test_c_on_the_command_line_is_still_named_c(tiny_bundle):
    for env in ({}, {"LLAMA_ARG_CTX_SIZE": "128"}):  # -c goes over the variable, and is what held the run
        result = _run(tiny_bundle, "-p", LONG, "-n", 1, "-c", 64, env=env)
        assert result.exit_code == 1, result.output
        said = flat(result.stderr)
        match = re.search(r"the prompt has (\d+) tokens, past this run's context, 64 \(-c\), of the bundle's 256", said)
        assert match, said
        assert f"shorten the prompt, or raise -c to {match[1]} or more, up to the bundle's 256 (-c 0: all of it)" \
            in said
        assert "raise LLAMA_ARG_CTX_SIZE" not in said


def test_embed_held_by_llama_arg_ctx_size_raises_it(tiny_bundle):
    result = invoke("embed", tiny_bundle.path, "-t", 1, "-p", LONG, env=ENV)
    assert result.exit_code != 0, result.output
    said = flat(result.stderr)
    assert re.search(r"raise LLAMA_ARG_CTX_SIZE to \d+ or more, up to the bundle's 256", said), said
    assert "raise -c" not in said


def _post_error(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=120)
    return refused.value.code, json.load(refused.value)


def test_a_server_held_by_llama_arg_ctx_size_names_it(tiny_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "64")  # the server's environment, as a systemd unit or Docker sets it
    with serve_command(tiny_bundle.path, tmp_path) as url:
        with urllib.request.urlopen(f"{url}/api/tags", timeout=60) as answer:
            name = json.load(answer)["models"][0]["name"]
        status, error = _post_error(f"{url}/api/generate", {"model": name, "prompt": LONG, "stream": False,
                                                            "truncate": False, "options": {"num_predict": 1}})
    assert status == 400
    said = error["error"]
    assert "within this run's context, 64 (LLAMA_ARG_CTX_SIZE), of the bundle's 256" in said, said
    assert "restart the server with LLAMA_ARG_CTX_SIZE up to the bundle's 256 (LLAMA_ARG_CTX_SIZE=0 or unset: " \
        "all of it)" in said, said
    assert not names_c(said), said


def test_context_limits_keep_their_source(tiny_bundle):
    with context_limits({tiny_bundle.path: 64}, "LLAMA_ARG_CTX_SIZE"):
        runtime = open_runtime(tiny_bundle.path, threads=1)
    try:
        assert runtime.backend.context_source == "LLAMA_ARG_CTX_SIZE"
        with pytest.raises(RuntimeBackendError) as past:
            runtime.backend.prefill(list(range(3, 3 + 80)))
        assert past.value.problem == \
            "sequence of 80 tokens exceeds this run's context, 64 (LLAMA_ARG_CTX_SIZE), of the bundle's 256"
        assert "raise LLAMA_ARG_CTX_SIZE to 80 or more" in past.value.fix
    finally:
        runtime.backend.close()
    plain = open_runtime(tiny_bundle.path, threads=1, context=64)  # open_runtime's context: -c's, as before
    try:
        assert plain.backend.context_source == "-c"
    finally:
        plain.backend.close()


# --- the Python API ------------------------------------------------------------------------------------------------


def test_the_python_api_s_n_ctx_is_named_n_ctx(tiny_bundle):
    import edgesdk

    model = edgesdk.load(tiny_bundle.path, n_ctx=64, threads=1)
    try:
        assert model.runtime.backend.context_source == "n_ctx"
        with pytest.raises(RuntimeBackendError) as past:
            model.runtime.backend.prefill(list(range(3, 3 + 80)))
        assert past.value.problem == "sequence of 80 tokens exceeds this run's context, 64 (n_ctx), of the bundle's 256"
        assert "load the bundle with load(..., n_ctx=80) or more, up to the bundle's 256" in past.value.fix
        assert not names_c(past.value.problem + past.value.fix), past.value
    finally:
        model.close()


def test_a_prompt_cache_past_n_ctx_is_refused_naming_n_ctx(tiny_bundle, tmp_path):
    import edgesdk

    whole = edgesdk.load(tiny_bundle.path, threads=1)
    try:
        whole.create_completion(LONG, max_tokens=1, temperature=0)
        assert whole.save_prompt_cache(tmp_path / "long.cache") > 64
    finally:
        whole.close()
    held = edgesdk.load(tiny_bundle.path, n_ctx=64, threads=1)
    try:
        tokens, refused = held.load_prompt_cache(tmp_path / "long.cache")
    finally:
        held.close()
    assert tokens == 0
    assert "more than this run's context, 64 (n_ctx), of the bundle's 256; raise n_ctx to" in refused, refused
    assert not names_c(refused), refused
