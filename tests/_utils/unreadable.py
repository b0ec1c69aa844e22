"""A file the test's user may not read. Root reads past chmod 000, so there Path.read_text is made to fail for
that one file (and Path.read_bytes) with the PermissionError an ordinary user gets."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def make_unreadable(path: Path, monkeypatch) -> Path:
    """``path`` (already written) made unreadable: chmod 000, and for root a refusing Path.read_text and Path.read_bytes."""
    path.chmod(0)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        for name in ("read_text", "read_bytes"):
            monkeypatch.setattr(Path, name, _refusing(getattr(Path, name), path))
    return path


def _refusing(read, path: Path):
    """``read`` (a Path method), refusing ``path`` alone with an ordinary user's PermissionError."""

    def refuse(self, *args, **kwargs):
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return read(self, *args, **kwargs)

    return refuse
