"""The real ``edgesdk serve`` command in a child process, for tests of its options."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def serve_command(bundle: Path, cwd: Path, *options: str) -> Iterator[str]:
    """``edgesdk serve BUNDLE --port 0 OPTIONS`` running; yields its base URL (no ``/v1``), stops it after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "edgesdk.cli", "serve", str(bundle), "--port", "0", "--threads", "1", *options],
        stderr=subprocess.PIPE, text=True, cwd=cwd, env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    try:
        url = None
        for line in process.stderr:
            if " on http://" in line:  # 'edgesdk serve: NAME on http://HOST:PORT/v1 (...)'
                url = line.split(" on ", 1)[1].split()[0].rstrip("/").removesuffix("/v1")
                break
        assert url, "the server did not start"
        yield url
    finally:
        process.terminate()
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired as stuck:  # chained: a failure of the test itself stays shown
            process.kill()
            rest = process.communicate()[1]
            raise AssertionError(f"the server did not stop within 60 s of SIGTERM; its log ended:\n{rest[-4000:]}") \
                from stuck
