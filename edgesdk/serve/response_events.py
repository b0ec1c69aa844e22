"""The answer of ``POST /v1/responses`` (edgesdk/serve/responses.py) in OpenAI's shapes: the response object and
its streamed events (OpenAI's API reference, "Responses" and "Streaming events"; the openai client's types are the
ground truth), written by one :class:`Output` for both, so the events assemble into the whole response.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from edgesdk.serve.api import ApiError
from edgesdk.serve.llama_native import ended_at_eos
from edgesdk.serve.reasoning import WHITESPACE
from edgesdk.serve.tools import AnswerStream, TokenSpans

if TYPE_CHECKING:
    from edgesdk.serve.responses import ResponsesRequest
def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(completion, reasoning_tokens: int = 0) -> dict:
    return {"input_tokens": completion.prompt_tokens,
            "input_tokens_details": {"cached_tokens": completion.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": completion.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": completion.prompt_tokens + completion.completion_tokens}


class Output:
    """One response's output items and events, streamed or whole: the items a whole answer holds are built by
    the same steps as a stream's events, so ``responses.stream(...)`` assembles the answer without ``stream``.

    ``count_tokens``: a text's token count (the reasoning tokens of ``usage``, counted on the reasoning's text up
    to its closing tag).

    Log-probabilities (``include`` ``"message.output_text.logprobs"``) come as the chat route computes them (its
    ``logprobs.content`` entries, handed with the text their tokens start in): the message's ``output_text`` part
    carries them whole (``token``, ``logprob``, ``bytes``, ``top_logprobs``), each ``response.output_text.delta``
    those it brings and ``response.output_text.done`` all of them, in the events' shape (``token``, ``logprob``,
    ``top_logprobs`` of ``token`` and ``logprob``: the openai client's ``ResponseTextDeltaEvent``). The tokens of
    a thinking model's reasoning, before the message's text, are the reasoning item's and are left out. Under tools
    the answer is JSON around a call or a text (edgesdk/serve/tools.py), which the client never sees: a text
    answer's message lists the tokens of its text alone (:meth:`AnswerStream.shown`), as the chat route's
    ``logprobs.content`` does, whole and streamed alike, and a call has none."""

    def __init__(self, asked: ResponsesRequest, model: str, temperature: float, top_p: float, splitter=None,
                 count_tokens=None, think_opened: bool | None = None):
        self.asked, self.model, self.splitter, self.count_tokens = asked, model, splitter, count_tokens
        self.temperature, self.top_p = temperature, top_p
        self.ident, self.created = new_response_id(), int(time.time())
        self.items: list[dict] = []  # finished items
        self.sequence = 0
        self.kind: str | None = None  # the open item's kind ("reasoning", "message"), None when none is open
        self.item: dict | None = None
        self.text = ""
        self.logprobs: list[dict] = []  # the open message's output_text logprobs so far
        # (where its token starts in the answer, where it ends, entry) not yet given out
        self.waiting: list[tuple[int, int, dict]] = []
        self.spans = TokenSpans()  # where each token starts and ends in the answer's text
        self.pushed = 0  # characters of the answer's text pushed so far
        self.finished: dict | None = None  # under tools, the message's fields once the answer has ended
        # an answer under tools is JSON: its call or its text goes out as it settles (tools.AnswerStream)
        tools = asked.request.tools
        # (``think_opened``: the answer is its <think> block from its first character, Completer.tools_think_opened)
        self.answer = AnswerStream(tools.structured, think_opened) if tools is not None else None

    # -------------------------------------------------------------- the response object
    def response(self, status: str, completion=None) -> dict:
        asked = self.asked
        body = {"id": self.ident, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if status == "completed" else None, "error": None,
                "incomplete_details": _incomplete_details(completion) if status == "incomplete" else None,
                "instructions": asked.instructions, "max_output_tokens": asked.max_output_tokens,
                "model": self.model, "output": list(self.items) if completion is not None else [],
                "parallel_tool_calls": asked.parallel_tool_calls,
                "previous_response_id": asked.previous_response_id,
                "reasoning": asked.reasoning, "temperature": self.temperature, "text": asked.text,
                "tool_choice": asked.tool_choice, "tools": asked.tools, "top_p": self.top_p,
                "truncation": asked.truncation, "usage": None, "metadata": asked.metadata, "background": False,
                "top_logprobs": asked.top_logprobs, **asked.echoed_ids}
        if completion is not None:
            body["usage"] = usage(completion, self._reasoning_tokens(completion))
        return body

    def _reasoning_tokens(self, completion) -> int:
        """The tokens of the answer's reasoning: its text before the message's text, which is the answer's end
        (reasoning.py splits off the blocks at its start, several where they follow each other with only whitespace
        between, and the whitespace after them), up to the last block's ``</think>``; all of it where no message
        follows (a block the limit cut). What follows the reasoning is the exact tail of ``completion.text``: the
        message's text, or under tools the answer's JSON after the block (:attr:`AnswerStream.text`; its call or
        its text reshape that JSON, so the items' text is not the tail there)."""
        if self.count_tokens is None or not any(item["type"] == "reasoning" for item in self.items):
            return 0
        said = self.answer.text if self.answer is not None else \
            "".join(part["text"] for item in self.items if item["type"] == "message" for part in item["content"])
        thought = completion.text[:len(completion.text) - len(said)].rstrip(WHITESPACE)
        return min(self.count_tokens(thought), completion.completion_tokens)

    # -------------------------------------------------------------- events
    def _event(self, kind: str, **fields) -> tuple[str, dict]:
        event = (kind, {"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return event

    def start(self) -> list:
        """The stream's first events."""
        return [self._event("response.created", response=self.response("in_progress")),
                self._event("response.in_progress", response=self.response("in_progress"))]

    def error(self, error: ApiError) -> tuple[str, dict]:
        """An error after the stream's start, as OpenAI's ``error`` event."""
        return self._event("error", code=error.code or error.kind, message=error.message, param=error.param)

    def push(self, text: str, logprobs: dict | None = None) -> list:
        """A piece of the answer's text, with the chat logprobs object of the tokens that start in it. Under tools
        the piece goes through :class:`AnswerStream`: what it settles of a call or a text goes out; a text
        answer's message carries the tokens of its text, not those of the JSON it is read out of, as the chat
        route's message does, and those of a thinking model's block before it are the reasoning item's."""
        if logprobs:
            entries = logprobs["content"]
            self.waiting += self.spans(entries)
        self.pushed += len(text)
        if self.answer is not None:
            return self._answer_events(self.answer.push(text))
        if self.splitter is None:
            return self._pieces("", text)
        return self._pieces(*self.splitter.push(text))

    def _given_logprobs(self) -> list[dict]:
        """The waiting entries of the message's tokens, taken: the message's text is the end of the answer's (what
        reasoning.py splits off comes before it, with the whitespace after ``</think>``), so a token ending before
        it is the reasoning's; one that starts in that whitespace and ends in the text (`` It`` after ``</think>``)
        is the message's, whose text begins with its word, as the chat route's ``logprobs.content`` holds it. Under
        tools see :meth:`_shown_logprobs`."""
        if self.answer is not None:
            given = self._shown_logprobs()
        else:
            begins = self.pushed - len(self.text)
            given = [entry for start, end, entry in self.waiting if start >= begins or end > begins]
            self.waiting = []
        self.logprobs += given
        return _event_logprobs(given)

    def _shown_logprobs(self) -> list[dict]:
        """Under tools, the waiting entries of the tokens now known to be the text's, in order, taken: the end of the
        answer's text is its JSON (:attr:`AnswerStream.text`), a token ending before it is the reasoning's, and of
        the JSON's tokens those that hold some of a text answer's value are the message's (:meth:`AnswerStream.shown`,
        the chat route's reading), none of a call's. A token not yet known to be either waits, with those after it;
        once the answer has ended (:attr:`finished`) every one is known."""
        begins = self.pushed - len(self.answer.text)
        given = []
        while self.waiting:
            start, end, entry = self.waiting[0]
            shown = self.answer.shown(start, end, self.pushed, self.finished)
            if shown is None:
                break
            self.waiting.pop(0)
            if shown and end > begins:
                given.append(entry)
        return given

    def _pieces(self, reasoning: str, content: str) -> list:
        events = []
        for kind, text in (("reasoning", reasoning), ("message", content)):
            if not text:
                continue
            if self.kind != kind:
                events += self._close("completed") + self._open(kind)
            self.text += text
            delta = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
            extra = {"logprobs": self._given_logprobs()} if kind == "message" else {}
            events.append(self._event(delta, item_id=self.item["id"], output_index=len(self.items), content_index=0,
                                      delta=text, **extra))
        return events

    def _answer_events(self, deltas: list[dict]) -> list:
        """The events of :class:`AnswerStream`'s chat deltas: a thinking model's reasoning before its JSON as the
        reasoning item's pieces (as an answer without tools gives it), a text's pieces as the message's, a call's
        first delta (its id and name) as a function_call item added, its arguments' pieces as
        ``response.function_call_arguments.delta`` events."""
        events = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                events += self._pieces(delta["reasoning_content"], "")
            if delta.get("content"):
                events += self._pieces("", delta["content"])
            for piece in delta.get("tool_calls") or []:
                function = piece["function"]
                if "name" in function:
                    events += self._close("completed") + self._open_call(piece["id"], function["name"])
                if function["arguments"]:
                    self.item["arguments"] += function["arguments"]
                    events.append(self._event("response.function_call_arguments.delta", item_id=self.item["id"],
                                              output_index=len(self.items), delta=function["arguments"]))
        return events

    def _open_call(self, call_id: str, name: str) -> list:
        self.kind, self.text, self.logprobs = "function_call", "", []
        self.item = {"id": item_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call_id,
                     "name": name, "arguments": ""}
        return [self._event("response.output_item.added", output_index=len(self.items), item=dict(self.item))]

    def _open(self, kind: str) -> list:
        self.kind, self.text, self.logprobs = kind, "", []
        if kind == "message":
            self.item = {"id": item_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                         "content": []}
        else:
            self.item = {"id": item_id("rs"), "type": "reasoning", "summary": [], "content": [],
                         "status": "in_progress"}
        index = len(self.items)
        return [self._event("response.output_item.added", output_index=index, item=dict(self.item, content=[])),
                self._event("response.content_part.added", item_id=self.item["id"], output_index=index,
                            content_index=0, part=self._part(""))]

    def _part(self, text: str) -> dict:
        if self.kind == "message":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(self.logprobs)}
        return {"type": "reasoning_text", "text": text}

    def _close(self, status: str) -> list:
        if self.kind is None:
            return []
        index = len(self.items)
        if self.kind == "function_call":  # its arguments whole (as written so far, where the answer was cut)
            self.item = {**self.item, "status": status}
            # the function's name beside its arguments, as OpenAI's API sends it (its reference's
            # ResponseFunctionCallArgumentsDoneEvent; some clients' types lack it and keep it as an extra field)
            events = [self._event("response.function_call_arguments.done", item_id=self.item["id"], output_index=index,
                                  name=self.item["name"], arguments=self.item["arguments"]),
                      self._event("response.output_item.done", output_index=index, item=self.item)]
            self.items.append(self.item)
            self.kind, self.item = None, None
            return events
        part = self._part(self.text)
        done = "response.output_text.done" if self.kind == "message" else "response.reasoning_text.done"
        extra = {"logprobs": _event_logprobs(self.logprobs)} if self.kind == "message" else {}
        events = [self._event(done, item_id=self.item["id"], output_index=index, content_index=0, text=self.text,
                              **extra),
                  self._event("response.content_part.done", item_id=self.item["id"], output_index=index,
                              content_index=0, part=part)]
        self.item = {**self.item, "status": status, "content": [part]}
        events.append(self._event("response.output_item.done", output_index=index, item=self.item))
        self.items.append(self.item)
        self.kind, self.item = None, None
        return events

    def end(self, completion) -> list:
        """The stream's last events: what the answer's end settles, the open item closed, then the response.

        The response is ``incomplete`` where the answer was cut: by ``max_output_tokens``, or under tools by a stop
        string (llama-server's ``stop``) while a call was open, before the answer's JSON was whole. That call keeps
        its arguments as written so far (a prefix of JSON), ``incomplete`` as one the limit cuts, so a client runs
        no call with cut arguments: the chat route answers such a cut ``finish_reason`` "stop" rather than
        "tool_calls", and the Messages route ``stop_reason`` "stop_sequence" rather than "tool_use"."""
        finish = completion.finish_reason
        events = []
        if self.answer is not None:
            # "tool_calls" where the calls are whole; the message's fields settle which tokens are its text's
            deltas, self.finished, finish = self.answer.finish(completion.finish_reason)
            events += self._answer_events(deltas)
        elif self.splitter is not None:
            # a partial closing tag stays in the reasoning when the answer ended at end-of-generation (llama.cpp)
            events += self._pieces(*self.splitter.flush(closed=ended_at_eos(completion)))
        if self.kind is None and not self.items:
            events += self._open("message")  # an answer with no text still has its message, as OpenAI's
        if self.kind == "message" and self.waiting:  # tokens that made no text (the chat route's last logprobs)
            given = self._given_logprobs()
            if given:
                events.append(self._event("response.output_text.delta", item_id=self.item["id"],
                                          output_index=len(self.items), content_index=0, delta="", logprobs=given))
        cut = completion.finish_reason == "length" or (self.kind == "function_call" and finish != "tool_calls")
        status = "incomplete" if cut else "completed"
        events += self._close(status)
        name = "response.completed" if status == "completed" else "response.incomplete"
        return events + [self._event(name, response=self.response(status, completion))]

    def whole(self, completion) -> dict:
        """The response to a request without ``stream``: the stream's steps, their events dropped, the response its
        last event carries."""
        self.push(completion.text, completion.logprobs)
        return self.end(completion)[-1][1]["response"]


def _incomplete_details(completion) -> dict:
    """Why an answer is incomplete: ``max_output_tokens`` where its token limit cut it; a reason of none of OpenAI's
    (``null``, which the openai client's ``IncompleteDetails`` takes) where a stop string cut a call (OpenAI's
    Responses API has no ``stop``, and its reasons name none of its kind)."""
    return {"reason": "max_output_tokens" if completion.finish_reason == "length" else None}


def _event_logprobs(entries: list[dict]) -> list[dict]:
    """Chat logprobs entries in the stream events' shape (the openai client's ``ResponseTextDeltaEvent.Logprob``:
    ``token``, ``logprob`` and ``top_logprobs`` of ``token`` and ``logprob``, no ``bytes``)."""
    return [{"token": entry["token"], "logprob": entry["logprob"],
             "top_logprobs": [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]]}
            for entry in entries]
