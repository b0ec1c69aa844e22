"""Signals in a test's child process as a terminal's foreground process has them."""

from __future__ import annotations

import signal


def default_signals() -> None:
    """In the child before exec: SIGINT and SIGHUP at their defaults. A test run started in the background (``&``,
    where a non-interactive shell sets SIGINT ignored) or under nohup (SIGHUP ignored) passes them on ignored, and
    Python keeps an ignored SIGINT ignored, so the Ctrl-C these tests send would do nothing."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
