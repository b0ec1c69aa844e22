"""Thermal sensors, clock cap and guard behaviour found in review."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.thermal.sensors import Combined, Vcgencmd

ROOT = Path(__file__).resolve().parents[2]

# Runs as an ordinary user (root drops to nobody after the imports, since it searches any directory).
AS_USER = """
import json, os, sys
from pathlib import Path
import edgesdk.models.sources  # imported before the user changes: nobody may not read the interpreter's files
from edgesdk.thermal.cpufreq import CpuFreqCap, recover_left_cap
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)
try:
    notes = recover_left_cap()
    cap = CpuFreqCap("no-cpufreq-here", Path(os.environ["EDGESDK_CACHE"]) / "clock-cap.json")
    cap.close()
    result = {"notes": notes, "cap": cap.describe()}
except Exception as error:
    result = {"error": repr(error)}
print(json.dumps(result))
"""


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_cache_directory_this_user_cannot_search_is_no_left_cap(tmp_path):
    """Every 'edgesdk run' and 'serve' first gives back a clock cap a killed run left (recover_left_cap).
    Path.exists raises PermissionError where the cache directory may not be searched ($EDGESDK_CACHE
    in another user's home), so every run ended in that traceback once the bundle loaded, with or
    without thermal options. Such a state file holds no cap this user could give back: nothing to do."""
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0)
    try:
        done = subprocess.run([sys.executable, "-c", AS_USER], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "EDGESDK_CACHE": str(cache)})
    finally:
        cache.chmod(0o755)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert "error" not in result, result
    assert result["notes"] == []
    assert result["cap"].startswith("CPU clock cap unavailable: no cpufreq policies")


def test_vcgencmd_output_that_is_not_text_is_no_data(tmp_path):
    """run_command decoded vcgencmd's stdout strictly: a byte that is not UTF-8 in get_throttled's answer was a
    UnicodeDecodeError out of Vcgencmd.read (the sensors' docstring: no data, never an exception), and the
    combined reader dropped the good temperature read beside it."""
    binary = tmp_path / "vcgencmd"
    binary.write_text("#!/bin/sh\n"
                      "if [ \"$1\" = measure_temp ]; then echo \"temp=61.2'C\"; else printf 'throttled=\\377\\n'; fi\n")
    binary.chmod(0o755)
    reading = Vcgencmd(binary=str(binary)).read()
    assert reading.zones == {"vcgencmd": 61.2}
    assert reading.throttled is None
    assert Combined([Vcgencmd(binary=str(binary))], ["vcgencmd"]).read().max_c == 61.2
