"""``edgesdk thermal plan``: what a Ctrl-C leaves behind, and the plan's answers at the edges."""

from __future__ import annotations

import _thread
import json
import os
import signal
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.profile import get_profile
from edgesdk.thermal.plan import PlanInterrupted, simulate


def open_paths() -> set[str]:
    """The files this process holds open."""
    paths = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return paths


class CtrlC:
    """Ctrl-C (KeyboardInterrupt in the main thread) once ``path`` holds more than ``size`` bytes.

    ``sent`` says the interrupt was sent. Python drops a KeyboardInterrupt raised inside a gc callback ("Exception
    ignored in ... gc_callback": hypothesis installs one in any process whose tests imported it), so a run may go
    on to its end after it was sent; the tests then run again (:data:`TRIES`)."""

    def __init__(self, path: Path, size: int = 20_000):
        self.path, self.size = path, size
        self.sent = False
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self.stopped.is_set():
            if self.path.exists() and self.path.stat().st_size > self.size:
                self.sent = True
                _thread.interrupt_main()
                return
            self.stopped.wait(0.01)

    def __enter__(self) -> CtrlC:
        # interrupt_main does nothing where SIGINT is not Python's own handler (an earlier test in the process may
        # have left it ignored), so the test puts Python's default back for its duration
        self.previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(timeout=30)
        signal.signal(signal.SIGINT, self.previous)


TRIES = 3  # runs of a Ctrl-C test whose interrupt Python dropped (see CtrlC)


def test_ctrl_c_mid_simulation_closes_the_telemetry_file_at_once(tmp_path):
    """simulate() closed its telemetry file only on the way out of a finished run: a KeyboardInterrupt left
    it open for as long as the traceback lived (an interactive session, a caller that catches it)."""
    for attempt in range(TRIES):
        path = tmp_path / f"try{attempt}" / "run.jsonl"
        path.parent.mkdir()
        try:
            with CtrlC(path) as ctrl_c:
                simulate(get_profile("rpi5"), 30, 25, True, 35.0, telemetry_path=str(path))
        except KeyboardInterrupt as interrupted:
            caught = interrupted
            break
        assert ctrl_c.sent, "the run ended before its telemetry reached the size that sends the Ctrl-C"
    else:
        pytest.fail(f"the Ctrl-C was dropped in each of {TRIES} runs")
    assert isinstance(caught, PlanInterrupted)
    assert caught.files == (str(path),)
    assert str(path) not in open_paths()
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_ctrl_c_mid_plan_closes_the_telemetry_file_and_says_what_it_holds(tmp_path):
    """A KeyboardInterrupt in a plan left its telemetry file open (closed only when the process ended) and
    click said only "Aborted!". The file is now closed at once, every line in it a whole record, and the
    plan names it."""
    for attempt in range(TRIES):
        directory = tmp_path / f"try{attempt}"
        guarded = directory / "rpi5-25C-guarded.jsonl"
        with CtrlC(guarded) as ctrl_c:
            result = CliRunner().invoke(main, ["thermal", "plan", "--target", "rpi5", "--decode-tok-s", "35",
                                               "--ambient", "25", "--telemetry-dir", str(directory)])
        if result.exit_code != 0:
            break
        assert ctrl_c.sent, "the plan ended before its telemetry reached the size that sends the Ctrl-C"
    assert result.exit_code == 130, result.output  # as a shell reports SIGINT (edgesdk/cli.py _Group)
    assert "edgesdk thermal: stopped (Ctrl-C)" in result.stderr
    assert f"edgesdk thermal plan: stopped; {guarded} is closed with every record written before the stop" \
        in result.stderr
    assert str(guarded) not in open_paths()
    lines = Path(guarded).read_text().splitlines()
    assert len(lines) > 10
    records = [json.loads(line) for line in lines]  # every line whole
    assert records[0]["type"] == "meta"
    assert {r["type"] for r in records[1:]} == {"step"}


def test_a_plan_shorter_than_the_first_prefill_says_why_it_has_no_figures():
    """--minutes 0.001 (0.06 s, less than one 128-token prefill) printed 0.00 tok/s and dashes for both runs
    with no word why: it read as a board that makes no tokens. A note now says no step was timed."""
    result = CliRunner().invoke(main, ["thermal", "plan", "--target", "rpi5", "--decode-tok-s", "35",
                                       "--minutes", "0.001", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["unguarded"]["tokens"] == 0
    assert plan["notes"] == [
        "the plan's 0.06 simulated s end before the first request's prefill (128 tokens, 0.914 s at full clock) "
        "finished: no step was timed; pass a longer --minutes (e.g. --minutes 30: the board settles within minutes)"]


def test_a_plan_long_enough_for_one_request_has_no_such_note():
    result = CliRunner().invoke(main, ["thermal", "plan", "--target", "rpi5", "--decode-tok-s", "35",
                                       "--minutes", "0.5", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["notes"] == []
