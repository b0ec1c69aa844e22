"""What deploy prints: each step with its time, bytes sent, and a one-line summary at the end."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager


def fmt_bytes(n: float) -> str:
    """Decimal units, as network and disk tools count them: 0 B, 412.3 kB, 12.4 MB, 1.20 GB.

    Every caller passes a count of bytes (a size, bytes sent or kept) and only prints the text: a count below 0 (a
    wrong one, e.g. from a damaged record on the board) keeps its sign in front of its units, -5.0 kB (it read
    "-5000 B", a size in bytes), and a NaN or infinite one, which is no count, reads "unknown" (it read "nan GB"). An
    int too large for a float (a damaged manifest's size, summed) reads as its bytes, e.g. "1000...0 B"."""
    try:
        finite = math.isfinite(n)
    except OverflowError:  # an int beyond a float's range: it raised here
        return f"{n} B"
    if not finite:
        return "unknown"
    if n < 0:
        return "-" + fmt_bytes(-n)
    if n < 1000:
        return f"{int(n)} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        text = f"{n / scale:.{2 if unit == 'GB' else 1}f}"
        if float(text) < 1000 or unit == "GB":  # as rounded: 999,950 B is 1.0 MB, not 1000.0 kB
            return f"{text} {unit}"
    return f"{n} B"  # pragma: no cover


def files_count(n: int) -> str:
    """``1 file``, ``0 files``, ``7 files``."""
    return f"{n} file" if n == 1 else f"{n} files"


class Reporter:
    """Writes ``deploy [3/9] step ... (0.42 s)`` lines to stderr (or any writer)."""

    def __init__(self, total: int, write: Callable[[str], None] | None = None, prefix: str = "deploy"):
        self.total = total
        self.number = 0
        self.prefix = prefix
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.started = time.monotonic()
        self.timings: dict[str, float] = {}

    @contextmanager
    def step(self, title: str):
        """Announce a step, run it, and print how long it took (or that it failed)."""
        self.number += 1
        self.write(f"{self.prefix} [{self.number}/{self.total}] {title}")
        began = time.monotonic()
        try:
            yield self
        except BaseException:
            self.write(f"{self.prefix}       {title}: failed after {time.monotonic() - began:.2f} s")
            raise
        self.timings[title] = time.monotonic() - began
        self.write(f"{self.prefix}       done in {self.timings[title]:.2f} s")

    def info(self, text: str) -> None:
        """A detail line under the current step."""
        for line in text.splitlines():
            self.write(f"{self.prefix}       {line}")

    def elapsed(self) -> float:
        return time.monotonic() - self.started
