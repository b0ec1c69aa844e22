"""OpenAI's Responses API on the same completer: ``POST /v1/responses``.

The openai client's ``responses.create`` / ``responses.stream`` / ``responses.parse`` (and the agent tools built on
them) speak this API; vLLM and LM Studio serve it beside chat completions. A request is translated into the chat
request it means and checked there (edgesdk/serve/api.py), so every field takes the same values, is refused the same
way (the error naming the Responses field) and renders the same prompt; the answer is written in the shapes of
OpenAI's API reference ("Responses", "Streaming events"):

* request: ``model``, ``input`` (a string, or a list of items: ``message`` items of role user / assistant / system /
  developer whose content is a string or ``input_text`` / ``output_text`` parts, ``function_call`` and
  ``function_call_output`` items; ``reasoning`` items a client sends back are left out, as Anthropic's route leaves
  out thinking blocks), ``instructions`` (a system message first), ``max_output_tokens``, ``temperature``,
  ``top_p``, ``stream``, ``tools`` (function tools in the flat form ``{"type": "function", "name", "description",
  "parameters", "strict"}``), ``tool_choice`` (auto / none / required / ``{"type": "function", "name"}``),
  ``text.format`` (text, json_object, json_schema), ``metadata`` (OpenAI's limits: 16 pairs, keys of 64
  characters, values of 512), ``include`` ``"message.output_text.logprobs"`` with ``top_logprobs`` (0-20),
  ``parallel_tool_calls`` (true: an answer may make several calls, each its own ``function_call`` item; absent,
  the chat route's default, llama-server's false, edgesdk/serve/tools.py, which the response repeats: OpenAI
  defaults it to true), ``truncation`` (:func:`truncated`: ``"auto"`` drops the oldest items until the
  conversation fits the context, ``"disabled"``, the default, refuses it with a 400 ``context_length_exceeded``);
  ``reasoning``, ``include``'s other entries, ``user``, ``service_tier``, ``safety_identifier``,
  ``prompt_cache_key`` and ``text.verbosity`` change nothing here (the response repeats them, its ``service_tier``
  "default", the tier that answered). A
  ``function_call_output`` answers a ``function_call`` earlier in the conversation (OpenAI refuses one whose
  ``call_id`` matches none: "No tool call found for function call output with call_id ..."), and a ``function_call``
  (in ``input`` or the previous response's output) needs its ``function_call_output`` before the conversation goes
  on (OpenAI: "No tool output found for function call call_..."); a ``call_id`` names one call, answered once (a
  second ``function_call`` with it, or a second ``function_call_output``, is a 400). An item's ``id``, where
  given, is a string that no other item of the conversation has (OpenAI: "Duplicate item found with id ..."): the
  response's input items keep it and are paged by it; its ``status``, where given, is one of OpenAI's
  (``in_progress``, ``completed``, ``incomplete``: a cut answer's items come back "incomplete") and is kept there
  too. llama-server's sampling fields (``top_k``, ``min_p``,
  ``seed``, ``logit_bias``, ``stop``, ...) and ``chat_template_kwargs`` are read as on the chat route.
* kept responses: ``store`` (true unless the request says false, OpenAI's default) keeps a finished response
  (completed or incomplete, whole or streamed) in this process's memory with the input items that led to it
  (:class:`ResponseStore`: the most recent ``ServeDefaults.responses_kept`` responses within
  ``responses_kept_bytes`` of their JSON; nothing survives a restart). ``previous_response_id`` continues one: the
  prompt is its input items, then its output items, then the request's ``input``, the prompt the whole
  conversation sent in ``input`` renders; its ``instructions`` are not carried over (OpenAI's API reference,
  "instructions": "When using along with previous_response_id, the instructions from a previous response will not
  be carried over to the next response"). An id not kept is OpenAI's 404 ``previous_response_not_found``.
  ``GET /v1/responses/{id}`` gives a kept response as it was answered, ``DELETE /v1/responses/{id}`` removes it,
  ``GET /v1/responses/{id}/input_items`` lists its input items (:func:`input_items_page`). A streamed response is
  kept from its first event on: while its stream runs, ``GET`` gives it ``in_progress`` as its
  ``response.created`` event gave it (no output, ``usage`` null; OpenAI answers a response being generated so),
  ``input_items`` lists its input, ``DELETE`` removes it and the finished response is then not kept, and
  ``previous_response_id`` naming it is a 400 until it finishes; a stream that ends in an error, or whose client
  leaves, keeps nothing. ``POST /v1/responses/{id}/cancel`` is refused (:func:`not_cancelled`): OpenAI cancels only
  ``background`` responses, and none is made here.
* ``item_reference`` input items (``{"type": "item_reference", "id"}``, the ``type`` optional as in the openai
  client's ``ItemReference``) stand for a kept item (:func:`_referenced`): an output item of a kept response, or an
  input item as ``input_items`` lists it; the prompt and the new response's input items hold the item itself. An id
  kept nowhere is OpenAI's 404 "Item with id '...' not found", naming ``input[i].id``.
* ``POST /v1/responses/input_tokens`` (the openai client's ``responses.input_tokens.count``): the prompt's tokens
  the same body would use, nothing generated, as ``{"object": "response.input_tokens", "input_tokens": N}``; it is
  the answer's ``usage.input_tokens``. A prompt longer than the context is counted too.
* ``conversation``, ``prompt`` (a stored prompt) and ``background`` are refused by name; so are built-in tools and
  image / file / audio parts, an ``include`` entry that is none of OpenAI's (its ``invalid_value``), and the chat
  fields the Responses API has moved (``max_tokens`` / ``max_completion_tokens`` to ``max_output_tokens``,
  ``response_format`` to ``text.format``, ``reasoning_effort`` to ``reasoning.effort``, ``messages`` to ``input``,
  ``logprobs`` to ``include``), as OpenAI refuses them ("Unsupported parameter: 'response_format'. In the Responses
  API, this parameter has moved to 'text.format'."): read as nothing, they would leave the answer unbounded or
  unshaped without a word.
* answer: ``{"id": "resp_...", "object": "response", "status": "completed" | "incomplete", "output": [a
  ``reasoning`` item where a thinking model's reasoning is split off (edgesdk/serve/reasoning.py; under ``tools``
  too, the block it thinks before its call: edgesdk/serve/tools.py, ``AnswerStream``), then a ``message`` item
  with one ``output_text`` part (its ``logprobs`` as asked), or ``function_call`` items],
  "usage": {"input_tokens", "output_tokens", "total_tokens", ...}}`` and the request's settings. An answer cut
  by its token limit is ``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens``; one whose call a
  ``stop`` string cut (before the answer's JSON was whole) is ``incomplete`` too, its ``incomplete_details.reason``
  null (OpenAI's reasons name no stop string), as the chat route answers it "stop" rather than "tool_calls" and
  the Messages route "stop_sequence" rather than "tool_use": a client runs no call with cut arguments. A stop
  string that cuts a text answer ends it ``completed``, as it does without tools.
* stream: named server-sent events, each carrying its ``type`` and ``sequence_number``: ``response.created``,
  ``response.in_progress``, per item ``response.output_item.added``, ``response.content_part.added``, the text's
  ``response.output_text.delta`` (``response.reasoning_text.delta`` in a reasoning item) and their ``.done``,
  ``response.content_part.done``, ``response.output_item.done``; a ``function_call`` item is added (``arguments``
  "", ``in_progress``) once its name is whole, its arguments follow in ``response.function_call_arguments.delta``
  pieces as they are written, then ``.done`` with them whole and the function's ``name`` (as OpenAI sends it) and
  ``response.output_item.done``; then ``response.completed`` or ``response.incomplete`` with the whole response,
  the same as the answer without ``stream``. An answer cut by ``max_output_tokens`` (or a ``stop`` string)
  mid-call keeps the call as written so far (its arguments a prefix of JSON), ``incomplete`` like the response,
  whose last event is ``response.incomplete``; sent back (in ``input``, or by ``previous_response_id``) it is
  read as the chat route reads such a call, its arguments the model's text as written. An error after the start
  is an ``error`` event.
* errors: OpenAI's ``{"error": {"message", "type", "param", "code"}}``, as on the chat route.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from edgesdk.serve.api import (
    MAX_TOP_LOGPROBS,
    SAMPLERS_OFF,
    ApiError,
    CompletionRequest,
    _integer,
    _object,
    join_text_parts,
    json_shown,
    parse_chat_request,
    utf8_field,
)
from edgesdk.serve.completion import Completer
from edgesdk.serve.ollama import cut_starts, trimmed  # Ollama's conversation kept to the context, shared
from edgesdk.serve.response_store import ResponseStore, kept_items

ROUTE = "/responses"
COUNT_ROUTE = "/responses/input_tokens"  # OpenAI's "Get input token counts" (``responses.input_tokens.count``)
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")
STATELESS = "this server keeps no conversations or stored prompts: chain turns with 'previous_response_id', or send " \
    "the whole conversation in 'input' (earlier turns as message, function_call and function_call_output items), " \
    "and leave '{field}' out"
WHOLE = "send the whole conversation in 'input' (earlier turns as message, function_call and function_call_output " \
    "items) without 'previous_response_id'"
# llama-server's fields the chat route reads, read here the same way (the samplers this server lacks are refused there,
# but where the fields beside them turn them off, as llama.cpp reads them: ``xtc_threshold`` above 0.5 and
# ``dry_penalty_last_n`` 0 (api.py ``sampler_off``), ``adaptive_target`` below 0 (api.py ``_samplers``), so these go too)
CHAT_FIELDS = ("top_k", "min_p", "seed", "samplers", "presence_penalty", "frequency_penalty", "repeat_penalty",
               "repeat_last_n", "logit_bias", "stop", "cache_prompt", "ignore_eos", "chat_template_kwargs",
               "reasoning_format", "grammar", *SAMPLERS_OFF, "xtc_threshold", "dry_penalty_last_n", "adaptive_target")
# A chat field the error names -> the Responses field it came from
TOOL_FIELD = re.compile(r"(tools\[\d+\])\.function\.(name|description|parameters)")
RENAMED = {"max_tokens": "max_output_tokens", "response_format": "text.format"}
FORMATS = ("text", "json_object", "json_schema")
# an item's ``status`` (the openai client's items: "Populated when items are returned via API"), which the response's
# input items keep: an answer cut by its token limit gives its items "incomplete"
STATUSES = ("in_progress", "completed", "incomplete")
LOGPROBS = "message.output_text.logprobs"  # the ``include`` entry that asks for the output text's log-probabilities
# ``include``'s values (the openai client's ``ResponseIncludable``); OpenAI refuses any other ("Invalid value: ...
# Supported values are: ...", code ``invalid_value``), so a misspelt entry is not an answer without what it asked for
INCLUDABLE = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url", "code_interpreter_call.outputs",
              "reasoning.encrypted_content", LOGPROBS)
# Chat completions fields the Responses API names otherwise: OpenAI refuses them ("Unsupported parameter:
# 'response_format'. In the Responses API, this parameter has moved to 'text.format'."; "Unknown parameter:
# 'max_tokens'."), and read as nothing here they would leave the answer unshaped or unbounded without a word
MOVED = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
         "response_format": "text.format", "reasoning_effort": "reasoning.effort", "messages": "input",
         "logprobs": "include"}
# OpenAI's limits on ``metadata`` (API reference, "metadata": "16 key-value pairs ... Keys are strings with a maximum
# length of 64 characters. Values are strings with a maximum length of 512 characters.")
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
# the request's identifiers that change nothing here and that the response repeats as given (null when absent), as
# OpenAI's Response object carries them
ECHOED_IDS = ("user", "safety_identifier", "prompt_cache_key")
# ``text.format`` json_schema ``name``: "Must be a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum
# length of 64" (API reference); the response repeats it, and the openai client requires it there
FORMAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# ``reasoning``'s fields the response repeats, with the values the openai client's ``Reasoning`` type takes
REASONING = {"effort": ("none", "minimal", "low", "medium", "high", "xhigh", "max"),
             "summary": ("auto", "concise", "detailed"), "generate_summary": ("auto", "concise", "detailed")}


def _refuse(field: str, message: str) -> ApiError:
    return ApiError(400, message, param=field, code="unsupported_parameter")


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses request: the chat request it means, and the settings the response repeats."""

    request: CompletionRequest
    instructions: str | None
    tools: list
    tool_choice: object
    text: dict
    max_output_tokens: int | None
    parallel_tool_calls: bool
    metadata: dict
    reasoning: dict | None
    truncation: str
    top_logprobs: int  # as the request gave it (0 when it did not), repeated in the response
    previous_response_id: str | None = None
    store: bool = True
    # the input items this response answers, each with its id: the previous response's input and output items
    # (where it continues one), then the request's ``input``
    items: tuple = ()
    # for each message of ``request``, the Responses field it came from (errors raised while answering name it)
    origins: tuple = ()
    # for each message the input made, where a cut there begins (a function_call_output kept with its call), for
    # ``truncation`` "auto" (:func:`truncated`)
    cuts: tuple = ()
    # ``user``, ``safety_identifier`` and ``prompt_cache_key`` as given (None when absent), repeated in the response
    ids: tuple = (None, None, None)

    @property
    def echoed_ids(self) -> dict:
        """The response's ``user``, ``safety_identifier`` and ``prompt_cache_key`` (the request's, or null) and its
        ``service_tier``, the tier that answered it: "default", whatever the request asked."""
        return {**dict(zip(ECHOED_IDS, self.ids, strict=True)), "service_tier": "default"}


