"""Tool calls (OpenAI's ``tools`` and ``tool_choice``) with any chat template, in llama.cpp's generic form.

Few small models' chat templates know tools, and those that do each mark a call their own way. So,
as llama.cpp does for templates without native tool support (its "generic" tool-call format), the
tools are described in the system message and the answer is constrained by a JSON schema
(``edgesdk/runtime/json_schema.py``) to one object:

- ``{"tool_call": {"name": NAME, "arguments": {...}}}``: a call, its arguments an instance of that
  tool's ``parameters`` schema; returned as OpenAI's ``tool_calls`` with ``finish_reason``
  ``tool_calls``;
- ``{"response": "..."}``: an answer in text, offered only with ``tool_choice`` ``auto``.

A tool's ``parameters`` (Anthropic's ``input_schema``, Ollama's ``parameters``) are followed leniently: keywords
that only narrow the arguments and that the constraint cannot follow (``not``, ``propertyNames``,
``patternProperties``, ``if`` / ``then`` / ``else``, ``dependentRequired``, ``minProperties``, a lookahead in a
``pattern``, ...; json_schema.lenient_schema) are dropped from the constraint, with a warning logged once per tool
naming them, rather than refusing the request: such schemas come from MCP servers (zod-to-json-schema writes
``propertyNames`` and ``not: {}``), llama-server's json-schema-to-grammar ignores these keywords, and Ollama builds
no grammar from tool schemas. The constraint then admits every valid call (and calls the dropped keywords would
refuse); the model still reads the whole schema. The older dialects' keywords that OpenAPI-generated (FastAPI,
Gemini-style) and draft-04 tool schemas carry are read as what they mean, without a word: OpenAPI 3.0's boolean
``nullable`` as its type plus ``null`` (beside an ``enum``, ``null`` among its values), draft-04's boolean
``exclusiveMinimum`` / ``exclusiveMaximum`` as 2020-12's numeric bound; ``$anchor``, ``$dynamicAnchor`` and
``$vocabulary``, which name rather than constrain, are left out, and a ``$dynamicRef`` is dropped with the warning
(json_schema.openapi_nullable, draft04_exclusive, NAMING_ONLY). The keywords that shape the arguments (``type``, ``properties``,
``required``, ``items``, ``enum``, ``const``, ``anyOf`` / ``oneOf`` / ``allOf``, ``$ref``) are followed as they
are, and a malformed schema is refused naming the tool. A root that admits null beside an object
(``{"type": ["object", "null"]}``, pydantic's ``Optional[Model]``) is read as its object, as a call's arguments are
one (``_object_branch``); a root that can be no object is refused. A response format's schema, which the user wrote for the
answer, is not read leniently: an unsupported keyword there is refused by name.

A response format beside the tools (OpenAI's ``response_format`` json_schema or json_object, llama-server's
``json_schema``) shapes that answer, as llama.cpp's generic format does (common/chat.cpp,
``common_chat_params_init_generic``: the ``response`` property takes the request's JSON schema in place of a
string): ``{"response": <an instance of the schema>}``, or with json_object ``{"response": {...}}``, any JSON
object. Its content is the JSON text of that value as the model wrote it, so a client parses it as it parses a
structured answer without tools (llama.cpp re-indents it, ``response.dump(2)``, which parses the same). The
model so answers either with a call or in the schema, as OpenAI answers a request carrying both. A GBNF
``grammar`` cannot be joined to this JSON envelope and is refused beside tools (edgesdk/serve/api.py).

``parallel_tool_calls`` true (OpenAI's field) lets one answer make several calls, in the list form llama.cpp's
generic format takes then (``common_chat_params_init_generic``): ``{"tool_calls": [{"name": NAME, "arguments":
{...}}, ...]}``, at least one call; each comes back as its own entry of ``tool_calls``, with its own ``id`` and
``index``. Its default here is llama-server's, false (``oaicompat_chat_params_parse`` reads
``parallel_tool_calls`` as false when absent), so an answer makes one call unless the request asks for more; OpenAI
defaults it to true. The Responses route (edgesdk/serve/responses.py) passes on its own field with the same
default, and repeats what it applied. llama.cpp also asks the model for an ``id`` of each call in the list form;
the ids here are the server's (``call_...``), as for one call, so the model writes none.

``tool_choice`` ``required`` leaves only calls, a named function only calls of it (there is no answer then, so
a response format does not apply), ``none`` offers no tools (a response format then shapes the whole answer).
Earlier turns travel in the same form: an assistant message's ``tool_calls`` become its ``{"tool_call": ...}``
text (with ``parallel_tool_calls``, one ``{"tool_calls": [...]}`` of them all), each call with its ``id`` after its
arguments, and a ``tool`` message becomes a user message ``{"tool_response": {"tool", "content", "tool_call_id"}}``
(the id of the call it answers where the caller passes it), both as llama.cpp's polyfills write them, which any
template renders; several results in a row, and a user message after them, are one user turn when the template
renders them (edgesdk/serve/api.py, ``chat_turns``), so templates that want the roles to alternate take them.

Streamed, the answer goes out as llama-server streams a call or a text (:class:`AnswerStream`): each call's name
once whole, then its arguments in pieces, under the call's own ``index``; the text as it is written; the JSON
around them never.
"""

from __future__ import annotations

import codecs
import copy
import json
import logging
import math
import re
import uuid
from dataclasses import dataclass

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.json_schema import (
    CompiledSchema,
    RootError,
    SchemaError,
    compile_schema,
    hoist_refs,
    lenient_schema,
    resolve_ref,
)
from edgesdk.runtime.text import check_utf8
from edgesdk.serve.reasoning import OPEN, ReasoningSplitter
from edgesdk.serve.reasoning import WHITESPACE as REASONING_SPACE

# A tool's name: 1-128 letters, digits, '_', '-', '.', '/' or ':'. OpenAI's rule (^[a-zA-Z0-9_-]{1,64}$) widened to
# what the clients of the other routes send and their references take: Anthropic's API takes ^[a-zA-Z0-9_-]{1,128}$
# (Claude Code's MCP tools, mcp__SERVER__TOOL, often pass 64); the MCP specification's tool names (SEP-986) add '.' and
# '/', and Ollama clients send them as they are (ollmcp, the MCP client for Ollama, names each tool SERVER.TOOL),
# Ollama's own API checking no name; Gemini's function names take '.' and ':'. llama-server checks no name either
# (common_chat_tools_parse_oaicompat). The name is a JSON string the answer's schema holds as a const, so none of these
# characters needs escaping, and a stream still finds a call's name whole (CALL_NAME, ITEM_NAME).
NAME = re.compile(r"^[A-Za-z0-9_./:-]{1,128}$")
NO_PARAMETERS = {"type": "object", "properties": {}}
LOG = logging.getLogger(__name__)
_WARNED: set = set()  # (tool name, keywords dropped) already logged: a client sends its tools with every request
_WARNED_MAX = 1024


