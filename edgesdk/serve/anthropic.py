"""Anthropic's Messages API on the same completer: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

llama-server and TensorRT Edge-LLM's server answer Anthropic's API beside OpenAI's, so clients
written for it (Anthropic's SDKs, Claude Code-style tools) can talk to a board. A request is
translated into the OpenAI chat request it means and checked there, so every field takes the same
values and is refused the same way (the error naming Anthropic's field); the answer is written in
Anthropic's shapes (Anthropic API reference, "Messages" and "Streaming Messages"):

* request: ``model``, ``max_tokens`` (required, >= 0: 0 evaluates the prompt into the cache and generates nothing,
  Anthropic's cache pre-warming), ``messages`` of ``user`` / ``assistant`` turns (consecutive turns of one role
  combined into one, as Anthropic combines them)
  whose content is a string or ``text``, ``tool_use`` and ``tool_result`` blocks (an assistant turn's
  ``thinking`` and ``redacted_thinking`` blocks, an answer's as a client sends it back, are left out, as
  Anthropic strips earlier turns' thinking from the context), ``system``
  (a string or text blocks; the ``cch`` stamp of Claude Code's billing header, new in every request, written as
  ``f``s as llama-server writes it, so the prompt cache reuses the prompt past it: :func:`_unstamped`),
  ``stop_sequences``, ``temperature`` (0 to 1, Anthropic's range), ``top_p``, ``top_k``,
  ``stream``, ``tools`` (``name``, ``description``, ``input_schema``), ``tool_choice``
  (``auto``, ``any``, ``tool``, ``none``; with ``disable_parallel_tool_use`` false an answer may make several
  calls, the chat route's ``parallel_tool_calls``; true or absent, one: llama-server's Messages route passes no
  parallel setting on, and the list form lets a small model go on calling, see :func:`_parallel`), and
  llama-server's ``chat_template_kwargs`` (extra chat-template variables, as on the chat route); ``metadata`` and ``service_tier`` change nothing.
  ``thinking`` (``enabled`` with its ``budget_tokens``, ``adaptive``, ``between_tools``, or ``disabled``) sets the
  chat template's ``enable_thinking`` (Qwen3's switch) unless ``chat_template_kwargs`` sets it; the budget is not
  enforced, but must be below ``max_tokens``, as Anthropic requires (:func:`_budget_within`). ``output_config.format``
  (or the beta's top-level ``output_format``) ``{"type": "json_schema", "schema": ...}`` is the chat route's
  ``response_format`` JSON schema, ``output_config.effort`` changes nothing (:func:`_output_format`); a
  ``tool_result`` with ``is_error`` true is its text led by ``Error: `` (:func:`_failed`). Images, documents, server
  tools, ``mcp_servers`` and ``container`` (:func:`_hosted`) are refused by name, and so is a tool without its
  ``input_schema``.
* answer: ``{"id": "msg_...", "type": "message", "role": "assistant", "content": [text or
  tool_use blocks (one per call, each with its own ``id``), after a ``thinking`` block where a thinking model's reasoning is split off
  (edgesdk/serve/reasoning.py; under ``tools`` too, the block it thinks before its call: :class:`ToolStream`; its
  ``signature`` empty)], "stop_reason": "end_turn" | "max_tokens" | "stop_sequence" | "tool_use" |
  "model_context_window_exceeded",
  "stop_sequence", "usage": {"input_tokens", "output_tokens", "cache_read_input_tokens"}}``.
* stream: the events ``message_start``, ``content_block_start``, ``ping``,
  ``content_block_delta`` (``text_delta``, ``thinking_delta`` in a thinking block, or ``input_json_delta`` pieces of
  a call's input as they are written: its ``tool_use`` block starts with ``input`` {} once the name is whole, and
  each call of an answer of several is its own block, under its own ``index``, "Streaming Messages"), ``content_block_stop``, ``message_delta`` (stop reason, the whole usage) and
  ``message_stop``; an error after the start is an ``error`` event.
* a call cut by ``max_tokens`` (or a stop sequence) mid-input is the ``tool_use`` block written so far, its input
  the object its JSON so far holds (:func:`partial_input`), with the stop reason of the cut (``max_tokens``:
  Anthropic's "Handling stop reasons", a response cut by the limit may end in an incomplete tool_use block); whole
  and streamed alike.
* errors: ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's error types; a prompt past the
  context led by Anthropic's words for it, ``prompt is too long: N tokens > M maximum`` (:func:`too_long`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import replace

from edgesdk.serve.api import (
    ApiError,
    CompletionRequest,
    _object,
    finite_number,
    join_text_parts,
    json_shown,
    parse_chat_request,
    utf8_field,
)
from edgesdk.serve.tools import AnswerStream, ToolError, arguments_text

ROUTES = ("/messages", "/messages/count_tokens")
ROLES = ("user", "assistant")
# An OpenAI tool's fields -> the Anthropic tool's (tools[0].function.parameters is tools[0].input_schema)
TOOL_FIELD = re.compile(r"(tools\[\d+\])\.function\.(name|description|parameters)")
TOOL_FIELDS = {"name": "name", "description": "description", "parameters": "input_schema"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
# output_config.effort's values (Anthropic SDK's OutputConfigParam): taken, and change nothing here
EFFORTS = ("low", "medium", "high", "xhigh", "max")
# Anthropic's fields that ask for a service of its own, refused where given: (what it is, what to do instead)
HOSTED = {"mcp_servers": ("remote MCP servers for Anthropic's MCP connector to call", "this server has no MCP "
                          "connector: run the MCP client yourself and give its tools in 'tools' as client tools, "
                          "answering each tool_use block with a tool_result"),
          "container": ("a code-execution container to reuse", "this server runs no code container: run the code "
                        "yourself behind a client tool in 'tools'")}
# Claude Code's first system text: "x-anthropic-billing-header: cc_version=...; cc_entrypoint=cli; cch=a5145;", its
# cch a stamp that changes with every request (the text after its ";" is kept)
BILLING_CCH = re.compile(r"(x-anthropic-billing-header:[^\n]*?cch=)([^;\s]+)(?=;)")


def error_body(error: ApiError) -> dict:
    """An error in Anthropic's shape (its type from the status: 400 invalid_request_error, 503 overloaded_error, which
    the HTTP server sends as Anthropic's 529 status...). A
    prompt past the model's context (``context_length_exceeded``) is worded as Anthropic words it (:func:`too_long`)."""
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    if error.code == "context_length_exceeded":
        counts = getattr(error, "context", None)  # (tokens, limit, positions): serve/api.py, context_refusal
        message = too_long(error.message, counts[:2] if counts else None)
    else:
        message = error.message
    return {"type": "error", "error": {"type": kind, "message": message}}


