"""A child process that pauses itself (SIGSTOP) when it is about to write a given file, as a PEP 578 audit hook sees
it, so that a test can look at what it wrote so far and kill it there (the killed-build tests: test_build_kill37,
test_resume59). :func:`pause_at` runs in the child, before the work; the others in the test."""

from __future__ import annotations

import os
import re
import signal
import sys


def pause_at(pattern: str, count: int = 1, events: tuple[str, ...] = ("open", "os.rename", "os.mkdir")) -> None:
    """Pause this process (SIGSTOP) at the ``count``-th of ``events`` whose "event path" (e.g.
    "open /tmp/b.build/state.json.tmp") matches the regular expression ``pattern``; the event fires before the call
    does its work."""
    compiled, seen = re.compile(pattern), [0]

    def hook(event, args):
        if event not in events or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        if compiled.search(f"{event} {os.fsdecode(args[0])}"):
            seen[0] += 1
            if seen[0] == count:
                os.kill(os.getpid(), signal.SIGSTOP)

    sys.addaudithook(hook)


def wait_paused(process) -> None:
    """Wait until ``process`` (a Popen whose output goes to its ``log`` file) pauses itself at its stop; one that
    ends first fails the test with its exit status and the end of its log."""
    _, status = os.waitpid(process.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        process.returncode = os.waitstatus_to_exitcode(status)
        process.log.seek(0)
        raise AssertionError(f"the build ended ({process.returncode}) before its stop:\n{process.log.read()[-3000:]}")


def kill_child(process) -> None:
    """SIGKILL ``process`` (paused or running), check that the signal ended it, and close its ``log``."""
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    process.log.close()