class ToolError(Exception):
    """A ``tools`` / ``tool_choice`` field or a tool message that cannot be honoured (``param`` names it; ``code``,
    the error code its 400 carries: ``not_utf8`` for text that is not UTF-8, as every route's 400 of it)."""

    def __init__(self, message: str, param: str, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass(frozen=True)
class Tools:
    """The tools offered to one request."""

    names: tuple[str, ...]  # every tool's name, in the request's order
    choice: str  # "auto", "required", or the one tool's name that must be called (which may be "auto" too)
    schema: CompiledSchema  # what the answer must be
    instructions: str  # appended to the system message
    # the {"response": ...} option's value is JSON of a response format, returned as its JSON text (not a string)
    structured: bool = False
    parallel: bool = False  # parallel_tool_calls: the answer may hold several calls ({"tool_calls": [...]})
    # per tool whose parameters use keywords the constraint does not follow (_function): what it says of them
    ignored: tuple[str, ...] = ()


ANY_OBJECT = {"type": "object", "additionalProperties": True}  # response_format json_object: any JSON object


def parse_tools(body: dict, response: dict | None = None) -> Tools | None:
    """``tools`` and ``tool_choice`` of a chat request (None: no tools offered, or ``tool_choice`` none).
    ``response``: the JSON schema of the request's response format (:data:`ANY_OBJECT` for json_object), which
    the ``{"response": ...}`` option's value follows, or None for an answer in text.

    The conversation's tool results are checked here too (:func:`check_tool_results`): every route's chat request
    comes through, tools offered or not (a last turn answering a call may offer none)."""
    if isinstance(body.get("messages"), list):
        check_tool_results(body["messages"])
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = parallel_calls(body)
    if tools is not None and not isinstance(tools, list):  # {}, "" or false too: no JSON array is no tools
        raise ToolError(f"'tools' must be an array of {{\"type\": \"function\", \"function\": ...}}, got "
                        f"{type(tools).__name__} {json.dumps(tools)[:60]}; send null or [] for no tools", "tools")
    if not tools:
        if choice not in (None, "none", "auto"):
            _choice_form(choice)  # a value no tools could make valid is named as such, not as wanting tools
            raise ToolError(f"'tool_choice' {json.dumps(choice)[:60]} needs 'tools' to choose from", "tool_choice")
        return None
    functions = [_function(tool, index) for index, tool in enumerate(tools)]
    names = tuple(function["name"] for function in functions)
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ToolError(f"'tools' names {duplicated} more than once; give each tool its own name (a call names the "
                        "tool it calls)", "tools")
    mode, named = _choice(choice, names)
    if mode == "none":
        return None
    offered = functions if named is None else [f for f in functions if f["name"] == named]
    may_answer = mode == "auto"
    chosen = mode if named is None else named
    response = response if may_answer else None  # only calls: no answer for a response format to shape
    try:
        schema = _answer_schema(offered, may_answer, response, parallel)
        instructions = _instructions(offered, may_answer, response, parallel)
    except SchemaError as exc:  # each tool's schema compiled alone, so one nested as deep as Python's stack allows
        # (the answer's schema holds it a few levels further down)
        raise ToolError(f"'tools': {exc.problem}; {exc.fix}", "tools") from exc
    except RecursionError:  # json.dumps of such a schema: a 500 with a traceback, not a refusal
        raise ToolError("'tools': a tool's parameters are nested too deeply; flatten them (move repeated parts "
                        "under $defs and refer to them with $ref)", "tools") from None
    return Tools(names=names, choice=chosen, schema=schema, instructions=instructions,
                 structured=response is not None, parallel=parallel,
                 ignored=tuple(f["ignored"] for f in functions if f["ignored"]))


def parallel_calls(body: dict) -> bool:
    """``parallel_tool_calls``: true, false, or absent / null for llama-server's default, false (one call per
    answer; OpenAI's default is true)."""
    value = body.get("parallel_tool_calls")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ToolError(f"'parallel_tool_calls' must be true (an answer may make several tool calls) or false (one "
                        f"at most), got {json.dumps(value)[:60]}", "parallel_tool_calls")
    return value


def check_tool_results(messages: list) -> None:
    """A :class:`ToolError` naming ``messages[i].tool_call_id`` where a ``tool`` message sends an id that no call
    made before it has, though the assistant message before it made calls with ids: the result answers no call the
    model made (an id mistyped, or one the client made up), and the prompt would show the model a result of nothing
    it asked for, of no tool. OpenAI refuses such a message ("Invalid parameter: messages with role 'tool' must be
    a response to a preceding message with 'tool_calls'"); the error names the id and those of the calls before it.

    Taken, as llama-server takes them (common_chat_msgs_parse_oaicompat reads the id where it is given and checks
    none): a result with no ``tool_call_id``, or after an assistant message whose calls carry no ids (or that made
    none): a client of the older function-calling form, or of Ollama's, names the tool alone; and a result whose id
    is that of a call of an earlier turn, which the prompt writes under that call's tool and id as it does any
    result (edgesdk/serve/api.py, ``_tool_call_names``; Ollama's route reads such an id the same way)."""
    made: set[str] = set()  # the ids of every call made so far
    offered: list[str] = []  # those of the calls of the last assistant message
    turn = 0  # that message's place
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant":
            calls = message.get("tool_calls")
            turn = index
            offered = [call["id"] for call in calls if isinstance(call, dict) and isinstance(call.get("id"), str)] \
                if isinstance(calls, list) else []
            made.update(offered)
        elif role == "tool" and offered:
            ident = message.get("tool_call_id")
            if isinstance(ident, str) and ident not in made:
                param = f"messages[{index}].tool_call_id"
                raise ToolError(f"{param} {json.dumps(ident, ensure_ascii=False)[:80]} names no call made before it "
                                f"(messages[{turn}].tool_calls, the calls it follows, has the ids "
                                f"{', '.join(json.dumps(i, ensure_ascii=False)[:80] for i in offered)}); send the id of "
                                "the call this result answers, as that message's tool_calls give it", param)


def _function(tool: object, index: int) -> dict:
    param = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise ToolError(f"{param} must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}; "
                        "this server calls functions only", param)
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):  # match's "$" would let a name end in "\n"
        raise ToolError(f"{param}.function.name {json.dumps(name)[:60]} must be 1-128 letters, digits, '_', '-', '.', "
                        "'/' or ':'; rename the tool", f"{param}.function.name")
    description = function.get("description")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise ToolError(f"{param}.function.description must be a string (or null for none), got "
                        f"{json.dumps(description)[:60]}", f"{param}.function.description")
    utf8_text(description, f"{param}.function.description")  # else the prompt's check blames the system message
    parameters = function.get("parameters")
    if parameters is None or parameters == {}:  # absent, null or {}: a function that takes no arguments
        parameters = NO_PARAMETERS
    if isinstance(parameters, str):  # compile_schema would read it as JSON text; here the schema is the object
        raise ToolError(f"{param}.function.parameters must be a JSON schema object, got a string "
                        f"{json.dumps(parameters)[:60]}; send the schema itself, not its JSON text",
                        f"{param}.function.parameters")
    try:
        constraint, dropped = lenient_schema(parameters)
        constraint = _object_branch(constraint)
        compile_schema(constraint)  # refused here, naming the tool, rather than inside the combined schema
    except RootError as exc:  # a string, a number, ...: the response format's advice does not fit arguments
        raise _not_an_object(param, f"is {exc.other}") from exc
    except SchemaError as exc:
        raise ToolError(f"{param}.function.parameters: {exc.problem}; {exc.fix}", f"{param}.function.parameters") \
            from exc
    types = _root_types(constraint, constraint)
    if types != {"object"}:
        raise _not_an_object(param, "names no type" if types is None
                             else f"is {' or '.join(sorted(types)) or 'no type at all'}")
    # its descriptions reach the prompt (checked once compiled: a schema nested too deeply is refused there)
    try:
        utf8_text(json.dumps(parameters, ensure_ascii=False), f"{param}.function.parameters")
    except RecursionError:  # a default, const or examples value nested deeper than Python's JSON writes
        raise ToolError(f"{param}.function.parameters is nested too deeply to write into the prompt (a value in it "
                        "holds objects or arrays deeper than this server's JSON reads and writes); flatten it",
                        f"{param}.function.parameters") from None
    ignored = _ignored(param, name, dropped)
    return {"name": name, "description": description, "parameters": parameters, "constraint": constraint,
            "ignored": ignored}


