"""A script run in a fresh Python process from the repository root, and the JSON it printed last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def script_outcome(script: str, *arguments: str) -> dict:
    """What ``script`` (run in a fresh process from the repository root) printed about the exception it caught."""
    done = subprocess.run([sys.executable, "-c", script, *arguments], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-2000:]
    return json.loads(lines[-1])
