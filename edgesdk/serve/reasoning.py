"""A thinking model's reasoning apart from its answer: ``reasoning_content`` beside ``content``.

Models that think before they answer (Qwen3, DeepSeek-R1 and their distillations) write their
reasoning between ``<think>`` and ``</think>`` at the start of the answer, or, where the chat
template already opened the block in the prompt ("thinking forced open", Qwen3-Thinking-2507's
templates), from the first token up to ``</think>``. llama-server's ``--reasoning-format deepseek``
(its ``auto`` picks it for templates that think) returns that text as the message's
``reasoning_content`` and the rest as ``content``, and streams it as ``reasoning_content`` deltas;
clients built on it (its web UI, Open WebUI) show the two apart. ``none`` leaves the tags in
``content``. ``deepseek-legacy`` answers as ``deepseek`` but streams the block in the ``content`` deltas,
between its tags, as llama-server does (``reasoning_in_content``: common/chat-parser.cpp's
``try_parse_reasoning``; a block left open is closed where the answer ended at its end of generation, and stays
open where its token limit or a stop string cut it).

Following llama.cpp (common/chat.cpp, the DeepSeek-R1 parser): only a block at the start of the answer
counts (whitespace before it is dropped), the reasoning is stripped of the whitespace around it (an empty
block gives no ``reasoning_content``), whitespace after ``</think>`` is dropped, and a block that never
closes (the token limit came first) is all reasoning. Blocks that follow each other with only whitespace
between are all reasoning, their stripped texts joined (common/chat-parser.cpp, ``try_parse_reasoning``).
"""

from __future__ import annotations

import re

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("auto", "none", "deepseek", "deepseek-legacy")
# what llama.cpp's string_strip trims around reasoning and content (common/common.cpp: std::isspace in the C locale);
# Python's str.strip() also takes \x1c-\x1f, no-break and ideographic spaces, which a model may write as text
WHITESPACE = " \t\n\v\f\r"


def template_thinks(template_source: str | None) -> bool:
    """``auto``'s test, as llama.cpp's: the chat template writes a ``<think>`` block."""
    return template_source is not None and OPEN in template_source


def prompt_opens_thinking(prompt: str) -> bool:
    """The rendered prompt ends inside an open ``<think>`` block (the template opened it for the model)."""
    return re.search(re.escape(OPEN) + r"\s*$", prompt) is not None


