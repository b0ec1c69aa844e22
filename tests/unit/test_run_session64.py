"""``edgesdk run`` sessions as llama.cpp runs them: ``-if`` with ``-p`` / ``-f`` (the prompt prefilled and the user
speaking first where it is fed as it is, the first turn answered through the chat template, as llama.cpp's
conversation mode); an answer cut at the default ``-n`` saying so; ``--stats`` for an answer Ctrl-C stopped
(``stop: interrupted``), with the load and total times; and ``--verbose-prompt`` in a session logging only each
turn's new tokens."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from edgesdk.cli_interactive import TypedPrompt, typed_prompt_ids
from tests._utils.signals import default_signals
from tests._utils.terminal import TerminalSession
from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")

ENV = {**os.environ, "EDGESDK_HUGE_PAGES": "0", "PYTHONDONTWRITEBYTECODE": "1"}
STATS = re.compile(r"^\[[\w-]+\] prompt (\d+) tok(?: \((\d+) from the cache\))?.*$", re.M)
CUT = "edgesdk: answer cut at -n 128 (the default); pass -n -1 for no limit"


def run(bundle, *args, input=None):
    return invoke("run", bundle.path, "--threads", 1, *args, input=input)


def stats(result) -> list[tuple[int, int]]:
    """(prompt tokens, of them from the cache) of each --stats line."""
    return [(int(total), int(cached or 0)) for total, cached in STATS.findall(result.stderr)]


def dumps(stderr: str) -> list[tuple[str, list[str]]]:
    """The --verbose-prompt dumps: (their count line, the pieces listed after it)."""
    found = []
    for block in re.split(r"(?=^edgesdk: number of tokens in prompt)", stderr, flags=re.M)[1:]:
        head = block.split("\n", 1)[0]
        pieces = re.findall(r"^ *\d+ -> '(.*?)'$", block, flags=re.M | re.S)
        found.append((head, pieces))
    return found


# --- -if with a prompt ---------------------------------------------------------------------------------------------


def test_if_with_a_raw_prompt_prefills_it_and_the_first_line_goes_on_it(tiny_bundle, runtime):
    """llama-completion -no-cnv -if -p: the prompt is tokenized into the input and ``is_interacting`` starts true,
    so it is prefilled and the user's line is read before a token is sampled. One answer, to the prompt and the
    line together, the prompt's tokens from the cache. It was refused ("pass -i")."""
    tokenizer = runtime.tokenizer
    preamble = tokenizer.prompt_ids("Alice: hi\nBob: hello", raw=True)
    line = typed_prompt_ids(tokenizer, TypedPrompt("Alice: ", (), "more", "\nBob:"), alone=False)
    for mode in ("--raw", "-no-cnv"):
        result = run(tiny_bundle, mode, "-if", "-p", "Alice: hi\\nBob: hello", "--in-prefix", "Alice: ",
                     "--in-suffix", "\\nBob:", "-n", "64", "--stats", input="more\n")
        assert_ok(result)
        assert stats(result) == [(len(preamble) + len(line), len(preamble))], result.stderr


def test_if_with_a_raw_prompt_reads_the_line_before_anything_is_generated(tiny_bundle, runtime):
    """Without a line (stdin at its end at once) nothing is generated: the prompt waited for the user."""
    result = run(tiny_bundle, "--raw", "-if", "-p", "hello", "--stats", input="")
    assert_ok(result)
    assert result.stdout == ""
    assert stats(result) == []


def test_if_with_a_prompt_through_the_chat_template_answers_it_first_as_cnv(tiny_bundle):
    """llama.cpp's conversation mode sets ``interactive_first`` itself and answers -p as the first user turn: -if -p
    is -cnv -p there, and so here."""
    first_turn = run(tiny_bundle, "-if", "-p", "hi", "-n", "2", "--stats", input="again\n")
    cnv = run(tiny_bundle, "-cnv", "-p", "hi", "-n", "2", "--stats", input="again\n")
    assert_ok(first_turn)
    assert_ok(cnv)
    assert len(stats(first_turn)) == 2
    assert stats(first_turn) == stats(cnv)


def test_if_with_a_prompt_and_single_turn_answers_the_prompt_alone(tiny_bundle):
    result = run(tiny_bundle, "-if", "-st", "-p", "hi", "-n", "2", "--stats", input="again\n")
    assert_ok(result)
    assert len(stats(result)) == 1


def test_if_with_a_raw_prompt_and_no_history_is_refused_by_name(tiny_bundle):
    result = run(tiny_bundle, "--raw", "-if", "-p", "hi", "--no-history", input="again\n")
    assert result.exit_code == 2
    assert "--no-history" in result.stderr
    assert "-if" in result.stderr


# --- an answer cut at the default -n -------------------------------------------------------------------------------


def test_an_answer_cut_at_the_default_limit_says_so_once(tiny_bundle):
    """--ignore-eos: the answer always runs to -n."""
    result = run(tiny_bundle, "-p", "hi", "--ignore-eos")
    assert_ok(result)
    assert result.stderr.count(CUT) == 1, result.stderr


def test_each_chat_answer_cut_at_the_default_limit_says_so(tiny_bundle):
    result = run(tiny_bundle, "--ignore-eos", input="hi\nagain\n")
    assert_ok(result)
    assert result.stderr.count(CUT) == 2, result.stderr