def parse_responses_request(body: object, store: ResponseStore | None = None) -> ResponsesRequest:
    """``POST /v1/responses``: the request as the chat request it means, checked there. ``previous_response_id``
    is looked up in ``store`` (without one, none is kept)."""
    body = _object(body)
    previous_id, earlier = _previous(body, store)
    body = _referenced(body, store)
    chat, origins = chat_body(body, earlier)
    cuts = cut_starts(chat["messages"])
    try:  # a prompt past the context is refused naming the field the conversation came in: input
        request = replace(parse_chat_request(chat), prompt_param="input")
    except ApiError as exc:
        raise _renamed(exc, origins) from None
    if len(request.messages) > len(origins):  # the tools' description, put first as a system message of its own
        origins = ["tools", *origins]  # (edgesdk.serve.tools.with_instructions): the input's messages follow it
    for message, origin in zip(request.messages, origins, strict=True):
        if isinstance(message.get("content"), str):  # text the prompt cannot hold (a lone surrogate from a JSON
            utf8_field(message["content"], origin)  # escape), named as the Responses field, with the fix
    tools = [_echoed_tool(tool) for tool in body.get("tools") or []]
    limit = body.get("max_output_tokens")  # checked as the chat request's max_tokens: a whole number (4.0 is 4)
    return ResponsesRequest(request=request, instructions=body.get("instructions"), tools=tools,
                            tool_choice=_echoed_choice(body.get("tool_choice")), text=_echoed_text(body.get("text")),
                            max_output_tokens=None if limit is None else int(limit),
                            parallel_tool_calls=_flag(body, "parallel_tool_calls", False),
                            metadata=_metadata(body.get("metadata")), reasoning=_echoed_reasoning(body.get("reasoning")),
                            truncation=body.get("truncation") or "disabled",
                            top_logprobs=_integer(body.get("top_logprobs"), "top_logprobs", minimum=0) or 0,
                            previous_response_id=previous_id, store=_flag(body, "store", True),
                            items=(*earlier, *kept_items(body.get("input"))), origins=tuple(origins), cuts=cuts,
                            ids=tuple(body.get(name) for name in ECHOED_IDS))


