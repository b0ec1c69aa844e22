"""Serve metrics, telemetry and the status line: what a run does when its telemetry file stops taking records."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgesdk.profile import get_profile
from edgesdk.serve.api import parse_chat_request
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.thermal.telemetry import load
from edgesdk.thermal.watch import open_session

resource = pytest.importorskip("resource")

# A process whose files may not grow past LIMIT bytes (RLIMIT_FSIZE, as `ulimit -f`, with SIGXFSZ ignored): a write
# past it fails with EFBIG, as a full disk fails one with ENOSPC. stdout and stderr are pipes, which it leaves alone.
LIMITED = """
import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def test_a_run_whose_telemetry_disk_fills_up_finishes_its_answer_and_warns_once(tiny_bundle, tmp_path):
    """``edgesdk run --simulate-thermal --telemetry FILE`` on a disk that filled up during the run: the step record
    the file refused raised TelemetryWriteError out of the thermal hook, and the run stopped mid-answer with exit 1.
    The records are a side line of the run, not what it is for: the answer is finished and the guard kept, the
    trouble told once with its fix, and the file keeps its whole records."""
    path = tmp_path / "run.jsonl"
    env = {**os.environ, "EDGESDK_HUGE_PAGES": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-c", LIMITED, "3000", "edgesdk", "run", str(tiny_bundle.path),
                             "--threads", "1", "-p", "hi", "-n", "40", "--ignore-eos", "--simulate-thermal",
                             "--telemetry", str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    meta, steps = load(path)
    assert meta["mode"] == "simulated"
    assert 0 < len(steps) < 40
    assert result.stderr.count("warning: telemetry file") == 1, result.stderr
    assert (f"warning: telemetry file {path}: cannot write step record {len(steps) + 1} (File too large); it keeps "
            f"the meta record and the {len(steps)} step records before it") in result.stderr
    assert "the run goes on without them (fix: free space on that disk" in result.stderr
    assert "error:" not in result.stderr


def test_a_server_whose_telemetry_file_is_gone_answers_the_request(runtime, tmp_path):
    """``edgesdk serve --telemetry FILE`` where the file stops taking records mid-answer (here a FIFO whose reader
    left: EPIPE, as a full disk's ENOSPC): the request generating failed with the TelemetryWriteError; now it is
    answered, and the warning goes to ``warn`` (serve's stderr) once."""
    fifo = tmp_path / "telemetry.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    warnings: list[str] = []
    thermal = open_session(get_profile("rpi5"), guard=True, simulate=True, status=False, telemetry_path=str(fifo),
                           warn=warnings.append)
    try:
        os.read(reader, 65536)  # the meta record
        os.close(reader)  # the reader leaves: the next record's write fails
        completer = Completer(runtime, ServeDefaults(max_tokens=6), hook=thermal.hook)
        request = parse_chat_request({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6})
        answer = completer.complete(request)
        again = completer.complete(request)
    finally:
        thermal.close()
    assert answer.completion_tokens >= 1
    assert again.completion_tokens >= 1
    assert answer.finish_reason in ("stop", "length")
    assert again.finish_reason in ("stop", "length")
    assert completer.metrics.finished["error"] == 0
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"telemetry file {fifo}: cannot write step record 1 (Broken pipe)")
    assert "the run goes on without them (fix: " in warnings[0]


def refusing_stderr():
    """A stderr that refuses every write: a pipe whose reader left (EPIPE, as a full disk under ``2> log`` fails
    a write with ENOSPC)."""
    read, write = os.pipe()
    os.close(read)
    return os.fdopen(write, "w")


def test_a_status_line_stderr_refuses_turns_off_instead_of_ending_the_run():
    """The status line's write to a stderr that refuses it raised out of the thermal hook's step (OSError), ending a
    run whose answer stdout was taking; now the status line is off from there on, and every later call is quiet."""
    import io

    from edgesdk.thermal.telemetry import StatusLine

    stderr = refusing_stderr()
    try:
        status = StatusLine(stream=stderr, stdout=io.StringIO())
        assert status.mode == "log"
        status.update("30.0 °C  normal", level="normal")  # raised BrokenPipeError
        assert status.mode == "off"
        status.warn("the sensor failed")
        status.update("31.0 °C  hot", level="hot", force=True)
        status.between_answers()
        status.close()
    finally:
        try:
            stderr.close()
        except OSError:
            pass


def test_a_run_with_stderr_closed_answers(tiny_bundle):
    """``edgesdk run --simulate-thermal -p hi 2>&-`` (a daemon's closed stderr): sys.stderr is None, and the status
    line's first write ended the run with an AttributeError ('NoneType' object has no attribute 'write') before the
    answer's first token, exit 1 and no output; without the thermal options the same run answered."""
    env = {**os.environ, "EDGESDK_HUGE_PAGES": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-m", "edgesdk", "run", str(tiny_bundle.path), "--threads", "1",
                             "-p", "hi", "-n", "4", "--ignore-eos", "--simulate-thermal"],
                            stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2), env=env, text=True, timeout=300)
    assert result.returncode == 0
    assert len(result.stdout) > 0


def test_a_warning_the_callers_stderr_refuses_does_not_end_the_run():
    """``--telemetry`` without ``--watch-thermal`` warns through the CLI's own echo; with stderr on the same full disk
    (``2> run.log``) that echo raised, ending the run the warning was about."""
    from edgesdk.thermal import watch

    def full_disk(message):
        raise OSError(28, "No space left on device")

    watch._late_warner(None, full_disk)("telemetry cannot be written")
