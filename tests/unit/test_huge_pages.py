"""Huge pages for the weight stream: when ``run`` / ``eval`` re-execute with glibc's tunable, and
that the re-executed CLI really runs with it (a subprocess, the way a user starts it)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from edgesdk.runtime.huge_pages import (
    OPT_OUT,
    REEXEC_PROGRAM,
    TUNABLE,
    commands_use_huge_pages,
    huge_page_environment,
    reexec_with_huge_pages,
    thp_mode,
)

GLIBC = ("glibc", "2.36")


@pytest.mark.parametrize(("mode", "libc", "wanted"), [
    ("madvise", GLIBC, True),
    ("always", ("glibc", "2.35"), False),  # glibc ignores hugetlb=1 there: the kernel hands out THP by itself
    ("madvise", ("glibc", "2.35"), True),
    ("never", GLIBC, False),  # the kernel has THP off
    (None, GLIBC, False),  # no THP at all (not Linux, or compiled out)
    ("madvise", ("glibc", "2.31"), False),  # before the tunable existed
    ("madvise", ("", ""), False),  # musl and others
])
def test_reexecution_only_where_it_can_change_something(mode, libc, wanted):
    environment = huge_page_environment({"PATH": "/bin"}, mode, libc)
    assert (environment is not None) is wanted
    if wanted:
        assert environment == {"PATH": "/bin", "GLIBC_TUNABLES": TUNABLE}


def test_existing_tunables_are_kept_and_the_reexecuted_process_stops_there():
    environment = huge_page_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC)
    assert environment["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}"
    assert huge_page_environment(environment, "madvise", GLIBC) is None  # no loop
    assert huge_page_environment({OPT_OUT: "0"}, "madvise", GLIBC) is None  # opted out
    assert commands_use_huge_pages(environment, "madvise", GLIBC)  # set already: they use them
    assert not commands_use_huge_pages({OPT_OUT: "0"}, "madvise", GLIBC)


@pytest.mark.parametrize(("tunables", "mode", "libc"), [
    ("glibc.malloc.hugetlb=0", "madvise", GLIBC),  # set, but to off
    ("glibc.malloc.hugetlb=1", "never", GLIBC),  # the kernel has THP off
    ("glibc.malloc.hugetlb=1", "madvise", ("glibc", "2.31")),  # a glibc that ignores the tunable
    ("glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0", "madvise", GLIBC),  # the last setting wins
], ids=["zero", "thp-never", "old-glibc", "last-wins"])
def test_a_tunable_that_changes_nothing_is_not_reported_as_huge_pages(tunables, mode, libc):
    assert not commands_use_huge_pages({"GLIBC_TUNABLES": tunables}, mode, libc)
    assert not commands_use_huge_pages({"GLIBC_TUNABLES": tunables, OPT_OUT: "0"}, mode, libc)


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    assert thp_mode(tmp_path / "enabled") == "madvise"
    (tmp_path / "garbled").write_text("madvise\n")
    assert thp_mode(tmp_path / "garbled") is None
    assert thp_mode(tmp_path / "missing") is None


def _stats_line(bundle, environment) -> str:
    proc = subprocess.run([sys.executable, "-m", "edgesdk", "run", str(bundle.path), "--prompt", "hello",
                           "--max-new-tokens", "4", "--stats", "--ignore-target"],
                          capture_output=True, text=True, env=environment, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return next(line for line in proc.stderr.splitlines() if line.startswith("["))


def test_run_reexecutes_with_huge_pages_and_the_opt_out_holds(tiny_bundle):
    environment = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    if huge_page_environment(environment, thp_mode(), platform.libc_ver()) is None:
        pytest.skip(f"huge pages cannot be used here (THP {thp_mode()}, C library {platform.libc_ver()})")
    with_huge = _stats_line(tiny_bundle, environment)
    without = _stats_line(tiny_bundle, {**environment, OPT_OUT: "0"})
    mib = lambda line: int(line.rsplit("huge pages ", 1)[1].split()[0])  # noqa: E731
    assert mib(with_huge) > 0
    if thp_mode() == "madvise":  # with "always" the kernel hands out huge pages regardless
        assert mib(without) == 0


def test_an_interpreter_that_cannot_start_again_leaves_the_command_running(monkeypatch, tmp_path):
    """execve of a missing interpreter fails; the command goes on in this process, on small pages."""
    environment = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    if huge_page_environment(environment, thp_mode(), platform.libc_ver()) is None:
        pytest.skip("no re-execution would be attempted here")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    assert reexec_with_huge_pages(["edgesdk", "run", "bundle"]) is None


def test_the_reexecuted_command_ignores_an_edgesdk_in_the_working_directory(tmp_path):
    """``python -m edgesdk`` in a directory holding another edgesdk (a checkout) imports that one;
    the program the re-execution runs imports the installed package."""
    shadow = tmp_path / "edgesdk"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise SystemExit('the shadow edgesdk was imported')\n")
    (shadow / "__main__.py").write_text("")
    environment = {**os.environ, OPT_OUT: "0"}  # no further re-execution: this process answers

    def version(*program: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *program, "--version"], capture_output=True, text=True,
                              env=environment, cwd=tmp_path, timeout=60, check=False)

    assert "shadow" in version("-m", "edgesdk").stderr  # what the old re-execution ran
    reexecuted = version("-c", REEXEC_PROGRAM)
    assert reexecuted.returncode == 0, reexecuted.stderr
    assert reexecuted.stdout.startswith("edgesdk, version")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH is new in Python 3.11")
def test_the_reexecuted_command_keeps_the_edgesdk_of_pythonpath_under_pythonsafepath(tmp_path):
    """With PYTHONSAFEPATH set, ``-c`` adds no working directory to sys.path: its first entry is
    PYTHONPATH's, where the edgesdk the user started may come from. The re-executed program keeps it."""
    package = tmp_path / "path" / "edgesdk"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text("def entry():\n    print('the PYTHONPATH edgesdk ran')\n")
    environment = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": str(package.parent), OPT_OUT: "0"}
    reexecuted = subprocess.run([sys.executable, "-c", REEXEC_PROGRAM, "--version"], capture_output=True, text=True,
                                env=environment, cwd=tmp_path, timeout=60, check=False)
    assert reexecuted.returncode == 0, reexecuted.stderr
    assert reexecuted.stdout == "the PYTHONPATH edgesdk ran\n"


@pytest.mark.parametrize("value", ["0", "off", "false", "No", " OFF "])
def test_opting_out_takes_the_usual_words(value):
    assert huge_page_environment({OPT_OUT: value}, "madvise", GLIBC) is None
    assert huge_page_environment({OPT_OUT: "1"}, "madvise", GLIBC) is not None