def _not_an_object(param: str, got: str) -> ToolError:
    """The refusal of a tool's parameters whose root is not an object (``got``: what it is instead): a call's
    arguments are a JSON object (OpenAI's ``arguments``, the JSON text of one; llama.cpp's generic format's
    ``"arguments": {...}``), its properties the named arguments."""
    return ToolError(f"{param}.function.parameters must describe an object (the call's named arguments), got a "
                     f"schema whose root {got}; give it \"type\": \"object\" and the arguments as its "
                     "\"properties\" (a single value: {\"type\": \"object\", \"properties\": {\"value\": ...}, "
                     "\"required\": [\"value\"]})", f"{param}.function.parameters")


def _object_branch(schema: object) -> object:
    """A tool's parameters read as the object they may be: ``null`` left out of a root that admits an object or
    null (``{"type": ["object", "null"]}``, OpenAPI's ``"nullable": true`` once read, a ``{"type": "null"}`` option
    of a root ``anyOf`` / ``oneOf`` as pydantic writes ``Optional[Model]``, such a type list in one of its options).
    A call's arguments are an object (OpenAI's ``arguments`` is the JSON text of one), and null arguments would make
    no call, so the constraint keeps the object branch; llama.cpp's tool grammar takes such a schema too. ``schema``
    itself is returned where there is no such null (the model reads the parameters as the client wrote them)."""
    out = _without_null_type(schema)
    for keyword in ("anyOf", "oneOf"):
        options = out.get(keyword) if isinstance(out, dict) else None
        if isinstance(options, list) and not all(_is_null(option) for option in options):
            out = {**out, keyword: [_without_null_type(option) for option in options if not _is_null(option)]}
    return out if out != schema else schema