def too_long(message: str, counts: tuple[int, int] | None = None) -> str:
    """A refusal of a prompt past the context, led by Anthropic's words for it: ``prompt is too long: N tokens > M
    maximum`` (its 400 ``invalid_request_error``, as Claude Code shows it: anthropics/claude-code issue 12186), then
    this server's own message with its fix. Agent clients written for Anthropic's API (Claude Code, and the agent
    loops that take its wording) read "prompt is too long" as the context overflowing and compact or trim the
    conversation; worded otherwise, they show the error and stop. ``counts`` are N and M, the prompt's tokens and the
    context the refusal carries (its ``context``), not read back out of its text, whose wording is OpenAI's."""
    if counts is None:
        return f"prompt is too long: {message}"
    return f"prompt is too long: {counts[0]} tokens > {counts[1]} maximum; {message}"


def model_not_found(name: str, served: list[str]) -> ApiError:
    """Anthropic's 404 ``not_found_error`` for a model it does not have (its message: ``model: NAME``), naming the
    models served here."""
    return ApiError(404, f"model: {name} (this server serves {', '.join(served)}; GET /v1/models lists them)",
                    param="model", code="model_not_found")


def parse_messages_request(body: object, counting: bool = False) -> CompletionRequest:
    """``POST /v1/messages``: the request as the OpenAI chat request it means, checked there. The
    stop sequences are set after that check: OpenAI's ``stop`` takes at most 4, Anthropic's
    ``stop_sequences`` any number (llama-server's takes them all too). ``counting``: the body is count_tokens',
    which takes no ``max_tokens`` (the caller puts a stand-in), so the thinking budget is not held against it."""
    chat = chat_body(body, counting)
    stops = chat.pop("stop", ())
    schema_field = chat.pop("schema_field", None)  # output_config.format or output_format, as the client named it
    try:
        request = parse_chat_request(chat)
    except ApiError as exc:
        if exc.param is not None and (match := TOOL_FIELD.fullmatch(exc.param)):
            field = f"{match[1]}.{TOOL_FIELDS[match[2]]}"
            exc.message, exc.param = exc.message.replace(exc.param, field), field
        elif schema_field is not None and exc.param == "response_format":
            # the schema's own fault ("response_format: $.properties..."): named at the schema the client sent
            field = f"{schema_field}.schema" if exc.message.startswith("response_format: ") else schema_field
            exc.message, exc.param = exc.message.replace("response_format", field, 1), field
        raise
    if schema_field is not None:  # a schema the answer breaks is refused naming the client's field
        request = replace(request, schema_param=schema_field)
    if body["max_tokens"] == 0:  # checked with 1 above: the prompt evaluated into the cache, nothing generated
        request = replace(request, max_tokens=0)
    return replace(request, stop=stops) if stops else request


def chat_body(body: object, counting: bool = False) -> dict:
    """The OpenAI chat body an Anthropic Messages body means (``counting``: :func:`parse_messages_request`)."""
    body = _object(body)
    if body.get("max_tokens") is None:
        raise ApiError(400, "'max_tokens' is required: the most tokens the answer may have", param="max_tokens")
    limit = _max_tokens(body["max_tokens"])
    thinking = _thinking(body.get("thinking"))
    if limit == 0 and (body.get("stream") is True or thinking):
        raise ApiError(400, f"'max_tokens' 0 (the prompt evaluated into the cache, nothing generated) takes no "
                       f"{'stream' if body.get('stream') is True else 'extended thinking'}: send 'max_tokens' >= 1 "
                       "for an answer", param="max_tokens")
    if not counting:
        _budget_within(body.get("thinking"), limit)
    _temperature(body.get("temperature"))
    _top_k(body.get("top_k"))
    _hosted(body)
    messages = _system(body.get("system"))
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise ApiError(400, "'messages' must be a non-empty array of {\"role\": \"user\" or \"assistant\", "
                       "\"content\"} objects", param="messages")
    # the tool_use ids of the previous message: the latest assistant turn, with the assistant turns right before it
    # (Anthropic combines consecutive turns of one role into one message)
    offered, spoken = [], False  # and whether an assistant turn came before
    for index, turn in enumerate(turns):
        converted = _turn(turn, index)
        if turn["role"] == "assistant":
            calls = [call["id"] for message in converted for call in message.get("tool_calls") or ()]
            offered = [*offered, *calls] if index and turns[index - 1]["role"] == "assistant" else calls
            spoken = True
        else:
            _answered(turn["content"], index, offered, spoken)
        for message in converted:
            previous = messages[-1] if messages else None
            if message["role"] in ROLES and previous is not None and previous["role"] == message["role"]:
                # Anthropic combines consecutive turns of one role into one turn; chat templates that require
                # the roles to alternate (Llama 2's, Mistral's) would refuse them apart
                messages[-1] = _combined(previous, message)
            else:
                messages.append(message)
    chat = {"messages": messages, "max_tokens": max(limit, 1), "stream": body.get("stream", False)}
    # chat_template_kwargs: llama-server's Messages route passes them on too (enable_thinking false for Qwen3)
    for field in ("temperature", "top_p", "top_k", "chat_template_kwargs"):
        if field in body:
            chat[field] = body[field]
    kwargs = {} if chat.get("chat_template_kwargs") is None else chat["chat_template_kwargs"]  # null: none given
    if thinking is not None and isinstance(kwargs, dict):
        # extended thinking on or off is the template's enable_thinking (Qwen3's), unless the request sets it itself
        chat["chat_template_kwargs"] = {"enable_thinking": thinking, **kwargs}
    if body.get("stop_sequences") is not None:
        chat["stop"] = _stop_sequences(body["stop_sequences"])
    # {}, "" or false are no array either: refused, as the chat route refuses them, not read as no tools
    tools = None if body.get("tools") is None else _list(body["tools"], "tools")
    parallel = _parallel(body.get("tool_choice"))  # checked with tools or without, as Anthropic checks it
    if tools:
        chat["tools"] = [_tool(tool, index) for index, tool in enumerate(tools)]
        chat["parallel_tool_calls"] = parallel
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"], bool(tools))
    output = _output_format(body)
    if output is not None:
        chat["schema_field"], schema = output
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return chat


