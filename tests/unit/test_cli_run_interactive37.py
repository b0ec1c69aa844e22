"""``edgesdk run``'s interactive mode against llama-cli's conversation mode (llama.cpp tools/cli/cli.cpp and
common/console.cpp): every turn rendered over the whole conversation, ``/clear`` and ``/exit``, a line ending in
``\\`` continued on the next, Ctrl-C stopping an answer and, at the prompt, ending the session, and input that is
not UTF-8 refused by name. Driven as a user drives it: on a pseudo-terminal, or with piped stdin."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from tests._utils.signals import default_signals as _default_signals
from tests.unit.test_cli import assert_error, assert_ok, invoke

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals and pipe sizes (Linux)")



def _argv(bundle, *options) -> list[str]:
    return [sys.executable, "-m", "edgesdk", "run", str(bundle), "--threads", "1", *options]


ENV = {**os.environ, "EDGESDK_HUGE_PAGES": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def _prompt_tokens(runtime, messages: list[dict]) -> int:
    tokenizer = runtime.tokenizer
    return len(tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False))


def _answer(runtime, messages: list[dict], n: int) -> str:
    tokenizer = runtime.tokenizer
    ids = tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False)
    tokens, _ = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=n), tokenizer.eos_token_ids)
    return tokenizer.decode(tokens)


def _stats_prompts(text: str) -> list[int]:
    """The prompt sizes ``--stats`` reported, one per answered turn."""
    return [int(n) for n in re.findall(r"\[ort-cpu\] prompt (\d+) tok", text)]


def _finish(terminal) -> None:
    """Wait for the process to end and read what it left on the terminal (read_until stops at its end)."""
    import select

    terminal.process.wait(timeout=60)
    while select.select([terminal.master], [], [], 5)[0]:
        try:
            chunk = os.read(terminal.master, 4096)
        except OSError:  # EIO: the terminal's last holder has closed it
            break
        if not chunk:
            break
        terminal.seen.extend(chunk)


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_a_terminal_conversation_renders_every_turn_clears_and_goes_on_after_a_refused_line(tiny_bundle, runtime):
    """Each turn's prompt is the chat template over the whole conversation; an empty line does nothing; a line
    too long for the context is refused by name and the conversation goes on as it was; '/clear' forgets it;
    Ctrl-D at the prompt exits 0."""
    from tests._utils.terminal import TerminalSession

    first = _answer(runtime, [_user("hello there")], 4)
    with TerminalSession(_argv(tiny_bundle.path, "-n", "4", "--stats"), ENV, _default_signals) as terminal:
        def answered(count: int):
            return lambda: len(_stats_prompts(terminal.text)) >= count and terminal.text.rstrip().endswith(">")

        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"hello there\n")
        terminal.read_until(answered(1))
        terminal.type(b"\n")
        terminal.type(b"fox " * 300 + b"\n")
        terminal.read_until(lambda: b"error:" in terminal.seen and terminal.text.rstrip().endswith(">"))
        terminal.type(b"what next\n")
        terminal.read_until(answered(2))
        terminal.type(b"/clear\n")
        terminal.read_until(lambda: b"cleared" in terminal.seen)
        terminal.type(b"what next\n")
        terminal.read_until(answered(3))
        terminal.type(b"\x04")
        _finish(terminal)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    assert "Traceback" not in text
    assert re.search(r"error: the prompt has \d+ tokens; the bundle's max_context is 256", text), text
    assert _stats_prompts(text) == [
        _prompt_tokens(runtime, [_user("hello there")]),
        _prompt_tokens(runtime, [_user("hello there"), _assistant(first), _user("what next")]),
        _prompt_tokens(runtime, [_user("what next")]),
    ], text


def test_ctrl_c_at_the_prompt_ends_the_session_as_ctrl_d_does(tiny_bundle):
    """llama-cli's conversation mode leaves its loop on Ctrl-C at the prompt and exits 0; edgesdk's own hint
    after a stopped answer names Ctrl-C at the prompt as a way to end the session."""
    from tests._utils.terminal import TerminalSession

    with TerminalSession(_argv(tiny_bundle.path, "-n", "4"), ENV, _default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"half a line")
        terminal.read_until(lambda: b"half a line" in terminal.seen)
        os.killpg(terminal.process.pid, signal.SIGINT)  # what the terminal sends for Ctrl-C
        _finish(terminal)
    assert terminal.process.returncode == 0, terminal.text
    assert "Traceback" not in terminal.text
    assert "Aborted" not in terminal.text, terminal.text
    assert terminal.text.endswith("\n"), repr(terminal.text)  # the shell's prompt starts on a line of its own


def _stopped_while_writing(bundle, room: int, unbuffered: str, *options: str) -> tuple[str, list[int], str]:
    """Ask 'hello' at a terminal whose answer goes to a pipe with room for ``room`` more bytes, and press Ctrl-C
    once the answer has begun: an answer longer than ``room`` bytes cannot end before it, so Ctrl-C comes while
    the answer is being written. Then ask 'what next' and end with Ctrl-D. (the stopped answer as shown, the
    --stats prompt sizes, the terminal's text)."""
    import fcntl
    import struct
    import termios

    from tests._utils.terminal import TerminalSession

    class AnswerToPipe(TerminalSession):
        """stdin and stderr on the terminal, stdout to ``pipe``."""

        def __init__(self, argv: list[str], pipe: int):
            import pty

            self.master, follower = pty.openpty()
            self.process = subprocess.Popen(argv, env={**ENV, "PYTHONUNBUFFERED": unbuffered}, stdin=follower,
                                            stdout=pipe, stderr=follower, start_new_session=True,
                                            preexec_fn=_default_signals)
            os.close(follower)
            self.seen = bytearray()

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    filler = b"#" * (fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ) - room)
    os.write(write_end, filler)
    terminal = AnswerToPipe(_argv(bundle, "-n", "64", "--ignore-eos", "--stats", *options), write_end)
    process = terminal.process
    os.close(write_end)
    stdout = bytearray()

    def queued() -> int:
        return struct.unpack("i", fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0"))[0]

    def drain() -> None:
        while chunk := os.read(read_end, 65536):
            stdout.extend(chunk)

    with terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"hello\n")
        terminal.read_until(lambda: queued() > len(filler))  # the answer has begun and cannot end unread
        assert process.poll() is None, terminal.text
        os.killpg(process.pid, signal.SIGINT)
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        terminal.read_until(lambda: b"answer stopped" in terminal.seen and terminal.text.rstrip().endswith(">"))
        assert process.poll() is None, terminal.text  # the session goes on
        terminal.type(b"what next\n")
        terminal.read_until(lambda: len(_stats_prompts(terminal.text)) >= 1 and terminal.text.rstrip().endswith(">"))
        terminal.type(b"\x04")
        _finish(terminal)
        reader.join(timeout=60)
    os.close(read_end)
    assert process.returncode == 0, terminal.text
    assert "Traceback" not in terminal.text
    assert stdout.startswith(filler)
    return stdout[len(filler):].decode().split("\n")[0], _stats_prompts(terminal.text), terminal.text


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_ctrl_c_during_an_answer_stops_it_and_the_conversation_keeps_what_was_written(tiny_bundle, runtime,
                                                                                    unbuffered):
    """Ctrl-C while the answer (letters only, by the grammar) is written: the next prompt appears, and the next
    turn's prompt holds the stopped answer as it was shown. Unbuffered (PYTHONUNBUFFERED=1, as services and
    containers often run Python) the write Ctrl-C stopped was lost, and the conversation kept its piece anyway."""
    stopped, prompts, text = _stopped_while_writing(tiny_bundle.path, 8, unbuffered, "--grammar", "root ::= [a-z]+")
    assert re.fullmatch("[a-z]+", stopped), stopped
    # the stopped answer has its own --stats line first (stop: interrupted)
    assert prompts[1:] == [_prompt_tokens(runtime, [_user("hello"), _assistant(stopped), _user("what next")])], text