def _without_null_type(schema: object) -> object:
    """``schema`` with ``null`` left out of a ``type`` list that names ``object`` too."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if not (isinstance(kind, list) and "object" in kind and "null" in kind):
        return schema
    kinds = [each for each in kind if each != "null"]
    return {**schema, "type": kinds[0] if len(kinds) == 1 else kinds}


def _is_null(schema: object) -> bool:
    """``schema`` admits null alone: ``{"type": "null"}`` (or ``["null"]``), ``{"const": null}`` or
    ``{"enum": [null]}``, with nothing beside but annotations."""
    if not isinstance(schema, dict):
        return False
    shaping = {key: value for key, value in schema.items() if key not in ("title", "description", "default",
                                                                           "examples", "$comment")}
    return shaping in ({"type": "null"}, {"type": ["null"]}, {"const": None}, {"enum": [None]})


def _ignored(param: str, name: str, dropped: tuple[str, ...]) -> str:
    """The line that says which keywords of a tool's parameters the answer's constraint does not follow
    (json_schema.lenient_schema: ``not``, ``propertyNames``, ``patternProperties``, ``if`` / ``then`` / ``else``,
    ``minProperties``, a pattern with a lookahead, ...; "" for none), logged as a warning once per tool and
    keywords. Such a keyword only narrows the arguments, so the constraint without it admits every call the
    schema admits (and some it does not, which the client's own validation catches): the request is answered
    rather than refused whole, as llama-server, whose json-schema-to-grammar ignores these keywords, and
    Ollama, which builds no grammar from tool schemas, answer it. The model still reads them in the tools'
    description. A response format's schema is not read this way: it is followed as written, or refused."""
    if not dropped:
        return ""
    line = (f"{param}.function.parameters of tool {name!r}: {', '.join(dropped)} not enforced on the call's "
            "arguments (the answer's constraint cannot follow them; llama.cpp's json-schema-to-grammar ignores them "
            "too); the model still reads them in the tools' description")
    warn_once(_WARNED, (name, dropped), line)
    return line


def warn_once(warned: set, key: object, line: str) -> None:
    """Log ``line`` as serve's warning the first time ``key`` is seen in ``warned`` (a client sends the same tools
    or chain with every request); ``warned`` is emptied past ``_WARNED_MAX`` keys, so a client sending ever new
    ones cannot grow it without bound."""
    if key in warned:
        return
    if len(warned) >= _WARNED_MAX:
        warned.clear()
    warned.add(key)
    LOG.warning("edgesdk serve: %s", line)


def _root_types(schema: dict, root: dict, depth: int = 0) -> set[str] | None:
    """The JSON types a schema's root may take (None where it names none): its ``type`` (a name or a list of
    them), an object where it has only ``properties``, following its local ``$ref`` (compile_schema has checked that
    each resolves, to an object or an array, and that no chain of them comes back to itself), the types of any of its
    ``anyOf`` / ``oneOf`` options and those all of its ``allOf`` parts share. So ``{"type": ["object"]}`` and a
    union of objects (zod's and Pydantic's root unions) describe an object, as llama.cpp's json-schema-to-grammar
    reads them; ``depth`` stops a chain of options that comes back to the root."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < _ROOT_DEPTH:
        schema, depth = resolve_ref(root, schema["$ref"]), depth + 1  # any local JSON pointer, as compiled
    if not isinstance(schema, dict) or depth >= _ROOT_DEPTH:
        return None
    kind = schema.get("type", "object" if "properties" in schema else None)
    types = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else None
    for keyword in ("anyOf", "oneOf"):
        if isinstance(schema.get(keyword), list) and schema[keyword]:
            options = [_root_types(option, root, depth + 1) for option in schema[keyword]]
            union = None if None in options else set().union(*options)
            types = union if types is None else types if union is None else types & union
    if isinstance(schema.get("allOf"), list):
        for part in schema["allOf"]:
            named = _root_types(part, root, depth + 1)
            types = named if types is None else types if named is None else types & named
    return types


_ROOT_DEPTH = 64  # options and refs followed from a tool's root before its type is taken for unnamed


def _choice(choice: object, names: tuple[str, ...]) -> tuple[str, str | None]:
    """(mode, function): ``tool_choice``'s mode, "auto", "required", "none" or "function", and with "function"
    the name of the one tool to call. A function may be named "none", "auto" or "required" (OpenAI's rule for a
    name allows it), and ``{"type": "function", "function": {"name": "none"}}`` still forces a call of it."""
    if choice is None:
        return "auto", None
    name = _choice_form(choice)
    if name is None:
        return choice, None
    if name in names:
        return "function", name
    raise ToolError(f"'tool_choice' names the function {json.dumps(name)[:60]}, which 'tools' does not offer "
                    f"(offered: {', '.join(names)})", "tool_choice")


def _choice_form(choice: object) -> str | None:
    """The function a ``tool_choice`` names (None for a mode, "auto", "required" or "none"), or a
    :class:`ToolError` for a value of no form OpenAI takes (as llama-server refuses it, "Invalid tool_choice",
    whether or not ``tools`` are given): a misspelt mode, or a function choice whose name is not a string."""
    if choice in ("auto", "required", "none"):
        return None
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return function["name"]
    raise ToolError(f"'tool_choice' must be \"auto\", \"required\", \"none\" or {{\"type\": \"function\", "
                    f"\"function\": {{\"name\": ...}}}}, got {json.dumps(choice)[:60]}", "tool_choice")


def _answer_schema(functions: list[dict], may_answer: bool, response: dict | None = None,
                   parallel: bool = False) -> CompiledSchema:
    """One call of one of ``functions`` (each tool's $defs moved under its own prefix), or with ``parallel`` a
    list of one or more such calls (llama.cpp's generic format's ``{"tool_calls": [...]}``, ``minItems`` 1), or
    an answer: text, or an instance of the ``response`` schema (its $defs moved under the prefix ``response``)."""
    definitions, calls = {}, []
    for index, function in enumerate(functions):
        parameters = _hoisted(function["constraint"], f"tool{index}", definitions)
        calls.append({"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                      "required": ["name", "arguments"]})
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        call = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
                "required": ["tool_calls"]}
    else:
        call = {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]}
    answer = {"type": "string"} if response is None else _hoisted(response, "response", definitions)
    options = [call, {"type": "object", "properties": {"response": answer}, "required": ["response"]}]
    root = {"anyOf": options} if may_answer else call
    return compile_schema({**root, "$defs": definitions})


def _hoisted(schema: dict, prefix: str, definitions: dict) -> dict:
    """``schema`` with the schemas its local refs reach moved into ``definitions`` under ``prefix`` and its refs
    renamed to match (json_schema.hoist_refs: ``#/$defs/NAME``, ``#/definitions/NAME``, ``#/properties/...``,
    ``#``, any JSON pointer, read as compile_schema reads it), so that nested in the answer's schema each still
    means what it meant in the tool's own schema."""
    return hoist_refs(schema, prefix, definitions)


def _instructions(functions: list[dict], may_answer: bool, response: dict | None = None,
                  parallel: bool = False) -> str:
    listed = json.dumps([{"name": f["name"], "description": f["description"], "parameters": f["parameters"]}
                         for f in functions], ensure_ascii=False)
    if response == ANY_OBJECT:
        value = "<your answer as one JSON object>"
    elif response is not None:
        value = f"<your answer as JSON of this schema: {json.dumps(response, ensure_ascii=False)}>"
    else:
        value = '"<your answer>"'
    calling = " to call one or more tools" if parallel else " to call a tool"
    answer = f'{calling}, or {{"response": {value}}} to answer the user directly' if may_answer else calling
    call = '{"name": "<tool name>", "arguments": {...}}'
    form = f'{{"tool_calls": [{call}, ...]}}' if parallel else f'{{"tool_call": {call}}}'
    return (f"You can call these tools (each with the JSON schema of its arguments):\n{listed}\n"
            f"Reply with one JSON object: {form}{answer}.")


def with_instructions(messages: list[dict], tools: Tools) -> list[dict]:
    """``messages`` with the tools' description appended to the system message (one is put first if none)."""
    if messages and messages[0]["role"] == "system":
        first = messages[0]["content"]
        return [{"role": "system", "content": f"{first}\n\n{tools.instructions}" if first else tools.instructions},
                *messages[1:]]
    return [{"role": "system", "content": tools.instructions}, *messages]


def call_text(tool_calls: object, param: str, parallel: bool = False) -> str:
    """An earlier assistant turn's ``tool_calls`` as the text the model writes for them: a ``{"tool_call": ...}``
    line each, or with ``parallel`` (the request's ``parallel_tool_calls``) one ``{"tool_calls": [...]}``, the
    form the model is asked to answer in.

    A call's ``arguments`` are JSON text, read as the value they write; text that is not JSON (an answer cut by
    ``max_tokens`` inside its arguments, which this server returns as written, or ``""`` for no arguments) is kept
    as that string, as llama-server keeps it (minja's ``chat_template::apply``, ``polyfill_tool_calls``: "Failed
    to parse arguments", the string left as it is), rather than refusing the conversation: OpenAI's API takes any
    string there, and a client sends back the answers it was given.

    A call's ``id`` (a string, where the call carries one) is written after its arguments, as llama.cpp's
    polyfill of earlier calls writes it (minja's ``polyfill_tool_calls``: ``name``, ``arguments``, then ``id``), so
    that the ``tool_call_id`` of a result (:func:`tool_result_text`) names a call the model has read: two calls of
    one tool are otherwise told apart by nothing. The answer's schema holds no ``id`` (the server gives each call
    its own, :func:`read_answer`), and it closes a call's object after its arguments; with the id last, a model that
    writes what its earlier turns show has its call whole before the constraint leaves the id out, rather than
    being turned away from its first key.

    Only ``function`` calls are read: a call of another ``type`` (OpenAI's custom tools, ``{"type": "custom",
    "custom": {"name", "input"}}``) is refused by its type, as llama-server refuses it
    (common_chat_msgs_parse_oaicompat: "Unsupported tool call type"); a call that gives no type is read as a
    function call, as Ollama's clients send them. A name, id or arguments holding text that is not UTF-8 (a lone
    surrogate from a JSON escape) is refused naming that field."""
    if not isinstance(tool_calls, list):
        raise ToolError(f"{param} must be an array of tool calls", param)
    calls = []
    for index, call in enumerate(tool_calls):
        where = f"{param}[{index}]"
        if isinstance(call, dict) and call.get("type") not in (None, "function"):
            raise ToolError(f"{where}.type is {call['type']!r}: only function calls ({{\"type\": \"function\", "
                            "\"function\": {\"name\", \"arguments\"}}) can be replayed to this model; send the "
                            "call as a function call or leave it out", f"{where}.type")
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ToolError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", "
                            "\"arguments\"}}", where)
        name = utf8_text(function["name"], f"{where}.function.name")
        arguments = _call_arguments(function.get("arguments", "{}"), f"{where}.function.arguments")
        ident = call.get("id")
        written = {} if not isinstance(ident, str) else {"id": utf8_text(ident, f"{where}.id")}  # last, as minja writes it
        calls.append({"name": name, "arguments": arguments, **written})
    if parallel:
        return json.dumps({"tool_calls": calls}, ensure_ascii=False)
    return "\n".join(json.dumps({"tool_call": call}, ensure_ascii=False) for call in calls)


def _call_arguments(arguments: object, param: str) -> object:
    """A call's ``arguments`` as the model reads them (:func:`call_text`): JSON text as the value it writes, other
    text (a call cut short) as it is. JSON text whose escapes decode to a lone surrogate (``"\\ud800"``) is kept as
    the text written, as llama.cpp keeps it (its JSON parser refuses such escapes, and minja keeps arguments it
    fails to parse), rather than read into text that is not UTF-8, and so is text whose value JSON's text cannot
    write back: ``NaN`` or ``Infinity`` (Python's JSON, not JSON), or a number past a double (``1e400``), which
    read would be written back as ``Infinity``, or nested deeper than Python's JSON reads or writes (arrays or
    objects in one another, counted as the call's line holds them: :func:`_enveloped`); arguments that are
    themselves not UTF-8 are refused naming ``param``, and so are arguments sent as a value nested that deep, which
    have no text to keep (:func:`arguments_text`)."""
    if not isinstance(arguments, str):
        utf8_text(arguments_text(arguments, param), param)
        return arguments
    utf8_text(arguments, param)
    try:
        value = json.loads(arguments)
        written = _enveloped(value, allow_nan=False)
    except (ValueError, RecursionError):  # not JSON text (a call cut short), NaN, 1e400, or nested past what
        return arguments  # Python's JSON reads and writes: the model reads the string as it is
    return value if _is_utf8(written) else arguments


def arguments_text(arguments: object, param: str) -> str:
    """A replayed call's arguments sent as a value (an object, not its JSON text: the chat route's, Ollama's
    ``function.arguments``, Anthropic's ``tool_use`` ``input``) as their JSON text, written once, inside the deepest
    envelope :func:`call_text` writes them in; a :class:`ToolError` naming ``param`` where they are nested deeper
    than this server's JSON reads and writes. The text's UTF-8 is the caller's to check, as its route words it."""
    try:
        written = _enveloped(arguments)
    except RecursionError:
        raise ToolError(f"{param} is nested too deeply to write into the prompt (objects or arrays deeper than this "
                        "server's JSON reads and writes); flatten the call's arguments", param) from None
    return written[len(_ENVELOPE_HEAD):-len(_ENVELOPE_TAIL)]


_ENVELOPE_HEAD, _ENVELOPE_TAIL = '{"tool_calls": [{"arguments": ', "}]}"  # around the arguments :func:`_enveloped` writes


def _enveloped(arguments: object, allow_nan: bool = True) -> str:
    """``arguments`` written inside the deepest envelope :func:`call_text` writes them in (the list form's), so
    that arguments Python's JSON writes here it writes there too (a RecursionError where they are nested too
    deeply; without ``allow_nan`` a ValueError where they hold NaN or an infinity)."""
    return json.dumps({"tool_calls": [{"arguments": arguments}]}, ensure_ascii=False, allow_nan=allow_nan)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def utf8_text(text: str, param: str) -> str:
    """``text``, a field of a call that reaches the prompt, or a :class:`ToolError` naming ``param`` where it is not
    UTF-8 (a lone surrogate from a JSON escape), which the prompt's own check would blame on the message's content."""
    try:
        check_utf8(text, param)
    except EdgeSDKError as exc:
        raise ToolError(f"{exc.problem}: {exc.fix}", param, code="not_utf8") from exc
    return text


def tool_result_text(name: str | None, content: str, call_id: str | None = None) -> str:
    """A ``tool`` message's content as the user-turn text the model reads, as llama.cpp's polyfill of tool results
    writes it for a template without a tool role (minja's ``chat_template::apply``, ``polyfill_tool_responses``):
    ``{"tool_response": {"tool": NAME, "content": ..., "tool_call_id": ID}}``, the tool's name under ``tool`` (left
    out where no name is known, as minja leaves it out of a message naming none), and the ``tool_call_id`` of the
    call it answers where the message gives one, which matches the ``id`` its call is written with
    (:func:`call_text`), so that two results of one tool, answering parallel calls, still say which call each
    answers."""
    result = {**({} if name is None else {"tool": name}), "content": content,
              **({} if call_id is None else {"tool_call_id": call_id})}
    return json.dumps({"tool_response": result}, ensure_ascii=False)


def is_tool_result(text: str) -> bool:
    """Whether ``text`` is a tool result's user-turn text (:func:`tool_result_text`), one ``{"tool_response":
    {...}}`` object."""
    if not text.startswith('{"tool_response": {'):
        return False
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python's JSON reads: a user's own text
        return False
    return isinstance(value, dict) and list(value) == ["tool_response"] and isinstance(value["tool_response"], dict)


def read_answer(text: str, complete: bool, structured: bool = False) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of an answer written under a tools schema; an incomplete one (cut by max_tokens,
    or by a stop string, whose answer also ends as "stop") is returned as text, and so is one holding a number
    the answer's JSON cannot carry on (the schema takes any digits: 1e999 is past a double, which JSON's text
    has no Infinity for, and Python reads no integer past 4,300 digits), and so is one nested deeper than Python's
    JSON reads (:meth:`AnswerStream.finish` reads such an answer itself). ``structured``: the ``response``
    option's value is JSON of a response format, whose text is the content, as written (such a number too: it is
    never written again, and the stream has given it out as written)."""
    content, calls, _ = _read(text, complete, structured)
    return content, calls


def _read(text: str, complete: bool, structured: bool) -> tuple[str | None, list[dict] | None, bool | None]:
    """:func:`read_answer`'s (content, tool_calls), and whether the text was read as a whole answer: None where it
    is JSON nested deeper than Python's JSON reads or writes (arrays or objects in one another, which an argument
    the schema leaves free admits), given as text (:meth:`AnswerStream.finish`, which reads the
    answer without that limit, makes its message of what it read)."""
    if not complete:
        return text, None, False
    try:
        return _read_whole(text, structured)
    except RecursionError:
        return text, None, None


def _read_whole(text: str, structured: bool) -> tuple[str | None, list[dict] | None, bool]:
    """:func:`_read` of an answer whose generation ended it."""
    try:
        answer = json.loads(text, parse_float=_finite)
    except ValueError:  # a stop string cut the JSON (the schema lets only a whole answer parse), or such a number
        if structured and _is_response(text, _as_written(text), structured):  # its text is the content, as written
            return _response_text(text), None, True
        return text, None, False
    if _is_response(text, answer, structured):
        return (_response_text(text) if structured else answer["response"]), None, True
    calls = _envelope_calls(answer)
    if calls is None:  # JSON, but not the envelope (no constraint held it): a text, given whole
        return text, None, True
    return None, [{"id": _call_id(), "type": "function",
                   "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
                  for call in calls], True


def _is_response(text: str, answer, structured: bool) -> bool:
    """Whether the parsed ``answer`` is the envelope's text answer, ``{"response": ...}`` (a string unless
    ``structured``)."""
    if not (isinstance(answer, dict) and list(answer) == ["response"]):
        return False
    return RESPONSE_KEY.match(text) is not None if structured else isinstance(answer["response"], str)


def _envelope_calls(answer) -> list[dict] | None:
    """The calls of the parsed ``answer``, ``{"tool_call": CALL}`` or ``{"tool_calls": [CALL, ...]}``, each CALL an
    object with a string ``name`` and ``arguments``; None for JSON of any other shape."""
    if not isinstance(answer, dict) or len(answer) != 1:
        return None
    calls = answer.get("tool_calls", [answer["tool_call"]] if "tool_call" in answer else None)
    if not isinstance(calls, list) or not all(isinstance(call, dict) and isinstance(call.get("name"), str) and
                                              "arguments" in call for call in calls):
        return None
    return calls


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


RESPONSE_KEY = re.compile(r'\s*\{\s*"response"\s*:\s*')  # the schema writes a listed key as it is named


def _response_text(text: str) -> str:
    """The JSON text of a whole answer's ``response`` value, as the model wrote it (``text`` parses)."""
    start = RESPONSE_KEY.match(text).end()
    _, end = AS_WRITTEN.raw_decode(text, start)
    return text[start:end]


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# JSON text read for its shape alone, its numbers kept as their text: any number JSON's grammar writes is read, one
# past a double (1e999) or of more digits than Python reads into an integer too, and NaN or Infinity is refused
AS_WRITTEN = json.JSONDecoder(parse_float=str, parse_int=str, parse_constant=_reject_constant)


