"""run --prompt-cache FILE, --prompt-cache-all and --prompt-cache-ro with llama-cli's meaning (tools/main/main.cpp,
common/arg.cpp; edgesdk/cli_prompt_cache.py): by default the prompt's cache alone, written where the file did not
hold the whole prompt; -all the prompt and the answer; -ro the file used and never written. Real runs of the CLI on
the tiny bundle."""

from __future__ import annotations

import os
import re
import signal

import numpy as np
import pytest

from tests.unit.test_cli import assert_ok, invoke

PROMPT = "The tower was built for the fair of 1889 and named after its engineer. " * 3
OTHER = PROMPT + "Its lift ran on water pressure."  # shares all of PROMPT
UNLIKE = "Ships leave the harbour at dawn when the tide turns. " * 3  # shares next to nothing with PROMPT


def _run(bundle, prompt, *extra, n=8):
    result = invoke("run", bundle.path, "--prompt", prompt, "--raw", "-n", n, "--ignore-eos", "--threads", 1,
                    "--stats", *extra)
    assert_ok(result)
    return result


def _ids(bundle, prompt) -> list[int]:
    from edgesdk.runtime.session import open_runtime

    return open_runtime(bundle.path, threads=1).tokenizer.prompt_ids(prompt, raw=True)


def _held(path) -> list[int]:
    with np.load(path) as data:
        assert data["cache_0"].shape[2] == data["tokens"].shape[0]
        return [int(token) for token in data["tokens"]]


def _cached(stderr: str) -> int:
    found = re.search(r"prompt (\d+) tok(?: \((\d+) from the cache\))?", stderr)
    assert found, stderr
    return int(found.group(2) or 0)


def _stamp(path) -> tuple[int, int]:
    """The file's inode and modification time: a write (a temporary file renamed over it) changes the inode."""
    status = path.stat()
    return status.st_ino, status.st_mtime_ns


def test_the_default_writes_the_prompt_alone_and_only_where_the_file_lacks_it(tiny_bundle, tmp_path):
    """llama-cli's --prompt-cache saves the session on the first sample: the prompt's tokens, not the answer's, and
    only where ``n_matching_session_tokens < embd_inp.size()``. edgesdk wrote the prompt and the answer after every
    answer (llama-cli's --prompt-cache-all) and rewrote the file on every run."""
    path = tmp_path / "prompt.cache"
    plain = _run(tiny_bundle, PROMPT)
    first = _run(tiny_bundle, PROMPT, "--prompt-cache", path)
    ids = _ids(tiny_bundle, PROMPT)
    assert _held(path) == ids  # the prompt, none of the answer
    stamp = _stamp(path)
    second = _run(tiny_bundle, PROMPT, "--prompt-cache", path)
    assert _cached(second.stderr) == len(ids) - 1  # all but the last prompt token, whose logits are needed
    assert first.stdout == second.stdout == plain.stdout
    assert _stamp(path) == stamp  # the file held the whole prompt: not written again, as llama-cli
    longer = _run(tiny_bundle, OTHER, "--prompt-cache", path)
    assert _cached(longer.stderr) == len(ids)
    assert _held(path) == _ids(tiny_bundle, OTHER)  # a prompt the file lacked is written
    assert "low similarity" not in first.stderr + second.stderr + longer.stderr