def _answered(content: object, index: int, offered: list, answered: bool) -> None:
    """A user turn's ``tool_result`` blocks must answer a ``tool_use`` block of the previous message (``offered``,
    its ids; ``answered``: whether an assistant message came before, else there is none): refused here, where the
    client's own indices are known, in Anthropic's words (``messages.1.content.0: unexpected `tool_use_id` ...``),
    as Anthropic's API refuses it with a 400 invalid_request_error, not later by the chat route in OpenAI's field
    names at the converted message's index. A result of a call made turns before, or one with no call before it
    (the first message, an assistant message that made none), was taken silently: the model read a tool's answer
    to nothing it had asked."""
    if not isinstance(content, list):
        return
    for number, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "tool_result" and block["tool_use_id"] not in offered:
            shown = json.dumps(block["tool_use_id"], ensure_ascii=False)[:80]
            previous = (f"its tool_use ids: {', '.join(json.dumps(i, ensure_ascii=False)[:80] for i in offered)}"
                        if offered else "it has no tool_use block" if answered else
                        "no assistant message comes before this one")
            raise ApiError(400, f"messages.{index}.content.{number}: unexpected `tool_use_id` found in `tool_result` "
                           f"blocks: {shown}. Each `tool_result` block must have a corresponding `tool_use` block in "
                           f"the previous message ({previous}); send the id of a tool_use block of the assistant "
                           "message right before it, or send the result as text",
                           param=f"messages[{index}].content[{number}].tool_use_id")


def _hosted(body: dict) -> None:
    """``mcp_servers`` and ``container`` ask Anthropic to run something on its side (remote MCP servers its MCP
    connector calls, a code-execution container); none runs here, so a non-empty value is refused by name, not
    answered as if its tools or files were there. The refusal describes the value without quoting it: an MCP
    server carries its ``authorization_token``, which must not come back in the 400 or go into the server's log."""
    for field, (what, instead) in HOSTED.items():
        if body.get(field) not in (None, [], "", {}):
            raise ApiError(400, f"'{field}' ({what}) is not served here, got {_described(body[field])}: {instead}; "
                           f"or leave '{field}' out", param=field)


def _described(value: object) -> str:
    """A hosted field's value as its shape alone: how many MCP servers and their names, a container's JSON type
    and its object's field names; no other field's value (a token, a URL with credentials) is shown."""
    if isinstance(value, list):
        names = [server["name"] for server in value if isinstance(server, dict) and isinstance(server.get("name"), str)]
        named = f" (names {', '.join(json.dumps(name, ensure_ascii=False)[:80] for name in names)})" if names else ""
        return f"{len(value)} MCP server{'' if len(value) == 1 else 's'}{named}"
    if isinstance(value, dict):
        return f"an object with the fields {', '.join(json.dumps(str(key))[:80] for key in value)}"
    return {str: "a string (a container id)", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "a JSON value")


def _output_format(body: dict) -> tuple[str, object] | None:
    """Structured outputs: ``output_config.format`` ``{"type": "json_schema", "schema": S}`` (Anthropic's
    "Structured outputs"; its SDK's ``messages.parse(output_format=...)`` sends it so), or the top-level
    ``output_format`` of the same shape that its ``structured-outputs-2025-11-13`` beta took, as (the field, S):
    the answer then follows S as the chat route's ``response_format`` json_schema makes it. ``output_config.effort``
    (low to max) is taken and changes nothing: a model here spends no more or less on an answer by it."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise ApiError(400, f"'output_config' must be an object ({{\"format\": ..., \"effort\": ...}}), got "
                       f"{json_shown(config)}", param="output_config")
    config = config or {}
    effort = config.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise ApiError(400, f"'output_config.effort' must be one of {', '.join(EFFORTS)}, got {json_shown(effort)}",
                       param="output_config.effort")
    given = [(field, value) for field, value in (("output_config.format", config.get("format")),
                                                 ("output_format", body.get("output_format"))) if value is not None]
    if len(given) > 1:
        raise ApiError(400, "both 'output_config.format' and 'output_format' (its beta name) give an output format; "
                       "send 'output_config.format' alone", param="output_format")
    if not given:
        return None
    field, value = given[0]
    kind = value.get("type") if isinstance(value, dict) else None
    if kind != "json_schema" or not isinstance(value.get("schema"), dict):
        raise ApiError(400, f"'{field}' must be {{\"type\": \"json_schema\", \"schema\": {{...}}}} (the JSON schema "
                       f"the answer follows), got {json_shown(value)}", param=field)
    return field, value["schema"]


def _parallel(choice: object) -> bool:
    """Whether an answer may make several calls (each its own ``tool_use`` block): where ``tool_choice``'s
    ``disable_parallel_tool_use`` (auto, any and tool take it) is false. Absent, one call, as llama-server's Messages
    route answers (server_chat_convert_anthropic_to_oai passes no parallel_tool_calls on), where Anthropic's default
    is several: a constrained answer in the list form lets a small model go on calling (SmolLM2-135M added an unasked
    second call to every one of 5 requests and ran one to max_tokens with 10 calls)."""
    value = choice.get("disable_parallel_tool_use") if isinstance(choice, dict) else None
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'tool_choice.disable_parallel_tool_use' must be true (one tool_use block at most) or "
                       f"false (several may come), got {json_shown(value)}", param="tool_choice.disable_parallel_tool_use")
    return value is False


def _thinking(value: object) -> bool | None:
    """``thinking``: ``{"type": "enabled", "budget_tokens": N}``, ``{"type": "adaptive"}`` or ``{"type":
    "between_tools"}`` (True), or ``{"type": "disabled"}`` (False), None when absent. Anthropic's ``thinking``
    takes these four (its SDK's ``ThinkingConfigParam``; "adaptive", the model choosing when and how much to think,
    is the one Claude Opus 4.7 and later accept, and what clients send for them). The budget is checked as Anthropic
    states it (a whole number >= 1024; 2048.0 is 2048, as ``max_tokens`` and ``top_k`` take a whole float) but not
    enforced: a model thinks until it closes its block, and ``max_tokens`` bounds the whole answer."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return False
    if kind in ("adaptive", "between_tools"):
        return True
    budget = value.get("budget_tokens") if isinstance(value, dict) else None
    whole = isinstance(budget, int) or (isinstance(budget, float) and budget.is_integer())  # not inf, not NaN
    if kind != "enabled" or isinstance(budget, bool) or not whole or budget < 1024:
        raise ApiError(400, f"'thinking' must be {{\"type\": \"enabled\", \"budget_tokens\": N}} with N >= 1024, "
                       f"{{\"type\": \"adaptive\"}}, {{\"type\": \"between_tools\"}} or {{\"type\": \"disabled\"}}; "
                       f"got {json_shown(value)}", param="thinking")
    return True


