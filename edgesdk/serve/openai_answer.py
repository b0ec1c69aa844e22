"""The OpenAI-shaped answer of a chat or text completion, whole or as stream chunks, whatever carries it.

``edgesdk serve`` writes these bodies to HTTP (:mod:`edgesdk.serve.http_server`) and :class:`edgesdk.api.Model`
returns them to a Python caller, so one request gives one answer both ways: the same text, reasoning split, tool
calls, logprobs, usage and llama-server's ``timings``.

A streamed answer is built as OpenAI's Chat Completions streaming reference describes it (a first delta with the
role, text deltas, a last chunk with ``finish_reason``, then a usage chunk where ``stream_options.include_usage``
asks for one), with llama-server's additions: ``reasoning_content`` deltas for a thinking model, tool calls in
pieces as they settle (:class:`~edgesdk.serve.tools.AnswerStream`) and ``timings`` on the last event
(tools/server/server-task.cpp, ``to_json_oaicompat_chat_stream``).
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
    usage_chunk_body,
)
from edgesdk.serve.completion import Completer, Completion
from edgesdk.serve.reasoning import split_answer
from edgesdk.serve.tools import AnswerStream


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
        reasoning, text = split_answer(splitter, completion.text)
    body = completion_body(request, new_id(request.chat), model, text, completion.finish_reason,
                           completion.prompt_tokens, completion.completion_tokens, completion.cached_tokens,
                           completion.logprobs, reasoning=reasoning)
    return {**body, "timings": llama_native.timings(completion)}


class StreamedAnswer:
    """The chunks of one streamed answer, in order: :meth:`opening` when the request's turn comes, :meth:`piece` for
    each piece of text the completer settles, :meth:`closing` once it has ended. Every chunk carries one id."""

    def __init__(self, completer: Completer, request: CompletionRequest, model: str):
        self.request, self.model = request, model
        self.ident = new_id(request.chat)
        self._splitter = completer.reasoning_splitter(request)
        # an answer under tools is JSON: its call or its text goes out as it settles
        self._tools = AnswerStream(request.tools.structured) if request.tools is not None else None

    def opening(self) -> list[dict]:
        """The first delta of a chat answer: the assistant's role (nothing for a text completion)."""
        return [chunk_body(self.request, self.ident, self.model, None, role=True)] if self.request.chat else []

    def piece(self, text: str, logprobs: dict | None) -> list[dict]:
        """The chunks that settled text gives; a token whose text is held back (a tag's or a call's possible
        start) still gives its logprobs, in a chunk with an empty delta."""
        request, ident, model = self.request, self.ident, self.model
        if self._tools is not None:
            chunks = []
            for delta in self._tools.push(text) or ([{}] if logprobs else []):
                chunks.append(self._delta_chunk(delta, logprobs))
                logprobs = None
            return chunks
        if self._splitter is None:
            return [chunk_body(request, ident, model, text, logprobs=logprobs)]
        reasoning, content = self._splitter.push(text)
        if reasoning or content or logprobs:
            return [chunk_body(request, ident, model, content, logprobs=logprobs, reasoning=reasoning)]
        return []

    def closing(self, completion: Completion) -> list[dict]:
        """What the answer's end settles, the chunk with ``finish_reason``, the usage chunk where asked for;
        the last of them carries the ``timings``."""
        request, ident, model = self.request, self.ident, self.model
        if self._tools is not None:
            deltas, _, finish_reason = self._tools.finish(completion.finish_reason)
            chunks = [self._delta_chunk(delta) for delta in deltas]
            chunks.append(chunk_body(request, ident, model, None, finish_reason=finish_reason))
        else:
            chunks = [chunk_body(request, ident, model, None, finish_reason=completion.finish_reason)]
            reasoning, content = self._splitter.flush() if self._splitter is not None else ("", "")
            if reasoning or content:  # what was held back, once the answer has ended
                chunks.insert(0, chunk_body(request, ident, model, content, reasoning=reasoning))
        if request.include_usage:
            chunks.append(usage_chunk_body(request, ident, model, completion.prompt_tokens,
                                           completion.completion_tokens, completion.cached_tokens))
        chunks[-1] = {**chunks[-1], "timings": llama_native.timings(completion)}
        return chunks

    def _delta_chunk(self, delta: dict, logprobs: dict | None = None) -> dict:
        """A chunk of an answer under tools carrying ``delta`` (content, or a piece of a tool call)."""
        body = chunk_body(self.request, self.ident, self.model, None, logprobs=logprobs)
        body["choices"][0]["delta"] = delta
        return body
