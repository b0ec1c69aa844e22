"""``edgesdk run``'s terminal chat (edgesdk/cli_interactive.py) against llama-cli: /regen, --multiline-input and the
escapes of typed input. Driven as a user drives it: on a pseudo-terminal, or with piped stdin."""

from __future__ import annotations

import os
import sys

import pytest

from tests._utils.signals import default_signals as _default_signals
from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_cli_run_interactive37 import (
    ENV,
    _answer,
    _argv,
    _assistant,
    _finish,
    _prompt_tokens,
    _stats_prompts,
    _user,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals and FIFOs (Linux)")


def test_a_regen_whose_telemetry_fails_answers_and_keeps_the_exchange(tiny_bundle, runtime, tmp_path):
    """/regen takes the last exchange back to answer it again; where the --telemetry file's reader has gone, so its
    first step's record cannot be written, the run warns and answers on (it ended that answer in an error before),
    and the conversation holds the exchange answered again (greedy, the same): the next turn's prompt is rendered
    over it."""
    from tests._utils.terminal import TerminalSession

    fifo = tmp_path / "telemetry.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    first = _answer(runtime, [_user("hello there")], 4)
    argv = _argv(tiny_bundle.path, "-n", "4", "--stats", "--telemetry", str(fifo))
    try:
        with TerminalSession(argv, ENV, _default_signals) as terminal:
            def answered(count: int):
                return lambda: len(_stats_prompts(terminal.text)) >= count and terminal.text.rstrip().endswith(">")

            terminal.read_until(lambda: b"> " in terminal.seen)
            terminal.type(b"hello there\n")
            terminal.read_until(answered(1))
            os.close(reader)
            reader = None
            terminal.type(b"/regen\n")
            terminal.read_until(answered(2))
            terminal.type(b"what next\n")
            terminal.read_until(answered(3))
            terminal.type(b"\x04")
            _finish(terminal)
    finally:
        if reader is not None:
            os.close(reader)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    assert "Traceback" not in text
    assert "error:" not in text, text
    assert "telemetry file" in text, text  # the warning
    assert _stats_prompts(text) == [
        _prompt_tokens(runtime, [_user("hello there")]),
        _prompt_tokens(runtime, [_user("hello there")]),
        _prompt_tokens(runtime, [_user("hello there"), _assistant(first), _user("what next")]),
    ], text


# --- --multiline-input, and a line ending in '/' ----------------------------------------------------------------


def _chat_run(bundle, stdin: str, *options):
    return invoke("run", bundle, "-n", 4, "--history", "--stats", "--threads", 1, *options, input=stdin)


def test_multiline_input_goes_on_over_lines_until_one_ends_in_a_backslash_or_a_slash(tiny_bundle, runtime):
    """llama-cli's -mli (common/console.cpp readline): each line goes on with the next, an empty one too; a line
    ending in '\\' ends the prompt (its line break popped), one ending in '/' ends it without a line break; the
    end of input ends the last prompt, here '/exit', with the lines read so far."""
    first, second = "first line\nsecond line\n\nfourth", "next one"
    answer = _answer(runtime, [_user(first)], 4)
    for option in ("--multiline-input", "-mli"):
        result = _chat_run(tiny_bundle.path, "first line\nsecond line\n\nfourth\\\nnext one/\n/exit\n", option)
        assert_ok(result)
        assert _stats_prompts(result.stderr) == [
            _prompt_tokens(runtime, [_user(first)]),
            _prompt_tokens(runtime, [_user(first), _assistant(answer), _user(second)]),
        ], result.stderr
        assert result.stdout.startswith(answer + "\n"), result.stdout


def test_a_line_ending_in_a_slash_ends_the_prompt_without_the_slash(tiny_bundle, runtime):
    """Without -mli too: llama-cli's console always hands control back at a line ending in '/', the '/' left out
    ("To return control without starting a new line, end your input with '/'", tools/main/main.cpp), also the
    last line of one that a '\\' went on with."""
    result = _chat_run(tiny_bundle.path, "hello there/\ntwo\\\nlines/\n")
    assert_ok(result)
    first = _answer(runtime, [_user("hello there")], 4)
    assert _stats_prompts(result.stderr) == [
        _prompt_tokens(runtime, [_user("hello there")]),
        _prompt_tokens(runtime, [_user("hello there"), _assistant(first), _user("two\nlines")]),
    ], result.stderr


def test_multiline_input_at_a_terminal(tiny_bundle, runtime):
    """Typed at a terminal: Return goes on to the next line, and a line ending in '\\' sends the prompt."""
    from tests._utils.terminal import TerminalSession

    argv = _argv(tiny_bundle.path, "-n", "4", "--stats", "--multiline-input")
    with TerminalSession(argv, ENV, _default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"roses are red\n")
        terminal.type(b"violets are blue\\\n")
        terminal.read_until(lambda: _stats_prompts(terminal.text) and terminal.text.rstrip().endswith(">"))
        terminal.type(b"\x04")
        _finish(terminal)
    assert terminal.process.returncode == 0, terminal.text
    assert _stats_prompts(terminal.text) == [_prompt_tokens(runtime, [_user("roses are red\nviolets are blue")])]


def test_multiline_input_with_a_prompt_is_named_as_unused(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-n", 2, "--threads", 1, "-p", "hi", "--multiline-input")
    assert_ok(result)
    assert "--multiline-input is not used" in result.stderr


# --- escapes in typed input -----------------------------------------------------------------------------------


def test_typed_text_is_taken_as_written_escapes_and_all(tiny_bundle, runtime):
    """llama-cli's chat (tools/cli/cli.cpp) passes typed text on as it is; -e (on by default) processes the text on
    the command line only. (tools/main/main.cpp, now llama-completion, would read '\\t' as a tab.)"""
    typed = "C:\\temp\\new and \\x41"
    result = _chat_run(tiny_bundle.path, typed + "\n")
    assert_ok(result)
    assert _stats_prompts(result.stderr) == [_prompt_tokens(runtime, [_user(typed)])], result.stderr
    assert _prompt_tokens(runtime, [_user(typed)]) != _prompt_tokens(runtime, [_user("C:\temp\new and A")])