def _budget_within(thinking: object, limit: int) -> None:
    """Anthropic refuses an ``enabled`` thinking budget that is not below ``max_tokens`` (400 invalid_request_error,
    "`max_tokens` must be greater than `thinking.budget_tokens`": its "Extended thinking" guide, the budget is
    part of the answer's tokens, so an answer of max_tokens leaves it no room). Its exception, a budget past
    max_tokens over all the thinking blocks of one turn, is interleaved thinking (the
    ``interleaved-thinking-2025-05-14`` beta), which is not served here: an answer has one thinking block, before
    its text or tool calls."""
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) and thinking.get("type") == "enabled" else None
    if budget is None or limit > budget:
        return
    budget = int(budget)
    lower = f", a 'budget_tokens' from 1024 to {limit - 1}" if limit > 1024 else ""
    raise ApiError(400, f"'max_tokens' {limit} must be greater than 'thinking.budget_tokens' {budget}: the thinking "
                   f"budget is part of the answer's tokens; send 'max_tokens' of at least {budget + 1}{lower}, or "
                   "thinking {\"type\": \"adaptive\"}, which takes no budget", param="max_tokens")


def _combined(previous: dict, message: dict) -> dict:
    """Two consecutive messages of one role as the one turn Anthropic makes of them ("Consecutive user or
    assistant turns in your request will be combined into a single turn", Messages API, ``messages``): their
    texts joined by a blank line (a text left empty, as an assistant turn of thinking alone, adds none), an
    assistant's tool calls kept, in order (an assistant's text then its tool_use in the next turn is one turn
    that writes and then calls)."""
    text = "\n\n".join(part for part in (previous.get("content"), message.get("content")) if part)
    calls = [*previous.get("tool_calls", ()), *message.get("tool_calls", ())]
    if not calls:
        return {**previous, "content": text}
    return {"role": previous["role"], "content": text or None, "tool_calls": calls}


def _max_tokens(value: object) -> int:
    """``max_tokens``: a whole number >= 0 (Anthropic's minimum; 0 pre-warms the prompt cache: the prompt is
    processed, no answer generated, and takes no stream or extended thinking, Anthropic's "Prompt caching",
    pre-warming the cache). No -1: the chat route's "no limit but the context" is llama-server's, not
    Anthropic's, which requires a limit."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # not inf, not NaN
    if isinstance(value, bool) or not whole or value < 0:
        raise ApiError(400, f"'max_tokens' must be a whole number >= 0: the most tokens the answer may have (0: the "
                       f"prompt evaluated into the cache, nothing generated), got {json_shown(value)}", param="max_tokens")
    return int(value)


def _temperature(value: object) -> None:
    """``temperature``: Anthropic's ranges from 0.0 to 1.0 (Messages API, ``temperature``), where the chat route's
    takes any finite number; a larger one is refused as Anthropic refuses it, not sampled hotter than any
    Anthropic client meant, and so is any other value but a number in that range (null: the default), with
    Anthropic's range named, not the chat route's."""
    if value is not None and not (finite_number(value) and 0 <= value <= 1):
        raise ApiError(400, f"'temperature' must be a number in [0, 1] (Anthropic's range), got {json_shown(value)}; "
                       "send a number from 0 to 1, or leave it out", param="temperature")


def _top_k(value: object) -> None:
    """``top_k``: Anthropic's is a whole number >= 0 (Messages API, ``top_k``); below 0 is refused as Anthropic
    refuses it, where llama-server's routes read it as the sampler off, and so is any other value but a whole
    number (null: the default; 40.0 is 40), without the chat route's "0 or below: off"."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # not inf, not NaN
    if value is not None and (isinstance(value, bool) or not whole or value < 0):
        raise ApiError(400, f"'top_k' must be a whole number >= 0 (Anthropic's range), got {json_shown(value)}; send 0 "
                       "or more, or leave it out", param="top_k")


