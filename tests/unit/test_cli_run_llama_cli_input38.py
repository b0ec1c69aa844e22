"""``edgesdk run``'s input options and commands against llama-cli's: ``--in-prefix`` / ``--in-suffix`` and
``-r/--reverse-prompt`` (llama.cpp tools/main/main.cpp, escapes as common.cpp's ``string_process_escapes``),
``/regen`` and ``/read`` (tools/cli/cli.cpp); an error mid-answer, and a Ctrl-C while a character's bytes are
still coming. Driven as a user drives them: on a pseudo-terminal, or with piped stdin."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from tests._utils.terminal import TerminalSession
from tests.unit.test_cli import flat, invoke
from tests.unit.test_cli_run_interactive37 import (
    ENV,
    _answer,
    _argv,
    _assistant,
    _default_signals,
    _finish,
    _prompt_tokens,
    _stats_prompts,
    _user,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals and FIFO sizes (Linux)")


def _at_prompt(terminal, answers: int, prompt: str = ">"):
    """The terminal shows ``answers`` --stats lines and the next prompt."""
    return lambda: len(_stats_prompts(terminal.text)) >= answers and terminal.text.rstrip().endswith(prompt)


def _piped(bundle, stdin: str, *options) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(bundle, *options), input=stdin, env=ENV, capture_output=True, text=True,
                          timeout=300)


def _two_turns(argv: list[str]) -> TerminalSession:
    """A terminal session that says "hello", then "what next", each after its prompt, and ends with Ctrl-D."""
    with TerminalSession(argv, ENV, _default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"hello\n")
        terminal.read_until(_at_prompt(terminal, 1))
        terminal.type(b"what next\n")
        terminal.read_until(_at_prompt(terminal, 2))
        terminal.type(b"\x04")
        _finish(terminal)
    return terminal


# --- --in-prefix and --in-suffix -----------------------------------------------------------------------------


def test_in_prefix_and_suffix_go_inside_the_users_turn_unshown(tiny_bundle, runtime):
    """With the chat template the prefix and suffix (escapes processed: '\\n') wrap each line inside the user's
    turn, every turn; as in llama-cli's conversation mode they are not shown."""
    argv = _argv(tiny_bundle.path, "-n", "4", "--stats", "--in-prefix", "Q: ", "--in-suffix", "\\nA:")
    terminal = _two_turns(argv)
    first = _answer(runtime, [_user("Q: hello\nA:")], 4)
    assert terminal.process.returncode == 0, terminal.text
    assert _stats_prompts(terminal.text) == [
        _prompt_tokens(runtime, [_user("Q: hello\nA:")]),
        _prompt_tokens(runtime, [_user("Q: hello\nA:"), _assistant(first), _user("Q: what next\nA:")]),
    ], terminal.text
    assert "Q:" not in terminal.text, terminal.text
    assert "A:" not in terminal.text, terminal.text


def test_in_prefix_and_suffix_are_the_raw_prompts_text_and_shown_around_the_input(tiny_bundle, runtime):
    """--raw: the line is completed as prefix + line + suffix, and the terminal shows the prefix before the
    input and the suffix after it, as llama-cli's interactive mode without a chat template prints them."""
    argv = _argv(tiny_bundle.path, "-n", "12", "--stats", "--raw", "--in-prefix", "Q: ", "--in-suffix", "\\nA:")
    with TerminalSession(argv, ENV, _default_signals) as terminal:
        terminal.read_until(lambda: b"> Q: " in terminal.seen)
        terminal.type(b"hello\n")
        terminal.read_until(_at_prompt(terminal, 1, "> Q:"))
        terminal.type(b"\x04")
        _finish(terminal)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    assert _stats_prompts(text) == [len(runtime.tokenizer.prompt_ids("Q: hello\nA:", raw=True))], text
    # -n is the session's budget, which the typed line's tokens spend too (llama-completion's n_remain)
    answer = _answer_raw(runtime, "Q: hello\nA:", 12 - len(runtime.tokenizer.encode_plain("hello")))
    assert "> Q: hello\r\n\r\nA:" + answer.replace("\n", "\r\n") + "\r\n" in text, repr(text)


def _answer_raw(runtime, text: str, n: int) -> str:
    tokenizer = runtime.tokenizer
    tokens, _ = generate(runtime.backend, tokenizer.prompt_ids(text, raw=True), SamplingConfig(max_new_tokens=n),
                         tokenizer.eos_token_ids)
    return tokenizer.decode(tokens)