def truncated(completer: Completer, asked: ResponsesRequest) -> CompletionRequest:
    """The chat request to run: with ``truncation`` "auto", a conversation whose prompt and answer's room
    (``max_output_tokens``, else the server's ``--max-new-tokens``) do not fit the context keeps its newest items
    that do. OpenAI's API reference, "truncation": "auto: If the input to this Response exceeds the model's context
    window size, the model will truncate the response to fit the context window by dropping items from the
    beginning of the conversation. disabled (default): If the input size will exceed the context window size for a
    model, the request will fail with a 400 error."

    The cut is Ollama's (edgesdk/serve/ollama.py, :func:`~edgesdk.serve.ollama.trimmed`): whole items are dropped,
    oldest first; ``instructions`` and system / developer messages are kept, and so is the last item; a
    function_call_output is kept with the function_call it answers (an assistant turn's text and calls are one
    message, dropped together). Where even the last item does not fit, the completer refuses the prompt with its 400
    ``context_length_exceeded``. Nothing is dropped where it all fits, and the response's input items (what
    ``previous_response_id`` continues) stay whole: the next turn cuts again."""
    if asked.truncation != "auto":
        return asked.request
    return trimmed(completer, asked.request, completer.runtime.backend.max_context, None, asked.cuts)


def _echoed_text(text: dict | None) -> dict:
    """``text`` (already checked) as the response repeats it: the fields of the openai client's
    ``ResponseTextConfig`` and of its format's type, and no others (the client reads the response's back)."""
    text = text or {}
    given = text.get("format") or {"type": "text"}
    fields = ("type", "name", "description", "schema", "strict") if given["type"] == "json_schema" else ("type",)
    return {"format": {field: given[field] for field in fields if field in given},
            "verbosity": text.get("verbosity") or "medium"}