def test_a_limit_given_is_not_said(tiny_bundle):
    for limit in ("128", "4"):
        result = run(tiny_bundle, "-p", "hi", "--ignore-eos", "-n", limit)
        assert_ok(result)
        assert "answer cut" not in result.stderr


# --- --stats: load and total times; an answer stopped with Ctrl-C ------------------------------------------------


def test_the_stats_line_has_the_load_and_total_times(tiny_bundle):
    result = run(tiny_bundle, "-p", "hi", "-n", "2", "--stats")
    assert_ok(result)
    found = re.search(r", load (\d+) ms, total (\d+) ms", result.stderr)
    assert found, result.stderr
    assert int(found.group(2)) >= int(found.group(1))


def _forever(bundle, *options) -> list[str]:
    """An answer with no end of its own (-n -1 with --context-shift and --ignore-eos): Ctrl-C always lands in it."""
    return [sys.executable, "-m", "edgesdk", "run", str(bundle.path), "--threads", "1", "-n", "-1",
            "--context-shift", "--ignore-eos", "--stats", *options]


@pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals")
def test_ctrl_c_in_a_one_shot_answer_prints_its_stats_before_exit_130(tiny_bundle, tmp_path):
    """llama.cpp prints its timings, then exits 130; run exited 130 with no stats line."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(_forever(tiny_bundle, "-p", "hi"), stdin=subprocess.DEVNULL, stdout=stdout,
                                   stderr=stderr, env=ENV, preexec_fn=default_signals)
        try:
            deadline = time.monotonic() + 120  # a guard against a hang only: the answer has no end of its own
            while out.stat().st_size < 64 and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)  # until the answer has begun
            assert process.poll() is None, err.read_text()
            process.send_signal(signal.SIGINT)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
    text = err.read_text()
    assert process.returncode == 130, text
    lines = [line for line in text.splitlines() if line.startswith("[")]
    assert len(lines) == 1, text
    assert "stop: interrupted" in lines[0], text
    assert text.index("stop: interrupted") < text.index("stopped (Ctrl-C)"), text


@pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals")
def test_ctrl_c_in_a_chat_answer_prints_its_stats_before_the_next_prompt(tiny_bundle):
    with TerminalSession(_forever(tiny_bundle), ENV, default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"hello\n")
        typed = len(terminal.seen)
        terminal.read_until(lambda: len(terminal.seen) > typed + 64)  # the answer has begun
        os.killpg(terminal.process.pid, signal.SIGINT)
        terminal.read_until(lambda: b"answer stopped" in terminal.seen and terminal.text.rstrip().endswith(">"))
        terminal.type(b"\x04")
        terminal.process.wait(timeout=60)
        terminal.read_until(lambda: False, seconds=1)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    stopped = re.search(r"^\[[\w-]+\] prompt \d+ tok.*stop: interrupted.*$", text, flags=re.M)
    assert stopped, text
    assert stopped.start() < text.index("answer stopped"), text


# --- --verbose-prompt in a session ---------------------------------------------------------------------------------


def test_verbose_prompt_in_a_chat_logs_only_the_tokens_each_turn_adds(tiny_bundle):
    """The second turn's dump held the whole conversation again, the system message too."""
    result = run(tiny_bundle, "-cnv", "-sys", "be brief", "-n", "3", "--verbose-prompt", input="hi\nyo\n")
    assert_ok(result)
    (first_head, first), (second_head, second) = dumps(result.stderr)
    assert first_head == f"edgesdk: number of tokens in prompt = {len(first)}"
    assert "be brief" in "".join(first)
    counted = re.fullmatch(r"edgesdk: number of tokens in prompt = (\d+) \(this turn's; (\d+) with the "
                           r"conversation before them\)", second_head)
    assert counted, second_head
    assert int(counted.group(1)) == len(second) < int(counted.group(2))
    assert "be brief" not in "".join(second)
    assert "".join(second).endswith("<|im_start|>user\nyo<|im_end|>\n<|im_start|>assistant\n")


def test_verbose_prompt_in_a_transcript_logs_only_the_typed_line(tiny_bundle, runtime):
    result = run(tiny_bundle, "--raw", "-i", "-p", "hello", "-n", "64", "--verbose-prompt", input="more\n")
    assert_ok(result)
    (_, first), (second_head, second) = dumps(result.stderr)
    assert len(first) == len(runtime.tokenizer.prompt_ids("hello", raw=True))
    line = typed_prompt_ids(runtime.tokenizer, TypedPrompt("", (), "more", ""), alone=False)
    assert second_head.startswith(f"edgesdk: number of tokens in prompt = {len(line)} (this turn's; ")
    assert "".join(second) == "more"


def test_verbose_prompt_for_regen_of_the_first_turn_logs_it_whole(tiny_bundle):
    """/regen answers the last prompt again: told from the turn before the one it answers again (none here)."""
    result = run(tiny_bundle, "-cnv", "-n", "3", "--verbose-prompt", input="hi\n/regen\n")
    assert_ok(result)
    (first_head, first), (again_head, again) = dumps(result.stderr)
    assert again_head == first_head
    assert again == first