def test_in_prefix_with_prompt_is_said_to_be_unused(tiny_bundle):
    """llama-cli adds the prefix and suffix to interactive input only, never to -p."""
    result = invoke("run", tiny_bundle.path, "-n", 1, "--threads", 1, "--prompt", "hi", "--in-prefix", "Q: ")
    assert result.exit_code == 0, result.output
    assert "--in-prefix is not used: it goes with each prompt read from stdin, and --prompt is answered as it is" \
        in result.stderr


@pytest.mark.parametrize("option", ["--in-prefix", "--in-suffix", "-r"])
def test_an_escape_that_makes_bytes_not_utf8_is_refused_by_name(tiny_bundle, option):
    result = invoke("run", tiny_bundle.path, "-n", 1, "--threads", 1, "--prompt", "hi", option, "caf\\xe9")
    assert result.exit_code == 2, result.output
    assert "'caf\\xe9' gives bytes that are not UTF-8 once its escapes are processed (unexpected end of data at " \
           "byte 3)" in flat(result.stderr)
    assert "all its bytes as \\xHH escapes (\\xc3\\xa9 for é)" in result.stderr


# --- -r/--reverse-prompt ----------------------------------------------------------------------------------------


def test_a_reverse_prompt_hands_control_back_cut_from_the_answer_shown_and_kept(tiny_bundle, runtime):
    """The answer (a grammar's text) stops where it holds the reverse prompt, which the chat template's answer cuts
    as a stop string (llama-cli's chat passes its -r texts to the server as stop strings); the next prompt comes, and
    the conversation keeps the answer as shown."""
    argv = _argv(tiny_bundle.path, "-n", "32", "--stats", "--grammar", 'root ::= "one two three four"',
                 "-r", "nothing", "-r", "two")
    terminal = _two_turns(argv)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    assert "hello\r\none \r\n" in text, repr(text)
    assert "three" not in text
    assert "stop: reverse_prompt" in text
    assert _stats_prompts(text)[1] == _prompt_tokens(runtime, [_user("hello"), _assistant("one "),
                                                               _user("what next")]), text


