"""An interactive `run` whose answer meets a failure on the way (its telemetry file refused) goes on to the next
prompt: the board gets its clock back there, as after an answer that ends normally or with Ctrl-C (a capped clock
left on an idle prompt slows everything else on the board for as long as the session stays open)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_thermal_cli import board_env

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a pseudo-terminal and RLIMIT_FSIZE (Linux)")


def _meta_line_bytes(bundle: Path, env: dict, tmp_path: Path) -> int:
    """The size of the telemetry file's first record (its meta record) for this run's flags."""
    probe = tmp_path / "probe.jsonl"
    subprocess.run([sys.executable, "-m", "edgesdk", "run", str(bundle), "--prompt", "hi", "-n", "1", "--raw",
                    "--watch-thermal", "--clock-cap", "--thermal-target", "rpi5", "--telemetry", str(probe)],
                   env={**os.environ, **env}, capture_output=True, check=True, timeout=300)
    return len(probe.read_bytes().splitlines(keepends=True)[0])


def test_an_answer_whose_telemetry_fails_gives_the_clock_back_at_the_prompt(tiny_bundle, tmp_path):
    """A Pi 5 at 74 °C caps the clock while it answers; the first step record cannot be written (the file-size
    limit lets only the meta record in), so the run warns once and answers without records (it ended the answer in
    an error before). At the prompt after it the 2.4 GHz ceiling is back while the session is still open."""
    from tests._utils.terminal import TerminalSession

    bundle = Path(shutil.copytree(tiny_bundle.path, tmp_path / "bundle"))
    env, policy = board_env(tmp_path, 74000)
    limit = _meta_line_bytes(bundle, env, tmp_path) + 16  # the meta record and no step record

    def limited() -> None:
        import resource
        import signal

        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    argv = [sys.executable, "-m", "edgesdk", "run", str(bundle), "-n", "8", "--raw", "--watch-thermal",
            "--clock-cap", "--thermal-target", "rpi5", "--telemetry", str(tmp_path / "t.jsonl")]
    with TerminalSession(argv, {**os.environ, **env, "PYTHONDONTWRITEBYTECODE": "1"}, limited) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"hello\n")
        terminal.read_until(lambda: b"telemetry" in terminal.seen.lower() and terminal.seen.rstrip().endswith(b">"))
        assert "error:" not in terminal.text, terminal.text  # the answer is not given up for its records
        assert "telemetry" in terminal.text.lower(), terminal.text
        assert terminal.process.poll() is None, terminal.text  # the session goes on
        assert (policy / "scaling_max_freq").read_text().strip() == "2400000", terminal.text  # not 1500000
        terminal.type(b"\x04")  # Ctrl-D at the prompt
        terminal.process.wait(timeout=60)
        assert terminal.process.returncode == 0, terminal.text
