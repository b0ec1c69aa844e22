"""A small disk for the tests that fill one: a tmpfs of a given size mounted on a directory (mounting one needs
root; the test is skipped elsewhere), unmounted after."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(root: Path, size: str = "256k") -> Iterator[Path]:
    """``root``, made here, with a ``size`` tmpfs (mount's ``size=`` option: 256k, 8m) mounted on it; unmounted on
    the way out. Skips the test where this user may not mount one."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    root.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount tmpfs here")
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=True)
