"""The small CLI commands and the main entry: a reader that closes the output early, and the commands' errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ENTRY = "from edgesdk.cli import entry; entry()"


def _to_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """``edgesdk ARGS`` with its stdout a pipe whose reader is gone before it writes (``... | head -c 0``)."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run([sys.executable, "-c", ENTRY, *args], stdout=writer, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(writer)


@pytest.mark.parametrize("args", [("targets", "list"), ("--help",), ("--version",)])
def test_closed_reader_is_a_quiet_sigpipe_exit(args):
    done = _to_closed_pipe(*args)
    assert done.stderr == ""  # no traceback, no "Exception ignored ... BrokenPipeError", no error of the command
    assert done.returncode == 128 + 13  # as a shell reports a tool SIGPIPE ended, not a failure of the command


def test_open_reader_gets_all_and_exit_0():
    done = subprocess.run([sys.executable, "-c", ENTRY, "targets", "list"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") >= 2
    assert "host" in done.stdout


def test_unpack_names_a_missing_archive_as_missing(tmp_path):
    """A mistyped archive name was "not a readable tar archive ([Errno 2] ...)" with the fix "re-create it with
    'edgesdk pack'", which sends the user to rebuild an archive that may be fine."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    missing = tmp_path / "bundle.tar"
    result = CliRunner().invoke(main, ["unpack", str(missing), str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "'ARCHIVE'" in result.stderr
    assert f"'{missing}' does not exist" in result.stderr
    assert "re-create" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_bench_cpu_info_is_the_cpu_name(tiny_bundle):
    """llama-bench's cpu_info is the CPU's name (ggml's CPU device: /proc/cpuinfo's "model name"); on a machine with
    no board model it was platform.machine(), "x86_64", so records of llama-bench and edgesdk on one host differed."""
    import json

    from click.testing import CliRunner

    from edgesdk.board import detect_board
    from edgesdk.cli import main

    board = detect_board()
    if not board.cpu_model_name:
        pytest.skip("this machine's /proc/cpuinfo names no CPU")
    result = CliRunner().invoke(main, ["bench", str(tiny_bundle.path), "-p", "4", "-n", "0", "-r", "1",
                                       "--no-warmup", "-o", "jsonl"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.splitlines()[0])
    assert record["cpu_info"] == board.cpu_model_name


@pytest.mark.parametrize("cache_all", [False, True])
def test_prompt_cache_written_when_the_reader_goes_away(tiny_bundle, tmp_path, cache_all):
    """``edgesdk run ... --prompt-cache FILE | head -c 20``: the answer stops where the reader closed the pipe, and
    the prompt's cache is kept, as llama-cli (which writes it at the first token) keeps it when SIGPIPE ends it. It
    was written only after a whole answer or Ctrl-C, so the prefill was lost."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    cache = tmp_path / "prompt.cache"
    prompt = "Hello there my friend, tell me a story"
    done = _to_closed_pipe("run", str(tiny_bundle.path), "--prompt", prompt, "-n", "8", "--temp", "0",
                           "--prompt-cache", str(cache), *(["--prompt-cache-all"] if cache_all else []))
    assert done.returncode == 128 + 13
    assert done.stderr == ""
    assert cache.is_file()
    again = CliRunner().invoke(main, ["run", str(tiny_bundle.path), "--prompt", prompt, "-n", "1", "--temp", "0",
                                      "--prompt-cache", str(cache), "--prompt-cache-ro", "--stats"])
    assert again.exit_code == 0, again.output
    assert f"prompt cache {cache}: " in again.stderr
    assert " tokens loaded" in again.stderr