def _echoed_choice(choice: object) -> object:
    """``tool_choice`` (already checked) as the response repeats it: a mode, or the client's
    ``ToolChoiceFunction`` (``type`` and ``name`` alone)."""
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["name"]}
    return choice or "auto"


def _echoed_reasoning(value: dict | None) -> dict | None:
    """``reasoning`` (already checked) as the response repeats it: the openai client's ``Reasoning`` fields only."""
    return None if value is None else {field: value[field] for field in REASONING if field in value}


def _previous(body: dict, store: ResponseStore | None) -> tuple[str | None, list[dict]]:
    """``previous_response_id`` and the items it continues: the kept response's input items, then its output."""
    ident = body.get("previous_response_id")
    if ident is None:
        return None, []
    if not isinstance(ident, str) or not ident:
        raise ApiError(400, f"'previous_response_id' must be the id of a response (\"resp_...\"), got {json_shown(ident)}",
                       param="previous_response_id")
    if body.get("conversation") is not None:  # OpenAI: "Cannot be used in conjunction with conversation"
        raise ApiError(400, "'previous_response_id' and 'conversation' cannot both be given: give one",
                       param="previous_response_id")
    kept = store.get(ident) if store is not None else None
    if kept is None:  # OpenAI's answer, with the fix
        raise ApiError(404, f"Previous response with id '{ident}' not found. This server keeps "
                       f"{store.description() if store is not None else 'no responses'} in memory until it restarts, "
                       f"and none made with 'store': false (or deleted); {WHOLE}",
                       param="previous_response_id", code="previous_response_not_found")
    if kept.response["status"] == "in_progress":  # its output is not written yet
        raise ApiError(400, f"Previous response with id '{ident}' is still in progress: its stream has not ended, so "
                       "its output is not whole; continue it once its response.completed (or response.incomplete) "
                       "event has come", param="previous_response_id")
    return ident, [*kept.items, *kept.response["output"]]


def _is_reference(item: object) -> bool:
    """Whether an input item is an ``item_reference``: its ``type`` says so, or it holds an ``id`` alone (the openai
    client's ``ItemReference``, whose ``type`` is optional)."""
    if not isinstance(item, dict):
        return False
    return item.get("type") == "item_reference" or ("id" in item and set(item) <= {"id", "type"}
                                                     and item.get("type") is None)


def _referenced(body: dict, store: ResponseStore | None) -> dict:
    """``body`` with each ``item_reference`` of ``input`` replaced by the kept item its ``id`` names: an output item
    of a kept response, or one of its input items as ``GET /v1/responses/{id}/input_items`` lists them. An id kept
    nowhere is OpenAI's 404 ("Item with id '...' not found"), naming ``input[i].id``."""
    given = body.get("input")
    if not isinstance(given, list) or not any(_is_reference(item) for item in given):
        return body
    resolved = []
    for index, item in enumerate(given):
        if not _is_reference(item):
            resolved.append(item)
            continue
        where, ident = f"input[{index}].id", item.get("id")
        if not isinstance(ident, str) or not ident:
            raise ApiError(400, f"{where} must be the id of an item of a kept response (an output item's id, or an "
                           f"input item's id as GET /v1/responses/{{id}}/input_items lists it), got {json_shown(ident)}",
                           param=where)
        found = store.item(ident) if store is not None else None
        if found is None:
            raise ApiError(404, f"Item with id '{ident}' not found. This server keeps the items of "
                           f"{store.description() if store is not None else 'no responses'} in memory until it "
                           "restarts, and none of a response made with 'store': false (or deleted); send the item "
                           "itself in its place, as the response gave it", param=where)
        resolved.append(found)
    return {**body, "input": resolved}


def _renamed(exc: ApiError, origins: list[str]) -> ApiError:
    """A chat request's error naming the Responses field it came from (``messages[2]`` -> ``input[1]``,
    ``tools[0].function.name`` -> ``tools[0].name``, ``max_tokens`` -> ``max_output_tokens``)."""
    param = exc.param
    if param is None:
        return exc
    field = None
    if match := TOOL_FIELD.fullmatch(param):
        field = f"{match[1]}.{match[2]}"
    elif match := re.match(r"messages\[(\d+)\]", param):
        index = int(match[1])
        if index < len(origins):
            field = origins[index] + param[match.end():]
    elif param == "response_format" and exc.message.startswith("response_format: "):
        field = "text.format.schema"  # the schema's own fault (api.py's _json_schema): the constraint refused it
    elif param in RENAMED:
        field = RENAMED[param]
    if field is not None:
        exc.message, exc.param = exc.message.replace(param, field), field
    return exc


def answering_error(exc: ApiError, asked: ResponsesRequest) -> ApiError:
    """An error raised while answering the chat request ``asked`` means (its prompt past the context, the chat
    template refusing its messages), naming the Responses field as a refusal of the request itself does: the
    messages as a whole are ``input``."""
    if exc.param in ("messages", "prompt"):  # 'prompt' is a Responses field of its own (a stored prompt)
        exc.param = "input"
        return exc
    return _renamed(exc, list(asked.origins))


