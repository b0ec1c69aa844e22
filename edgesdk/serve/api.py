"""The OpenAI-compatible bodies ``edgesdk serve`` reads and writes.

Requests follow OpenAI's API reference for ``POST /v1/chat/completions`` and ``POST /v1/completions``
(the fields llama.cpp's ``llama-server`` also takes). A field this server cannot honour (``n`` or
llama-server's ``n_cmpl`` > 1, llama-server's ``min_keep`` > 1, legacy functions, audio output, web search) is
refused with a 400 that names it, never silently ignored; ``suffix`` on ``/v1/completions`` builds a
fill-in-the-middle prompt (:func:`parse_text_request`); fields that change nothing here (``user``, ``metadata``,
``store``) are accepted. Repetition penalties: OpenAI's ``presence_penalty`` and ``frequency_penalty`` and
llama-server's ``repeat_penalty`` over the last ``repeat_last_n`` tokens; llama-server's ``top_k`` and
``min_p``; ``logit_bias`` as OpenAI's object or llama-server's list of pairs; llama-server's GBNF
``grammar``. llama-server's ``POST /tokenize``
and ``POST /detokenize`` bodies are read here too. Errors use OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from dataclasses import fields as dataclass_fields
from typing import TypeVar

from edgesdk.api_checks import RANDOM_SEED_VALUE, UNLIMITED_TOKENS
from edgesdk.errors import EdgeSDKError, overflow_headline
from edgesdk.runtime.fim import fim_ids, framing_count, leading_bos
from edgesdk.runtime.gbnf import Grammar, GrammarError, parse_grammar
from edgesdk.runtime.generate import CARRIED_SAMPLERS, PASS_THROUGH_SAMPLERS, sampler_chain
from edgesdk.runtime.json_schema import CompiledSchema, SchemaError, compile_schema
from edgesdk.runtime.lookup import MAX_DRAFT
from edgesdk.runtime.text import check_template_kwargs, check_utf8
from edgesdk.serve.reasoning import FORMATS as REASONING_FORMATS
from edgesdk.serve.tools import (
    ANY_OBJECT,
    ToolError,
    Tools,
    answer_message,
    call_text,
    is_tool_result,
    parallel_calls,
    parse_tools,
    tool_result_text,
    warn_once,
    with_instructions,
)

MAX_STOP_SEQUENCES = 4  # OpenAI's limit on ``stop``
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on ``top_logprobs``
# llama.cpp's LLAMA_DEFAULT_SEED (include/llama.h, 0xFFFFFFFF): the seed a sampler given it draws at random
# (src/llama-sampling.cpp, get_rng_seed), and the largest llama-server's 32-bit ``seed`` holds
LLAMA_DEFAULT_SEED = RANDOM_SEED_VALUE


def default_seed(seed: int | None) -> int | None:
    """A seed as llama.cpp's ``-s`` takes it (llama-cli's, llama-server's, and load()'s ``seed``): None, a random one
    each time, for -1 and LLAMA_DEFAULT_SEED (what -1 becomes there), else the seed itself."""
    return None if seed in (-1, LLAMA_DEFAULT_SEED) else seed

# CompletionRequest.seed of a request that asks for a random seed (-1, or LLAMA_DEFAULT_SEED on llama-server's and
# OpenAI's routes): a random one even where the server has a seed of its own (serve -s), as llama-server draws one for
# a request's -1; a request that sends no seed (None) gets the server's (completion.py, Completer.sampling)
RANDOM_SEED = -1
# The fields a request's token limit is read from, the first given (not null) winning, as llama-server reads them on
# every completion route (tools/server/server-task.cpp, params_from_json_cmpl: n_predict, else max_completion_tokens,
# else max_tokens)
LIMIT_FIELDS = ("n_predict", "max_completion_tokens", "max_tokens")
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body. ``param`` names the request field at fault. ``fix``, where given, is
    what to do, which the body's message ends with ("<message>; <fix>") and the Python API takes as its error's fix
    rather than reading it out of the message's words (edgesdk.api_checks.split_fix)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", fix: str | None = None):
        message = message if fix is None else f"{message}; {fix}"
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.fix = fix

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class CompletionRequest:
    """One request, checked. ``None`` sampling fields take the server's defaults."""

    chat: bool  # /v1/chat/completions (messages through the chat template) or /v1/completions (raw prompt)
    messages: tuple[dict, ...] = ()  # {"role", "content"} with roles and content normalised
    # chat: each message's string content as the client sent it, with the field that names it (messages[1].content):
    # checked before the prompt renders (Completer.rendered_chat), where the turns are counted otherwise (the tools'
    # description a first system message) and a tool result's text is wrapped in its {"tool_response": ...}
    texts: tuple[tuple[str, str], ...] = dataclass_field(default=(), compare=False)
    # chat: the last message is the assistant's answer begun by the client (a prefill), which the model continues
    # (llama-server's default, Anthropic's Messages API); the answer holds only what the model adds
    continue_final: bool = False
    prompt: str = ""
    prompt_tokens: tuple[int, ...] = ()  # /v1/completions given token ids instead of text
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # llama-server's, >= 0 (0: off)
    min_p: float | None = None  # llama-server's, in [0, 1] (0: off)
    samplers: tuple[str, ...] | None = None  # llama-server's sampler chain, canonical names in order
    seed: int | None = None  # a fixed seed, RANDOM_SEED (a random one), or None: the server's (serve -s)
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2]
    frequency_penalty: float = 0.0
    repeat_penalty: float | None = None  # llama-server's, > 0, over the last repeat_last_n tokens
    repeat_last_n: int | None = None  # -1: the whole context
    # (token id, or text whose tokens all take the bias, as llama-server reads it; bias, -inf for never)
    logit_bias: tuple[tuple[int | str, float], ...] = ()
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk carrying the usage
    cache_prompt: bool = True  # llama-server's field: reuse the KV cache of the previous answer's prefix
    ignore_eos: bool = False  # llama-server's: end-of-text and end-of-turn tokens are never taken (-inf)
    json_object: bool = False  # response_format {"type": "json_object"}: the answer is one JSON object
    json_schema: CompiledSchema | None = None  # the answer follows this schema (edgesdk/runtime/json_schema.py)
    # The field the schema came from, as the client wrote it, which a refusal of the constraint names (OpenAI's
    # response_format, llama-server's json_schema; a route whose field has another name sets its own, as keep_param)
    schema_param: str = "response_format"
    grammar: Grammar | None = None  # llama-server's: the answer follows this GBNF grammar (edgesdk/runtime/gbnf.py)
    tools: Tools | None = None  # chat: the tools the answer may call (edgesdk/serve/tools.py)
    logprobs: int | None = None  # None: no log-probabilities; else how many alternatives per token (0-20)
    echo: bool = False  # /v1/completions: the prompt comes back before the answer (with its log-probabilities)
    # POST /completion's n_probs: the log-probabilities as llama-server's completion_probabilities, not OpenAI's
    llama_probs: bool = False
    # the end-of-text token the answer stopped at is listed with the log-probabilities (POST /completion and /infill,
    # as llama-server lists every token it sampled; an echo lists it too, as OpenAI's completions do; Ollama's runner
    # leaves it out: "after EOS check to avoid logprobs for EOS tokens")
    end_probs: bool = False
    # chat: extra variables for the chat template (llama-server's chat_template_kwargs, e.g. enable_thinking)
    template_kwargs: dict | None = None
    # chat: auto | none | deepseek | deepseek-legacy (edgesdk/serve/reasoning.py); None: the server's
    reasoning_format: str | None = None
    # llama-server's /completion and /infill limits for code completion (edgesdk/serve/line_limits.py): a line after
    # the first new line indented less than n_indent ends the answer; past t_max_predict_ms of generation a new line
    # ends it (0: off)
    n_indent: int = 0
    t_max_predict_ms: float = 0.0
    # The context shift where the answer fills the context (edgesdk.runtime.generate.ContextShift): llama-server's
    # n_keep and n_discard on every completion route, or Ollama's shift and num_keep; None: the server's
    # --context-shift and --keep
    context_shift: bool | None = None
    n_keep: int | None = None  # -1: the whole prompt
    n_discard: int = 0  # 0: half of what follows the kept tokens
    keep_param: str = "n_keep"  # the field an error about the kept tokens names
    shift_window: int | None = None  # the context the answer shifts within (Ollama's num_ctx); None: the bundle's
    # llama-server's per-request draft settings (speculative.n_max, speculative.n_min, speculative.p_min) for this
    # answer's drafter (serve --draft or --lookup); None: the server's (completion.py, Completer.draft_settings)
    draft_max: int | None = None
    draft_min: int | None = None
    draft_p_min: float | None = None
    # the field the prompt came from, as the route's client wrote it, which a refusal of a prompt past the context
    # names (the Responses API's ``input``); None: ``messages`` on a chat route, ``prompt`` on a text one
    prompt_param: str | None = dataclass_field(default=None, compare=False)