def _held_back(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag``."""
    return max((n for n in range(1, len(tag)) if text.endswith(tag[:n])), default=0)


class ReasoningSplitter:
    """Splits an answer, streamed or whole, into (reasoning, content) pieces.

    :meth:`push` takes each new piece of text and returns what is settled of each; text that could
    still be part of a tag is held back until the next piece decides it, so a streamed answer splits
    as the whole one does.

    A block that follows a closed one with only whitespace between (``<think>a</think>\n<think>b</think>``) is
    reasoning too, each block stripped and their texts joined, as common/chat-parser.cpp's ``try_parse_reasoning``
    goes on after ``</think>`` and its whitespace while another ``<think>`` opens there; a ``<think>`` after other
    text is content.

    ``inline`` (deepseek-legacy's stream): the pieces come back as content alone, each block's text in it
    between ``<think>`` and ``</think>`` (a block with no text gives no tags, as ``try_parse_reasoning`` writes
    none for it)."""

    def __init__(self, opened: bool = False, inline: bool = False):
        # start -> reasoning -> after -> (reasoning again, for a block that follows) content, or start -> content
        self.state = "reasoning" if opened else "start"
        self.pending = ""
        self.inline = inline
        self.tagged = False  # inline: the open block's <think> is out (its text began), its </think> not yet
        self.reasoning_started = False  # some of the open block's text (not whitespace) is out
        # begun(): the start of a tag the client's text ended on (held in pending), the tag, and what has come of it
        self.owed, self.owed_tag, self.owed_seen = "", "", ""

    def push(self, text: str) -> tuple[str, str]:
        owed = self._owed(text)
        return self._shaped(_dropped(self._push(text), owed))

    def _owed(self, text: str) -> int:
        """How many of the client's characters (:meth:`begun`: the start of a tag its text ended on) the pieces of
        this push give out at their front: none while the answer's text may still complete the tag, nor once it
        did (the tag is read, none of it given out); all of them once it cannot, as the tag's start is text then."""
        if not self.owed:
            return 0
        self.owed_seen += text
        if len(self.owed_seen) < len(self.owed_tag) and self.owed_tag.startswith(self.owed_seen):
            return 0
        owed, self.owed = len(self.owed), ""
        return 0 if self.owed_seen.startswith(self.owed_tag) else owed

    def _shaped(self, pieces: list[tuple[str, str]], final: bool = False) -> tuple[str, str]:
        """(reasoning, content) of ``pieces`` (("reasoning", text), ("close", ""), ("content", text) in the answer's
        order), or with ``inline`` ("", content) with each block's reasoning in it between its tags."""
        if final and self.state == "reasoning":  # a block the answer's end leaves open closes there
            pieces = [*pieces, ("close", "")]
        if not self.inline:
            return ("".join(text for kind, text in pieces if kind == "reasoning"),
                    "".join(text for kind, text in pieces if kind == "content"))
        out = []
        for kind, text in pieces:
            if kind == "reasoning" and text:
                out.append(text if self.tagged else OPEN + text)
                self.tagged = True
            elif kind == "close":
                if self.tagged:
                    out.append(CLOSE)
                self.tagged = False
            elif kind == "content":
                out.append(text)
        return "", "".join(out)

    def _push(self, text: str) -> list[tuple[str, str]]:
        self.pending += text
        pieces = []
        if self.state == "start":
            stripped = self.pending.lstrip(WHITESPACE)
            if stripped.startswith(OPEN):
                self.state, self.pending = "reasoning", stripped[len(OPEN):]
            elif OPEN.startswith(stripped):  # nothing but whitespace, or the tag's start so far: wait
                return pieces
            else:
                self.state = "content"
        while self.state in ("reasoning", "after"):
            if self.state == "reasoning":
                end = self.pending.find(CLOSE)
                if end < 0:
                    # what could still be the tag's start waits, and so does trailing whitespace: llama.cpp strips
                    # the reasoning, so whitespace counts only once text follows it
                    keep = _held_back(self.pending, CLOSE)
                    settled = self.pending[: len(self.pending) - keep]
                    text = settled.rstrip(WHITESPACE)
                    self.pending = settled[len(text):] + self.pending[len(self.pending) - keep:]
                    pieces.append(("reasoning", self._reasoning_text(text)))
                    return pieces
                pieces += [("reasoning", self._reasoning_text(self.pending[:end].rstrip(WHITESPACE))), ("close", "")]
                self.pending, self.state = self.pending[end + len(CLOSE):], "after"
            # after </think>: its whitespace is dropped, and a <think> there opens another block
            self.pending = self.pending.lstrip(WHITESPACE)
            if self.pending.startswith(OPEN):
                self.pending, self.state, self.reasoning_started = self.pending[len(OPEN):], "reasoning", False
            elif OPEN.startswith(self.pending):  # nothing yet, or the tag's start so far: wait
                return pieces
            else:
                self.state = "content"
        pieces.append(("content", self.pending))
        self.pending = ""
        return pieces

    def _reasoning_text(self, text: str) -> str:
        """Reasoning text to hand out, its leading whitespace dropped until the block's first other character."""
        if not self.reasoning_started:
            text = text.lstrip(WHITESPACE)
            self.reasoning_started = bool(text)
        return text

    def begun(self, text: str) -> ReasoningSplitter:
        """Take the text of an answer the client began (a prefilled assistant message the answer goes on from),
        none of which comes back: where it leaves off (inside a ``<think>`` block, past it, or in plain content)
        decides what the answer's first text is. A text that ends on a tag's start (``<think>The fox</thi``, a
        continued answer whose tag the token limit split) has the answer's text decide the tag: ``nk>`` closes the
        block, as in the whole answer."""
        self.push(text)
        tag = CLOSE if self.state == "reasoning" else OPEN
        # what the splitter holds back of the client's text: whitespace (theirs, dropped) and a tag's start
        self.pending = self.pending[len(self.pending) - _held_back(self.pending, tag):]
        self.owed, self.owed_tag, self.owed_seen = self.pending, tag, self.pending
        self.tagged = self.state == "reasoning"  # the client's text opened the block: its <think> is theirs
        return self

    def flush(self, closed: bool | None = None) -> tuple[str, str]:
        """What is held back once the answer has ended: reasoning inside an unclosed block, else content.
        ``closed``: whether the answer ended at its end of generation (None: not told, read as ended, but for a cut
        tag, below). With ``inline``, a block left open gets its ``</think>`` only then: llama-server reads an answer
        cut by its token limit or a stop string as partial (tools/server/server-context.cpp, ``update_chat_msg``:
        ``is_partial`` unless it stopped at end-of-generation), and ``try_parse_reasoning`` closes an open block where
        the answer is not partial alone.

        A block whose text ends on the start of its ``</think>`` (``...abc</thi``) keeps that start where the answer
        ended at its end of generation (``closed``): common/chat-parser.cpp's ``try_find_literal`` takes a trailing
        prefix of the tag for the tag in a partial answer alone, so a whole one's block is its text up to the end,
        ``abc</thi``, and closed. A partial answer (not ``closed``: the limit or a stop string cut the tag) loses
        that start, its reasoning the text before it; the block so read is closed, so with ``inline`` it gets its
        ``</think>`` where the answer wrote some of that start (not the client's alone). Not told (None), the start
        is dropped, as Ollama's thinking parser holds it back and never gives it out."""
        owed, self.owed = len(self.owed), ""  # the client's tag start (begun) the answer never completed: theirs
        rest, self.pending = self.pending, ""
        if self.state == "reasoning":  # a block that never closed: its text so far, stripped like a closed one's
            cut_tag = 0 if closed else _held_back(rest, CLOSE)
            text = rest[: len(rest) - cut_tag].rstrip(WHITESPACE)
            return self._shaped(_dropped([("reasoning", self._reasoning_text(text))], owed),
                                final=closed is not False or cut_tag > owed)  # the answer's own text began the tag
        return "", rest[owed:]  # after </think>, what waits is the start of a <think> that never came: no whitespace


def _dropped(pieces: list[tuple[str, str]], count: int) -> list[tuple[str, str]]:
    """``pieces`` without the first ``count`` characters of their text (the client's, :meth:`ReasoningSplitter.begun`)."""
    kept = []
    for kind, text in pieces:
        cut = min(count, len(text))
        kept.append((kind, text[cut:]))
        count -= cut
    return kept


def split_answer(splitter: ReasoningSplitter, text: str, closed: bool | None = None) -> tuple[str, str]:
    """(reasoning, content) of a whole answer, through a fresh ``splitter``; ``closed`` as
    :meth:`ReasoningSplitter.flush` reads it."""
    reasoning, content = splitter.push(text)
    more_reasoning, more_content = splitter.flush(closed)
    return reasoning + more_reasoning, content + more_content
