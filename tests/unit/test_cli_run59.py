"""``edgesdk run`` where stdout cannot take the answer: started with it closed, or on a file the disk refuses to
grow (a full disk under ``> answer.txt``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

resource = pytest.importorskip("resource")

# the huge-page re-execution is left out: what is checked is run's own handling of stdout
ENV = {**os.environ, "EDGESDK_HUGE_PAGES": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def run_process(bundle, *options: str, stdout=subprocess.PIPE, preexec_fn=None,
                stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgesdk", "run", str(bundle), "--threads", "1", *options],
                          input=stdin, stdout=stdout, stderr=subprocess.PIPE, preexec_fn=preexec_fn, env=ENV,
                          text=True, timeout=300)


def small_disk() -> None:
    """Files this process writes may not grow past 0 bytes (RLIMIT_FSIZE, SIGXFSZ ignored): each write to them
    fails with EFBIG, as a full disk fails one with ENOSPC."""
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_a_closed_stdout_is_refused_by_name_before_the_bundle_loads(tiny_bundle):
    """``edgesdk run BUNDLE -p hi >&-``: ``sys.stdout`` is None there, and the run ended in an AttributeError
    traceback ('NoneType' object has no attribute 'write') at the answer's first token."""
    result = run_process(tiny_bundle.path, "-p", "hi", "-n", "2", "--ignore-eos", stdout=None,
                         preexec_fn=lambda: os.close(1))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "the answers are written to stdout, and this process has none (it was closed)" in result.stderr
    assert "fix: redirect it where the answers should go" in result.stderr


@pytest.mark.parametrize("stdin", [None, "hi\nthere\n"])
def test_an_answer_stdout_refuses_is_an_error_naming_stdout(tiny_bundle, tmp_path, stdin):
    """``edgesdk run ... > answer.txt`` on a full disk: the write's OSError ended the run in a traceback, with -p
    and with prompts read from stdin alike; now one error line naming stdout, why, and the fix, and exit 1."""
    options = ("-n", "2", "--ignore-eos") + (("-p", "hi") if stdin is None else ())
    with open(tmp_path / "answer.txt", "w") as answer:
        result = run_process(tiny_bundle.path, *options, stdout=answer, preexec_fn=small_disk, stdin=stdin)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "error: cannot write the answer to stdout: File too large" in result.stderr
    assert "fix: free space on the disk that holds the file stdout is redirected to" in result.stderr
    assert result.stderr.count("error:") == 1, result.stderr  # the piped chat ends at the first failed answer


def test_a_chat_at_a_terminal_ends_where_stdout_refuses_the_answer(tiny_bundle, tmp_path):
    """At a terminal an error ends the line, not the session; an answer stdout refuses is told once and ends the
    session, as no later answer can be shown (the second line typed is not answered into the full disk)."""
    import pty

    master, follower = pty.openpty()
    os.write(master, b"hi\nthere\n\x04")  # typed ahead: two prompts, then Ctrl-D
    try:
        with open(tmp_path / "answer.txt", "w") as answer:
            result = subprocess.run([sys.executable, "-m", "edgesdk", "run", str(tiny_bundle.path), "--threads", "1",
                                     "-n", "2", "--ignore-eos"], stdin=follower, stdout=answer,
                                    stderr=subprocess.PIPE, preexec_fn=small_disk, env=ENV, text=True, timeout=300)
    finally:
        os.close(follower)
        os.close(master)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("error: cannot write the answer to stdout: File too large") == 1, result.stderr


def test_the_huge_page_reexec_flushes_only_the_streams_the_process_has(monkeypatch):
    """With stdout closed (``>&-``) ``sys.stdout`` is None: the re-exec's flush raised AttributeError before the
    command could refuse the closed stdout itself; where exec fails the command goes on on small pages."""
    import sys

    from edgesdk.runtime import huge_pages

    def refused(*args):
        raise OSError("exec refused")

    monkeypatch.setattr(huge_pages, "huge_page_environment", lambda *args: {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    monkeypatch.setattr(huge_pages.os, "execve", refused)
    monkeypatch.setattr(sys, "stdout", None)
    monkeypatch.setattr(sys, "platform", "linux")
    huge_pages.reexec_with_huge_pages(["edgesdk", "run"])