def _stop_sequences(value: object) -> tuple[str, ...]:
    """``stop_sequences``: an array of strings, as many as the client likes (empty ones end nothing)."""
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise ApiError(400, f"'stop_sequences' must be an array of strings, got {json_shown(value)}",
                       param="stop_sequences")
    for index, stop in enumerate(stops):
        _check_text(stop, f"stop_sequences[{index}]")
    return tuple(stop for stop in stops if stop)


def _check_text(text: str, where: str) -> str:
    """``text`` where it is UTF-8, else a 400 naming the Anthropic field it came in (the chat request it is
    translated into numbers its messages otherwise: a system prompt or a tool result is one more)."""
    return utf8_field(text, where)


def _list(value: object, param: str) -> list:
    if not isinstance(value, list):
        raise ApiError(400, f"'{param}' must be an array, got {json_shown(value)}", param=param)
    return value


def _system(system: object) -> list[dict]:
    """The system message; none for no system prompt, also given as "" or [] (a template that puts a default
    system prompt where there is none, as SmolLM2's, then puts it, as for a request without 'system')."""
    if system is None or isinstance(system, str):
        return [{"role": "system", "content": _unstamped(_check_text(system, "system"))}] if system else []
    if not isinstance(system, list):
        raise ApiError(400, f"'system' must be a string or an array of text blocks ([{{\"type\": \"text\", "
                       f"\"text\": ...}}]), got {json_shown(system)}", param="system")
    blocks = system
    for index, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise ApiError(400, f"system[{index}] must be a text block {{\"type\": \"text\", \"text\": ...}}, got "
                           f"{json_shown(block)}", param=f"system[{index}]")
        _check_text(block["text"], f"system[{index}].text")
    # joined as they are, as llama-server's Messages route joins them
    text = "".join(_unstamped(block["text"]) for block in blocks)
    return [{"role": "system", "content": text}] if text else []


def _unstamped(text: str) -> str:
    """A system text with the ``cch`` stamp of Claude Code's billing header (``x-anthropic-billing-header:
    cc_version=...; cc_entrypoint=cli; cch=a5145;``, the first text of every request it sends) written as ``f``s of
    the same length, as llama-server's Messages route writes it (tools/server, ``normalize_anthropic_billing_header``,
    ggml-org/llama.cpp PR 21793): the stamp changes with every request, so left as sent the prompt cache could reuse
    nothing past it and every turn evaluated the whole system prompt and conversation again. Any other text, and a
    header without a ``cch=...;``, is left as it is."""
    if not text.startswith("x-anthropic-billing-header:"):
        return text
    return BILLING_CCH.sub(lambda match: match[1] + "f" * len(match[2]), text, count=1)


def _turn(turn: object, index: int) -> list[dict]:
    """One Anthropic turn as OpenAI messages: tool results become ``tool`` messages, tool uses ``tool_calls``."""
    param = f"messages[{index}]"
    if not isinstance(turn, dict) or turn.get("role") not in ROLES:
        role = turn.get("role") if isinstance(turn, dict) else turn
        raise ApiError(400, f"{param}.role must be \"user\" or \"assistant\", got {json_shown(role)} (the system prompt "
                       "goes in 'system')", param=f"{param}.role")
    role, content = turn["role"], turn.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": _check_text(content, f"{param}.content")}]
    if not isinstance(content, list):
        raise ApiError(400, f"{param}.content must be a string or an array of content blocks, got {json_shown(content)}",
                       param=f"{param}.content")
    texts, calls, results = [], [], []
    for number, block in enumerate(content):
        where = f"{param}.content[{number}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_check_text(_block_text(block, where), f"{where}.text"))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise ApiError(400, f"{where} must carry the call's string 'id' and 'name'", param=where)
            arguments = {} if block.get("input") is None else block["input"]
            if not isinstance(arguments, dict):  # Anthropic: a tool_use block's input is an object
                raise ApiError(400, f"{where}.input must be the call's arguments as an object, got "
                               f"{json_shown(arguments)}", param=f"{where}.input")
            try:  # written as the chat route writes the call, refused where nested too deeply to write
                text = arguments_text(arguments, f"{where}.input")
            except ToolError as exc:
                raise ApiError(400, exc.message, param=exc.param) from exc
            for value, field in ((block["id"], "id"), (block["name"], "name"), (text, "input")):
                utf8_field(value, f"{where}.{field}")  # named as the client sent it, not as the chat route reads it
            calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": text}})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # an answer's own reasoning sent back: Anthropic strips earlier turns' thinking from the context
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise ApiError(400, f"{where}.tool_use_id must be the string id of the tool_use block it answers, got "
                               f"{json_shown(block.get('tool_use_id'))}", param=f"{where}.tool_use_id")
            utf8_field(block["tool_use_id"], f"{where}.tool_use_id")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _failed(block.get("is_error"), _result_text(block.get("content"), where), where)})
        elif kind is None:
            raise ApiError(400, f"{where} must be a content block object with its \"type\" ({{\"type\": \"text\", "
                           f"\"text\": ...}}), got {json_shown(block)}", param=where)
        else:
            raise ApiError(400, f"{where} is a {json_shown(kind)} block in a {role} turn; this server reads text, "
                           "an assistant's tool_use and thinking and a user's tool_result blocks", param=where)
    # a turn's text blocks are its message's text parts, joined as on the chat route (llama-server's
    # server_chat_convert_anthropic_to_oai passes them on as OpenAI text parts)
    text = join_text_parts(texts)
    messages = results + ([{"role": role, "content": text}] if texts or not (calls or results) else [])
    if calls:
        messages = [{"role": "assistant", "content": text or None, "tool_calls": calls}]
    return messages


def _failed(is_error: object, text: str, where: str) -> str:
    """A tool result's ``text`` led by ``Error: `` where its ``is_error`` is true, so the model reads the call as
    failed (Anthropic's ``is_error``: the tool could not run, its content says why); in the text, which every chat
    template carries whatever its tool message looks like. A result that succeeded (false or absent) is its text."""
    if is_error is not None and not isinstance(is_error, bool):
        raise ApiError(400, f"{where}.is_error must be true (the tool call failed; its content says why) or false, "
                       f"got {json_shown(is_error)}", param=f"{where}.is_error")
    if not is_error:
        return text
    return f"Error: {text}" if text else "Error"


