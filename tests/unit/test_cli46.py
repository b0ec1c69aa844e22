"""The command line's shared plumbing: Ctrl-C's exit status, numeric options that must be finite."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from tests._utils.signals import default_signals


def test_ctrl_c_in_a_command_exits_130_without_click_aborted(tmp_path):
    """Ctrl-C in a command that leaves the KeyboardInterrupt to the CLI (here a long ``thermal plan``) ended in
    click's "Aborted!" and exit 1, which a script cannot tell from a failure; a shell reports SIGINT as 130, and
    llama.cpp's tools exit 130 on it (tools/main/main.cpp ``sigint_handler``)."""
    for attempt in range(3):  # a plan that ended before the signal could be sent (a starved test) is run again
        telemetry = tmp_path / f"telemetry dir {attempt}"
        process = subprocess.Popen(
            [sys.executable, "-m", "edgesdk.cli", "thermal", "plan", "--target", "rpi5", "--decode-tok-s", "20",
             "--minutes", "230", "--telemetry-dir", str(telemetry)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=default_signals)  # a suite started in the background passes SIGINT on ignored
        guarded = telemetry / "rpi5-25C-guarded.jsonl"
        began = time.monotonic()
        try:
            while not (guarded.is_file() and guarded.stat().st_size > 0):  # the plan is under way
                assert process.poll() is None, process.communicate()
                assert time.monotonic() - began < 120
                time.sleep(0.05)
            signalled = process.poll() is None
            if signalled:
                process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        if signalled:
            break
    assert signalled, "the plan ended before the signal could be sent, three times"
    assert process.returncode == 130, stderr
    assert "Aborted!" not in stderr
    assert "Traceback" not in stderr
    assert "edgesdk thermal: stopped (Ctrl-C)" in stderr
    assert "is closed with every record written before the stop" in stderr  # the plan's own word still comes


@pytest.mark.parametrize("value", ["nan", "inf", "1e9"])
def test_deploy_smoke_timeout_must_be_finite_and_at_most_a_week(tmp_path, value):
    """click's FloatRange(min=1) let nan and inf through (and any huge number): the bundle was copied, and then
    subprocess's timeout (or the board-side deadline's round()) ended the deploy in a ValueError / OverflowError
    traceback."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    result = CliRunner().invoke(main, ["deploy", str(bundle), "--to", str(tmp_path / "to"), "--smoke-timeout", value])
    assert result.exit_code == 2, result.output
    assert f"'--smoke-timeout': {value} is out of range: expected seconds the smoke test may take, a finite " \
           "number" in result.output
    assert "(e.g. --smoke-timeout 900)" in result.output
    assert not (tmp_path / "to").exists()


def test_deploy_smoke_timeout_of_a_week_is_taken(tmp_path):
    result = CliRunner().invoke(main, ["deploy", str(tmp_path / "missing"), "--to", str(tmp_path / "to"),
                                       "--smoke-timeout", str(7 * 24 * 3600)])
    assert result.exit_code == 5, result.output  # past the option: the missing bundle is the error
    assert "--smoke-timeout" not in result.output


@pytest.mark.parametrize("command", [["run", "--prompt", "hi"], ["serve"]])
def test_draft_p_min_nan_is_refused_by_the_option(tmp_path, command):
    """click's FloatRange(0, 1) passes nan (every comparison with it is false); DraftConfig then refused it with a
    bare ValueError traceback after the bundles had loaded."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    result = CliRunner().invoke(main, [command[0], str(bundle), *command[1:], "--draft", str(bundle),
                                       "--draft-p-min", "nan"])
    assert result.exit_code == 2, result.output
    assert "'--draft-p-min': nan is out of range: expected a draft token's probability, a finite number" \
           in result.output


def test_deploy_names_options_that_status_and_a_single_board_do_not_use(tmp_path):
    """--jobs and --fail-fast beside one board, and --keep / --smoke-timeout / --no-install beside --status, were
    taken and did nothing without a word (deploy refuses --service-host without --service, run names an unused
    --top-p)."""
    result = CliRunner().invoke(main, ["deploy", "--status", "--to", str(tmp_path / "root"), "--jobs", "3",
                                       "--fail-fast", "--keep", "2", "--smoke-timeout", "30", "--no-install"])
    for flag in ("--jobs", "--fail-fast"):
        assert f"edgesdk deploy: {flag} is not used: it works with several boards (--host repeated, or --hosts " \
               "FILE)" in result.stderr
    for flag in ("--keep", "--smoke-timeout", "--no-install"):
        assert f"edgesdk deploy: {flag} is not used: it works with a deploy of a BUNDLE, not --status" \
               in result.stderr
    rollback = CliRunner().invoke(main, ["deploy", "--rollback", "--to", str(tmp_path / "root"), "--keep", "2",
                                         "--smoke-timeout", "30"])
    assert "edgesdk deploy: --keep is not used: it works with a deploy of a BUNDLE, not --rollback" in rollback.stderr
    assert "--smoke-timeout is not used" not in rollback.stderr  # a rollback smoke-tests the release it goes to


def test_deploy_of_a_bundle_names_no_option_unused(tmp_path):
    result = CliRunner().invoke(main, ["deploy", str(tmp_path / "missing"), "--to", str(tmp_path / "root"),
                                       "--keep", "2", "--smoke-timeout", "30", "--no-install"])
    assert result.exit_code == 5, result.output
    assert "is not used" not in result.stderr


def test_engine_build_help_names_the_variable_that_finds_an_engine_built_elsewhere():
    """An engine built with --out DIR outside <deploy root>/engines and the cache is found by run and serve only
    through $EDGESDK_ENGINE_DIR (edgesdk/runtime/tensorrt_engine.py find_engine), which no help or README named."""
    result = CliRunner().invoke(main, ["engine", "build", "--help"], terminal_width=400)
    assert result.exit_code == 0
    assert "one elsewhere they use only when $EDGESDK_ENGINE_DIR names it" in result.output


def test_export_prints_a_llama_cli_command_that_a_shell_runs_for_a_path_with_spaces(tiny_bundle, tmp_path):
    """``edgesdk export`` ended with 'llama-cli -m PATH' unquoted: for a path with a space the shell split it
    and llama-cli was handed the wrong file (build's own 'next:' line quotes its path)."""
    pytest.importorskip("gguf")
    output = tmp_path / "out dir" / "my model.gguf"
    output.parent.mkdir()
    result = CliRunner().invoke(main, ["export", str(tiny_bundle.path), str(output), "--no-verify"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if line.startswith("run it with llama.cpp: "))
    assert shlex.split(line.removeprefix("run it with llama.cpp: ")) == ["llama-cli", "-m", str(output)]


def test_the_iconv_fix_for_a_latin1_file_is_a_command_a_shell_runs_for_a_path_with_spaces(tmp_path):
    """read_utf8's fix 'iconv -f latin1 -t utf-8 PATH > PATH.utf8' left the path unquoted: pasted for a file whose
    name holds a space, iconv read the wrong files and the shell wrote the output elsewhere."""
    profile = tmp_path / "my board.yaml"
    profile.write_bytes("description: caf\u00e9\n".encode("latin-1"))
    result = CliRunner().invoke(main, ["targets", "show", str(profile)])
    assert result.exit_code == 2, result.output
    fix = next(line for line in result.stderr.splitlines() if line.startswith("  fix: convert it first, e.g. "))
    command = shlex.split(fix.removeprefix("  fix: convert it first, e.g. "))
    assert command == ["iconv", "-f", "latin1", "-t", "utf-8", str(profile), ">", f"{profile}.utf8"]