def parse_chat_request(body: object, *, limit_fields: tuple[str, ...] = LIMIT_FIELDS,
                       ollama_seed: bool = False) -> CompletionRequest:
    """``POST /v1/chat/completions``: messages of system / developer / user / assistant text. The token limit is
    the first of ``limit_fields`` given (:data:`LIMIT_FIELDS`, llama-server's order); ``seed`` is read as
    llama-server reads it, or with ``ollama_seed`` as Ollama's sampler does (:func:`_seed`)."""
    body = _object(body)
    _refuse_unsupported(body, chat=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        got = json_shown(messages) if "messages" in body else "none (the field is missing)"
        raise ApiError(400, "'messages' must be a non-empty array of {\"role\", \"content\"} objects (one object "
                       f"is sent as [{{...}}]), got {got}", param="messages")
    names = _tool_call_names(messages)
    try:  # earlier calls are written in the form the answer's calls take (one, or a list)
        parallel = parallel_calls(body) and bool(body.get("tools")) and body.get("tool_choice") != "none"
    except ToolError as exc:
        raise tool_refusal(exc) from exc
    parsed = [_message(message, index, names[index], parallel) for index, message in enumerate(messages)]
    fields = _common_fields(body, chat=True, limit_fields=limit_fields, ollama_seed=ollama_seed)
    try:
        # a response format beside tools shapes the {"response": ...} answer (edgesdk/serve/tools.py)
        tools = parse_tools(body, _response_schema(body, fields))
    except ToolError as exc:
        raise tool_refusal(exc) from exc
    if tools is not None:
        if fields["grammar"] is not None:
            raise ApiError(400, "'tools' and 'grammar' both constrain the answer, and a GBNF grammar cannot be joined "
                           "to the tools' JSON answer ({\"tool_call\": ...} or {\"response\": ...}); send one of "
                           "them, or shape the answer with a 'response_format' JSON schema beside the tools",
                           param="grammar")
        parsed = with_instructions(parsed, tools)
    begun = messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls")
    return _held_to_server_limit(
        CompletionRequest(chat=True, messages=tuple(parsed), tools=tools, continue_final=begun, texts=_texts(messages),
                          template_kwargs=_template_kwargs(body), reasoning_format=_reasoning_format(body), **fields),
        body, limit_fields)


def _texts(messages: list) -> tuple[tuple[str, str], ...]:
    """Each message's string content, with the field that names it as the client sent it
    (:attr:`CompletionRequest.texts`)."""
    return tuple((f"messages[{index}].content", message["content"]) for index, message in enumerate(messages)
                 if isinstance(message, dict) and isinstance(message.get("content"), str))


def _asks_minus_one(body: dict, limit_fields: tuple[str, ...]) -> bool:
    """Whether the request's token limit (the first of ``limit_fields`` given) is -1 on a route read as llama-server
    reads it (``n_predict`` among ``limit_fields``: :data:`LIMIT_FIELDS`, the HTTP routes). There -1 is no limit of
    the request's own, and the server's ``-n`` holds the answer (:func:`_held_to_server_limit`); in-process callers
    that read ``max_tokens`` as llama-cpp-python does (edgesdk/api.py: ``limit_fields`` without ``n_predict``) keep
    -1 as no limit but the context, as llama-cpp-python's ``max_tokens <= 0`` is."""
    if "n_predict" not in limit_fields:
        return False
    value = body.get(next((name for name in limit_fields if body.get(name) is not None), limit_fields[-1]))
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == -1


def _held_to_server_limit(request: CompletionRequest, body: dict,
                          limit_fields: tuple[str, ...]) -> CompletionRequest:
    """``request`` as the :class:`~edgesdk.serve.llama_native.NativeRequest` of a -1 token limit where
    :func:`_asks_minus_one`: ``max_tokens`` None (the server's ``--max-new-tokens``, unlimited only where the server's
    is -1), ``generation_settings`` showing the -1 asked for. llama-server reads ``max_tokens`` /
    ``max_completion_tokens`` / ``n_predict`` alike on every completion route (tools/server/server-task.cpp,
    ``params_from_json_cmpl``; the OpenAI routes copy them into the same body, server-common.cpp
    ``oaicompat_chat_params_parse``), and a request's -1 takes the server's ``-n`` (server-context.cpp:
    ``slot.n_predict_max = task.params.n_predict != -1 ? task.params.n_predict : params_base.n_predict``); llama.cpp's
    web UI sends ``max_tokens: -1`` by default."""
    if not _asks_minus_one(body, limit_fields):
        return request
    from edgesdk.serve.llama_native import NativeRequest  # it imports this module

    return NativeRequest(**{item.name: getattr(request, item.name) for item in dataclass_fields(request)},
                         predict_minus_one=True)


def _template_kwargs(body: dict) -> dict | None:
    """``chat_template_kwargs``: extra chat-template variables, as llama-server and vLLM take them."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return None
    try:
        return check_template_kwargs(value, "'chat_template_kwargs'")
    except ValueError as exc:
        raise ApiError(400, str(exc), param="chat_template_kwargs") from exc


def _reasoning_format(body: dict) -> str | None:
    """``reasoning_format``: how a thinking model's reasoning comes back (llama-server's request field)."""
    value = body.get("reasoning_format")
    if value is not None and value not in REASONING_FORMATS:
        raise ApiError(400, f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}, got {json_shown(value)}",
                       param="reasoning_format")
    return value


def parse_text_request(body: object, route: str = "/v1/completions", completer=None,
                       takes_suffix: bool | None = None, *, limit_fields: tuple[str, ...] = LIMIT_FIELDS,
                       ollama_seed: bool = False, empty_prompt: bool = False) -> CompletionRequest:
    """``POST /v1/completions`` (or llama-server's ``route`` /completion, which refusals name): one raw prompt (a
    string, token ids, or, with the ``completer``, the two mixed), fed to the model without a chat template; several
    prompts are split off before this (:func:`edgesdk.serve.llama_native.prompts`).

    With the ``completer`` of the model that answers, a non-empty ``suffix`` (OpenAI's insert mode: the text after
    the completion) makes the prompt a fill-in-the-middle one (:func:`suffix_request`); without one (or with
    ``takes_suffix`` false), a ``suffix`` is refused as a field this route does not take. With the ``completer``, a
    prompt that mixes token ids and strings (``[12, 34, "text", 56]``) is read as llama-server's
    ``tokenize_mixed`` reads it (:func:`mixed_prompt_ids`). ``limit_fields`` and ``ollama_seed`` as in
    :func:`parse_chat_request`: the token limit is ``n_predict``, else ``max_completion_tokens``, else ``max_tokens``,
    as llama-server reads it on this route too. With ``empty_prompt`` and the ``completer``, an empty string prompt
    is the tokenizer's special tokens alone (its BOS), as llama-cpp-python's ``create_completion("")`` feeds it, and
    is refused by name where the tokenizer adds none (:func:`_empty_prompt`)."""
    body = _object(body)
    takes_suffix = completer is not None if takes_suffix is None else takes_suffix
    _refuse_unsupported(body, chat=False, route=route, takes_suffix=takes_suffix)
    suffix = _suffix(body) if takes_suffix else ""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if is_mixed_prompt(prompt) and completer is not None:
        # before a suffix the prompt is the FIM prefix, whose BOS goes in front of FIM_PRE (suffix_request)
        prompt = mixed_prompt_ids(completer.runtime.tokenizer, prompt, "prompt", add_special=not suffix)

    def fields() -> dict:  # read after the prompt's check, which a bad prompt fails first
        return _common_fields(body, chat=False, limit_fields=limit_fields, ollama_seed=ollama_seed)

    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in prompt):
        # Token ids, as OpenAI takes them (lm-evaluation-harness sends its prompts so by default).
        request = CompletionRequest(chat=False, prompt_tokens=tuple(prompt), **fields())
    elif not isinstance(prompt, str) or not (prompt or suffix or _empty_prompt(empty_prompt, completer)):
        # "" before a suffix: completing a file's start
        raise ApiError(400, f"'prompt' must be a non-empty string, an array of token ids or an array mixing token "
                       f"ids and strings, got {json_shown(prompt)} (an empty one only before a 'suffix'; several prompts "
                       "as an array of them, one choice each, on POST /v1/completions)", param="prompt")
    else:
        request = CompletionRequest(chat=False, prompt=prompt, **fields())
    return _held_to_server_limit(suffix_request(request, suffix, completer) if suffix else request, body, limit_fields)


def _empty_prompt(taken: bool, completer) -> bool:
    """Whether an empty prompt is ``taken`` (with the ``completer``): it is then the special tokens the tokenizer adds
    to any text (a BOS), which the answer is generated from, as llama-cpp-python's ``create_completion("")``
    generates from its BOS alone; a 400 naming the prompt where the tokenizer adds none, as there is then nothing
    to generate from."""
    if not taken or completer is None:
        return False
    if not completer.runtime.tokenizer.encode(""):
        raise ApiError(400, "'prompt' is \"\" and this model's tokenizer adds no BOS token to a text, so there is no "
                       "token to generate from: pass the text the answer follows, or its token ids (tokenize() gives "
                       "them)", param="prompt")
    return True


def is_mixed_prompt(value: object) -> bool:
    """llama-server's ``json_is_array_of_mixed_numbers_strings`` (tools/server/utils.hpp): an array of token ids and
    strings holding at least one of each (``[12, 34, "text"]``: one prompt, not a batch)."""
    return isinstance(value, list) and all(isinstance(item, (str, int)) for item in value) \
        and any(isinstance(item, str) for item in value) \
        and any(isinstance(item, int) and not isinstance(item, bool) for item in value)


def mixed_prompt_ids(tokenizer, parts: list, param: str, add_special: bool = True) -> list[int]:
    """The token ids of a prompt mixing ids and strings, as llama-server's ``tokenize_mixed`` (tools/server/utils.hpp)
    builds them: ids as they are, each string tokenized with special tokens read from its text, the tokenizer's
    special tokens (BOS) added to a string only where it is the prompt's first part and ``add_special`` (false for
    the prefix of a fill-in-the-middle prompt, whose BOS goes before its FIM prefix token). ``param`` names the field
    in a 400 (a negative id, a boolean, text that is not UTF-8); ids past the vocabulary are refused where the prompt
    runs."""
    ids: list[int] = []
    for index, part in enumerate(parts):
        if isinstance(part, str):
            utf8_field(part, param, f"'{param}[{index}]'")  # lone surrogates from JSON escapes
            ids.extend(tokenizer.encode(part, add_special_tokens=add_special and index == 0))
        elif isinstance(part, bool) or not isinstance(part, int) or part < 0:
            raise ApiError(400, f"'{param}[{index}]' must be a token id (a whole number >= 0) or a string, got "
                           f"{json_shown(part)}", param=param)
        else:
            ids.append(part)
    return ids


def prompt_refusal(error: ApiError, index: int) -> ApiError:
    """``error``, a refusal of the ``index``-th of a request's several prompts, naming that prompt: ``'prompt'`` in
    its message reads ``'prompt[1]'`` (``'prompt[2]'``, a part of a mixed prompt, ``'prompt[1][2]'``), and a message
    that does not name it starts with it, as OpenAI names a field inside an array (``param`` stays the field)."""
    named = re.sub(r"'prompt(?=['\[])", f"'prompt[{index}]", error.message)
    if named == error.message:
        named = f"'prompt[{index}]': {error.message}"
    return ApiError(error.status, named, param=error.param, code=error.code, kind=error.kind)


def _suffix(body: dict) -> str:
    """``suffix``: a string, or null; "" is no suffix, as Ollama's ``/api/generate`` reads its ``suffix``
    (llama-cpp-python builds a fill-in-the-middle prompt for "" too). ``echo`` and ``logprobs`` beside a suffix are
    refused by name."""
    suffix = body.get("suffix")
    if suffix is None:
        return ""
    if not isinstance(suffix, str):
        raise ApiError(400, f"'suffix' must be a string (the text that comes after the completion), got "
                       f"{json_shown(suffix)}", param="suffix")
    why = {"echo": "an echo gives back the prompt the model read, which with a suffix is the fill-in-the-middle "
                   "prompt (FIM tokens and the suffix around 'prompt'), not 'prompt' as sent",
           "logprobs": "each token's text_offset counts from the prompt the model read, which with a suffix is the "
                       "fill-in-the-middle prompt, not 'prompt' as sent"}
    for name, reason in why.items():
        if suffix and body.get(name) is not None and body.get(name) is not False:  # logprobs 0 asks for them
            raise ApiError(400, f"'{name}' with a 'suffix' is not supported: {reason}; leave '{name}' out, or the "
                           "'suffix'", param=name, code="unsupported_parameter")
    return suffix


def suffix_request(request: CompletionRequest, suffix: str, completer) -> CompletionRequest:
    """``request`` with a ``suffix``: its prompt becomes the token ids of the fill-in-the-middle prompt
    ``[BOS] FIM_PRE prompt FIM_SUF suffix FIM_MID`` (``--spm-infill``: the suffix first), as llama-cpp-python's
    ``Llama._create_completion`` builds it for its ``suffix`` and its server's ``/v1/completions`` (the prompt and
    the suffix read as plain text, the suffix without the space a SentencePiece tokenizer puts in front of a text
    (:func:`unprefixed_ids`), token ids taken as they are, the BOS where the tokenizer adds one; no extra
    context and no budget, which are ``/infill``'s: edgesdk/runtime/fim.py, ``fim_ids``). The answer is the
    middle alone, as llama-cpp-python's. A model without FIM tokens is a 400 naming ``suffix``: llama-cpp-python
    0.3 puts token 0 where each FIM token goes there, and Ollama answers "does not support insert". A prompt past
    the model's context is a 400 naming the longer of ``prompt`` and ``suffix``, with each one's tokens."""
    from edgesdk.serve.infill import FIM_MODELS

    tokenizer = completer.runtime.tokenizer
    fim = tokenizer.fim_tokens()
    if not fim.can_infill:
        raise ApiError(400, f"'suffix' needs a fill-in-the-middle model, and {fim.lacking()}; leave 'suffix' out, or "
                       f"serve {FIM_MODELS}", param="suffix", code="unsupported_parameter")
    for text, param in ((request.prompt, "prompt"), (suffix, "suffix")):
        utf8_field(text, param, f"'{param}'")  # lone surrogates from JSON escapes
    prefix = list(request.prompt_tokens) or tokenizer.encode_plain(request.prompt)
    suffix_ids = unprefixed_ids(tokenizer, suffix)
    ids = fim_ids(fim, prefix, suffix_ids, leading_bos(tokenizer), spm_infill=completer.defaults.spm_infill)
    limit = completer.runtime.backend.max_context
    if len(ids) > limit:
        # the engine's own refusal names the prompt alone, which is not at fault where the suffix fills the context
        param, other = ("suffix", "prompt") if len(suffix_ids) > len(prefix) else ("prompt", "suffix")
        headline = (overflow_headline(len(ids), limit, "fill-in-the-middle prompt") +
                    f" (the prompt's {len(prefix)}, the suffix's {len(suffix_ids)}, {framing_count(tokenizer)} "
                    "special tokens around them)")
        raise context_refusal(headline, f"shorten the {param} (or the {other}) to fewer tokens (POST /tokenize "
                              "counts them)", param, len(ids), limit, completer.runtime.bundle.manifest,
                              getattr(completer.runtime.backend, "built_context", None))
    return replace(request, prompt="", prompt_tokens=tuple(ids))


def context_refusal(headline: str, shorten: str, param: str, tokens: int, limit: int, manifest: dict,
                    built: int | None = None, source: str | None = None) -> ApiError:
    """The 400 for a prompt of ``tokens`` tokens past the model's context of ``limit`` (``context_length_exceeded``,
    naming ``param``): ``headline``, then the fix a bundle's context takes (``shorten``, the --max-context that holds
    more, the most the model's positions allow, or that none does), in the command line's words, as the operator
    rebuilds. ``built``: the bundle's context where the server runs with less (``-c N``): raising -c comes first,
    and a rebuild is named only where the prompt is past the bundle's context too; ``source``: what held the run's
    context (the backend's ``context_source``: -c, LLAMA_ARG_CTX_SIZE, n_ctx), which that fix raises. The refusal keeps ``context``
    (tokens, limit, the model's positions) and ``headline``, with which the Python API words its own message and fix (edgesdk/api.py, _too_long)."""
    from edgesdk.bundle import context_fix, model_positions

    positions = model_positions(manifest)
    fix = context_fix(shorten, limit, positions, tokens, built=built, source=source)
    refusal = ApiError(400, f"{headline}: {fix}", param=param, code="context_length_exceeded")
    refusal.context, refusal.headline = (tokens, limit, positions), headline
    return refusal


# llama-cpp-python's sentinel in front of a suffix ("Tokenizer hack to remove leading space"): its tokens, the
# space in front included, are cut off, leaving the suffix's own
SPACE_SENTINEL = "\u263a"


def unprefixed_ids(tokenizer, text: str) -> list[int]:
    """The plain-text ids of ``text`` without the space a tokenizer puts in front of every text (SentencePiece's
    ``add_space_prefix``: CodeLlama's and Llama 2's ``\u2581``), which is no part of a suffix that goes on from the
    middle: llama-cpp-python's ``Llama._create_completion`` tokenizes ``"\u263a" + suffix`` where the model's
    ``tokenizer.ggml.add_space_prefix`` is true and drops the sentinel's tokens. A tokenizer that puts no space in
    front (SmolLM2's, Qwen's byte-level BPE) gives the text's ids as they are, and so does a text whose tokens do
    not begin with the sentinel's (merged across it)."""
    plain = tokenizer.encode_plain(text)
    if not text or not _puts_space_in_front(tokenizer.plain_text()):
        return plain
    sentinel, ids = tokenizer.encode_plain(SPACE_SENTINEL), tokenizer.encode_plain(SPACE_SENTINEL + text)
    return ids[len(sentinel):] if ids[:len(sentinel)] == sentinel else plain


def _puts_space_in_front(backend) -> bool:
    """Whether the ``tokenizers`` tokenizer ``backend`` puts a space (``\u2581``, ``\u0120``) in front of a text:
    its normalizer (Llama 2's ``Prepend``) or pre-tokenizer (a ``Metaspace`` that prepends, a byte-level one with
    ``add_prefix_space``) turns "a" into more than "a"."""
    text = backend.normalizer.normalize_str("a") if backend.normalizer is not None else "a"
    if backend.pre_tokenizer is not None:
        text = "".join(piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text))
    return text != "a"


@dataclass(frozen=True)
class TokenizeRequest:
    """llama-server's ``POST /tokenize`` body."""

    content: str | tuple[int | str, ...]  # a text, or token ids mixed with texts as ``tokenize_mixed`` reads them
    add_special: bool = False  # add the tokenizer's special tokens (a BOS where the model has one)
    parse_special: bool = True  # special tokens written in the text are those tokens (false: plain text)
    with_pieces: bool = False  # each token as {"id", "piece"}


def parse_tokenize_request(body: object) -> TokenizeRequest:
    """``POST /tokenize``: ``{"content": str, "add_special": false, "parse_special": true, "with_pieces": false}``;
    ``content`` may also be an array of token ids and strings (``[12, "text"]``), as llama-server's
    ``tokenize_mixed`` (tools/server/utils.hpp) reads it: ids kept as they are (checked against the vocabulary by
    the caller), each string tokenized, ``add_special`` applied only where the first part is a string."""
    body = _object(body)
    content = body.get("content")
    if isinstance(content, list):
        content = tuple(_tokenize_part(part, index) for index, part in enumerate(content))
    elif not isinstance(content, str):
        raise ApiError(400, "'content' must be the text to tokenize (a string) or an array of token ids and strings "
                       f"([12, \"text\"]), got {json_shown(content)}", param="content")
    flags = {name: _flag(body, name, default)
             for name, default in (("add_special", False), ("parse_special", True), ("with_pieces", False))}
    return TokenizeRequest(content=content, **flags)


def _tokenize_part(part: object, index: int) -> int | str:
    """One part of an array ``content`` of ``POST /tokenize``: a token id (a whole number >= 0) or a string."""
    if isinstance(part, str) or (isinstance(part, int) and not isinstance(part, bool) and part >= 0):
        return part
    raise ApiError(400, f"'content[{index}]' must be a token id (a whole number >= 0) or a string, got {json_shown(part)}",
                   param="content")


def _flag(body: dict, name: str, default: bool) -> bool:
    """A true/false field; absent or null is ``default``."""
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {json_shown(value)}", param=name)
    return default if value is None else value


def parse_detokenize_request(body: object) -> tuple[int, ...]:
    """``POST /detokenize``: ``{"tokens": [id, ...]}``; the ids are checked against the vocabulary by the caller."""
    body = _object(body)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise ApiError(400, f"'tokens' must be an array of token ids, got {json_shown(tokens)}", param="tokens")
    for index, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ApiError(400, f"tokens[{index}] must be a token id (a whole number >= 0), got {json_shown(token)}",
                           param=f"tokens[{index}]")
    return tuple(tokens)


def _object(body: object) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {json_kind(body)}")
    return body


def json_kind(value: object) -> str:
    """What a parsed JSON ``value`` is, in JSON's words (an array, a string, null), not Python's (list, str, NoneType)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = ((dict, "an object"), (list, "an array"), (str, "a string"), ((int, float), "a number"))
    return next((kind for python, kind in kinds if isinstance(value, python)), type(value).__name__)


def json_shown(value: object) -> str:
    """A parsed JSON ``value`` as JSON text (``null``, ``true``, ``{"role": "user"}``, ``NaN``), cut to 60
    characters. A value JSON has no text for (what a Python caller may pass: a generator, a set, a tuple where an
    array is read) is its Python type (``a generator``), alone or inside an object or array, not the string of its
    repr (``"<generator object ...>"``, which read as if a string had been sent); a value with a key that is no
    string is its repr."""
    if value is not None and not isinstance(value, (dict, list, str, int, float)):
        return python_kind(value)
    marker = uuid.uuid4().hex  # no string of the value's holds it
    kinds: list[str] = []

    def placeholder(part: object) -> str:
        kinds.append(python_kind(part))
        return f"{marker}{len(kinds) - 1}"

    try:
        text = json.dumps(value, ensure_ascii=False, default=placeholder)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a JSON escape's): its escape, as json_bytes writes it
            kinds.clear()
            text = json.dumps(value, ensure_ascii=True, default=placeholder)
    except (TypeError, ValueError):
        return _shown(value)
    for index, kind in enumerate(kinds):
        text = text.replace(f'"{marker}{index}"', kind)
    return text if len(text) <= 60 else text[:57] + "..."


def python_kind(value: object) -> str:
    """``value``'s Python type with its article (``a generator``, ``an ndarray``): what a Python caller passed
    where JSON has no value like it."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(message: object, index: int, call_name: str | None, parallel: bool = False) -> dict:
    """A message with its role and text normalised; tool turns become the text of llama.cpp's generic tool
    format (edgesdk/serve/tools.py), which any chat template renders (an assistant turn's calls in the list form
    where ``parallel``: the request's ``parallel_tool_calls`` with tools offered); ``call_name`` is the function
    whose call a tool message answers (:func:`_tool_call_names`)."""
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{param} must be an object with 'role' and 'content', got {json_shown(message)}", param=param)
    role = message.get("role")
    try:
        if role == "tool":
            content = _content(message.get("content"), f"{param}.content")
            call_id = message.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise ApiError(400, f"{param}.tool_call_id must be the string id of the call it answers, got "
                               f"{json_shown(call_id)}", param=f"{param}.tool_call_id")
            if call_id is not None:
                utf8_field(call_id, f"{param}.tool_call_id")
            name = call_name
            if name is None and isinstance(message.get("name"), str):  # the message names its tool itself, as
                name = utf8_field(message["name"], f"{param}.name")  # llama.cpp reads it (tool_name)
            # the id too, as llama.cpp's polyfill writes it: two results of one tool say which call each answers
            return {"role": "user", "content": tool_result_text(name, content, call_id)}
        if role == "assistant" and message.get("tool_calls"):
            text = call_text(message["tool_calls"], f"{param}.tool_calls", parallel)
            content = message.get("content")
            spoken = _content(content, f"{param}.content") if content is not None else ""
            return {"role": "assistant", "content": f"{spoken}\n{text}" if spoken else text}
    except ToolError as exc:
        raise tool_refusal(exc) from exc
    if role not in CHAT_ROLES:
        raise ApiError(400, f"{param}.role {json_shown(role)} is not one this server takes: expected one of "
                       f"{', '.join([*CHAT_ROLES, 'tool'])}", param=f"{param}.role")
    if message.get("tool_calls"):
        raise ApiError(400, f"{param} is a {role} message carrying tool_calls; only assistant messages make calls",
                       param=f"{param}.tool_calls")
    if role == "assistant" and "content" in message and message["content"] is None:
        # a replayed refusal (OpenAI's ``refusal`` text, content null): llama-server reads null content as empty
        # (common_chat_msgs_parse_oaicompat); only a message with neither content nor calls is refused there
        return {"role": "assistant", "content": ""}
    return {"role": CHAT_ROLES[role], "content": _content(message.get("content"), f"{param}.content")}


def tool_refusal(exc: ToolError) -> ApiError:
    """The 400 of a refused ``tools`` / ``tool_choice`` field or tool message (``exc``), naming its field and with
    its code: ``not_utf8`` for a lone surrogate from a JSON escape, as :func:`not_utf8` gives it on every route."""
    return ApiError(400, exc.message, param=exc.param, code=exc.code)


def not_utf8(exc: EdgeSDKError, param: str) -> ApiError:
    """The 400 of text that is not UTF-8 (``exc``, :func:`edgesdk.runtime.text.check_utf8`'s: a lone surrogate from
    a JSON escape) in the field ``param``: its problem and its fix (send each character whole), as
    :func:`utf8_field` and the Responses route word it."""
    return ApiError(400, f"{exc.problem}: {exc.fix}", param=param, code="not_utf8")


def utf8_field(text: str, param: str, what: str | None = None) -> str:
    """``text``, a field that reaches the prompt (a tool result's ``tool_call_id``, a stop string, a prompt), or the
    400 naming ``param`` where it is not UTF-8 (lone surrogates from JSON escapes, :func:`not_utf8`), which the
    prompt's own check would blame on the message's content. ``what`` is the field as the message words it
    (``'prompt[1]'``); ``param`` itself where not given."""
    try:
        check_utf8(text, param if what is None else what)
    except EdgeSDKError as exc:
        raise not_utf8(exc, param) from exc
    return text


def chat_turns(messages: tuple[dict, ...] | list[dict]) -> list[dict]:
    """The parsed messages as the chat template's turns: a run of user turns that holds a tool result (the
    ``{"tool_response": ...}`` text a ``tool`` message becomes, :func:`edgesdk.serve.tools.is_tool_result`) is one
    user turn, its texts in order, a line each (as :func:`call_text` writes several calls), so that the roles
    still alternate.

    llama.cpp turns each ``tool`` message into a user message of its own where the template has no tool role
    (minja's ``chat_template::apply``, ``polyfill_tool_responses``) and merges none, so an answer of several calls
    gives several user turns in a row, and a user message after them one more; Llama 2's and Mistral's templates
    refuse that ("Conversation roles must alternate user/assistant/user/assistant/..."), and Anthropic's Messages
    API (one user turn of several ``tool_result`` blocks and text), Ollama's /api/chat (a ``tool`` message per
    result) and the Responses API (a ``function_call_output`` item per call) all send that shape. Joined, the
    conversation reads as Anthropic's one user turn of results does. User turns that hold no tool result are left
    apart, as llama-server leaves them."""
    turns: list[dict] = []
    joined = False  # the last turn is a user turn that holds a tool result
    for message in messages:
        result = message["role"] == "user" and is_tool_result(message["content"])
        if message["role"] == "user" and turns and turns[-1]["role"] == "user" and (result or joined):
            texts = [text for text in (turns[-1]["content"], message["content"]) if text]
            turns[-1] = {**turns[-1], "content": "\n".join(texts)}
            joined = True
        else:
            turns.append(dict(message))
            joined = result
    return turns


def _tool_call_names(messages: list) -> list[str | None]:
    """For each message, the name of the function whose call it answers where it is a tool message (which names only
    the call's id), else None. Of the earlier calls with its ``tool_call_id``, the first in the latest turn of calls
    that no result has answered yet, else the latest of them (:func:`answered_call`, as Ollama's route reads an id):
    a client numbering each turn's calls from 0 gives one id to calls of different functions, and each result names
    the call it follows."""
    calls: list[tuple[str, str]] = []  # (id, name) of the calls made so far, in order
    answered: set[int] = set()  # the places in ``calls`` of the calls a result has answered
    latest = 0  # where the calls of the latest message that made any begin in ``calls``
    names: list[str | None] = []
    for message in messages:  # malformed calls are refused by _message, naming them
        name = None
        if isinstance(message, dict) and message.get("role") == "tool":
            named = [(place, place) for place, (ident, _) in enumerate(calls) if ident == message.get("tool_call_id")]
            place = answered_call(named, latest, answered)
            if place is not None:
                answered.add(place)
                name = calls[place][1]
        made = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(made, list) and made:
            latest = len(calls)
            calls.extend((call["id"], call["function"].get("name")) for call in made if isinstance(call, dict)
                         and isinstance(call.get("id"), str) and isinstance(call.get("function"), dict))
        names.append(name)
    return names


_Key = TypeVar("_Key")  # how :func:`answered_call`'s caller tells its calls apart: a place, an id


def answered_call(named: list[tuple[int, _Key]], latest: int, answered: set[_Key]) -> _Key | None:
    """The call a tool result answers, of the calls its ``tool_call_id`` names, each given as (its place among the
    conversation's calls, its key), in order: the first in the latest turn of calls (from place ``latest`` on) whose
    key is not in ``answered`` (no result has answered it yet), so that a client numbering each turn's calls from 0
    answers the call it just received, not an earlier turn's of the same number; else the latest of them (None
    where the id names no call). The one reading of an id the chat route (:func:`_tool_call_names`) and Ollama's
    (edgesdk/serve/ollama.py, ``_call_of_id``) have."""
    waiting = (key for place, key in named if place >= latest and key not in answered)
    return next(waiting, named[-1][1] if named else None)


def join_text_parts(texts: list[str]) -> str:
    """A message's text parts as one text, as llama.cpp gives them to a chat template that does not take typed
    content (common/chat.cpp, ``common_chat_msgs_to_json_oaicompat``): each part after a line break, once the text
    so far is not empty."""
    joined = ""
    for text in texts:
        joined += ("\n" if joined else "") + text
    return joined


def _content(content: object, param: str) -> str:
    """A message's text: a string, or an array of ``{"type": "text", "text": ...}`` parts joined
    (:func:`join_text_parts`)."""
    if isinstance(content, str):  # checked where the prompt is rendered, named as sent (CompletionRequest.texts)
        return content
    if isinstance(content, list):
        return join_text_parts([_text_part(part, f"{param}[{index}]") for index, part in enumerate(content)])
    raise ApiError(400, f"{param} must be a string or an array of text parts, got {json_shown(content)}", param=param)


def _text_part(part: object, param: str) -> str:
    """The text of one content part ``{"type": "text", "text": ...}``, or the 400 that says what is wrong with it: a
    text part whose ``text`` is missing or not a string, or a part of another type (an image, audio, a file), which
    this server's text-only models cannot read."""
    if not isinstance(part, dict):
        raise ApiError(400, f"{param} must be a content part object {{\"type\": \"text\", \"text\": ...}}, got "
                       f"{json_shown(part)}", param=param)
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise ApiError(400, f"{param} is a text part whose 'text' must be a string, got {json_shown(part.get('text'))}",
                           param=f"{param}.text")
        return utf8_field(part["text"], f"{param}.text")  # the part named: the joined content's index is no part's
    raise ApiError(400, f"{param} is a part of type {json_shown(kind)}, which this server cannot read: its models take "
                   "text alone; send the message's content as text parts ({\"type\": \"text\", \"text\": ...}) or "
                   "a string", param=param, code="unsupported_parameter")


RESPONSE_FORMATS = ("text", "json_object", "json_schema")


# llama-server's samplers this runtime lacks -> the value that turns each off (llama.cpp's web UI sends each at it)
SAMPLERS_OFF = {"mirostat": 0, "typical_p": 1.0, "dynatemp_range": 0.0, "xtc_probability": 0.0, "dry_multiplier": 0.0,
                "top_n_sigma": -1.0}


def sampler_off(field: str, value: object, body: dict) -> bool:
    """Whether ``value`` of ``field`` (of :data:`SAMPLERS_OFF`) leaves that llama.cpp sampler doing nothing, as
    llama.cpp's own sampler reads it (src/llama-sampling.cpp), not only at the one value :data:`SAMPLERS_OFF` names:
    top-n-sigma returns at once for ``n <= 0`` (SillyTavern and KoboldAI Lite send ``top_n_sigma: 0`` by default),
    typical-p for ``p >= 1``, the temperature is plain for a ``dynatemp_range`` of 0 or below (``delta > 0`` makes it
    dynamic), XTC does nothing for a probability of 0 or below or an ``xtc_threshold`` above 0.5, DRY nothing for a
    multiplier of 0 or a ``dry_penalty_last_n`` of 0 (a ``dry_base`` below 1 llama-server resets to its default:
    server-task.cpp ``params_from_json_cmpl``), and mirostat is off at 0 alone. Such a request is llama-server's
    answer without the sampler, and so taken here; a value that is no number is refused, as before. edgesdk's commands
    judge llama.cpp's options of these samplers by it too (cli_llama, ``_SamplerOff``)."""
    if value == SAMPLERS_OFF[field]:
        return True
    if not finite_number(value):
        return False
    if field == "top_n_sigma":
        return value <= 0
    if field == "typical_p":
        return value >= 1
    if field == "dynatemp_range":
        return value <= 0
    if field == "xtc_probability":
        threshold = body.get("xtc_threshold")
        return value <= 0 or (finite_number(threshold) and threshold > 0.5)
    if field == "dry_multiplier":
        last_n = body.get("dry_penalty_last_n")
        return value == 0 or (isinstance(last_n, int) and not isinstance(last_n, bool) and last_n == 0)
    return False  # mirostat: 1 and 2 are its two versions


def _refuse_unsupported(body: dict, chat: bool, route: str = "/v1/completions", takes_suffix: bool = False) -> None:
    """Name the first field whose meaning this server cannot honour: a sampler it lacks set to a value that turns it
    on in llama.cpp (:func:`sampler_off`; on every route, as llama-server takes them on every route), then the OpenAI fields below
    (``suffix`` but where ``takes_suffix``: the route builds a fill-in-the-middle prompt from it)."""
    for field, off in SAMPLERS_OFF.items():
        value = body.get(field)
        if value is not None and not sampler_off(field, value, body):
            raise ApiError(400, f"'{field}' = {json_shown(value)} is not supported: this server does not have that sampler",
                           param=field, code="unsupported_parameter", fix=f"leave '{field}' out or set it to {off}")
    checks = [  # (field, is its value one we can honour, why not)
        ("n", lambda v: v is None or (v == 1 and not isinstance(v, bool)), "one choice per request (n = 1)"),
        # llama-server's own name for n on every completion route (tools/server/server-schema.cpp: "n_cmpl", alias
        # "n", "Number of completions to generate"): a client asking for several must not get one without a word
        ("n_cmpl", lambda v: v is None or (v == 1 and not isinstance(v, bool)),
         "one completion per prompt (n_cmpl = 1)"),
        ("best_of", lambda v: v is None or (v == 1 and not isinstance(v, bool)), "one choice per request (best_of = 1)"),
        # llama-server's min_keep (tools/server/server-task.cpp, params_from_json_cmpl): its top-p and min-p samplers
        # keep at least that many tokens (src/llama-sampling.cpp); this runtime's keep one, as min_keep 0 or 1 does,
        # so a larger value would be dropped without a word and the answer drawn from fewer tokens than asked
        ("min_keep", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1),
         "samplers that keep at least one token (min_keep 0 or 1): its top-p and min-p keep no more to reach a "
         "minimum"),
        ("suffix", lambda v: takes_suffix or v in (None, ""),
         "no suffix (fill-in-the-middle: send the text after the cursor to /infill as 'input_suffix')"),
        ("functions", lambda v: not v, "no legacy functions (send them as 'tools')"),
        ("function_call", lambda v: v in (None, "none"), "no legacy function_call (send 'tool_choice' with 'tools')"),
        ("tools", lambda v: not v or chat, "no tools (they belong to /v1/chat/completions)"),
        # OpenAI's audio output and web search: answers here are text the model writes
        ("modalities", lambda v: v is None or (isinstance(v, list) and all(kind == "text" for kind in v)),
         "text answers only (modalities [\"text\"])"),
        ("audio", lambda v: v is None, "no audio output"),
        ("web_search_options", lambda v: v is None, "no web search"),
        ("response_format", lambda v: v is None or (isinstance(v, dict) and v.get("type") in RESPONSE_FORMATS),
         "plain text, one JSON object or an answer to a JSON schema (response_format type "
         f"{' / '.join(RESPONSE_FORMATS)})"),
    ]
    for field, honoured, why in checks:
        if field in body and not honoured(body[field]):
            endpoint = "/v1/chat/completions" if chat else route
            raise ApiError(400, f"'{field}' = {json_shown(body[field])} is not supported: {endpoint} here gives {why}",
                           param=field, code="unsupported_parameter", fix=f"leave '{field}' out")


