"""A run held below its bundle's context by llama.cpp's ``-c N`` (or LLAMA_ARG_CTX_SIZE): a prompt past N was refused
naming N as "the bundle's max_context" with a rebuild for its fix, though the bundle held the prompt already; an
unloaded model of a multi-bundle server described the bundle's context, not the ``-c`` one it loads with; and help
said ``-c`` took 0 or the bundle's context alone. Also: onnxruntime and onnxruntime-gpu installed together (the CPU
one wins on a Jetson) were named by ``edgesdk env`` alone, never by the commands that run a bundle. Real bundles built
by the pipeline, a real ONNX Runtime session, the real CLI and a real server."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from importlib import metadata

import pytest

from edgesdk.bundle import context_fix
from edgesdk.errors import EdgeSDKError, RuntimeBackendError
from edgesdk.runtime.session import context_limits, open_runtime
from tests._utils.serve_command import serve_command
from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")

LONG = "The quick brown fox jumps over the lazy dog. " * 3  # 85 tokens of the tiny tokenizer: past 64, within 256


def flat(text: str) -> str:
    return " ".join(text.split())


# --- a prompt past -c ----------------------------------------------------------------------------------------------


def test_run_names_the_c_context_and_raising_c_as_the_fix(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-t", 1, "--temp", 0, "-p", LONG, "-n", 1, "-c", 64)
    assert result.exit_code == 1, result.output
    said = flat(result.stderr)
    match = re.search(r"the prompt has (\d+) tokens, past this run's context, 64 \(-c\), of the bundle's 256", said)
    assert match, said
    assert f"raise -c to {match[1]} or more, up to the bundle's 256" in said
    assert "the bundle's max_context is 64" not in said
    assert "--max-context" not in said  # the bundle holds the prompt: no rebuild


def test_a_system_message_past_c_names_the_c_context_and_raising_c(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-t", 1, "--temp", 0, "-sys", LONG, "-p", "hi", "-n", 1, "-c", 64)
    assert result.exit_code == 2, result.output
    said = flat(result.stderr)
    assert "and this run's context, 64 (-c), of the bundle's 256: it leaves no room" in said, said
    assert re.search(r"shorten --system, or raise -c to \d+ or more, up to the bundle's 256", said), said
    assert "the bundle's max_context is 64" not in said
    assert "--max-context" not in said  # the bundle holds the system message: no rebuild


def test_run_uncapped_keeps_its_refusal(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-t", 1, "--temp", 0, "-p", LONG * 4, "-n", 1)
    assert result.exit_code == 1, result.output
    said = flat(result.stderr)
    assert re.search(r"the prompt has \d+ tokens; the bundle's max_context is 256", said), said
    assert "raise -c" not in said
    assert "(-c)" not in said


def test_the_backend_names_the_c_context_and_the_bundle_s(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1, context=64)
    try:
        assert runtime.backend.built_context == 256
        with pytest.raises(RuntimeBackendError) as within:
            runtime.backend.prefill(list(range(3, 3 + 80)))
        assert within.value.problem == "sequence of 80 tokens exceeds this run's context, 64 (-c), of the bundle's 256"
        assert "raise -c to 80 or more, up to the bundle's 256" in within.value.fix
        runtime.cap_context(32)  # a second cap: the built context is still the bundle's
        assert runtime.backend.built_context == 256
        with pytest.raises(RuntimeBackendError) as past:
            runtime.backend.prefill(list(range(3, 3 + 300)))
        assert "this run's context, 32 (-c), of the bundle's 256" in past.value.problem
        assert past.value.fix.startswith("shorten the prompt or --max-new-tokens (raising -c up to the bundle's 256 "
                                         "holds fewer than 300 tokens)")
    finally:
        runtime.backend.close()
    whole = open_runtime(tiny_bundle.path, threads=1)
    try:
        assert whole.backend.built_context is None
        with pytest.raises(RuntimeBackendError) as uncapped:
            whole.backend.prefill(list(range(3, 3 + 300)))
        assert uncapped.value.problem == "sequence of 300 tokens exceeds the bundle's max_context 256"
        assert "raise -c" not in uncapped.value.fix
    finally:
        whole.backend.close()


def test_context_fix_without_a_cap_is_as_before():
    for built in (None, 256, 100):  # not above the run's context: no cap
        assert context_fix("shorten the prompt", 256, 2048, 300, built=built) == context_fix(
            "shorten the prompt", 256, 2048, 300)


# --- serve ---------------------------------------------------------------------------------------------------------


def test_an_unloaded_model_is_described_with_the_c_context(tiny_bundle):
    from edgesdk.serve.api import ApiError, CompletionRequest
    from edgesdk.serve.completion import ServeDefaults
    from edgesdk.serve.model_pool import described

    with context_limits({tiny_bundle.path: 64}):
        completer = described(tiny_bundle, ServeDefaults(), None)
    assert completer.runtime.backend.max_context == 64
    with pytest.raises(ApiError) as refused:
        completer.prompt_ids(CompletionRequest(chat=False, prompt=LONG))
    said = flat(refused.value.message)
    assert "maximum context length is 64 tokens" in said
    assert re.search(r"or raise -c to \d+ or more, up to the bundle's 256", said), said
    assert described(tiny_bundle, ServeDefaults(), None).runtime.backend.max_context == 256  # the limits left


def test_a_multi_bundle_server_shows_an_unloaded_model_s_c_context(tiny_bundle, tmp_path):
    second = tmp_path / "second"
    shutil.copytree(tiny_bundle.path, second)
    with serve_command(tiny_bundle.path, tmp_path, str(second), "--alias", f"second={second}", "-c", "64") as url:
        with urllib.request.urlopen(f"{url}/api/tags", timeout=120) as answer:
            names = [entry["name"] for entry in json.load(answer)["models"]]
        request = urllib.request.Request(f"{url}/api/show", json.dumps({"model": names[1]}).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            shown = json.load(answer)
        with urllib.request.urlopen(f"{url}/api/ps", timeout=120) as answer:
            loaded = [entry["name"] for entry in json.load(answer)["models"]]
    assert loaded == [names[0]]  # the second was described, not loaded
    assert shown["model_info"]["llama.context_length"] == 64
    assert re.search(r"num_ctx\s+64\b", shown["parameters"]), shown["parameters"]


def test_help_says_c_takes_a_context_up_to_the_bundle_s():
    for command in ("run", "serve", "embed"):
        result = invoke(command, "--help")
        assert_ok(result)
        said = flat(result.output)
        assert "-c N (--ctx-size) up to" in said, said
        assert "-c 0 or the bundle's context" not in said
        assert "said where it is not the bundle's context" not in said


# --- onnxruntime and onnxruntime-gpu together ----------------------------------------------------------------------


@pytest.fixture
def both_onnxruntimes(tmp_path, monkeypatch):
    """A second ONNX Runtime distribution's metadata on sys.path (the module stays the installed one), as pip leaves
    onnxruntime-gpu beside onnxruntime; and the warnings said once per process, reset for the test."""
    from edgesdk.envinfo import NOT_INSTALLED, package_version
    from edgesdk.runtime import session

    if package_version("onnxruntime-gpu") != NOT_INSTALLED:
        pytest.skip("a real onnxruntime-gpu distribution is installed")
    info = tmp_path / "site" / "onnxruntime_gpu-1.23.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.23.0\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(session, "_SAID_ONCE", set(), raising=False)
    return metadata.version("onnxruntime")


def test_run_says_both_onnxruntimes_are_installed(tiny_bundle, both_onnxruntimes):
    result = invoke("run", tiny_bundle.path, "-t", 1, "--temp", 0, "-p", "hi", "-n", 1)
    assert_ok(result)
    said = flat(result.stderr)
    assert (f"edgesdk: warning: onnxruntime {both_onnxruntimes} and onnxruntime-gpu 1.23.0 are installed together"
            in said), said
    assert "pip uninstall -y onnxruntime onnxruntime-gpu, then install onnxruntime-gpu again" in said
    assert said.count("are installed together") == 1


def test_a_draft_of_the_same_bundle_with_stats_says_both_onnxruntimes_once(tiny_bundle, both_onnxruntimes):
    # two runtimes in one process (the target and its draft), each with --stats' notes: one warning, unnamed
    result = invoke("run", tiny_bundle.path, "-t", 1, "--temp", 0, "-p", "hi", "-n", 1, "--stats",
                    "--draft", tiny_bundle.path)
    assert_ok(result)
    said = flat(result.stderr)
    assert said.count("are installed together") == 1, said
    assert "edgesdk: warning: onnxruntime" in said


def test_verbose_runtimes_say_both_onnxruntimes_once_a_process(tiny_bundle, both_onnxruntimes, capsys):
    for name in ("a", "b"):
        runtime = open_runtime(tiny_bundle.path, threads=1, verbose=True, name=name)
        runtime.backend.close()
        assert any("installed together" in note for note in runtime.notes), runtime.notes
    said = capsys.readouterr().err
    assert said.count("are installed together") == 1, said
    assert "edgesdk: warning: onnxruntime" in said
    assert "edgesdk: a: warning" not in said  # the install, not a bundle: unnamed


def test_the_python_api_keeps_the_warning_in_its_notes(tiny_bundle, both_onnxruntimes, capsys):
    runtime = open_runtime(tiny_bundle.path, threads=1, terms="python")
    runtime.backend.close()
    assert any("onnxruntime-gpu 1.23.0 are installed together" in note for note in runtime.notes), runtime.notes
    assert "installed together" not in capsys.readouterr().err


def test_one_onnxruntime_says_nothing(tiny_bundle):
    from edgesdk.envinfo import NOT_INSTALLED, package_version

    if package_version("onnxruntime-gpu") != NOT_INSTALLED:
        pytest.skip("a real onnxruntime-gpu distribution is installed")
    result = invoke("run", tiny_bundle.path, "-t", 1, "--temp", 0, "-p", "hi", "-n", 1)
    assert_ok(result)
    assert "installed together" not in result.stderr


def test_cap_context_refuses_as_before(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1)
    try:
        with pytest.raises(EdgeSDKError, match="expected a whole number from 1 to the 256 it holds"):
            runtime.cap_context(257)
        assert runtime.backend.built_context is None
    finally:
        runtime.backend.close()
