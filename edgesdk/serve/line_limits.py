"""llama-server's two limits for code completion, ``n_indent`` and ``t_max_predict_ms`` (tools/server README,
"POST /completion"; applied in server-context.cpp ``process_token``), which llama.vscode and llama.vim send with
every ``/infill``:

- ``n_indent``: once the answer has a new line, each line after a new line must start with at least ``n_indent``
  spaces or tabs; the first that does not (a blank line too: its new line comes where text should) ends the
  answer, cut before that line's text (its new line and indentation kept), so a completion does not run on into
  the next function;
- ``t_max_predict_ms``: once generation has run that long since its first token, the next token whose text holds a
  new line ends the answer there.

Both end the answer as its token limit does (``stop_type`` ``limit``). As in llama-server, the checks run once per
token over the answer's text so far (here: the text handed out, which leaves out a stop string's beginning held
back) and a line is judged after the token that follows its new line, so with ``stream`` the start of the cut line
may already have been sent; the whole answer is cut.

llama-server scans the judged line's indentation in ``generated_text`` again on every token and looks for the next
new line from ``last_nl_pos``, which advances by one line a token. Here each token's text is read once as it comes:
every line after a new line keeps where it starts and where its first character other than a space or tab is, so a
token costs the same however long the answer is, with the same lines judged at the same tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Line:
    """A line after a new line: where it starts in the answer's text and where its first character other than a
    space or tab is (its text, or the new line of a blank line), None while only indentation came."""

    start: int
    text_at: int | None = None


@dataclass
class LineLimits:
    """The state of one answer's checks; :meth:`push` says where to end it."""

    n_indent: int = 0
    t_max_predict_ms: float = 0.0
    has_new_line: bool = False  # a previous token's text held a new line (llama-server's slot.has_new_line)
    last_line_start: int = 0  # where the line after the last new line found starts (slot.last_nl_pos)
    length: int = 0  # the answer's text so far, in characters
    _started: float | None = field(default=None, repr=False)
    _judged: _Line | None = field(default=None, repr=False)  # the line at last_line_start, once it is past 0
    _ahead: deque = field(default_factory=deque, repr=False)  # the lines after it, in order
    _last: _Line | None = field(default=None, repr=False)  # the answer's last line after a new line

    @property
    def active(self) -> bool:
        return self.n_indent > 0 or self.t_max_predict_ms > 0

    def push(self, new_text: str, now: float) -> int | None:
        """``new_text``: what this token added to the answer, ``now``: seconds (a monotonic clock). None to go on,
        else the length of the answer's text it keeps."""
        if self._started is None:
            self._started = now
        if self.n_indent > 0:
            self._read(new_text)
        self.length += len(new_text)
        if self.has_new_line and self.n_indent > 0:
            line = self._judged
            if line is not None and line.text_at is not None and line.text_at - line.start < self.n_indent:
                return line.text_at
            if self._ahead:  # llama-server's find('\n', last_nl_pos): the next line, one a token
                self._judged = self._ahead.popleft()
                self.last_line_start = self._judged.start
        if "\n" in new_text:
            self.has_new_line = True
            if self.t_max_predict_ms > 0 and (now - self._started) * 1e3 > self.t_max_predict_ms:
                return self.length
        return None

    def after_token(self, text: str, new_text: str, now: float) -> int | None:
        """:meth:`push` for a caller that holds the answer's text so far, ``text``, which ends with ``new_text``."""
        return self.push(new_text, now)

    def _read(self, new_text: str) -> None:
        """Note the lines ``new_text`` starts and where the last line's indentation ends."""
        for at, char in enumerate(new_text, start=self.length):
            line = self._last
            if line is not None and line.text_at is None and char not in " \t":
                line.text_at = at
            if char == "\n":
                self._last = _Line(at + 1)
                self._ahead.append(self._last)


__all__ = ["LineLimits"]