def _common_fields(body: dict, chat: bool, limit_fields: tuple[str, ...] = LIMIT_FIELDS,
                   ollama_seed: bool = False) -> dict:
    # The token limit: the first of limit_fields given (llama-server's n_predict, then chat's newer name for
    # max_tokens, then max_tokens, on both routes); only the fields up to the one given are read.
    name = next((name for name in limit_fields if body.get(name) is not None), limit_fields[-1])
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, f"'stream' must be true or false, got {json_shown(stream)}", param="stream")
    options = body.get("stream_options") or {}
    # include_usage null is its default (false), as a null field is everywhere else
    if not isinstance(options, dict) or not isinstance(_default(options.get("include_usage"), False), bool):
        raise ApiError(400, f"'stream_options' must be an object like {{\"include_usage\": true}}, got "
                       f"{json_shown(body.get('stream_options'))}", param="stream_options")
    cache_prompt = _flag(body, "cache_prompt", True)  # null is the default, as for every other field (and in llama-server)
    return {
        # -1 on an HTTP route: None, the server's limit (_held_to_server_limit marks the request)
        "max_tokens": None if _asks_minus_one(body, limit_fields) else
        _max_tokens(body.get(name), name, zero=not chat, server="n_predict" in limit_fields),
        "temperature": _temperature(body.get("temperature")),
        "top_p": _top_p(body.get("top_p")),
        "top_k": _integer(top_k_off_below_zero(body.get("top_k")), "top_k", minimum=0, note=" (0 or below: off)"),
        "min_p": _number(body.get("min_p"), "min_p", 0.0, 1.0, "[0, 1] (0: off)"),
        "samplers": _samplers(body.get("samplers"), body.get("adaptive_target")),
        "seed": _seed(body.get("seed"), ollama=ollama_seed),
        "presence_penalty": _default(_number(body.get("presence_penalty"), "presence_penalty", -2.0, 2.0, "[-2, 2]"), 0.0),
        "frequency_penalty": _default(_number(body.get("frequency_penalty"), "frequency_penalty", -2.0, 2.0, "[-2, 2]"),
                                      0.0),
        "repeat_penalty": _repeat_penalty(body.get("repeat_penalty")),
        "repeat_last_n": _integer(body.get("repeat_last_n"), "repeat_last_n", minimum=-1),
        "logit_bias": _logit_bias(body.get("logit_bias")),
        "stop": _stop(body.get("stop"), MAX_STOP_SEQUENCES if chat else None),
        "stream": stream,
        "include_usage": stream and bool(options.get("include_usage")),
        "cache_prompt": cache_prompt,
        "ignore_eos": _flag(body, "ignore_eos", False),
        "json_object": (body.get("response_format") or {}).get("type") == "json_object",
        "json_schema": _json_schema(body),
        "schema_param": (_given_schema(body) or ("response_format", None))[0],
        "grammar": _grammar(body),
        "n_keep": _shift_field(body, "n_keep", -1),
        "n_discard": _shift_field(body, "n_discard", 0) or 0,
        **_speculative(body),
        **(_chat_logprobs(body) if chat else _text_logprobs(body)),
    }