def _as_written(text: str) -> object:
    """``text`` read by :data:`AS_WRITTEN` (None where it is no JSON text)."""
    try:
        return AS_WRITTEN.decode(text)
    except ValueError:
        return None


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"the number {number[:40]} is past a double's range")
    return value


def answer_message(text: str, finish_reason: str, structured: bool = False,
                   opened: bool | None = None) -> tuple[dict, str]:
    """(the assistant message's fields, finish_reason) of an answer written under a tools schema: a call gives
    ``tool_calls`` with no content and the finish reason ``tool_calls`` (``structured``: as for :func:`read_answer`;
    ``opened``: as for :class:`AnswerStream`). It is the message a stream of the same answer (:class:`AnswerStream`)
    builds: an answer cut (by max_tokens or a stop string) once its call's name or its text had begun keeps what was
    written of them, as llama-server's answer cut by max_tokens keeps its partial call or text (it reads the answer
    as partial unless it ended with the end-of-generation token: tools/server/server-context.cpp,
    ``update_chat_msg``); one cut before that has an empty content and no call (the envelope's JSON is not the
    model's answer; llama-server's partial parse gives nothing for it either)."""
    stream = AnswerStream(structured, opened)
    stream.push(text)
    _, fields, finish_reason = stream.finish(finish_reason)
    return fields, finish_reason


# --------------------------------------------------------------------------------- the answer as it streams