def _block_text(block: dict, where: str) -> str:
    """A ``text`` block's ``text``, which must be a string."""
    text = block.get("text")
    if not isinstance(text, str):
        raise ApiError(400, f"{where}.text must be the text block's text, a string, got {json_shown(text)}",
                       param=f"{where}.text")
    return text


def _result_text(content: object, where: str) -> str:
    """A ``tool_result`` block's content as one text: a string, or its text blocks, each refused by its own index
    where it is not one (or its text not UTF-8)."""
    if content is None or isinstance(content, str):
        return _check_text(content or "", f"{where}.content")
    texts = []
    for number, block in enumerate(_list(content, f"{where}.content")):
        part = f"{where}.content[{number}]"
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise ApiError(400, f"{part} must be a text block {{\"type\": \"text\", \"text\": ...}}, got "
                           f"{json_shown(block)}; a tool result here is text (send an image's or a document's content "
                           "as text)", param=part)
        texts.append(_check_text(block["text"], f"{part}.text"))
    return "".join(texts)  # joined as they are, as llama-server's Messages route joins a tool result's text blocks


def _tool(tool: object, index: int) -> dict:
    if not isinstance(tool, dict) or (tool.get("type") not in (None, "custom")):
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise ApiError(400, f"tools[{index}] is a {json_shown(kind)} tool; this server calls client tools "
                       "({\"name\", \"description\", \"input_schema\"}) only", param=f"tools[{index}]")
    if tool.get("input_schema") is None:  # Anthropic: 400 "Field required"; the chat route would take it as no parameters
        raise ApiError(400, f"tools[{index}].input_schema: Field required: the JSON schema of the tool's input "
                       "({\"type\": \"object\", \"properties\": {...}}; {\"type\": \"object\"} for a tool that takes none)",
                       param=f"tools[{index}].input_schema")
    return {"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description"),
                                             "parameters": tool.get("input_schema")}}


def _tool_choice(choice: object, tools: bool) -> object:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind in ("any", "tool") and not tools:
        raise ApiError(400, f"'tool_choice' {json_shown(choice)} needs 'tools' to choose from", param="tool_choice")
    if kind == "any":
        return "required"
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise ApiError(400, f"'tool_choice' {{\"type\": \"tool\"}} must name the tool to call ({{\"type\": \"tool\", "
                           f"\"name\": ...}}), got {json_shown(choice)}", param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, f"'tool_choice' must be {{\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}}, got "
                   f"{json_shown(choice)}", param="tool_choice")


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def content_blocks(request: CompletionRequest, text: str, finish_reason: str,
                   think_opened: bool | None = None) -> tuple[list[dict], str]:
    """The answer's content blocks and its finish reason ("tool_calls" where a tool was called): under tools the
    blocks its stream builds (:class:`ToolStream`), a call cut short kept as written so far."""
    if request.tools is None:
        return [{"type": "text", "text": text}], finish_reason
    stream = ToolStream(think_opened)
    stream.push(text)
    _, finish_reason = stream.close(finish_reason)
    if stream.too_deep is not None:
        raise too_deep_call(*stream.too_deep, "a tool_use block's input", 'send "stream": true, whose '
                            "input_json_delta events carry the input as its JSON text")
    return stream.blocks, finish_reason


# The levels of JSON an answer writes around a call's input (Anthropic's message: content, the block; Ollama's
# object: message, tool_calls, the call, function), with room for the frames of the server that writes the answer.
INPUT_ENVELOPE = 64


def call_input(arguments: str, whole: bool) -> dict | None:
    """A call's ``arguments`` (JSON text, as :class:`AnswerStream` gives them out) as the object an answer carries:
    read whole (``whole``: the call ended) or as far as its JSON goes (:func:`partial_input`, a call cut short).
    None where they are nested deeper than Python's JSON reads, or writes inside an answer (arrays or objects in
    one another, which a parameter the tool's schema leaves free lets the model write): the chat route gives such a
    call's arguments as their text, which no answer carrying them as an object can."""
    try:
        value = json.loads(arguments) if whole else partial_input(arguments)
        json.dumps(_nested(value, INPUT_ENVELOPE), ensure_ascii=False)
    except RecursionError:
        return None
    return value


def _nested(value: object, depth: int) -> object:
    """``value`` inside ``depth`` arrays."""
    for _ in range(depth):
        value = [value]
    return value


def nesting(text: str) -> int:
    """How many arrays or objects deep the JSON ``text`` goes (read without recursion, strings skipped)."""
    depth = deepest = 0
    quoted = escaped = False
    for char in text:
        if quoted:
            quoted, escaped = (escaped or char != '"'), (not escaped and char == "\\")
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def too_deep_call(name: str, arguments: str, carrier: str, fix: str) -> ApiError:
    """The error of an answer whose call of ``name`` has ``arguments`` that :func:`call_input` cannot give as
    ``carrier``, the object the route's answer holds them in; ``fix``: how else the client gets the call."""
    return ApiError(500, f"the model called the tool {json_shown(name)} with arguments nested {nesting(arguments)} "
                    f"arrays or objects deep (deeper than this server's JSON reads and writes), so "
                    f"{carrier} cannot hold them; {fix}, or give each of the tool's parameters a type that bounds "
                    "its nesting (one with no type, as {}, lets the model nest arrays without limit)",
                    code="tool_call_too_deep", kind="server_error")


def partial_input(arguments: str) -> dict:
    """The input a call's arguments so far (the start of a JSON object, as :class:`AnswerStream` gives it out) hold,
    as Anthropic's SDK reads the ``input_json_delta`` pieces it has accumulated (``jiter.from_json`` in partial
    mode): what is whole is kept, objects and arrays left open are closed, and an unfinished string, a number or
    literal that may go on, a key without its value are left out."""
    value, _ = _partial_value(arguments, 0)
    return value if isinstance(value, dict) else {}