def _speculative(body: dict) -> dict:
    """llama-server's per-request draft settings, read on every completion route as its flat keys
    (tools/server/server-task.cpp, params_from_json_cmpl): ``speculative.n_max``, the most tokens a draft holds (0: no
    drafts for this answer), ``speculative.n_min``, the fewest a draft is checked with, and ``speculative.p_min``, the
    draft model's least probability of a drafted token. None where absent or null: the server's (--draft-max,
    --draft-min, --draft-p-min; --lookup N). A negative n_max or n_min is raised to 0, and an n_min above n_max
    lowered to it where the answer drafts, as llama-server clamps them (n_min = min(n_max, n_min), then both at
    least 0; completion.py, Completer.draft_settings, takes the lower); on a server that drafts nothing they are
    taken and change nothing, as in llama-server. An n_max above :data:`MAX_DRAFT` (what one pass checks here) or a
    value that is no whole number is refused."""
    n_max, n_min, p_min = (body.get(f"speculative.{name}") for name in ("n_max", "n_min", "p_min"))
    for name, value in (("n_max", n_max), ("n_min", n_min)):
        if value is None:
            continue
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # 2.0 is 2, as _integer
        if isinstance(value, bool) or not whole or (name == "n_max" and value > MAX_DRAFT):
            what = f"up to {MAX_DRAFT} (below 0 taken as 0; the most tokens a draft holds, as the server's " \
                   "--draft-max; 0: no drafts for this answer)" if name == "n_max" else \
                "(below 0 taken as 0, above speculative.n_max lowered to it; the fewest tokens a draft is checked " \
                "with, as the server's --draft-min)"
            raise ApiError(400, f"'speculative.{name}' must be a whole number {what}, got {json_shown(value)}; leave it "
                           "out for the server's", param=f"speculative.{name}")
    if p_min is not None and (not finite_number(p_min) or not 0 <= p_min < 1):
        raise ApiError(400, f"'speculative.p_min' must be a number in [0, 1) (drafting stops at a token the draft "
                       f"model gives less probability, as the server's --draft-p-min; 0: never), got "
                       f"{json_shown(p_min)}; leave it out for the server's", param="speculative.p_min")
    return {"draft_max": None if n_max is None else max(int(n_max), 0),
            "draft_min": None if n_min is None else max(int(n_min), 0),
            "draft_p_min": None if p_min is None else float(p_min)}