def chat_body(body: dict, earlier: list[dict] | None = None) -> tuple[dict, list[str]]:
    """The chat body a Responses body means, and for each of its messages the Responses field it came from.
    ``earlier``: the items of the response ``previous_response_id`` continues, before ``input``."""
    for name in ("conversation", "prompt"):
        if body.get(name) is not None:
            raise _refuse(name, f"'{name}' = {json_shown(body[name])} is not supported: " + STATELESS.format(field=name))
    if body.get("background") not in (None, False):
        raise _refuse("background", f"'background' = {json_shown(body['background'])} is not supported: this server "
                      "answers while the request waits, and a response is kept only once it is answered; leave "
                      "'background' out")
    for name, moved in MOVED.items():
        if body.get(name) is not None:
            how = f'["{LOGPROBS}"]' if moved == "include" else "its value"
            raise _refuse(name, f"Unsupported parameter: '{name}' (got {json_shown(body[name])}). In the Responses API, "
                          f"this parameter has moved to '{moved}': send {how} there and leave '{name}' out")
    logprobs = _logprobs(body)
    messages, origins = [], []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, f"'instructions' must be a string (the system message), got {json_shown(instructions)}",
                       param="instructions")
    if instructions:  # "" is none, as Anthropic's route reads an empty 'system'
        messages.append({"role": "system", "content": instructions})
        origins.append("instructions")
    for message, origin in _input(body.get("input"), earlier or []):
        messages.append(message)
        origins.append(origin)
    chat = {"messages": messages, "stream": body.get("stream", False), **logprobs}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for field in ("temperature", "top_p", *CHAT_FIELDS):
        if field in body:
            chat[field] = body[field]
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):  # {}, "" or false too: no array is no tools (as the chat
        # route refuses them): read as none, the answer would be text without a word
        raise ApiError(400, f"'tools' must be an array of function tools ({{\"type\": \"function\", \"name\", "
                       f"\"parameters\"}}), got {json_shown(tools)}; send null or [] for no tools", param="tools")
    if tools:
        chat["tools"] = [_tool(tool, index) for index, tool in enumerate(tools)]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _text_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    chat["parallel_tool_calls"] = _flag(body, "parallel_tool_calls", False)  # the chat route's default
    _flag(body, "store", True)
    if body.get("truncation") not in (None, "auto", "disabled"):
        raise ApiError(400, f"'truncation' must be \"auto\" or \"disabled\", got {json_shown(body['truncation'])}",
                       param="truncation")
    _reasoning(body.get("reasoning"))
    _metadata(body.get("metadata"))
    _identifiers(body)
    return chat, origins


def _identifiers(body: dict) -> None:
    """``user``, ``safety_identifier`` and ``prompt_cache_key`` change nothing here, and the response repeats them:
    each a string, as OpenAI takes them. ``service_tier`` names a tier (a string: OpenAI adds tiers, so any name is
    taken); the response names the one that served it, which here is always the one, "default" (OpenAI answers
    "auto", and a tier it did not use, with the one it used)."""
    for name in (*ECHOED_IDS, "service_tier"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise ApiError(400, f"'{name}' must be a string, got {json_shown(body[name])}", param=name)


def _logprobs(body: dict) -> dict:
    """The chat request's ``logprobs`` / ``top_logprobs`` of ``include`` and ``top_logprobs``.

    ``include`` ``"message.output_text.logprobs"`` asks for each output_text token's log-probability, with
    ``top_logprobs`` (0-20) alternatives per token; ``top_logprobs`` alone gives none (OpenAI's output_text then
    carries ``"logprobs": []``). The other ``include`` entries name data of built-in tools and encrypted reasoning,
    which answers here never hold; an entry that is none of OpenAI's is refused as OpenAI refuses it (a misspelt
    ``message.output_text.logprob`` would otherwise answer without the log-probabilities it asked for)."""
    top = _integer(body.get("top_logprobs"), "top_logprobs", minimum=0)
    if top is not None and top > MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}, got {top}", param="top_logprobs")
    include = body.get("include")
    if include is None:
        return {}
    if not isinstance(include, list) or not all(isinstance(entry, str) for entry in include):
        raise ApiError(400, f"'include' must be an array of strings, got {json_shown(include)}", param="include")
    for index, entry in enumerate(include):
        if entry not in INCLUDABLE:
            raise ApiError(400, f"Invalid value: {json_shown(entry)}. Supported values are: {', '.join(INCLUDABLE)} "
                           f"(this server gives {LOGPROBS}; the others name data answers here never hold)",
                           param=f"include[{index}]", code="invalid_value")
    if LOGPROBS not in include:
        return {}
    return {"logprobs": True, **({} if top is None else {"top_logprobs": top})}


def _reasoning(value: object) -> None:
    """``reasoning`` changes nothing here, and the response repeats it: its fields take OpenAI's values."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ApiError(400, f"'reasoning' must be an object such as {{\"effort\": \"low\"}}, got {json_shown(value)}",
                       param="reasoning")
    for field, allowed in REASONING.items():
        if value.get(field) is not None and value[field] not in allowed:
            raise ApiError(400, f"'reasoning.{field}' must be one of {', '.join(allowed)}, got "
                           f"{json_shown(value[field])}", param=f"reasoning.{field}")


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {json_shown(value)}", param=name)
    return default if value is None else value


def _metadata(value: object) -> dict:
    """``metadata``: at most 16 pairs of string keys (64 characters at most) and string values (512 at most),
    OpenAI's limits, refused past them as OpenAI refuses them."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
        raise ApiError(400, f"'metadata' must be an object of string values, got {json_shown(value)}", param="metadata")
    if len(value) > METADATA_PAIRS:
        raise ApiError(400, f"'metadata' holds {len(value)} pairs, more than OpenAI's limit of {METADATA_PAIRS}; send "
                       f"at most {METADATA_PAIRS}", param="metadata")
    for key, item in value.items():
        if len(key) > METADATA_KEY:
            raise ApiError(400, f"'metadata' key {json_shown(key)} is {len(key)} characters long, more than OpenAI's "
                           f"limit of {METADATA_KEY}; use a shorter key", param="metadata")
        if len(item) > METADATA_VALUE:
            raise ApiError(400, f"'metadata.{key}' is {len(item)} characters long, more than OpenAI's limit of "
                           f"{METADATA_VALUE}; send a shorter value", param=f"metadata.{key}")
    return value


