"""The OpenAI-shaped answer of a chat or text completion, whole or as stream chunks, whatever carries it.

``edgesdk serve`` writes these bodies to HTTP (:mod:`edgesdk.serve.http_server`) and :class:`edgesdk.api.Model`
returns them to a Python caller, so one request gives one answer both ways: the same text, reasoning split, tool
calls, logprobs, usage and llama-server's ``timings``.

A streamed answer is built as OpenAI's Chat Completions streaming reference describes it (a first delta with the
role, text deltas, a last chunk with ``finish_reason``, then a usage chunk where ``stream_options.include_usage``
asks for one), with llama-server's additions: ``reasoning_content`` deltas for a thinking model, tool calls in
pieces as they settle (:class:`~edgesdk.serve.tools.AnswerStream`) and ``timings`` on the last event
(tools/server/server-task.cpp, ``to_json_oaicompat_chat_stream``).

Under tools the answer is JSON around a call or a text (edgesdk/serve/tools.py), which the client never sees: its
``logprobs.content`` holds the tokens of what the message says (a text answer's, a thinking model's reasoning), not
the JSON's, as OpenAI's holds the tokens of the message's content alone (none for a call: ``content`` null), whole
and streamed alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edgesdk.serve import llama_native
from edgesdk.serve.api import (
    ApiError,
    CompletionRequest,
    chunk_body,
    completion_body,
    new_id,
    usage,
    usage_chunk_body,
)
from edgesdk.serve.completion import Completer, Completion
from edgesdk.serve.reasoning import split_answer
from edgesdk.serve.tools import AnswerStream, TokenSpans


def served_model_name(manifest: dict) -> str:
    """``<model>-<target>``, e.g. smollm2-135m-rpi5: the id answers carry, the same across redeploys of one model."""
    source = Path(str(manifest["model"]["before"]["source"]).rstrip("/")).name
    return f"{source.removesuffix('.gguf')}-{manifest['target']['name']}"


def model_not_found(name: str, served: Sequence[str] = ()) -> ApiError:
    """OpenAI's 404 for a model it does not have, in its error shape (``param`` "model", ``code``
    "model_not_found"), its message followed by the models ``served`` here."""
    after = f"; this server serves {', '.join(served)} (GET /v1/models lists them)" if served else ""
    return ApiError(404, f"The model '{name}' does not exist{after}", param="model", code="model_not_found")


def whole_answer(completer: Completer, request: CompletionRequest, model: str, completion: Completion) -> dict:
    """The body of a request without ``stream``: a thinking model's reasoning apart from its text, a tool call
    parsed from an answer under tools, and llama-server's ``timings``."""
    splitter, reasoning, text = completer.reasoning_splitter(request), "", completion.text
    if splitter is not None:
        # a tag's start at the end stays in the reasoning where the model ended the answer (llama-server's whole parse)
        reasoning, text = split_answer(splitter, completion.text, closed=llama_native.ended_at_eos(completion))
    body = completion_body(request, new_id(request.chat), model, text, completion.finish_reason,
                           completion.prompt_tokens, completion.completion_tokens, completion.cached_tokens,
                           completion.logprobs, reasoning=reasoning,
                           think_opened=completer.tools_think_opened(request))
    if request.tools is not None and _entries(completion.logprobs) is not None:
        answer = AnswerStream(request.tools.structured, completer.tools_think_opened(request))
        answer.push(completion.text)
        _, fields, _ = answer.finish(completion.finish_reason, note=False)  # the body's message read it already
        placed = TokenSpans()(_entries(completion.logprobs))
        body["choices"][0]["logprobs"] = _message_logprobs(
            [entry for start, end, entry in placed if answer.shown(start, end, len(completion.text), fields)],
            fields)
    return {**body, "timings": llama_native.timings(completion)}


def _entries(logprobs: object) -> list | None:
    """The token entries of a chat answer's ``logprobs`` object (None: none asked for)."""
    return logprobs.get("content") if isinstance(logprobs, dict) else None