def _shift_field(body: dict, name: str, minimum: int) -> int | None:
    """``n_keep`` (-1: the whole prompt) or ``n_discard`` (0: half of what follows the kept tokens), a whole number,
    as llama-server reads them on every completion route (tools/server/server-schema.cpp); None where absent or null
    (the server's)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():  # 2.0 is 2, as the other integer fields read it (_integer)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "tokens of the prompt kept when the context shifts (-1: all of it)" if name == "n_keep" else \
            "tokens dropped after the kept ones when the context shifts (0: half of them)"
        raise ApiError(400, f"'{name}' must be a whole number of {what}, >= {minimum}, got {json_shown(value)}",
                       param=name)
    return value


def _grammar(body: dict) -> Grammar | None:
    """llama-server's ``grammar``: GBNF text the answer follows (edgesdk/runtime/gbnf.py); "" or null is none."""
    source = body.get("grammar")
    if source is None or source == "":
        return None
    if not isinstance(source, str):
        raise ApiError(400, f"'grammar' must be GBNF text (a string), got {json_shown(source)}", param="grammar")
    format_type = (body.get("response_format") or {}).get("type") if isinstance(body.get("response_format"), dict) \
        else None
    if body.get("json_schema") is not None or format_type in ("json_object", "json_schema"):
        given = "json_schema" if body.get("json_schema") is not None else "response_format"
        raise ApiError(400, f"'grammar' and '{given}' both constrain the answer; send one of them", param="grammar")
    try:
        return parse_grammar(source)
    except GrammarError as exc:
        raise ApiError(400, f"grammar: {exc.problem}; {exc.fix}", param="grammar") from exc