def test_a_reverse_prompt_ends_a_prompt_answer_as_a_stop_string(tiny_bundle):
    """Without interactive input the reverse prompt ends the answer, cut from it as a stop string (the answer goes
    through the chat template); an escape in it is processed ('\\x20' is a space)."""
    result = subprocess.run(_argv(tiny_bundle.path, "-n", "32", "--prompt", "hello", "--grammar",
                                  'root ::= "one two three four"', "-r", "two\\x20"),
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "one \n"


def test_a_reverse_prompt_that_is_a_special_token_stops_at_that_token(tiny_bundle):
    """A special token's name is left out of the answer's text; the answer stops at the token itself, as
    llama-cli's single-token reverse prompts do."""
    result = subprocess.run(_argv(tiny_bundle.path, "-n", "32", "--prompt", "hello", "--grammar",
                                  'root ::= "ab" <|im_start|> "cd"', "-r", "<|im_start|>"),
                            env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ab\n"


def test_an_empty_reverse_prompt_is_refused(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-n", 1, "--threads", 1, "--prompt", "hi", "-r", "")
    assert result.exit_code == 2, result.output
    assert "is empty, so every answer would stop at its first token" in flat(result.stderr)


# --- /regen and /read --------------------------------------------------------------------------------------------


def test_regen_replaces_the_last_answer_and_a_greedy_one_comes_again(tiny_bundle, runtime):
    """'/regen' before any answer does nothing (said); after one it drops the answer and generates it again from
    the same conversation: greedy, the same answer; the next turn follows the regenerated answer, once."""
    with TerminalSession(_argv(tiny_bundle.path, "-n", "4", "--stats"), ENV, _default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"/regen\n")
        terminal.read_until(lambda: b"no answer yet" in terminal.seen)
        terminal.type(b"hello\n")
        terminal.read_until(_at_prompt(terminal, 1))
        terminal.type(b"/regen\n")
        terminal.read_until(_at_prompt(terminal, 2))
        terminal.type(b"what next\n")
        terminal.read_until(_at_prompt(terminal, 3))
        terminal.type(b"\x04")
        _finish(terminal)
    text = terminal.text
    first = _answer(runtime, [_user("hello")], 4)
    assert terminal.process.returncode == 0, text
    assert "edgesdk: /regen does nothing: there is no answer yet to generate again" in text
    assert _stats_prompts(text) == [
        _prompt_tokens(runtime, [_user("hello")]),
        _prompt_tokens(runtime, [_user("hello")]),
        _prompt_tokens(runtime, [_user("hello"), _assistant(first), _user("what next")]),
    ], text


def test_piped_regen_shows_the_same_greedy_answer_again(tiny_bundle, runtime):
    first = _answer(runtime, [_user("hello")], 4)
    second = _answer(runtime, [_user("hello"), _assistant(first), _user("what next")], 4)
    result = _piped(tiny_bundle.path, "hello\n/regen\nwhat next\n", "-n", "4", "--history")
    assert result.returncode == 0, result.stderr
    assert result.stdout == first + "\n" + first + "\n" + second + "\n"


def test_regen_draws_with_the_seed_moved_on(tiny_bundle, runtime):
    """Sampling with --seed S, the answer /regen gives is the one seed S + 1 gives (another draw, reproducible);
    without a conversation (--raw) it answers the last line again."""
    tokenizer = runtime.tokenizer
    ids = tokenizer.prompt_ids("hello", raw=True)

    def drawn(seed: int) -> str:
        tokens, _ = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=8, temperature=1.5, seed=seed),
                             tokenizer.eos_token_ids)
        return tokenizer.decode(tokens)

    result = _piped(tiny_bundle.path, "hello\n/regen\n/regen\n", "-n", "8", "--raw", "--temperature", "1.5",
                    "--seed", "7")
    assert result.returncode == 0, result.stderr
    assert result.stdout == drawn(7) + "\n" + drawn(8) + "\n" + drawn(9) + "\n"
    assert len({drawn(7), drawn(8), drawn(9)}) > 1


def test_read_puts_a_files_text_before_the_next_prompt(tiny_bundle, runtime, tmp_path):
    """'/read FILE' as llama-cli's: the file's text under a '--- File: FILE ---' line goes before the next
    prompt (a line break added where the file lacks one); a file that cannot be read is refused by name and
    the session goes on."""
    notes = tmp_path / "notes.txt"
    notes.write_text("the fox\njumps", encoding="utf-8")
    argv = _argv(tiny_bundle.path, "-n", "4", "--stats")
    with TerminalSession(argv, ENV, _default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(f"/read {tmp_path / 'missing.txt'}\n".encode())
        terminal.read_until(lambda: b"error:" in terminal.seen and terminal.text.rstrip().endswith(">"))
        terminal.type(f"/read {notes}\n".encode())
        terminal.read_until(lambda: b"it goes before your next prompt" in terminal.seen)
        terminal.type(b"what does it say\n")
        terminal.read_until(_at_prompt(terminal, 1))
        terminal.type(b"\x04")
        _finish(terminal)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    assert f"error: the /read file {tmp_path / 'missing.txt'} cannot be read (No such file or directory)" in text
    assert f"edgesdk: read {notes} (13 characters)" in text
    assert _stats_prompts(text) == [
        _prompt_tokens(runtime, [_user(f"--- File: {notes} ---\nthe fox\njumps\nwhat does it say")])], text


# --- an error mid-answer, and Ctrl-C mid-character ---------------------------------------------------------------


def _telemetry_fifo(path) -> int:
    """A FIFO for --telemetry, opened for reading (so the run can open it) with the smallest pipe buffer: the run
    blocks on a step record once a few of them are unread."""
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)
    fcntl.fcntl(reader, fcntl.F_SETFL, fcntl.fcntl(reader, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return reader


def _read_records(reader: int, count: int) -> None:
    """Read the FIFO until it has given the meta record and ``count`` step records (until the run opens it, a
    read finds no writer and returns nothing)."""
    seen, deadline = b"", time.monotonic() + 120
    while seen.count(b"\n") < count + 1:
        chunk = os.read(reader, 1)
        if not chunk:
            assert not seen, seen  # the writer went away mid-record
            assert time.monotonic() < deadline, "the run never opened the telemetry FIFO"
            time.sleep(0.05)
        seen += chunk


def _digits_banned(runtime) -> list[str]:
    """--logit-bias options banning every digit: under the grammar ``[a-z]{3} [0-9]`` an answer writes three letters,
    then its constraint allows only tokens the bias bans, an error mid-answer (LogitBiasError)."""
    vocabulary = runtime.tokenizer.token_bytes()
    return [option for digit in b"0123456789" for option in ("--logit-bias", f"{vocabulary.index(bytes([digit]))}=-inf")]


MID_ANSWER_ERROR = "error: the logit_bias bans every token the constraint allows next"


def _after_errors(terminal, errors: int):
    """The terminal shows ``errors`` mid-answer errors and the next prompt (an answer an error cuts short reports
    no --stats line, so :func:`_at_prompt` would wait out its whole time)."""
    return lambda: terminal.text.count(MID_ANSWER_ERROR) >= errors and terminal.text.rstrip().endswith(">")


def test_an_error_mid_answer_starts_on_its_own_line_and_the_conversation_goes_on(tiny_bundle, runtime):
    """An answer an error cuts short after its first letters (the grammar then allows only tokens --logit-bias bans):
    the letters shown end their line before the error, and the session goes on to the next line, as llama-cli's
    does. (It used a telemetry file whose reader went away; a failed step record now only warns.)"""
    argv = _argv(tiny_bundle.path, "-n", "60", "--ignore-eos", "--stats", "--grammar", "root ::= [a-z]{3} [0-9]",
                 *_digits_banned(runtime))
    with TerminalSession(argv, ENV, _default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"hello\n")
        terminal.read_until(_after_errors(terminal, 1))
        terminal.type(b"what next\n")
        terminal.read_until(_after_errors(terminal, 2))
        terminal.type(b"\x04")
        _finish(terminal)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    shown = re.search(r"hello\r\n([a-z]*)(.*?)" + re.escape(MID_ANSWER_ERROR), text, re.S)
    assert shown is not None, repr(text)
    assert shown.group(1), repr(text)  # letters were shown before the error
    assert shown.group(2) == "\r\n", repr(text)
    # the session went on: the next line was answered (cut short the same way, the grammar being the session's)
    assert re.search(r"what next\r\n[a-z]+\r\n" + re.escape(MID_ANSWER_ERROR), text), repr(text)


def test_an_error_mid_prompt_answer_ends_its_line_and_exits_non_zero(tiny_bundle, runtime):
    """With --prompt (no session to go on with) the run exits 1 after the error, which starts on a line of its
    own after the letters shown."""
    argv = _argv(tiny_bundle.path, "-n", "60", "--ignore-eos", "--prompt", "hello", "--grammar",
                 "root ::= [a-z]{3} [0-9]", *_digits_banned(runtime))
    with TerminalSession(argv, ENV, _default_signals) as terminal:
        _finish(terminal)
    assert terminal.process.returncode == 1, terminal.text
    assert re.search(r"(^|\n)[a-z]+\r\n" + re.escape(MID_ANSWER_ERROR), terminal.text), repr(terminal.text)


def test_ctrl_c_while_a_characters_bytes_are_coming_keeps_no_replacement_character(tiny_bundle, runtime, tmp_path):
    """Every answer token is the byte 0xc3 (the logit bias), the lead byte of a character that never completes, so
    the terminal is shown nothing. Ctrl-C mid-answer (the run blocked on a telemetry record, a few tokens in):
    the conversation keeps the answer as shown, empty, not the U+FFFD its held-back bytes decode to."""
    lead = runtime.tokenizer.token_bytes().index(b"\xc3")
    fifo = tmp_path / "telemetry"
    reader = _telemetry_fifo(fifo)
    argv = _argv(tiny_bundle.path, "-n", "60", "--ignore-eos", "--stats", "--logit-bias", f"{lead}=100",
                 "--telemetry", str(fifo))
    with TerminalSession(argv, ENV, _default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"hello\n")
        _read_records(reader, 3)  # a few tokens in; 60 records cannot fit the pipe, so the answer is not over
        os.killpg(terminal.process.pid, signal.SIGINT)
        drain = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(reader, 65536), b"")],
                                 daemon=True)
        drain.start()
        terminal.read_until(lambda: b"answer stopped" in terminal.seen and terminal.text.rstrip().endswith(">"))
        terminal.type(b"what next\n")
        terminal.read_until(_at_prompt(terminal, 1))
        terminal.type(b"\x04")
        _finish(terminal)
        drain.join(timeout=60)
    os.close(reader)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    assert _stats_prompts(text)[1:] == [_prompt_tokens(runtime, [_user("hello"), _assistant(""), _user("what next")])], \
        text