def _input(value: object, earlier: list[dict]) -> list[tuple[dict, str]]:
    """(chat message, the Responses field it came from) of ``earlier`` (a kept response's items, named
    ``previous_response_id``), then ``input``: a string is one user message."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
        named = ["input"]
    elif not isinstance(value, list) or not value:
        raise ApiError(400, f"'input' must be a string or a non-empty array of input items (messages, function_call "
                       f"and function_call_output items), got {json_shown(value)}", param="input")
    else:
        named = [f"input[{index}]" for index in range(len(value))]
    messages: list[tuple[dict, str]] = []
    calls: dict[str, str] = {}  # call_id -> where, of each function_call item so far
    unanswered: dict[str, str] = {}  # call_id -> where, of each function_call no function_call_output answers yet
    answered: dict[str, str] = {}  # call_id -> where, of the function_call_output of the latest call of each id
    made: dict[str, dict] = {}  # call_id -> the function (name, arguments) of the latest call of each id
    ids: set[str] = set()  # the id of each item so far: a response's input items are listed (and paged) by id
    joinable = False  # the last message is an assistant turn the next function_call items belong to
    for index, (item, where) in enumerate(zip([*earlier, *value], ["previous_response_id"] * len(earlier) + named,
                                              strict=True)):
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an input item object, got {json_shown(item)}", param=where)
        _item_ident(item, where, ids, earlier=index < len(earlier))
        if item.get("status") is not None and item["status"] not in STATUSES:  # OpenAI: "Invalid value: ..."
            raise ApiError(400, f"{where}.status must be one of {', '.join(STATUSES)} (as the response gave the item), "
                           f"got {json_shown(item['status'])}; send it as given, or leave it out",
                           param=f"{where}.status", code="invalid_value")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            _reasoning_item(item, where)
            continue  # an earlier answer's reasoning sent back: earlier turns' reasoning is not in the context
        if kind == "message":
            messages.append((_message(item, where), where))
            joinable = messages[-1][0]["role"] == "assistant"
            continue
        if kind == "function_call":
            call = _function_call(item, where)
            if index >= len(earlier):  # a call_id names one call until its output: that call's result
                _new_call(call, where, unanswered, made)
            calls[call["id"]] = where
            made[call["id"]] = call["function"]
            unanswered[call["id"]] = where
            answered.pop(call["id"], None)  # an id used again names the new call: its output is the next one
            if joinable:  # an assistant turn's calls (parallel calls, or calls after its text) are one chat message
                previous, origin = messages[-1]
                messages[-1] = ({**previous, "tool_calls": [*previous.get("tool_calls", []), call]}, origin)
            else:
                messages.append(({"role": "assistant", "content": None, "tool_calls": [call]}, where))
            joinable = True
            continue
        joinable = False
        if kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ApiError(400, f"{where}.call_id must be the string call_id of the function_call it answers, got "
                               f"{json_shown(call_id)}", param=f"{where}.call_id")
            if call_id not in calls:  # OpenAI: "No tool call found for function call output with call_id ..."
                before = "earlier in 'input' or the previous response" if earlier else "earlier in 'input'"
                raise ApiError(400, f"{where}.call_id = {json_shown(call_id)} answers no function_call {before} "
                               f"(its call_ids: {', '.join(sorted(calls)) or 'none'}); send the function_call item "
                               "the output answers before it, as the response gave it", param=f"{where}.call_id")
            if index >= len(earlier):
                _first_output(call_id, where, answered)
            answered[call_id] = where
            unanswered.pop(call_id, None)
            messages.append(({"role": "tool", "tool_call_id": call_id,
                              "content": _output_text(item.get("output"), f"{where}.output")}, where))
        else:
            raise _unread_item(item, kind, where)
    if unanswered:  # OpenAI: "No tool output found for function call call_..." (param 'input')
        call_id, where = next(iter(unanswered.items()))
        raise ApiError(400, f"No tool output found for function call {call_id} ({where}): a function_call the model "
                       "made must be answered before the conversation goes on; send a function_call_output item with "
                       f"call_id {json_shown(call_id)} and the function's result after it, in 'input'", param="input")
    if not messages:
        raise ApiError(400, "'input' holds no message to answer (reasoning items alone are left out)", param="input")
    return messages


def _unread_item(item: dict, kind: object, where: str) -> ApiError:
    """The 400 for an input item of no type this server reads, saying what it is: an item with no ``type`` (and no
    ``role`` that makes it a message), a content part sent where an item goes (``input_text`` outside a message), or
    a built-in tool's item."""
    if kind is None:
        missing = "'type' is null" if "type" in item else "it has neither 'type' nor 'role'"
        return ApiError(400, f"{where} is no input item: {missing}, got {json_shown(item)}; send a message as "
                        "{\"role\": \"user\", \"content\": ...} (its \"type\": \"message\" optional), other items "
                        "with their type (function_call, function_call_output, reasoning)", param=f"{where}.type")
    if kind in (*TEXT_PARTS, "refusal", "input_image", "input_file", "input_audio"):
        return ApiError(400, f"{where} is a content part ({kind}) where an input item goes: put it in a message's "
                        f"content ({{\"role\": \"user\", \"content\": [{{\"type\": \"{kind}\", ...}}]}}), or send "
                        "'input' as a string", param=f"{where}.type", code="invalid_value")
    return _refuse(where, f"{where} is a {json_shown(kind)} item; this server reads message, function_call, "
                   "function_call_output and reasoning items (built-in tools' items have no tool here)")