def _response_schema(body: dict, fields: dict) -> dict | None:
    """The JSON schema of the request's response format (:func:`_json_schema`, already compiled in ``fields``), as
    the object it was given, or any JSON object for json_object; None for none."""
    if fields["json_schema"] is not None:
        _, schema = _given_schema(body)
        return json.loads(schema) if isinstance(schema, str) else schema  # compile_schema reads text as JSON too
    return ANY_OBJECT if fields["json_object"] else None


def _json_schema(body: dict) -> CompiledSchema | None:
    """The schema the answer must follow: OpenAI's ``response_format {"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}}`` (always enforced strictly here), or llama-server's top-level
    ``json_schema`` or ``response_format {"type": "json_object", "schema": ...}``. A ``schema`` beside the type
    ``text`` constrains nothing, as llama-server reads it (server-common.cpp, ``oaicompat_chat_params_parse``: only
    ``json_object`` and ``json_schema`` formats give a schema)."""
    given = _given_schema(body)
    if given is None:
        return None
    param, schema = given
    try:
        return compile_schema(schema)
    except SchemaError as exc:
        raise ApiError(400, f"{param}: {exc.problem}; {exc.fix}", param=param, code="unsupported_parameter") from exc


def _given_schema(body: dict) -> tuple[str, object] | None:
    """(the field that gave it, the schema as given) of :func:`_json_schema`, or None."""
    response_format = body.get("response_format")
    given = []
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ApiError(400, f"response_format json_schema must carry {{\"json_schema\": {{\"name\": ..., \"schema\": "
                           f"{{...}}}}}}, got json_schema = {json_shown(spec)}", param="response_format")
        given.append(("response_format", spec["schema"]))
    elif isinstance(response_format, dict) and response_format.get("type") == "json_object" \
            and response_format.get("schema"):  # {} in json_object: any object
        # llama-server's json_object with a schema; a "text" format's schema it ignores, and so does this server
        given.append(("response_format", response_format["schema"]))
    if body.get("json_schema") is not None:
        given.append(("json_schema", body["json_schema"]))
    if len(given) > 1:
        raise ApiError(400, "both 'response_format' and 'json_schema' give a JSON schema; send one of them",
                       param="json_schema")
    return given[0] if given else None


def _chat_logprobs(body: dict) -> dict:
    """Chat: ``logprobs`` true asks for them, ``top_logprobs`` (0-20) for alternatives; echo is not a chat field."""
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise ApiError(400, f"'logprobs' must be true or false, got {json_shown(wanted)}", param="logprobs")
    top = _integer(body.get("top_logprobs"), "top_logprobs", minimum=0)
    if top is not None and top > MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'top_logprobs' must be at most {MAX_TOP_LOGPROBS}, got {top}", param="top_logprobs")
    if top and not wanted:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if body.get("echo") not in (None, False):
        raise ApiError(400, "'echo' is a /v1/completions field; chat answers do not repeat the messages",
                       param="echo", code="unsupported_parameter")
    return {"logprobs": (top or 0) if wanted else None}


def _text_logprobs(body: dict) -> dict:
    """Completions: ``logprobs`` N (0-20) gives each token's log-probability and N alternatives; ``echo``
    returns the prompt first (with ``logprobs``, its tokens' log-probabilities too)."""
    top = body.get("logprobs")
    if top is False:
        top = None
    top = _integer(top, "logprobs", minimum=0)
    if top is not None and top > MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'logprobs' must be at most {MAX_TOP_LOGPROBS}, got {top}", param="logprobs")
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise ApiError(400, f"'echo' must be true or false, got {json_shown(echo)}", param="echo")
    return {"logprobs": top, "echo": bool(echo)}