# The envelope before the value, as the schema writes it (listed keys in order, as named; between tokens nothing,
# one space, or a newline and indentation, edgesdk/runtime/json_schema.py): a value starts at its first character.
RESPONSE_START = re.compile(r'\s*\{\s*"response"\s*:\s*(?=\S)')
CALL_NAME = re.compile(r'\s*\{\s*"tool_call"\s*:\s*\{\s*"name"\s*:\s*"(' + NAME.pattern[1:-1] + ')"')
ARGUMENTS_START = re.compile(r'\s*,\s*"arguments"\s*:\s*(?=\S)')
# parallel_tool_calls' list form: {"tool_calls": [{"name": ..., "arguments": ...}, ...]}
CALLS_START = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[')
ITEM_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"(' + NAME.pattern[1:-1] + ')"')
ITEM_END = re.compile(r'\s*\}\s*([,\]])')  # a call's object closed, then the next call or the list's end
# what closes the envelope after its value (a call's arguments, a text), or after the list form's "]"
ENVELOPE_END = {"call": re.compile(r"\s*\}\s*\}\s*"), "response": re.compile(r"\s*\}\s*"),
                "calls": re.compile(r"\s*\}\s*")}
# No envelope's text before its value is longer (a name of 128 characters, 8 gaps of at most 21 spacing
# characters and the keys around them); an answer that has not begun one by then is read once whole.
ENVELOPE_LIMIT = 400
ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
WHITESPACE = " \t\n\r"
NUMBER = set("0123456789+-.eE")
LITERALS = ("true", "false", "null")
CLOSES = {"}": "{", "]": "["}


class _Value:
    """One JSON value's text read piece by piece, giving out what of it is settled (held back: a number until
    it ends, a literal until whole, an escape until its last character, a high surrogate until the escape that
    may pair with it). ``mode``: ``dump``, the value as ``json.dumps(value, ensure_ascii=False)`` writes it
    (a call's arguments as :func:`read_answer` gives them); ``text``, a string value's characters (a text
    answer); ``raw``, the value's text as written (a structured answer's). ``done`` once the value is whole;
    ``broken`` where the text is no JSON this reads, or, written again (``dump``), holds a number JSON cannot carry
    on (the answer is then read whole, :func:`read_answer`)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.stack: list[str] = []  # the open containers, "{" or "["
        self.expect = "value"  # value; key (or "}"); item (or "]"); colon; next ("," or the container's close)
        self.token: str | None = None  # string, key, number, literal: the token being read
        self.pending = ""  # a number's or a literal's text, or an escape's
        self.high = ""  # a high surrogate read from an escape, held for a low one
        self.done = self.broken = False
        self.used = 0  # characters read (the value's text, once done)

    def feed(self, text: str) -> str:
        out: list[str] = []
        for char in text:
            if self.done or self.broken:
                break
            self.used += 1
            self._char(char, out)
        return "".join(out)

    def _emit(self, out: list[str], char: str, dumped: str | None = None) -> None:
        """``char`` of the value's structure, written ``dumped`` (itself by default) by json.dumps."""
        if self.mode == "raw":
            out.append(char)
        elif self.mode == "dump":
            out.append(char if dumped is None else dumped)

    def _char(self, char: str, out: list[str]) -> None:
        if self.token in ("string", "key"):
            self._string_char(char, out)
        elif self.token == "literal":
            self.pending += char
            self._emit(out, char, "")
            if self.pending in LITERALS:
                self._emit(out, "", self.pending)
                self.token, self.pending = None, ""
                self._after_value()
            elif not any(word.startswith(self.pending) for word in LITERALS):
                self.broken = True
        elif self.token == "number" and char in NUMBER:
            self.pending += char
            self._emit(out, char, "")
        else:
            if self.token == "number":  # the number ends before this character
                self._end_number(out)
                if self.done or self.broken:
                    return
            self._structural(char, out)

    def _structural(self, char: str, out: list[str]) -> None:
        if char in WHITESPACE:
            if self.stack:  # spacing inside the value is its raw text's, never json.dumps'
                self._emit(out, char, "")
            return
        expect = self.expect
        if (expect, char) in (("key", "}"), ("item", "]")):
            self._close(out, char)
        elif expect in ("value", "item"):
            self._begin(char, out)
        elif expect == "key" and char == '"':
            self.token = "key"
            self._emit(out, char)
        elif expect == "colon" and char == ":":
            self.expect = "value"
            self._emit(out, char, ": ")
        elif expect == "next" and char == ",":
            self.expect = "key" if self.stack[-1] == "{" else "item"
            self._emit(out, char, ", ")
        elif expect == "next" and char in CLOSES and self.stack[-1] == CLOSES[char]:
            self._close(out, char)
        else:
            self.broken = True

    def _begin(self, char: str, out: list[str]) -> None:
        """A value's first character."""
        if self.mode == "text" and char != '"':
            self.broken = True  # a text answer is one string
        elif char in "{[":
            self.stack.append(char)
            self.expect = "key" if char == "{" else "item"
            self._emit(out, char)
        elif char == '"':
            self.token = "string"
            self._emit(out, char)
        elif char in "-0123456789":
            self.token, self.pending = "number", char
            self._emit(out, char, "")
        elif char in "tfn":
            self.token, self.pending = "literal", ""
            self._char(char, out)
        else:
            self.broken = True

    def _close(self, out: list[str], char: str) -> None:
        self.stack.pop()
        self._emit(out, char)
        self._after_value()

    def _after_value(self) -> None:
        self.expect = "next"
        self.done = not self.stack

    def _end_number(self, out: list[str]) -> None:
        number, self.token, self.pending = self.pending, None, ""
        try:  # read and written as read_answer reads and writes it; raw, only read (it went out as written)
            value = AS_WRITTEN.decode(number) if self.mode == "raw" else json.loads(number, parse_float=_finite)
        except ValueError:
            self.broken = True
            return
        self._emit(out, "", json.dumps(value))
        self._after_value()

    def _string_char(self, char: str, out: list[str]) -> None:
        self._emit(out, char, "")  # raw: every character as written
        if self.pending:  # an escape being read
            self.pending += char
            if self.pending[1] != "u":
                self.pending = ""
                if char not in ESCAPES:
                    self.broken = True
                    return
                self._give_high(out)
                self._give(ESCAPES[char], out)
            elif len(self.pending) > 2 and char not in "0123456789abcdefABCDEF":
                self.broken = True
            elif len(self.pending) == 6:
                code, self.pending = int(self.pending[2:], 16), ""
                if 0xDC00 <= code < 0xE000 and self.high:  # a pair, read as one character (json.loads does)
                    self.high, high = "", ord(self.high)
                    self._give(chr(0x10000 + ((high - 0xD800) << 10) + code - 0xDC00), out)
                    return
                self._give_high(out)
                if 0xD800 <= code < 0xDC00:
                    self.high = chr(code)
                else:
                    self._give(chr(code), out)
            return
        if char == "\\":
            self.pending = char
            return
        self._give_high(out)
        if char == '"':
            key, self.token = self.token == "key", None
            self._emit(out, "", char)
            if key:
                self.expect = "colon"
            else:
                self._after_value()
        elif char < " ":  # a control character is no JSON string's (json.loads refuses it)
            self.broken = True
        else:
            self._give(char, out)

    def _give_high(self, out: list[str]) -> None:
        if self.high:  # not followed by a low surrogate's escape: a lone one, as json.loads reads it
            char, self.high = self.high, ""
            self._give(char, out)

    def _give(self, char: str, out: list[str]) -> None:
        """A string's character, as read."""
        if self.mode == "dump":
            out.append(json.dumps(char, ensure_ascii=False)[1:-1])
        elif self.mode == "text":
            out.append(char)


class TokenSpans:
    """Where each token of an answer under tools starts and ends in its text, in characters, as their UTF-8 bytes
    form it, kept across a stream's pieces. A token that leaves a character unfinished reaches into that character
    (it holds some of its bytes): a text that begins with a character of several tokens keeps every one of them,
    not the last alone, since each would otherwise span nothing at the text's first position
    (:meth:`AnswerStream.shown` takes a token holding any of the text), as the Ollama routes place them."""

    def __init__(self):
        self.at = 0  # where the next token's text begins
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, entries: list) -> list[tuple[int, int, dict]]:
        placed = []
        for entry in entries:
            start = self.at
            self.at += len(self._utf8.decode(bytes(entry["bytes"])))
            unfinished = bool(self._utf8.getstate()[0])  # bytes of a character not yet whole: some of it is this one's
            placed.append((start, self.at + unfinished, entry))
        return placed