def _new_call(call: dict, where: str, unanswered: dict[str, str], made: dict[str, dict]) -> None:
    """A function_call's (``call``, as the chat route reads it) ``call_id``, which no earlier call still waiting for its output has: a function_call_output
    names the call it answers by it, so a second call with the id of an unanswered one would leave one call without
    its output and render the output as the other function's result. An id whose call has its output may be used
    again (a client numbering each turn's calls from 0): the outputs after the new call answer it.

    A call the response ``previous_response_id`` names made, sent again in ``input`` (its ``id`` left out, else the
    duplicate item's 400 names it), is the conversation's own call repeated: the fix is to send only its output. A
    call of another function or arguments (``made``: each call_id's latest call) with that call's id is a new call
    reusing its id: the fix is a call_id of its own."""
    call_id, function = call["id"], call["function"]
    earlier = made.get(call_id)
    if unanswered.get(call_id) == "previous_response_id" and earlier is not None and earlier != function:
        differs = (f"calls {json_shown(function['name'])}, that call {json_shown(earlier['name'])}"
                   if earlier["name"] != function["name"] else
                   f"calls {json_shown(function['name'])} with other arguments than that call's")
        raise ApiError(400, f"Duplicate function call id: {where}.call_id = {json_shown(call_id)} is the call_id of the "
                       "function_call of the response previous_response_id names, which no function_call_output has "
                       f"answered yet, and {where} {differs}; each function_call needs a call_id of its own: give "
                       f"this call a new call_id, and answer that response's call with a function_call_output with "
                       f"call_id {json_shown(call_id)}", param=f"{where}.call_id")
    if unanswered.get(call_id) == "previous_response_id":
        raise ApiError(400, f"Duplicate function call: {where} (call_id {json_shown(call_id)}) repeats the "
                       "function_call of the response previous_response_id names, which the conversation holds "
                       "already; with previous_response_id send only the new items: the function_call_output with "
                       f"call_id {json_shown(call_id)}, not the call again", param=f"{where}.call_id")
    if call_id in unanswered:
        raise ApiError(400, f"Duplicate function call id: {where}.call_id = {json_shown(call_id)} is the call_id of the "
                       f"function_call at {unanswered[call_id]}, which no function_call_output has answered yet; each "
                       "function_call needs a call_id of its own, which its function_call_output names: send the "
                       "calls as the response gave them", param=f"{where}.call_id")


def _first_output(call_id: str, where: str, answered: dict[str, str]) -> None:
    """A function_call_output for a call no earlier output answers: each function_call has exactly one, and a second
    result would be read as one more result of the call."""
    if call_id in answered:
        raise ApiError(400, f"Duplicate function_call_output for call_id {json_shown(call_id)}: {where} answers the "
                       f"function_call that {answered[call_id]} already answers; each function_call has exactly one "
                       "function_call_output: send one output per call", param=f"{where}.call_id")


def _item_ident(item: dict, where: str, ids: set[str], earlier: bool) -> None:
    """An input item's ``id``: a string where given, and no other item's of the conversation. The response's input
    items keep it, and ``GET /v1/responses/{id}/input_items`` pages them by it (``after``), so a repeated id would
    page in a loop; OpenAI refuses one ("Duplicate item found with id ...")."""
    ident = item.get("id")
    if ident is None or ident == "":
        return
    if not isinstance(ident, str):
        raise ApiError(400, f"{where}.id must be a string (the id a response gave the item), got {json_shown(ident)}; "
                       "leave it out for a new item", param=f"{where}.id")
    if ident in ids and not earlier:
        raise ApiError(400, f"Duplicate item found with id '{ident}': {where} repeats an item earlier in the "
                       "conversation ('input', or the items of the response previous_response_id names); send each "
                       "item once (with previous_response_id, send only the new items)", param=f"{where}.id")
    ids.add(ident)


def _reasoning_item(item: dict, where: str) -> None:
    """A ``reasoning`` item sent back, left out of the prompt but kept with the response's input items: its fields
    of the openai client's ``ResponseReasoningItem`` take their types there (``summary`` parts of ``summary_text``,
    ``content`` parts of ``reasoning_text``), so the input items list reads back."""
    for field, part in (("summary", "summary_text"), ("content", "reasoning_text")):
        value = item.get(field)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(entry, dict) and entry.get("type") == part
                                                  and isinstance(entry.get("text"), str) for entry in value):
            raise ApiError(400, f"{where}.{field} must be an array of {{\"type\": \"{part}\", \"text\": ...}} "
                           f"parts, got {json_shown(value)}", param=f"{where}.{field}")
    if item.get("encrypted_content") is not None and not isinstance(item["encrypted_content"], str):
        raise ApiError(400, f"{where}.encrypted_content must be a string, got {json_shown(item['encrypted_content'])}",
                       param=f"{where}.encrypted_content")


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ROLES:
        raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {json_shown(role)}",
                       param=f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or an array of input_text / output_text parts, got "
                       f"{json_shown(content)}", param=f"{where}.content")
    return {"role": role, "content": _parts(content, f"{where}.content")}


def _parts(parts: list, where: str) -> str:
    """Text parts as one text, joined as the chat route joins a message's text parts (:func:`join_text_parts`); an
    assistant output's ``refusal`` part is its text. A part's text the prompt cannot hold (a lone surrogate from a
    JSON escape) is refused naming that part, where it is in the part's own text."""
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        field = "refusal" if kind == "refusal" else "text"
        if kind in (*TEXT_PARTS, "refusal") and isinstance(part.get(field), str):
            texts.append(utf8_field(part[field], f"{where}[{index}].{field}"))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise _refuse(f"{where}[{index}]", f"{where}[{index}] is an {kind} part: the model served here reads text "
                          "alone; send the content as input_text parts")
        else:
            raise ApiError(400, f"{where}[{index}] must be an input_text or output_text part ({{\"type\": "
                           f"\"input_text\", \"text\": ...}}), got {json_shown(part)}", param=f"{where}[{index}]")
    return join_text_parts(texts)