def top_k_off_below_zero(value: object) -> object:
    """``top_k``: a whole number below 0 is 0, the top-k sampler off, as llama.cpp's sampler reads any k <= 0
    (src/llama-sampling.cpp, ``llama_sampler_top_k_impl``: ``if (k <= 0) return;``) on every llama-server route, so
    the -1 that clients written for vLLM send for "off" is taken as llama-server takes it; anything else is left
    for the request's check (a fraction, a string: refused naming ``top_k``)."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return 0 if whole and not isinstance(value, bool) and value < 0 else value


def _integer(value: object, name: str, minimum: int, note: str = "") -> int | None:
    if value is None:
        return None
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # not inf, not NaN
    if isinstance(value, bool) or not whole or value < minimum:
        raise ApiError(400, f"'{name}' must be a whole number >= {minimum}{note}, got {json_shown(value)}", param=name)
    return int(value)


UNTIL_THE_CONTEXT_FILLS = UNLIMITED_TOKENS  # a token limit of -1: the answer runs until it ends or the context is full


def _max_tokens(value: object, name: str, zero: bool = False, server: bool = False) -> int | None:
    """``max_tokens`` / ``max_completion_tokens``: a whole number >= 1, or -1 for no limit but the context (on the
    HTTP routes, where llama-server's ``n_predict`` -1 is read, the server's ``--max-new-tokens`` holds it too:
    :func:`_held_to_server_limit`; llama.cpp's web UI sends ``max_tokens: -1`` by default). With
    ``zero`` (``/v1/completions``) also 0, which OpenAI's completions take: nothing is generated, the prompt is
    evaluated (llama-server's ``n_predict`` 0), and with ``echo`` and ``logprobs`` scored
    (edgesdk/serve/completion.py, ``Completer._prefill_only``). A refusal says what -1 is where it is read
    (``server``: an HTTP route, :func:`_asks_minus_one`)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == -1:
        return UNTIL_THE_CONTEXT_FILLS
    minus_one = "or -1 for no limit but the context" + (" and the server's --max-new-tokens" if server else "")
    if zero:
        return _integer(value, name, minimum=0, note=f" (0: the prompt only, scored with echo and logprobs), {minus_one}")
    return _integer(value, name, minimum=1, note=f", {minus_one}")


SAMPLER_NAMES = CARRIED_SAMPLERS + PASS_THROUGH_SAMPLERS  # llama.cpp's names this runtime takes
ADAPTIVE_P_NAMES = ("adaptive_p", "adaptive-p", "adaptivep")  # llama.cpp's names of its adaptive-p sampler (letter "a")


def _samplers(value: object, adaptive_target: object = None) -> tuple[str, ...] | None:
    """llama-server's ``samplers``: a list of sampler names or a string of their letters (``"kpmt"``), read as
    :func:`~edgesdk.runtime.generate.sampler_chain` reads them; null: the server's chain.

    llama.cpp's ``adaptive_p`` (letter ``a``), which this runtime does not have, is dropped from the chain where
    ``adaptive_target`` leaves it off: below 0 (common/common.h: "negative = disabled"), or not given, which is
    llama-server's default target, -1 (params_from_json_cmpl reads it from the server's params; the native routes
    set the same: edgesdk/serve/llama_native.py ``ADAPTIVE_TARGET_OFF``). There the sampler only picks a token from the
    distribution as it is (src/llama-sampling.cpp, ``llama_sampler_adaptive_p_apply``: "at negative target values,
    adaptive-p is no-op"), as the chain's closing pick does here. SillyTavern's default llama.cpp chain ends in it
    (LLAMACPP_DEFAULT_ORDER) beside ``adaptive_target`` -0.01. A target of 0 or above, which turns the sampler on, is
    refused naming ``adaptive_target``.

    A name or letter llama.cpp does not know (SillyTavern's older presets send ``tfs_z`` and ``typical_p``; an old
    web UI setting the letter ``f``) is left out of the chain with a warning in the server's log, as llama-server's
    ``common_sampler_types_from_names`` / ``common_sampler_types_from_chars`` skip it with ``LOG_WRN("unable to
    match sampler ...")``: the rest of the chain runs (:func:`skipped_samplers`)."""
    if value is None:
        return None
    off = adaptive_target is None or adaptive_p_off(adaptive_target)
    if isinstance(value, str):
        adaptive = "a" in value
        value = value.replace("a", "") if adaptive and off else value
    elif isinstance(value, list):
        adaptive = any(isinstance(name, str) and name.lower() in ADAPTIVE_P_NAMES for name in value)
        if adaptive and off:
            value = [name for name in value if not (isinstance(name, str) and name.lower() in ADAPTIVE_P_NAMES)]
    else:
        adaptive = False
    if adaptive and not off:
        raise ApiError(400, f"'adaptive_target' = {json_shown(adaptive_target)} with adaptive_p in 'samplers' is not "
                       "supported: this server does not have llama.cpp's adaptive-p sampler; leave 'adaptive_target' "
                       "out or set it below 0 (off), or take adaptive_p out of 'samplers'", param="adaptive_target",
                       code="unsupported_parameter")
    skipped: list[str] = []
    try:
        chain = sampler_chain(value, skipped=skipped)
    except ValueError as exc:
        raise ApiError(400, f"'samplers': {exc}", param="samplers") from None
    if skipped:
        skipped_samplers(skipped)
    return chain


_WARNED_SAMPLERS: set = set()  # the skipped names already logged: a client sends its chain with every request


def skipped_samplers(names: list[str]) -> str:
    """The log line that says which of a request's ``samplers`` llama.cpp does not know and the chain leaves out,
    logged as a warning once per set of names (a client sends the same chain with every request), as llama-server
    logs each (common/sampling.cpp: ``unable to match sampler by name '%s'`` / ``by char '%c'``)."""
    shown = ", ".join(_shown(name) for name in names[:8]) + (" ..." if len(names) > 8 else "")
    line = (f"'samplers': {shown} left out of the chain: no sampler llama.cpp knows (llama-server skips such names "
            f"too); the names are {', '.join(SAMPLER_NAMES)}")
    warn_once(_WARNED_SAMPLERS, tuple(names), line)
    return line


def adaptive_p_off(target: object) -> bool:
    """Whether llama.cpp's adaptive-p sampler does nothing at ``adaptive_target`` (a number below 0); edgesdk's
    commands judge llama.cpp's --adaptive-target by it too (cli_llama)."""
    return finite_number(target) and target < 0


def _seed(value: object, ollama: bool = False) -> int | None:
    """``seed`` as llama-server reads it on every route: a whole number >= 0 is a fixed seed, -1 or 4294967295 a
    random one (:data:`RANDOM_SEED`, even where the server has a seed), and none (or null) the server's (None).
    llama-server's seed is a ``uint32_t`` read with the server's ``-s`` for its default (server-task.cpp
    ``params_from_json_cmpl``), and LLAMA_DEFAULT_SEED (0xFFFFFFFF, what -1 becomes there) makes its sampler draw a
    seed (src/llama-sampling.cpp, ``get_rng_seed``: ``if (seed == LLAMA_DEFAULT_SEED)``). A seed past 32 bits stays
    a fixed seed of its own, as it was here before: OpenAI's ``seed`` is any 64-bit integer, llama-server takes it
    too (cut to its low 32 bits), and clients send such seeds (a ComfyUI seed widget's, ``random.getrandbits(64)``),
    so refusing it turned working requests into 400s.

    With ``ollama``, as Ollama's sampler reads ``options.seed`` (sample/samplers.go, ``NewSampler``: every seed but -1
    is fixed, ``uint64(seed)``): -1 is random, any other whole number >= 0 (4294967295 too) fixed;
    edgesdk/serve/ollama.py has made a seed below -1 its uint64 already."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == -1:
        return RANDOM_SEED
    seed = _integer(value, "seed", minimum=0, note=", or -1 for a random seed")
    if ollama or seed != LLAMA_DEFAULT_SEED:
        return seed
    return RANDOM_SEED  # LLAMA_DEFAULT_SEED: a random seed, as -1


def finite_number(value: object) -> bool:
    """A JSON number that is a double's finite value: no NaN, no infinity, and no integer past a double (a JSON
    integer of 400 digits is a Python int, on which math.isfinite raised OverflowError: a 500, not a 400)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _number(value: object, name: str, low: float, high: float, interval: str) -> float | None:
    if value is None:
        return None
    if not finite_number(value) or not low <= value <= high:
        raise ApiError(400, f"'{name}' must be a number in {interval}, got {json_shown(value)}", param=name)
    return float(value)


def _temperature(value: object) -> float | None:
    """``temperature``: any finite number, below 0 read as 0 (greedy); None where absent or null (the server's).
    llama-server takes it on every route (/completion and the OpenAI ones alike) without OpenAI's upper bound of 2
    and reads one below 0 as greedy sampling, n_probs still reported (its README, "POST /completion"); clients send
    more than 2 beside min-p for creative writing."""
    if value is None:
        return None
    if not finite_number(value):
        raise ApiError(400, f"'temperature' must be a finite number (0 or below: greedy), got {json_shown(value)}",
                       param="temperature")
    return max(float(value), 0.0)


def _default(value, default):
    return default if value is None else value


def _repeat_penalty(value: object) -> float | None:
    penalty = _number(value, "repeat_penalty", 0.0, math.inf, "(0, inf)")
    if penalty == 0.0 or penalty == math.inf:
        raise ApiError(400, f"'repeat_penalty' must be a finite number > 0, got {json_shown(value)}", param="repeat_penalty")
    return penalty


def _top_p(value: object) -> float | None:
    """OpenAI's ``top_p``, in [0, 1]: 0 keeps the likeliest token alone, as llama.cpp's top-p sampler does."""
    return _number(value, "top_p", 0.0, 1.0, "[0, 1]")


MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a bias: [-100, 100]


def _logit_bias(value: object) -> tuple[tuple[int | str, float], ...]:
    """OpenAI's ``{"token id": bias}`` or llama-server's ``[[token id, bias], ...]``; llama-server also takes text
    for the id (every token of it gets the bias) and ``false`` for the bias (the token is never taken: -inf).
    Ids are checked against the vocabulary, and text tokenized, when the request runs."""
    if value is None:
        return ()
    if isinstance(value, dict):  # a key is a token id where it reads as a whole number, as llama-server's strtol
        entries = [(_bias_key(key), bias) for key, bias in value.items()]
    elif isinstance(value, list) and all(isinstance(entry, list) and len(entry) == 2 for entry in value):
        entries = [tuple(entry) for entry in value]  # a string here is text, a number an id
    else:
        raise ApiError(400, "'logit_bias' must be an object mapping token ids to biases ({\"15043\": -100}) or an "
                       f"array of [token id, bias] pairs, got {json_shown(value)}", param="logit_bias")
    pairs = []
    for key, bias in entries:
        if isinstance(key, bool) or not isinstance(key, (int, str)) or (isinstance(key, int) and key < 0) or key == "":
            raise ApiError(400, f"'logit_bias' keys must be token ids >= 0 (or text to tokenize), got {json_shown(key)}",
                           param="logit_bias")
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:  # NaN and infinities fail the range too
            raise ApiError(400, f"'logit_bias' for {json_shown(key)} must be a number in [-100, 100], or false for a "
                           f"token never to be taken, got {json_shown(bias)}", param="logit_bias")
        pairs.append((key, float(bias)))
    return tuple(pairs)


def _bias_key(key: str) -> int | str:
    """A logit_bias object key: the token id it reads as (leading zeros and all, as strtol reads it), or the text."""
    match = re.fullmatch(r"\s*([+-]?)0*([0-9]+)", key)
    if match is None:
        return key
    sign, digits = match.groups()
    if len(digits) > 18:  # no vocabulary comes near, and int() refuses past 4,300 digits
        raise ApiError(400, f"'logit_bias' keys must be token ids >= 0 of this model's vocabulary (or text to "
                       f"tokenize), got {json_shown(key)} ({len(digits):,} digits)", param="logit_bias")
    return int(sign + digits)


def _stop(value: object, limit: int | None = MAX_STOP_SEQUENCES) -> tuple[str, ...]:
    """``stop``: a string or an array of strings, at most ``limit`` of them (None: any number).

    Chat takes OpenAI's 4. ``/v1/completions`` takes any number, as llama-server's does (tools/server
    server-common.cpp, ``oaicompat_completion_params_parse``, puts the array as it is into the task's stop words):
    lm-evaluation-harness's ``local-completions`` sends a task's whole ``until`` list with the end-of-text text added
    (HumanEval's five stops and more; only its chat models cut the list to 4), which a limit of 4 refused."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    most = "" if limit is None else f"at most {limit} "
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, f"'stop' must be a string or an array of {most}strings, got {json_shown(value)}",
                       param="stop")
    if limit is not None and len(stops) > limit:  # the count, which a long list's shortened text would hide
        raise ApiError(400, f"'stop' must be a string or an array of {most}strings, got {len(stops)} strings "
                       f"({json_shown(value)}); send the {limit} that matter most", param="stop")
    utf8_stops(value)
    return tuple(s for s in stops if s)  # an empty stop string would end every answer before it starts


def utf8_stops(value: str | list[str], field: str = "stop") -> None:
    """A 400 naming the first of the stop strings ``value`` (one, or an array) of the request's ``field`` that is not
    UTF-8 (a lone surrogate from a JSON escape): the answer's text is UTF-8, so such a stop could never match and
    would be ignored without a word."""
    for index, stop in enumerate([value] if isinstance(value, str) else value):
        param = field if isinstance(value, str) else f"{field}[{index}]"
        utf8_field(stop, param, f"'{param}'")


# ------------------------------------------------------------------------------------------ responses


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens`` counts the prompt tokens taken
    from the previous answer's KV cache instead of being prefilled."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class TextOffsets:
    """Where each token starts in the returned text, in characters, as its UTF-8 bytes form them: a byte
    piece that ends a multi-byte character starts where that character does (alone it reads U+FFFD, but
    the text holds the one character). Kept across the chunks of a streamed answer."""

    def __init__(self, start: int = 0):
        self.at = start
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, pieces: list[bytes]) -> list[int]:
        offsets = []
        for piece in pieces:
            offsets.append(self.at)
            self.at += len(self._utf8.decode(piece))
        return offsets


def logprobs_body(request: CompletionRequest, entries: list, piece: Callable[[int], bytes],
                  offset: int | TextOffsets = 0) -> dict | list[dict]:
    """OpenAI's ``logprobs`` object for ``entries`` (:class:`~edgesdk.runtime.logprobs.TokenLogprob`;
    a prompt's first token has no log-probability): chat's ``content`` list (each ``token`` cut before an unfinished
    UTF-8 character at its end as llama-server cuts it, ``bytes`` whole), or the completions' parallel lists
    with each token's character offset in the returned text (from ``offset``, or where the
    :class:`TextOffsets` of the chunks before left off); for llama-server's ``POST /completion``, its
    :func:`completion_probabilities` list."""
    def text(token: int) -> str:
        return piece(token).decode("utf-8", errors="replace")

    if request.llama_probs:
        return completion_probabilities(entries, piece)
    if request.chat:
        def shown(token: int) -> dict:
            data = piece(token)
            return {"token": _complete_characters(data), "bytes": list(data)}

        return {"content": [{**shown(e.token), "logprob": e.logprob,
                             "top_logprobs": [{**shown(t), "logprob": lp} for t, lp in e.top]}
                            for e in entries], "refusal": None}
    offsets = (offset if isinstance(offset, TextOffsets) else TextOffsets(offset))([piece(e.token) for e in entries])
    return {"tokens": [text(e.token) for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else _by_text(e.top + ((e.token, e.logprob),), text)
                             for e in entries],
            "text_offset": offsets}


def completion_probabilities(entries: list, piece: Callable[[int], bytes]) -> list[dict]:
    """llama-server's ``completion_probabilities`` (tools/server README, "POST /completion"; server-task.cpp,
    ``probs_vector_to_json``): per token its ``id``, ``token``, ``bytes`` and ``logprob``, and ``top_logprobs``,
    the most likely tokens at its position in the same form. ``token`` is the text of the bytes up to an
    unfinished UTF-8 character at their end, as llama-server cuts it (``bytes`` holds them all)."""
    def shown(token: int) -> dict:
        data = piece(token)
        return {"id": token, "token": _complete_characters(data), "bytes": list(data)}

    return [{**shown(entry.token), "logprob": entry.logprob,
             "top_logprobs": [{**shown(token), "logprob": logprob} for token, logprob in entry.top]}
            for entry in entries]


def _complete_characters(data: bytes) -> str:
    """A token's text as llama-server shows it (``completion_token_output::probs_vector_to_json`` in
    tools/server/server-task.cpp): cut by ``validate_utf8`` (tools/server/server-common.cpp) before a multi-byte
    character's lead byte among the last four bytes that has fewer bytes after it than its character needs; what
    is left and not UTF-8 reads U+FFFD, as the server's JSON writer (``error_handler_t::replace``) writes it."""
    size = len(data)
    for back in range(1, min(4, size) + 1):
        byte = data[size - back]
        if ((byte & 0xE0) == 0xC0 and back < 2) or ((byte & 0xF0) == 0xE0 and back < 3) or \
                ((byte & 0xF8) == 0xF0 and back < 4):
            size -= back
            break
    return data[:size].decode("utf-8", errors="replace")


