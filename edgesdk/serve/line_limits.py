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
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LineLimits:
    """The state of one answer's checks; :meth:`after_token` says where to end it."""

    n_indent: int = 0
    t_max_predict_ms: float = 0.0
    has_new_line: bool = False  # a previous token's text held a new line (llama-server's slot.has_new_line)
    last_line_start: int = 0  # where the line after the last new line found starts (slot.last_nl_pos)
    _started: float | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.n_indent > 0 or self.t_max_predict_ms > 0

    def after_token(self, text: str, new_text: str, now: float) -> int | None:
        """``text``: the answer so far, ``new_text``: what this token added to it, ``now``: seconds (a monotonic
        clock). None to go on, else the length of ``text`` the answer keeps."""
        if self._started is None:
            self._started = now
        if self.has_new_line and self.n_indent > 0:
            if self.last_line_start > 0:
                at = self.last_line_start
                while at < len(text) and text[at] in " \t":
                    at += 1
                if at < len(text) and at - self.last_line_start < self.n_indent:
                    return at
            found = text.find("\n", self.last_line_start)
            if found != -1:
                self.last_line_start = found + 1
        if "\n" in new_text:
            self.has_new_line = True
            if self.t_max_predict_ms > 0 and (now - self._started) * 1e3 > self.t_max_predict_ms:
                return len(text)
        return None


__all__ = ["LineLimits"]