def _message_logprobs(entries: list[dict], fields: dict) -> dict:
    """The ``logprobs`` of an answer under tools: the entries of the tokens its message says, ``content`` null
    where the message's is (a call) and says nothing else."""
    return {"content": entries if entries or fields.get("content") is not None else None, "refusal": None}


def whole_answers(completer: Completer, requests: Sequence[CompletionRequest], model: str,
                  completions: Sequence[Completion]) -> dict:
    """The body of a text request of several prompts without ``stream``: one choice per prompt in their order, each
    with its ``index`` (OpenAI's "Create completion": ``prompt`` "can be ... an array of strings, array of tokens, or
    array of token arrays"), under one id, ``usage`` summed over the prompts, as OpenAI counts a request. llama-server
    (tools/server/server-context.cpp, ``handle_completions_impl``) gathers the choices the same way but keeps the
    first prompt's ``usage``; the ``timings`` here are the first prompt's, as there. One prompt: :func:`whole_answer`."""
    bodies = [whole_answer(completer, request, model, completion)
              for request, completion in zip(requests, completions, strict=True)]
    body = bodies[0]
    if len(bodies) == 1:
        return body
    choices = [{**each["choices"][0], "index": index} for index, each in enumerate(bodies)]
    return {**body, "choices": choices, "usage": summed_usage(completions)}


def summed_usage(completions: Sequence[Completion]) -> dict:
    """OpenAI's ``usage`` of a request of several prompts: each count summed over them."""
    return usage(sum(c.prompt_tokens for c in completions), sum(c.completion_tokens for c in completions),
                 sum(c.cached_tokens for c in completions))