class AnswerStream:
    """An answer written under a tools schema, read as it is generated, giving out the deltas of OpenAI's
    streamed chat completion chunks as llama-server gives them for its tool-call formats (common/chat.cpp,
    ``common_chat_msg_diff::compute_diffs``; tools/server/server-task.cpp, ``to_json_oaicompat_chat_stream``):
    a text answer's content as it is written; each call's ``id``, ``type`` and ``function.name`` in its first
    delta once the name is whole, with ``arguments`` "", then the arguments' text in pieces, as
    :func:`read_answer` writes them, every piece under its call's ``index`` (0, 1, ... in the order of the list
    form's calls, as OpenAI's chunks number parallel calls). Nothing is given out that the answer's message
    (:meth:`finish`, :func:`answer_message`) does not hold: the JSON around the value, and what of the value is
    not settled, wait (an answer that is neither form is given out whole once it ends).

    A thinking model's answer thinks before its JSON (edgesdk/serve/completion.py, ``ThinkingFirst``): its
    ``<think>`` block is split off as llama-server splits it (edgesdk/serve/reasoning.py) and given out as
    ``reasoning_content`` deltas, the message's ``reasoning_content``; the JSON after it is read as above.
    ``opened``, the server's word (``Completer.tools_think_opened``): True, the prompt opened the block, so the
    text is reasoning from its first character until ``</think>`` (whatever JSON it holds); False, a block is only
    one the text opens with ``<think>``; None (not known), also text that does not begin with the JSON's ``{``
    is taken for a block the prompt opened. The reasoning is always split off, ``reasoning_format``
    ``deepseek-legacy`` streamed too (without tools its stream keeps it in the content): the content under tools is
    the call's JSON."""

    def __init__(self, structured: bool = False, opened: bool | None = None):
        self.structured, self.opened = structured, opened
        self.head: str | None = ""  # the answer's text until its form is known (None once it is)
        self.thinking: ReasoningSplitter | None = None  # the splitter of a thinking model's block before the JSON
        self.reasoning = ""  # the reasoning given out so far
        self.text = ""
        # "response", "call" ({"tool_call": ...}), "calls" ({"tool_calls": [...]}), or "other" (read once whole)
        self.kind: str | None = None
        self.name: str | None = None  # the name of the call being read
        self.value: _Value | None = None
        self.consumed = 0  # how much of the text is read: the envelope, then what the value has read
        self.content: str | None = None  # the content given out so far
        self.calls: list[dict] = []  # the calls given out so far (the last one's arguments so far)
        self.settled = 0  # how many of them went out whole (their arguments' value ended)
        self.ended = False  # the list form's "]" is read: no call follows
        # where a text answer's value begins and ends in the text (its quotes too): its tokens are the message's
        self.value_start: int | None = None
        self.value_end: int | None = None

    def push(self, text: str) -> list[dict]:
        """The deltas that the answer's next ``text`` settles (reasoning, then none, or one a call, or one of
        text)."""
        if self.head is not None:
            self.head += text
            if not self._begun(self.head):
                return []
            text, self.head = self.head, None
            self.thinking = self._splitter(text.lstrip(REASONING_SPACE))
        if self.thinking is None:
            return self._push_json(text)
        reasoning, content = self.thinking.push(text)
        return self._reasoned(reasoning) + self._push_json(content)

    def _begun(self, head: str) -> bool:
        """Whether the answer's text so far shows its form: the JSON's ``{``, or a thinking block's text."""
        begun = head.lstrip(REASONING_SPACE)
        return self.opened is True or bool(begun) and not (len(begun) < len(OPEN) and OPEN.startswith(begun))

    def _splitter(self, begun: str) -> ReasoningSplitter | None:
        """The splitter of the answer's block, from its first text that shows its form (``begun``), or None: no
        block (:attr:`opened`)."""
        if self.opened is True or (self.opened is None and not begun.startswith(("{", OPEN))):
            return ReasoningSplitter(opened=True)
        if begun.startswith(OPEN):
            return ReasoningSplitter(opened=False)
        return None

    def _reasoned(self, reasoning: str) -> list[dict]:
        """The delta of a piece of the reasoning (none for none)."""
        self.reasoning += reasoning
        return [{"reasoning_content": reasoning}] if reasoning else []

    def _push_json(self, text: str) -> list[dict]:
        """The deltas that the next ``text`` of the answer's JSON settles."""
        self.text += text
        deltas: list[dict] = []
        while self._read_envelope(deltas) or self._read_value(deltas):
            pass
        return deltas

    def _read_value(self, deltas: list[dict]) -> bool:
        """Feed the value what is unread of the text; whether a call of the list form ended (more may follow)."""
        value = self.value
        if value is None:
            return False
        if not (value.done or value.broken) and self.consumed < len(self.text):
            used = value.used
            piece = value.feed(self.text[self.consumed:])
            self.consumed += value.used - used
            if piece and self.kind in ("call", "calls"):
                index = len(self.calls) - 1
                self.calls[-1]["function"]["arguments"] += piece
                last = deltas[-1]["tool_calls"][0] if deltas and deltas[-1].get("tool_calls") else None
                if last is not None and last["index"] == index:  # the call's first delta: its name and this
                    last["function"]["arguments"] += piece
                else:
                    deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            elif piece:
                self.content = (self.content or "") + piece
                deltas.append({"content": piece})
            if value.done and self.kind in ("call", "calls"):
                self.settled = len(self.calls)
            if value.done and self.kind == "response" and self.value_end is None:
                self.value_end = self.consumed
        if value.done and self.kind == "calls":
            end = ITEM_END.match(self.text, self.consumed)
            if end:
                self.consumed, self.value, self.name = end.end(), None, None
                self.ended = end.group(1) == "]"
                return not self.ended
        return False

    def _read_envelope(self, deltas: list[dict]) -> bool:
        """The answer's form, from the JSON before its value: a text (``response``), or a call (or the list form's
        next call), given out once its name is whole, whose value starts after ``"arguments":``; an answer that
        has begun neither within :data:`ENVELOPE_LIMIT` characters is "other", read once whole. Whether a value
        has begun."""
        if self.value is not None or self.kind == "other" or self.ended:
            return False
        if self.kind is None:
            response = RESPONSE_START.match(self.text)
            if response:
                self.kind, self.consumed = "response", response.end()
                self.value_start = response.end()
                self.value = _Value("raw" if self.structured else "text")
                return True
            listed = CALLS_START.match(self.text)
            named = None if listed else CALL_NAME.match(self.text)
            if listed:
                self.kind, self.consumed = "calls", listed.end()
            elif named:
                self.kind, self.consumed = "call", named.end()
                self._open_call(named.group(1), deltas)
            elif len(self.text) > ENVELOPE_LIMIT:
                self.kind = "other"
                return False
            else:
                return False
        if self.kind == "calls" and self.name is None:
            named = ITEM_NAME.match(self.text, self.consumed)
            if not named:
                return False
            self.consumed = named.end()
            self._open_call(named.group(1), deltas)
        arguments = ARGUMENTS_START.match(self.text, self.consumed)
        if arguments:
            self.consumed, self.value = arguments.end(), _Value("dump")
            return True
        return False

    def _open_call(self, name: str, deltas: list[dict]) -> None:
        """A call whose name is whole: its first delta (id, type, name, ``arguments`` "")."""
        self.name = name
        self.calls.append({"id": _call_id(), "type": "function", "function": {"name": name, "arguments": ""}})
        deltas.append({"tool_calls": [{"index": len(self.calls) - 1, **copy.deepcopy(self.calls[-1])}]})

    def finish(self, finish_reason: str, note: bool = True) -> tuple[list[dict], dict, str]:
        """Once the answer has ended (``finish_reason`` its generation's, "stop" or "length"): the deltas that
        are still to go, the message's fields, and its finish reason. A whole answer is read as
        :func:`read_answer` reads it. One cut short (by max_tokens or a stop string) keeps what was given out of
        it, its finish reason the generation's; one cut before anything was (a call's name not yet whole, a
        text not begun) is an empty content and no call: the JSON written so far is this server's envelope, never
        the model's words to the user, as llama-server's partial parse of its generic format gives nothing for it
        (common/chat.cpp, ``common_chat_parse_generic`` throws its partial exception, and ``common_chat_parse``
        keeps the empty message where the answer is partial: tools/server/server-context.cpp, ``update_chat_msg``
        reads every answer not ended by end-of-generation as partial, max_tokens and stop strings alike).

        A thinking model's reasoning is the message's ``reasoning_content``, its last piece among the deltas.

        An answer its token limit cut before its call or its text was whole (a call cut short, or nothing but the
        JSON's start: content empty, no call) is a line on serve's log (``note``: the answer's one reading), since the
        client sees only that the limit ended it, with no call or text whole: the JSON around a call takes tokens
        too. Which caller reads the answer (a route of edgesdk serve, or the Python API's Model) is not known here, so
        the line (:func:`cut_note`) names each one's limit."""
        early: list[dict] = []
        if self.head is not None:  # the form never showed: the text is read as the JSON's (or as "other")
            early, self.head = self._push_json(self.head), None
        elif self.thinking is not None:
            reasoning, content = self.thinking.flush()
            early = self._reasoned(reasoning) + self._push_json(content)
        deltas, fields, finish_reason = self._finish(finish_reason)
        if note and finish_reason == "length" and not fields.get("content"):
            LOG.warning("edgesdk: %s", cut_note(fields.get("tool_calls") or []))
        if self.reasoning:
            fields = {**fields, "reasoning_content": self.reasoning}
        return early + deltas, fields, finish_reason

    def _finish(self, finish_reason: str) -> tuple[list[dict], dict, str]:
        """:meth:`finish` of the answer's JSON."""
        given = self.content is not None or bool(self.calls)
        content, calls, whole = _read(self.text, finish_reason == "stop", self.structured)
        if whole is None:  # nested past what Python's JSON reads: what the stream read is the answer, if it is whole
            whole = self._streamed_whole()
            if whole and self.kind in ("call", "calls"):
                return [], {"content": None, "tool_calls": copy.deepcopy(self.calls)}, "tool_calls"
            if whole:
                return [], {"content": self.content}, finish_reason
        if not whole and not (self.value is not None and self.value.broken):
            if self.calls:
                return [], {"content": None, "tool_calls": copy.deepcopy(self.calls)}, finish_reason
            if given:
                return [], {"content": self.content}, finish_reason
            return [{"content": ""}], {"content": ""}, finish_reason
        if calls is not None:
            deltas, message = [], []
            for index, call in enumerate(calls):
                if index >= len(self.calls):  # not begun in the stream: it goes out whole
                    deltas.append({"tool_calls": [{"index": index, **call}]})
                    message.append(call)
                elif index < self.settled:
                    # the arguments went out whole and stay as given (a key written twice too: a JSON reader keeps
                    # its last value, as json.loads does)
                    message.append(copy.deepcopy(self.calls[index]))
                else:
                    sent, arguments = self.calls[index], call["function"]["arguments"]
                    message.append({**sent, "function": {**sent["function"], "arguments": arguments}})
                    rest = _unsent(arguments, sent["function"]["arguments"])
                    if rest:
                        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": rest}}]})
            return deltas, {"content": None, "tool_calls": message}, "tool_calls"
        if self.content is None and not self.calls:
            delta = {"content": content}
        else:
            rest = _unsent(content, self.content or "")
            delta = {"content": rest} if rest else {}
        return [delta] if delta else [], {"content": content}, finish_reason

    def shown(self, start: int, end: int, pushed: int, fields: dict | None = None) -> bool | None:
        """Whether the token at characters ``start`` to ``end`` of the answer's text (``pushed`` characters of it
        read so far) is the message's, so that its log-probability goes out (OpenAI's ``logprobs.content`` holds
        the tokens of the message's content): a thinking model's reasoning before the JSON, and a text answer's
        value (a token that holds any of it); not the JSON around the value, nor any token of an answer that is a
        call (its content null). None while that is not yet known; ``fields``, the message :meth:`finish` gave,
        settles every token. The answer's JSON is the end of its text (what reasoning.py splits off comes before
        it), read from where it begins."""
        if self.head is not None or (fields is None and not self.text):
            return None
        begins = pushed - len(self.text)
        if end <= begins:  # the reasoning before the JSON
            return True
        start, end = start - begins, end - begins
        if self.kind == "response" and self.value_start is not None:
            quote = 0 if self.structured else 1  # a text's quotes are the JSON's, a structured value is the content
            first = self.value_start + quote
            if self.value_end is not None:
                last = self.value_end - quote
            elif fields is None:
                return end > first  # the value goes on: what follows its start is the text
            else:
                last = len(self.text)
            return first < last and start < last and end > first
        if fields is None:
            return None
        return bool(fields.get("content"))  # an answer read whole as text (not the envelope) is all content

    def _streamed_whole(self) -> bool:
        """Whether the stream has read a whole answer: its value (the list form's last call) ended, and after it
        nothing but the envelope's close (:data:`ENVELOPE_END`). Every piece of it has gone out then, as
        :func:`read_answer` gives an answer it can read."""
        if self.kind == "calls":
            ended = self.ended
        else:
            ended = self.value is not None and self.value.done
        end = ENVELOPE_END.get(self.kind)
        return ended and end is not None and end.fullmatch(self.text, self.consumed) is not None


