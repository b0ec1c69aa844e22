"""``edgesdk run``'s interactive input and text handling (edgesdk/cli_interactive.py, edgesdk/runtime/text.py,
edgesdk/runtime/conversation.py) against llama-cli (llama.cpp common/console.cpp, tools/cli/cli.cpp,
tools/completion/completion.cpp), driven on real pseudo-terminals and pipes."""

from __future__ import annotations

import io
import os
import sys

import pytest

from edgesdk.cli_interactive import TERMINAL_LINE_BYTES, read_prompt
from edgesdk.errors import EdgeSDKError

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the Linux terminal's canonical line limit")


# --- a line longer than the terminal holds --------------------------------------------------------------------


class _TerminalStdin:
    """sys.stdin on the follower side of a new pseudo-terminal (canonical mode, as a shell leaves it, unless
    ``canonical`` is False); :meth:`paste` writes to it as a terminal emulator writes what is pasted."""

    def __init__(self, canonical: bool = True):
        import pty
        import termios

        self.master, self.follower = pty.openpty()
        if not canonical:
            attributes = termios.tcgetattr(self.follower)
            attributes[3] &= ~termios.ICANON
            termios.tcsetattr(self.follower, termios.TCSANOW, attributes)
        self.stdin = io.TextIOWrapper(io.FileIO(self.follower, "r", closefd=False), encoding="utf-8",
                                      errors="surrogateescape")

    def paste(self, data: bytes) -> None:
        for start in range(0, len(data), 512):  # in pieces, as a terminal emulator hands a paste over
            os.write(self.master, data[start:start + 512])

    def close(self) -> None:
        os.close(self.master)
        os.close(self.follower)


@pytest.fixture
def terminal(monkeypatch):
    made = []

    def make(canonical: bool = True) -> _TerminalStdin:
        terminal = _TerminalStdin(canonical)
        made.append(terminal)
        monkeypatch.setattr(sys, "stdin", terminal.stdin)
        return terminal

    yield make
    for terminal in made:
        terminal.close()


@linux_only
def test_a_line_the_terminal_cut_short_is_refused_not_answered_without_its_end(terminal):
    """A Linux terminal in canonical mode keeps 4095 bytes of a line and drops the rest (here mid-'é', which then
    read as a byte that is not UTF-8); llama-cli's console reads the terminal in non-canonical mode and gets the
    whole line. The cut line was answered as if it were the whole prompt."""
    tty = terminal()
    tty.paste("é".encode() * 2500 + b" what does this say?\n")
    with pytest.raises(EdgeSDKError) as refused:
        read_prompt()
    assert f"filled the terminal's line ({TERMINAL_LINE_BYTES:,} bytes)" in str(refused.value)
    assert "/read FILE" in refused.value.fix
    tty.paste(b"next question\n")  # the session reads on
    assert read_prompt() == "next question"


@linux_only
def test_a_long_line_is_read_whole_where_the_terminal_holds_it(terminal):
    """Not canonical (stty -icanon, as llama-cli sets it) the terminal has no line limit: nothing is refused."""
    tty = terminal(canonical=False)
    tty.paste(b"a" * 5000 + b"\n")
    assert read_prompt() == "a" * 5000


def test_a_long_piped_line_is_read_whole(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("b" * 9000 + "\n"))
    assert read_prompt() == "b" * 9000


@linux_only
def test_a_line_just_under_the_limit_is_read(terminal):
    tty = terminal()
    tty.paste(b"c" * (TERMINAL_LINE_BYTES - 1) + b"\n")
    assert read_prompt() == "c" * (TERMINAL_LINE_BYTES - 1)


@linux_only
def test_at_a_terminal_the_session_says_why_and_goes_on(tiny_bundle):
    """The whole run: the cut line is told by name and not answered; the next line is."""
    session = _refused_then_answered(tiny_bundle, [b"x" * min(512, 5000 - start) for start in range(0, 5000, 512)]
                                     + [b"\n"])
    assert "filled the terminal's line (4,095 bytes)" in session.text


def _refused_then_answered(tiny_bundle, refused: list[bytes]):
    """A terminal session that types ``refused`` (in pieces), waits for its error and the next prompt, then
    types a line that is answered and ends with Ctrl-D: the session, checked to have ended with exit 0, no
    traceback and one answered prompt."""
    from tests._utils.terminal import TerminalSession
    from tests.unit.test_cli_run_interactive37 import ENV, _argv, _default_signals, _finish, _stats_prompts

    with TerminalSession(_argv(tiny_bundle.path, "-n", "2", "--stats"), ENV, _default_signals) as session:
        session.read_until(lambda: b"> " in session.seen)
        for piece in refused:
            session.type(piece)
        session.read_until(lambda: b"error:" in session.seen and session.text.rstrip().endswith(">"))
        session.type(b"hello\n")
        session.read_until(lambda: _stats_prompts(session.text) and session.text.rstrip().endswith(">"))
        session.type(b"\x04")
        _finish(session)
    assert session.process.returncode == 0, session.text[-2000:]
    assert "Traceback" not in session.text, session.text[-2000:]
    assert len(_stats_prompts(session.text)) == 1, session.text[-2000:]
    return session


# --- /read with a name no path can hold -----------------------------------------------------------------------


def test_read_naming_a_nul_is_refused_by_name_not_a_traceback(tiny_bundle):
    """A NUL in /read's file name (Ctrl-@ at a terminal types one, and the terminal passes it on) made open()
    raise ValueError, which no handler took: a traceback, and at a terminal the end of the session."""
    from tests.unit.test_cli import assert_error, invoke

    result = invoke("run", tiny_bundle.path, "-n", 2, "--threads", 1, input="/read notes\x00.txt\nhello\n")
    assert_error(result, "/read 'notes\\x00.txt' names no file a path can name: it holds a NUL character")
    assert "Traceback" not in result.output


@linux_only
def test_read_naming_a_nul_at_a_terminal_leaves_the_session_going(tiny_bundle):
    session = _refused_then_answered(tiny_bundle, [b"/read a\x00b\n"])
    assert "holds a NUL character" in session.text
