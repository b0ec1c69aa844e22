"""A command run on a pseudo-terminal, as a user at a shell runs it: stdin, stdout and stderr all on the pty,
in a session of its own (so a test can send the terminal's Ctrl-C to its process group)."""

from __future__ import annotations

import os
import select
import subprocess
import time


class TerminalSession:
    """``argv`` started on a new pty; :meth:`type` writes keystrokes, :meth:`read_until` collects what the
    terminal shows. Used as a context manager, it kills a process still running and closes the pty."""

    def __init__(self, argv: list[str], env: dict, preexec_fn=None):
        import pty

        self.master, follower = pty.openpty()
        self.process = subprocess.Popen(argv, env=env, stdin=follower, stdout=follower, stderr=follower,
                                        start_new_session=True, preexec_fn=preexec_fn)
        os.close(follower)
        self.seen = bytearray()

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def read_until(self, predicate, seconds: float = 120) -> None:
        """Read the terminal until ``predicate()`` holds, the process ends or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        while not predicate() and time.monotonic() < deadline and self.process.poll() is None:
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    self.seen.extend(os.read(self.master, 4096))
                except OSError:
                    break

    @property
    def text(self) -> str:
        return self.seen.decode(errors="replace")

    def __enter__(self) -> TerminalSession:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        os.close(self.master)
