"""run's -if with stdin closed through the chat template, -c checked and said before the bundle loads (run and
embed), --verbose-prompt after /clear, a host module that is installed but does not match, and a capped runtime
asked for more of the bundle's own context."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from edgesdk.errors import EdgeSDKError
from tests.unit.test_cli import assert_ok, invoke

ENV = {**os.environ, "EDGESDK_HUGE_PAGES": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def _edgesdk(*args: str) -> subprocess.CompletedProcess:
    """The command in a process started with stdin closed (``<&-``: ``sys.stdin`` is None there)."""
    return subprocess.run([sys.executable, "-m", "edgesdk", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, preexec_fn=lambda: os.close(0), env=ENV,
                          text=True, timeout=300)


def test_if_through_the_chat_template_answers_the_prompt_without_stdin(tiny_bundle):
    """-if -p through the chat template is -cnv -p: its prompt is answered first, so a closed stdin ends the chat
    after it, as it does -cnv's; it was refused as -if fed as it is is."""
    result = _edgesdk("run", str(tiny_bundle.path), "--threads", "1", "-if", "-p", "hi", "-n", "2")
    assert result.returncode == 0, result.stderr
    assert "it was closed" not in result.stderr


def test_if_fed_as_it_is_without_stdin_is_refused(tiny_bundle):
    result = _edgesdk("run", str(tiny_bundle.path), "--threads", "1", "--raw", "-if", "-p", "hi", "-n", "2")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "reads the first line from stdin after it, and this process has none (it was closed)" in result.stderr


def test_if_without_a_chat_template_and_stdin_is_refused_once_the_bundle_is_known(tiny_bundle, monkeypatch):
    """A bundle without a chat template feeds -if's prompt as it is: known after the load, refused there."""
    from edgesdk.cli_run import _check_user_first, _without_closed_stdin
    from edgesdk.runtime.session import open_runtime

    settings = _settings(user_first=True, raw=False, go_on=True, prompt="hi", prompt_option="--prompt")
    monkeypatch.setattr(sys, "stdin", None)
    settings = _without_closed_stdin(settings)  # the template is not known yet: not refused here
    runtime = open_runtime(tiny_bundle.path, threads=1)
    _check_user_first(settings, runtime.tokenizer)  # with the chat template: answered first, not refused
    runtime.tokenizer.template_source = None
    with pytest.raises(EdgeSDKError, match=r"-if with --prompt fed as it is reads the first line from stdin"):
        _check_user_first(settings, runtime.tokenizer)


def _settings(**changes):
    import dataclasses

    from edgesdk.cli_run import RunSettings
    from edgesdk.runtime.generate import SamplingConfig

    fields = {field.name for field in dataclasses.fields(RunSettings)
              if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING}
    base = dict.fromkeys(fields)
    base.update(sampling=SamplingConfig(), history=None, stats=False)
    base.update(changes)
    return RunSettings(**base)


def _broken_copy(tiny_bundle, tmp_path):
    """The bundle with its weights cut short: a load fails on their hash, so a refusal that comes first comes
    before the load."""
    copy = tmp_path / "broken"
    shutil.copytree(tiny_bundle.path, copy)
    data = next(path for path in copy.iterdir() if path.name.startswith("model.onnx"))
    data.write_bytes(data.read_bytes()[:-8])
    return copy


@pytest.mark.parametrize("command", ["run", "embed"])
def test_an_oversized_c_is_refused_before_the_bundle_loads(tiny_bundle, tmp_path, command):
    result = invoke(command, _broken_copy(tiny_bundle, tmp_path), "-c", "600", "--threads", 1, "-p", "hi")
    assert result.exit_code == 2, result.output
    assert "is 600, and the context of" in result.stderr


def test_run_stats_say_the_c_context_beside_the_bundles(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-c", "64", "--threads", 1, "-p", "hi", "-n", 1, "--stats")
    assert_ok(result)
    assert "edgesdk: context 64 tokens (the bundle's 256)" in result.stderr


def test_verbose_prompt_after_clear_counts_the_next_turn_whole(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "--threads", 1, "-cnv", "-sys", "be brief", "-n", 2,
                    "--verbose-prompt", input="hi\n/clear\nhi\n")
    assert_ok(result)
    after = result.stderr.split("conversation cleared", 1)[1]
    assert "number of tokens in prompt" in after
    assert "this turn's" not in after
    first = result.stderr.split("number of tokens in prompt = ", 1)[1].split()[0]
    assert after.split("number of tokens in prompt = ", 1)[1].split()[0] == first


def test_a_host_module_that_is_there_but_does_not_match_is_not_called_missing():
    pytest.importorskip("onnx")
    from edgesdk.cli_build import host_modules

    with pytest.raises(EdgeSDKError) as info:
        with host_modules("'edgesdk build'"):
            from onnx import no_such_name  # noqa: F401
    message = str(info.value)
    assert "does not have" not in message
    assert "does not match" in message
    assert "no_such_name" in message
    assert "pip install --upgrade 'onnx" in info.value.fix


def test_a_capped_runtime_asked_for_more_of_the_bundles_context_is_told_to_open_it_again(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1, context=100)
    with pytest.raises(EdgeSDKError) as info:
        runtime.cap_context(200)
    assert "can only be lowered" in str(info.value)
    assert "open the bundle again" in info.value.fix
    assert "rebuild" not in info.value.fix
    with pytest.raises(EdgeSDKError) as info:
        runtime.cap_context(300)
    assert "rebuild it with 'edgesdk build --max-context N'" in info.value.fix