def test_prompt_cache_all_writes_the_prompt_and_the_answer(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.cache"
    result = _run(tiny_bundle, PROMPT, "--prompt-cache", path, "--prompt-cache-all")
    ids = _ids(tiny_bundle, PROMPT)
    held = _held(path)
    assert len(held) == len(ids) + 8 - 1  # the answer's last token was never fed back, as in llama-cli
    assert held[:len(ids)] == ids
    from edgesdk.runtime.session import open_runtime

    tokenizer = open_runtime(tiny_bundle.path, threads=1).tokenizer
    assert result.stdout.startswith(tokenizer.decode(held[len(ids):]))  # the answer's tokens
    stamp = _stamp(path)
    again = _run(tiny_bundle, PROMPT, "--prompt-cache", path, "--prompt-cache-all")
    assert _cached(again.stderr) == len(ids) - 1
    assert again.stdout == result.stdout
    assert _stamp(path) != stamp  # the final output is written after every answer, as llama-cli's -all


def test_prompt_cache_ro_uses_the_file_and_never_writes_it(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.cache"
    _run(tiny_bundle, PROMPT, "--prompt-cache", path)
    before, stamp = path.read_bytes(), _stamp(path)
    ids = _ids(tiny_bundle, PROMPT)
    result = _run(tiny_bundle, OTHER, "--prompt-cache", path, "--prompt-cache-ro")
    assert _cached(result.stderr) == len(ids)  # the file's prompt is reused
    assert result.stdout == _run(tiny_bundle, OTHER).stdout
    assert path.read_bytes() == before
    assert _stamp(path) == stamp
    both = _run(tiny_bundle, UNLIKE, "--prompt-cache", path, "--prompt-cache-ro", "--prompt-cache-all")
    assert "--prompt-cache-all is not used: --prompt-cache-ro never writes the file" in both.stderr
    assert path.read_bytes() == before
    assert _stamp(path) == stamp


def test_prompt_cache_ro_with_a_missing_file_runs_and_creates_nothing(tiny_bundle, tmp_path):
    """llama-cli logs "session file does not exist, will create" and, read-only, creates nothing; the directory is
    never written, so a missing or unwritable one is no reason to refuse the run."""
    path = tmp_path / "none" / "prompt.cache"
    result = _run(tiny_bundle, PROMPT, "--prompt-cache", path, "--prompt-cache-ro")
    assert "does not exist, and --prompt-cache-ro does not create it" in result.stderr
    assert _cached(result.stderr) == 0
    assert result.stdout == _run(tiny_bundle, PROMPT).stdout
    assert not path.parent.exists()


def test_a_refused_file_is_left_as_it_is_with_prompt_cache_ro(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.cache"
    path.write_bytes(b"not a cache")
    result = _run(tiny_bundle, PROMPT, "--prompt-cache", path, "--prompt-cache-ro")
    assert "cannot be read as a cache file" in result.stderr
    assert "; --prompt-cache-ro leaves it as it is" in result.stderr
    assert "rewrites it" not in result.stderr
    assert path.read_bytes() == b"not a cache"


@pytest.mark.parametrize("option", ["--prompt-cache-all", "--prompt-cache-ro"])
def test_a_mode_without_prompt_cache_is_refused_by_name(tiny_bundle, option):
    result = invoke("run", tiny_bundle.path, "--prompt", "hello", "-n", 2, option)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.stderr
    assert f"no --prompt-cache FILE names one; pass --prompt-cache FILE with {option}" in result.stderr
    assert result.stdout == ""


def test_a_file_that_shares_little_of_the_prompt_is_said(tiny_bundle, tmp_path):
    """llama-cli: "session file has low similarity to prompt (N / M tokens); will mostly be reevaluated"."""
    path = tmp_path / "prompt.cache"
    _run(tiny_bundle, PROMPT, "--prompt-cache", path)
    result = _run(tiny_bundle, UNLIKE, "--prompt-cache", path)
    shared = _cached(result.stderr)
    assert f"has low similarity to the prompt ({shared} / {len(_ids(tiny_bundle, UNLIKE))} tokens)" in result.stderr
    assert _held(path) == _ids(tiny_bundle, UNLIKE)


@pytest.fixture
def python_handles_sigint():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("inside", [False, True])
def test_ctrl_c_writes_the_prompt_alone_by_default(tiny_bundle, tmp_path, monkeypatch, python_handles_sigint,
                                                   inside):
    """The prompt's cache was copied at the first token, so a Ctrl-C between steps or inside one writes it whole
    (llama-cli wrote it before the first token); the answer's tokens are not in it."""
    from tests.unit.test_prompt_cache_interrupt import _interrupt_at_decode

    path = tmp_path / "prompt.cache"
    _interrupt_at_decode(monkeypatch, step=4, inside=inside)
    stopped = invoke("run", tiny_bundle.path, "--prompt", PROMPT, "--raw", "-n", 40, "--ignore-eos", "--threads", 1,
                     "--prompt-cache", path)
    assert stopped.exit_code != 0
    monkeypatch.undo()
    assert _held(path) == _ids(tiny_bundle, PROMPT)


def test_a_chat_writes_each_prompt_the_file_lacks(tiny_bundle, tmp_path):
    """Piped lines, each its own prompt: the file holds the last prompt written; a repeated line writes nothing."""
    path = tmp_path / "prompt.cache"
    result = invoke("run", tiny_bundle.path, "--raw", "-n", 4, "--threads", 1, "--prompt-cache", path,
                    input=f"{PROMPT}\n{UNLIKE}\n")
    assert_ok(result)
    assert _held(path) == _ids(tiny_bundle, UNLIKE)
    os.utime(path, ns=(0, 0))
    stamp = _stamp(path)
    assert_ok(invoke("run", tiny_bundle.path, "--raw", "-n", 4, "--threads", 1, "--prompt-cache", path,
                     input=f"{UNLIKE}\n{UNLIKE}\n"))
    assert _stamp(path) == stamp


def test_a_chat_at_a_terminal_keeps_its_last_prompt_or_with_all_its_last_answer_too(tiny_bundle, tmp_path):
    """llama-cli refuses --prompt-cache-all in interactive mode ("not supported in interactive mode yet"); a chat here
    writes it after each answer. The default keeps the last turn's prompt (the conversation so far, up to the
    assistant's turn), -all that and the answer's tokens but the last."""
    from tests.unit.test_cache_file_review import _Terminal

    held = {}
    for mode in ("prompt", "all"):
        path = tmp_path / f"{mode}.cache"
        extra = ["--prompt-cache-all"] if mode == "all" else []
        result = invoke("run", tiny_bundle.path, "-n", 4, "--ignore-eos", "--threads", 1, "--prompt-cache", path,
                        *extra, input=_Terminal(b"hello there\nwhat next\n"))
        assert_ok(result)
        held[mode] = _held(path)
    assert held["all"][:len(held["prompt"])] == held["prompt"]
    assert len(held["all"]) == len(held["prompt"]) + 4 - 1