_UNFINISHED = object()  # a value the text ends inside of
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = {"true": True, "false": False, "null": None}


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def _partial_value(text: str, at: int) -> tuple[object, int]:
    """The value that starts at ``text[at]`` (``_UNFINISHED`` where the text ends before it is whole; an open
    object or array is whole as far as it goes) and where it ends."""
    at = _skip(text, at)
    if at == len(text):
        return _UNFINISHED, at
    char = text[at]
    if char in "{[":
        container: dict | list = {} if char == "{" else []
        at += 1
        while True:
            at = _skip(text, at)
            if at == len(text):
                return container, at
            if text[at] in "}]":
                return container, at + 1
            if text[at] == ",":
                at += 1
            if isinstance(container, list):
                value, at = _partial_value(text, at)
                if value is _UNFINISHED:
                    return container, len(text)
                container.append(value)
                continue
            key, at = _partial_value(text, at)
            at = _skip(text, at)
            if not isinstance(key, str) or at == len(text):  # a key unfinished, or without its colon yet
                return container, len(text)
            value, at = _partial_value(text, at + 1)  # past the colon
            if value is _UNFINISHED:
                return container, len(text)
            container[key] = value
    if char == '"':
        try:
            return json.decoder.scanstring(text, at + 1)
        except ValueError:  # the string goes on past the text
            return _UNFINISHED, len(text)
    number = _NUMBER.match(text, at)
    if number and (number.end() == len(text) or text[number.end()] in ",]} \t\n\r"):  # else it goes on ("1." "1e")
        return json.loads(number.group()), number.end()
    for word, value in _LITERALS.items():
        if text.startswith(word, at):
            return value, at + len(word)
    return _UNFINISHED, len(text)


def stop_reason(request: CompletionRequest, finish_reason: str, completion) -> str:
    """Anthropic's stop reason. An answer whose calls are whole ("tool_calls") is ``tool_use`` even where a stop
    sequence ended it after them (its ``stop_sequence`` still names it): the client must answer each ``tool_use``
    block, and agent loops run the tools on that stop reason alone, as llama-server's Messages route reports
    ``tool_use`` for any answer with calls that was not cut by its limit. An answer cut off ("length") before its
    ``max_tokens`` ran out of the model's context: ``model_context_window_exceeded`` (Anthropic's "Handling stop
    reasons"), which a larger ``max_tokens`` would not change."""
    if finish_reason == "tool_calls":
        return "tool_use"
    if completion.stop_string is not None:
        return "stop_sequence"
    if finish_reason == "length" and request.max_tokens is not None \
            and completion.completion_tokens < request.max_tokens:
        return "model_context_window_exceeded"
    return STOP_REASONS.get(finish_reason, "end_turn")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """Anthropic's usage, as llama-server's ``to_json_anthropic`` counts it (tools/server/server-task.cpp):
    ``input_tokens`` the prompt tokens not read from the KV cache (``n_prompt_tokens - n_prompt_tokens_cache``),
    ``cache_read_input_tokens`` those read from it, ``output_tokens`` every token sampled, the end-of-text token
    the answer stopped at included (``n_decoded``; :attr:`Completion.completion_tokens`)."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": completion_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def message_body(request: CompletionRequest, ident: str, model: str, completion, reasoning: str = "",
                 text: str | None = None, think_opened: bool | None = None) -> dict:
    """The whole answer of a request without ``stream`` (``completion``: serve.completion.Completion); a thinking
    model's ``reasoning`` comes first as a ``thinking`` block (``text``: the answer without it)."""
    blocks, finish = content_blocks(request, completion.text if text is None else text, completion.finish_reason,
                                    think_opened)
    if reasoning:  # an answer that is all thinking has no empty text block after it, as its stream has none
        blocks = [thinking_block(reasoning), *(block for block in blocks if block != {"type": "text", "text": ""})]
    return {"id": ident, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": stop_reason(request, finish, completion), "stop_sequence": completion.stop_string,
            "usage": usage(completion.prompt_tokens, completion.completion_tokens, completion.cached_tokens)}