class StreamedAnswer:
    """The chunks of one streamed answer, in order: :meth:`opening` when the request's turn comes, :meth:`piece` for
    each piece of text the completer settles, :meth:`closing` once it has ended. Every chunk carries one id.

    The answer to one of a text request's several prompts carries that prompt's ``index`` in its choices and the
    request's ``ident`` (one id for the whole stream, as OpenAI's and llama-server's chunks share theirs); its
    :meth:`closing` then leaves the usage chunk to :meth:`usage_chunk`, sent once after the last prompt's."""

    def __init__(self, completer: Completer, request: CompletionRequest, model: str, index: int = 0,
                 ident: str | None = None):
        self.request, self.model, self.index = request, model, index
        self.ident = new_id(request.chat) if ident is None else ident
        self._splitter = completer.reasoning_splitter(request)
        # an answer under tools is JSON: its call or its text goes out as it settles
        self._tools = (AnswerStream(request.tools.structured, completer.tools_think_opened(request))
                       if request.tools is not None else None)
        # under tools, the answer's tokens not yet known to be the message's or the JSON's (AnswerStream.shown)
        self._spans, self._waiting, self._pushed = TokenSpans(), [], 0

    def opening(self) -> list[dict]:
        """The first delta of a chat answer: the assistant's role (nothing for a text completion)."""
        if not self.request.chat:
            return []
        return [chunk_body(self.request, self.ident, self.model, None, role=True, index=self.index)]

    def progress(self, progress: dict, timings: dict | None = None) -> list[dict]:
        """The chunk of ``return_progress`` after a step of the prompt's prefill: its ``prompt_progress`` (and the
        ``timings`` so far with ``timings_per_token``) on a chat's assistant-role delta or a text completion's empty
        text, as llama-server's progress partial result (server-task.cpp ``to_json_oaicompat_chat``: the role delta
        where ``is_progress``; ``to_json_oaicompat``: ``text`` "")."""
        body = chunk_body(self.request, self.ident, self.model, None if self.request.chat else "",
                          role=self.request.chat, index=self.index)
        if timings is not None:
            body["timings"] = timings
        body["prompt_progress"] = progress
        return [body]

    def piece(self, text: str, logprobs: dict | None) -> list[dict]:
        """The chunks that settled text gives; a token whose text is held back (a tag's or a call's possible
        start) still gives its logprobs, in a chunk with an empty delta. Under tools a token's logprobs go out once
        it is known to be the message's (:meth:`AnswerStream.shown`), in order; the JSON's never do."""
        request, ident, model = self.request, self.ident, self.model
        if self._tools is not None:
            self._waiting += self._spans(_entries(logprobs) or [])
            self._pushed += len(text)
            deltas = self._tools.push(text)
            return self._tool_chunks(deltas, self._settled_logprobs())
        if self._splitter is None:
            return [chunk_body(request, ident, model, text, logprobs=logprobs, index=self.index)]
        reasoning, content = self._splitter.push(text)
        if reasoning or content or logprobs:
            return [chunk_body(request, ident, model, content, logprobs=logprobs, reasoning=reasoning,
                               index=self.index)]
        return []

    def closing(self, completion: Completion, with_usage: bool = True) -> list[dict]:
        """What the answer's end settles, the chunk with ``finish_reason``, the usage chunk where asked for (and
        ``with_usage``: false for each of several prompts, whose request sends one :meth:`usage_chunk` at its end);
        the last of them carries the ``timings``."""
        request, ident, model = self.request, self.ident, self.model
        if self._tools is not None:
            deltas, fields, finish_reason = self._tools.finish(completion.finish_reason)
            chunks = self._tool_chunks(deltas, self._settled_logprobs(fields))
            chunks.append(chunk_body(request, ident, model, None, finish_reason=finish_reason, index=self.index))
        else:
            chunks = [chunk_body(request, ident, model, None, finish_reason=completion.finish_reason,
                                 index=self.index)]
            # deepseek-legacy's open block is closed in the content where the model ended the answer, not where its
            # token limit or a stop string cut it (llama-server's partial parse)
            ended = llama_native.ended_at_eos(completion)
            reasoning, content = self._splitter.flush(closed=ended) if self._splitter is not None else ("", "")
            if reasoning or content:  # what was held back, once the answer has ended
                chunks.insert(0, chunk_body(request, ident, model, content, reasoning=reasoning, index=self.index))
        if request.include_usage and with_usage:
            chunks.append(usage_chunk_body(request, ident, model, completion.prompt_tokens,
                                           completion.completion_tokens, completion.cached_tokens))
        chunks[-1] = {**chunks[-1], "timings": llama_native.timings(completion)}
        return chunks

    def usage_chunk(self, completions: Sequence[Completion]) -> list[dict]:
        """The one usage chunk of a request of several prompts where ``stream_options.include_usage`` asks for it
        (OpenAI: "an additional chunk ... before the data: [DONE] message", the usage "for the entire request"):
        the counts summed over the prompts. llama-server puts each prompt's own ``usage`` on its last chunk instead."""
        if not self.request.include_usage:
            return []
        total = summed_usage(completions)
        return [usage_chunk_body(self.request, self.ident, self.model, total["prompt_tokens"],
                                 total["completion_tokens"], total["prompt_tokens_details"]["cached_tokens"])]

    def _settled_logprobs(self, fields: dict | None = None) -> dict | None:
        """The logprobs object of the waiting tokens now known to be the message's, in order (those known to be the
        JSON's dropped; ``fields``: the finished message's, which settles every token), or None for none."""
        kept = []
        while self._waiting:
            start, end, entry = self._waiting[0]
            shown = self._tools.shown(start, end, self._pushed, fields)
            if shown is None:
                break
            self._waiting.pop(0)
            if shown:
                kept.append(entry)
        return {"content": kept, "refusal": None} if kept else None

    def _tool_chunks(self, deltas: list[dict], logprobs: dict | None) -> list[dict]:
        """The chunks of ``deltas`` of an answer under tools, ``logprobs`` on the first (on an empty delta of its
        own where there is none)."""
        chunks = []
        for delta in deltas or ([{}] if logprobs else []):
            chunks.append(self._delta_chunk(delta, logprobs))
            logprobs = None
        return chunks

    def _delta_chunk(self, delta: dict, logprobs: dict | None = None) -> dict:
        """A chunk of an answer under tools carrying ``delta`` (content, or a piece of a tool call)."""
        body = chunk_body(self.request, self.ident, self.model, None, logprobs=logprobs, index=self.index)
        body["choices"][0]["delta"] = delta
        return body