def _output_text(output: object, where: str) -> str:
    """A function_call_output's ``output``: a string, or input_text parts (joined as they are). Text the prompt
    cannot hold is refused naming ``output`` and where it is there: the prompt's own check would name the message
    and a place in the tool-result text it becomes."""
    if isinstance(output, str):
        return utf8_field(output, where)
    if isinstance(output, list):
        return _parts(output, where)
    raise ApiError(400, f"{where} must be a string or an array of input_text parts, got {json_shown(output)}",
                   param=where)


def _function_call(item: dict, where: str) -> dict:
    """A ``function_call`` item as the chat route's assistant tool call. Its ``arguments`` are any string, as
    OpenAI's ``ResponseFunctionToolCall`` types them and as llama-server takes them (tools/server,
    ``convert_responses_to_chatcmpl`` passes the string on to the chat path, whose template layer keeps text that is
    not JSON as it is): a call cut by ``max_output_tokens`` or a ``stop`` string inside its arguments, which this
    server returns as written (``status`` "incomplete"), or ``""``, is the model's text as written (edgesdk/serve/tools.py, ``call_text``)."""
    for field in ("call_id", "name", "arguments"):
        if not isinstance(item.get(field), str):
            raise ApiError(400, f"{where}.{field} must be a string, got {json_shown(item.get(field))} (a function_call "
                           "item as the response gave it: call_id, name and the arguments' JSON text)",
                           param=f"{where}.{field}")
        utf8_field(item[field], f"{where}.{field}")  # named as the client sent it, not as the chat route reads it
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                    "arguments": item["arguments"]}}


def _tool(tool: object, index: int) -> dict:
    where = f"tools[{index}]"
    if not isinstance(tool, dict):  # no tool at all, not a tool of another kind
        raise ApiError(400, f"{where} must be a function tool object ({{\"type\": \"function\", \"name\", "
                       f"\"parameters\"}}), got {json_shown(tool)}", param=where)
    if tool.get("type") is None:  # a function tool without its type, not a built-in tool
        raise ApiError(400, f"{where}.type is missing: a function tool is {{\"type\": \"function\", \"name\", "
                       f"\"parameters\"}}, got {json_shown(tool)}; add \"type\": \"function\"", param=f"{where}.type")
    kind = tool["type"]
    if kind != "function":
        raise _refuse(where, f"{where} is a {json_shown(kind or tool)} tool; this server calls function tools only "
                      "({\"type\": \"function\", \"name\", \"parameters\"}): built-in tools (web search, file search, "
                      "code interpreter, computer use, MCP...) have nothing to run them here; leave it out")
    if "function" in tool and "name" not in tool:
        raise ApiError(400, f"{where} is a chat completions tool ({{\"function\": {{...}}}}); a Responses function "
                       "tool is flat: {\"type\": \"function\", \"name\", \"description\", \"parameters\"}",
                       param=f"{where}.name")
    if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
        raise ApiError(400, f"{where}.strict must be true or false, got {json_shown(tool['strict'])}",
                       param=f"{where}.strict")
    return {"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description"),
                                             "parameters": tool.get("parameters")}}


def _echoed_tool(tool: dict) -> dict:
    """A function tool as the response repeats it (OpenAI's: strict unless the request said otherwise)."""
    strict = tool.get("strict")
    return {"type": "function", "name": tool["name"], "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": True if strict is None else strict}


def _tool_choice(choice: object) -> object:
    if choice in ("auto", "none", "required"):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if kind == "allowed_tools":
        raise _refuse("tool_choice", "'tool_choice' {\"type\": \"allowed_tools\"} is not supported: send only the "
                      "allowed tools in 'tools', with tool_choice \"auto\" or \"required\"")
    raise ApiError(400, f"'tool_choice' must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
                   f"\"name\": ...}}, got {json_shown(choice)}", param="tool_choice")


def _text_format(text: object) -> dict | None:
    """``text.format`` as the chat request's ``response_format`` (None for plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise ApiError(400, f"'text' must be an object such as {{\"format\": {{\"type\": \"text\"}}}}, got "
                       f"{json_shown(text)}", param="text")
    if text.get("verbosity") not in (None, "low", "medium", "high"):
        raise ApiError(400, f"'text.verbosity' must be \"low\", \"medium\" or \"high\", got "
                       f"{json_shown(text['verbosity'])}", param="text.verbosity")
    given = text.get("format")
    if given is None:
        return None
    kind = given.get("type") if isinstance(given, dict) else None
    if kind not in FORMATS:
        raise ApiError(400, f"'text.format' must be {{\"type\": \"text\" | \"json_object\" | \"json_schema\"}}, got "
                       f"{json_shown(given)}", param="text.format")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if not isinstance(given.get("schema"), dict):
        raise ApiError(400, f"'text.format' json_schema must carry its JSON schema object ({{\"type\": \"json_schema\", "
                       f"\"name\": ..., \"schema\": {{...}}}}), got schema = {json_shown(given.get('schema'))}",
                       param="text.format")
    name = given.get("name")
    if not isinstance(name, str) or not FORMAT_NAME.fullmatch(name):
        raise ApiError(400, f"'text.format.name' must name the schema with 1 to 64 letters, digits, '_' or '-' "
                       f"({{\"type\": \"json_schema\", \"name\": \"reading\", \"schema\": {{...}}}}), got "
                       f"{json_shown(name)}", param="text.format.name")
    if given.get("strict") is not None and not isinstance(given["strict"], bool):
        raise ApiError(400, f"'text.format.strict' must be true or false, got {json_shown(given['strict'])}",
                       param="text.format.strict")
    if given.get("description") is not None and not isinstance(given["description"], str):
        raise ApiError(400, f"'text.format.description' must be a string, got {json_shown(given['description'])}",
                       param="text.format.description")
    spec = {field: given[field] for field in ("name", "description", "schema", "strict") if field in given}
    return {"type": "json_schema", "json_schema": spec}


# ------------------------------------------------------------------------------------------ kept responses