def start_events(ident: str, model: str, prompt_tokens: int, cached_tokens: int, text_block: bool) -> list:
    """(event, data) pairs that open a stream; ``text_block`` also opens the text block the deltas go to."""
    message = {"id": ident, "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": usage(prompt_tokens, 0, cached_tokens)}
    events = [("message_start", {"type": "message_start", "message": message})]
    if text_block:
        events.append(("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}))
    events.append(("ping", {"type": "ping"}))
    return events


def thinking_block(reasoning: str) -> dict:
    """A thinking model's reasoning as Anthropic's ``thinking`` block. Its ``signature`` (Anthropic's proof that
    the thinking is its own, checked when a client sends the block back) is empty: nothing here signs."""
    return {"type": "thinking", "thinking": reasoning, "signature": ""}


class ThinkingStream:
    """The content blocks of a stream whose answer may begin with reasoning: a ``thinking`` block for the
    reasoning's deltas (``thinking_delta``), then a ``text`` block for the rest, each opened when its first
    text comes and closed when the next opens or the answer ends (Anthropic's "Streaming Messages", extended
    thinking). A thinking block ends with its ``signature_delta`` just before its ``content_block_stop``, as
    Anthropic's stream ends one (its "Streaming Messages" reference, extended thinking: the block's signature comes in
    a ``signature_delta`` event just before its ``content_block_stop``) and llama-server's does (tools/server/server-task.cpp, ``to_json_anthropic_stream``:
    ``{"type": "signature_delta", "signature": ""}``): its signature empty, as the whole answer's block has it
    (:func:`thinking_block`), for clients that keep a thinking block once its signature comes."""

    def __init__(self):
        self.index, self.kind = -1, None

    def pieces(self, reasoning: str, content: str) -> list:
        events = []
        for kind, text in (("thinking", reasoning), ("text", content)):
            if not text:
                continue
            if self.kind != kind:
                events += self._open(kind)
            delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else \
                {"type": "text_delta", "text": text}
            events.append(("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}))
        return events

    def close(self) -> list:
        """The last block's end (an empty text block where the answer wrote nothing, as a whole answer has one)."""
        events = self._open("text") if self.kind is None else []
        return events + self._stop()

    def _stop(self) -> list:
        """The open block's end (:func:`block_end`)."""
        return block_end(self.index, self.kind)

    def _open(self, kind: str) -> list:
        events = [] if self.kind is None else self._stop()
        self.index, self.kind = self.index + 1, kind
        block = thinking_block("") if kind == "thinking" else {"type": "text", "text": ""}
        return events + [("content_block_start", {"type": "content_block_start", "index": self.index,
                                                  "content_block": block})]


class ToolStream:
    """The content blocks of an answer under tools, read as it is generated (:class:`AnswerStream`, as the chat
    route streams it): a ``tool_use`` block started once the call's name is whole (``input`` {}), its input's JSON
    in ``input_json_delta`` pieces as it settles; a text answer's ``text`` block with its ``text_delta`` pieces
    (Anthropic's "Streaming Messages"). A thinking model's reasoning before its JSON (the ``reasoning_content``
    deltas) is a ``thinking`` block first, its ``thinking_delta`` pieces and its empty ``signature_delta`` before
    its ``content_block_stop``, as :class:`ThinkingStream` streams one. ``blocks`` is the message's content the
    events build."""

    def __init__(self, think_opened: bool | None = None):
        # think_opened: the answer is its <think> block from its first character (Completer.tools_think_opened)
        self.answer = AnswerStream(opened=think_opened)
        self.blocks: list[dict] = []
        # (name, arguments) of the first call whose input is too deep for its block (call_input); its block's input
        # stays {}: the stream gave the input out as its JSON text, which a whole answer cannot (content_blocks)
        self.too_deep: tuple[str, str] | None = None

    def push(self, text: str) -> list:
        """The events that the answer's next ``text`` settles."""
        return self._events(self.answer.push(text))

    def close(self, finish_reason: str) -> tuple[list, str]:
        """Once the answer has ended (``finish_reason`` its generation's): the events still to go, the last
        block's end (an empty text block where nothing was written, as a whole answer has one), and the
        answer's finish reason ("tool_calls" for a whole call)."""
        deltas, fields, finish_reason = self.answer.finish(finish_reason)
        events = self._events(deltas)
        if not self.blocks:
            events += self._start({"type": "text", "text": ""})
        # each call's tool_use block, in order, takes its input from the chat route's message, which its pieces join
        # into (a call cut short: what its JSON so far holds)
        uses = [block for block in self.blocks if block["type"] == "tool_use"]
        for block, call in zip(uses, fields.get("tool_calls") or [], strict=False):
            arguments = call["function"]["arguments"]
            value = call_input(arguments, finish_reason == "tool_calls")
            if value is not None:
                block["input"] = value
            elif self.too_deep is None:
                self.too_deep = (block["name"], arguments)
        return events + self._stop(), finish_reason

    def _events(self, deltas: list[dict]) -> list:
        events = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                if not self.blocks or self.blocks[-1]["type"] != "thinking":
                    events += self._start(thinking_block(""))
                self.blocks[-1]["thinking"] += delta["reasoning_content"]
                events.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
            if delta.get("content"):
                if not self.blocks or self.blocks[-1]["type"] != "text":
                    events += self._start({"type": "text", "text": ""})
                self.blocks[-1]["text"] += delta["content"]
                events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for piece in delta.get("tool_calls") or []:
                function = piece["function"]
                if "name" in function:
                    events += self._start({"type": "tool_use", "id": "toolu_" + piece["id"].removeprefix("call_"),
                                           "name": function["name"], "input": {}})
                if function["arguments"]:
                    events.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
        return events

    def _start(self, block: dict) -> list:
        events = self._stop() if self.blocks else []
        self.blocks.append(block)
        return events + [("content_block_start", {"type": "content_block_start", "index": len(self.blocks) - 1,
                                                  "content_block": dict(block)})]

    def _stop(self) -> list:
        """The last block's end (:func:`block_end`)."""
        return block_end(len(self.blocks) - 1, self.blocks[-1]["type"])

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}


def block_end(index: int, kind: str | None) -> list:
    """The events that end content block ``index`` of type ``kind``: a thinking block's (empty) signature, then its
    ``content_block_stop``."""
    events = [] if kind != "thinking" else \
        [("content_block_delta", {"type": "content_block_delta", "index": index,
                                  "delta": {"type": "signature_delta", "signature": ""}})]
    return events + [("content_block_stop", {"type": "content_block_stop", "index": index})]


def text_event(text: str) -> tuple[str, dict]:
    return "content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": text}}


def end_events(request: CompletionRequest, completion, closing: list | None = None,
               finish_reason: str | None = None) -> list:
    """(event, data) pairs that close a stream: the blocks' ends (``closing`` where the caller opened them:
    ThinkingStream, ToolStream; else the one text block's), then the stop reason (``finish_reason``: the answer's,
    where it is not the generation's, as a tools answer's "tool_calls")."""
    events = list(closing) if closing is not None else \
        [("content_block_stop", {"type": "content_block_stop", "index": 0})]
    finish = completion.finish_reason if finish_reason is None else finish_reason
    # The usage is cumulative (Anthropic's "Streaming Messages"): the prompt tokens taken from the cache are
    # known once the answer is made, and the client's message then reads as the answer without stream does.
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": stop_reason(request, finish, completion),
                                               "stop_sequence": completion.stop_string},
                                     "usage": usage(completion.prompt_tokens, completion.completion_tokens,
                                                    completion.cached_tokens)}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events