def test_bytes_not_utf8_typed_under_a_strict_utf8_locale_are_refused_by_name(tiny_bundle):
    """A board's en_GB.UTF-8 locale gives Python's stdin strict UTF-8 decoding (PYTHONIOENCODING stands in for
    it here): a Latin-1 'é' typed at the prompt is refused by name and the session goes on."""
    from tests._utils.terminal import TerminalSession

    env = {**ENV, "PYTHONIOENCODING": "utf-8:strict"}
    with TerminalSession(_argv(tiny_bundle.path, "-n", "2", "--stats"), env, _default_signals) as terminal:
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"caf\xe9\n")
        terminal.read_until(lambda: b"error:" in terminal.seen and terminal.text.rstrip().endswith(">"))
        terminal.type(b"hello\n")
        terminal.read_until(lambda: _stats_prompts(terminal.text) and terminal.text.rstrip().endswith(">"))
        terminal.type(b"\x04")
        _finish(terminal)
    assert terminal.process.returncode == 0, terminal.text
    assert "Traceback" not in terminal.text
    assert "error: the prompt is not valid UTF-8 (byte 0xe9 at character 3)" in terminal.text, terminal.text
    assert len(_stats_prompts(terminal.text)) == 1


def test_piped_bytes_not_utf8_are_refused_by_name_not_a_traceback(tiny_bundle):
    """Click's test runner decodes stdin strictly, as a UTF-8 locale other than C.UTF-8 does."""
    result = invoke("run", tiny_bundle.path, "-n", 2, "--threads", 1, input=b"caf\xe9\n")
    assert_error(result, "the prompt is not valid UTF-8 (byte 0xe9 at character 3)")


def test_a_trailing_backslash_continues_the_prompt_and_exit_ends_the_input(tiny_bundle, runtime):
    """llama-cli's console: a line ending in '\\' goes on with the next (the backslash dropped, the newline
    kept); '/exit' leaves before the lines after it."""
    result = invoke("run", tiny_bundle.path, "-n", 4, "--history", "--stats", "--threads", 1,
                    input="first line\\\nsecond line\n/exit\nnever asked\n")
    assert_ok(result)
    assert _stats_prompts(result.stderr) == [_prompt_tokens(runtime, [_user("first line\nsecond line")])]
    assert result.stdout == _answer(runtime, [_user("first line\nsecond line")], 4) + "\n"


def test_clear_without_a_conversation_is_not_a_prompt(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-n", 2, "--raw", "--stats", "--threads", 1,
                    input="hello\n/clear\nworld\n")
    assert_ok(result)
    assert len(_stats_prompts(result.stderr)) == 2
    assert "/clear does nothing" in result.stderr
