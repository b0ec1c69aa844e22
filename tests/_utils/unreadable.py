"""A file the test's user may not read. Root reads past chmod 000, so there Path.read_text is made to fail for
that one file with the PermissionError an ordinary user gets."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def make_unreadable(path: Path, monkeypatch) -> Path:
    """``path`` (already written) made unreadable: chmod 000, and for root a refusing Path.read_text."""
    path.chmod(0)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        read_text = Path.read_text

        def refuse(self, *args, **kwargs):
            if self == path:
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", refuse)
    return path