def cut_note(calls: list[dict]) -> str:
    """The log line of an answer under tools that its token limit cut before it was whole (``calls``: the calls whose
    names were whole, none where no name was). Every route, and the Python API's Model, reads the answer through
    :meth:`AnswerStream.finish`, and each gives such an answer its own way (the chat route keeps a partial call as
    llama-server does, the Ollama routes give its text as the content, Ollama's parser finding no call) under its own
    name for the limit, so the line says what happened and which limit to raise, not what the client got. Calls
    whose arguments all read as JSON were cut in the envelope after them, not in their arguments, and the line says
    so: it said their arguments were not whole."""
    if not calls:
        what = "before a tool call's name or the text had begun"
    elif all(_whole_json(call.get("function", {}).get("arguments")) for call in calls):
        what = "after its tool call's arguments (they are whole JSON) but before the JSON around the call was closed"
    else:
        what = "before its tool call's arguments were whole"
    return (f"an answer under tools reached its token limit {what} (it ended \"length\"): the JSON a call is "
            "written in ({\"tool_call\": {\"name\": ..., \"arguments\": ...}}) counts against the limit too; raise "
            "max_tokens (num_predict on edgesdk serve's Ollama routes, max_output_tokens on its /v1/responses)")


def _whole_json(text: object) -> bool:
    """Whether ``text`` (a call's arguments as given) reads as one JSON value."""
    try:
        json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _unsent(whole: str, sent: str) -> str:
    """What of ``whole`` is still to go after ``sent``; nothing where the two part ways (what went out stays)."""
    return whole[len(sent):] if whole.startswith(sent) else ""