def _by_text(top: tuple[tuple[int, float], ...], text: Callable[[int], str]) -> dict[str, float]:
    """The completions' ``{token text: logprob}`` of a position's alternatives (most likely first) and, last,
    the token taken there: OpenAI's legacy ``logprobs`` "will always return the logprob of the sampled token, so
    there may be up to logprobs+1 elements" (llama-cpp-python adds it the same way). Where two tokens read alike
    (the token taken is usually among the alternatives; byte pieces of one character both read U+FFFD), the key
    keeps the likelier."""
    alternatives: dict[str, float] = {}
    for token, logprob in top:
        alternatives.setdefault(text(token), logprob)
    return alternatives


def completion_body(request: CompletionRequest, ident: str, model: str, text: str, finish_reason: str,
                    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                    logprobs: dict | None = None, reasoning: str = "", think_opened: bool | None = None) -> dict:
    """The whole answer of a request without ``stream`` (``reasoning``: a thinking model's, apart from ``text``;
    ``think_opened``: under tools, whether the answer is its ``<think>`` block from its first character, as
    :func:`~edgesdk.serve.tools.answer_message` takes it)."""
    if request.chat:
        fields = {"content": text}
        if reasoning:
            fields["reasoning_content"] = reasoning
        if request.tools is not None:
            fields, finish_reason = answer_message(text, finish_reason, request.tools.structured, think_opened)
        choice = {"index": 0, "message": {"role": "assistant", **fields}, "logprobs": logprobs,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"id": ident, "object": "chat.completion" if request.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def chunk_body(request: CompletionRequest, ident: str, model: str, text: str | None,
               finish_reason: str | None = None, role: bool = False, logprobs: dict | None = None,
               reasoning: str = "", index: int = 0) -> dict:
    """One server-sent event of a streamed answer: a text delta, or the last one with ``finish_reason``.
    With ``stream_options.include_usage`` it carries ``"usage": null`` ("All other chunks will also
    include a usage field, but with a null value", OpenAI's reference for ``stream_options``).

    The first delta (``role``) of an answer under tools carries ``"content": null``, as llama-server's first delta
    does (tools/server/server-task.cpp, ``to_json_oaicompat_chat``) and as OpenAI's does for a tool call: a client
    that accumulates the deltas (the openai package's stream helper) then ends with the ``content`` null of the
    whole answer's tool-call message, not ``""``. ``index``: the choice's, the prompt's place among a text request's
    several prompts (llama-server's chunks carry their task's ``index``)."""
    if request.chat:
        opening = {"role": "assistant", "content": None if request.tools is not None else ""}
        delta = opening if role else ({} if text is None else {"content": text})
        if reasoning:  # llama-server's delta for a thinking model's reasoning
            delta = {"reasoning_content": reasoning, **({"content": text} if text else {})}
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    body = {"id": ident, "object": "chat.completion.chunk" if request.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}
    if request.include_usage:
        body["usage"] = None
    return body


def usage_chunk_body(request: CompletionRequest, ident: str, model: str, prompt_tokens: int,
                     completion_tokens: int, cached_tokens: int = 0) -> dict:
    """The extra last chunk ``stream_options.include_usage`` asks for: no choices, the usage."""
    return {"id": ident, "object": "chat.completion.chunk" if request.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}
