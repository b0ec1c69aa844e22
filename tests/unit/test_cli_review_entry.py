"""``python -m edgesdk.cli`` (what deploy's smoke test runs on the board and the run command its summary
prints) starts the CLI the way the ``edgesdk`` script and ``python -m edgesdk`` do."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from edgesdk.runtime.huge_pages import OPT_OUT, huge_page_environment, thp_mode


def test_python_m_edgesdk_cli_goes_through_the_huge_page_entry():
    code = textwrap.dedent("""
        import runpy, sys
        import edgesdk.runtime.huge_pages as huge_pages
        huge_pages.reexec_with_huge_pages = lambda argv: print("REEXEC", argv[1:])
        sys.argv = ["edgesdk.cli", "run", "--help"]
        runpy.run_module("edgesdk.cli", run_name="__main__")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "REEXEC ['run', '--help']" in proc.stdout
    assert "Usage: edgesdk run" in proc.stdout  # the same program name as the console script


def test_python_m_edgesdk_cli_run_puts_the_weights_on_huge_pages(tiny_bundle):
    environment = {key: value for key, value in os.environ.items() if key not in ("GLIBC_TUNABLES", OPT_OUT)}
    if huge_page_environment(environment, thp_mode(), platform.libc_ver()) is None:
        pytest.skip(f"huge pages cannot be used here (THP {thp_mode()}, C library {platform.libc_ver()})")
    proc = subprocess.run([sys.executable, "-m", "edgesdk.cli", "run", str(tiny_bundle.path), "--prompt", "hello",
                           "-n", "4", "--stats", "--ignore-target"], capture_output=True, text=True, env=environment,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    stats = next(line for line in proc.stderr.splitlines() if line.startswith("["))
    assert int(stats.rsplit("huge pages ", 1)[1].split()[0]) > 0, stats
