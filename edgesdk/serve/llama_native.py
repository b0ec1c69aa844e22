"""llama-server's own completion API, ``POST /completion``, on the same completer.

Scripts and tools written against llama.cpp's server (its README, "POST /completion") send this
rather than OpenAI's ``/v1/completions``, and read its ``timings`` for speed. A request is
translated into the OpenAI text request it means and checked there, so the fields both take
(``prompt`` as text or token ids, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``samplers``, ``seed``,
``stop``, ``stream``, ``grammar``, ``json_schema``, ``ignore_eos``, ``logit_bias``,
``repeat_penalty``, ``repeat_last_n``, ``presence_penalty``, ``frequency_penalty``,
``cache_prompt``) take the same values (``temperature`` any finite number, below 0 greedy, as llama-server takes
it on every route, not OpenAI's [0, 2]), but for ``top_k``, whose whole numbers below 0 are 0 (off), as llama.cpp's
top-k sampler reads them. ``n_predict`` is the token limit (-1: none of the request's own, so the
server's ``--max-new-tokens`` holds it, and only a server started with -1 answers until the end-of-text token or a
full context, as llama-server holds a request's -1 to its ``-n``: :class:`NativeRequest`; ``max_completion_tokens``,
else ``max_tokens``, where it is not given, as llama-server reads it; 0 evaluates the prompt into the KV cache and generates nothing, as llama-server does, so
a next request that starts with that prompt prefills only what follows); ``stop`` takes any number
of strings; ``seed`` -1 is a random seed, and a request without one takes the server's ``--seed`` (a random seed
by default), as on the OpenAI routes; ``generation_settings`` shows a random one as llama-server does, 4294967295. ``n_probs`` N (any number: as llama-server, the N most likely
tokens of the vocabulary, all of them past its size; not OpenAI's limit of 20 on ``top_logprobs``, which the OpenAI
routes keep; OpenAI's ``logprobs`` N where ``n_probs`` is not given, as llama-server reads it) adds
``completion_probabilities``: each answer token's ``id``, ``token``, ``bytes`` and ``logprob``
with the N most likely tokens at its position as ``top_logprobs``, from the model's own
distribution (before the samplers, as llama-server's without ``post_sampling_probs``, which is
refused with ``n_probs`` above 0: this runtime does not keep the distribution its samplers leave; with none asked for it
changes nothing, as in llama-server, and is taken), the end-of-text token the answer stopped at
listed last, as llama-server lists every token it sampled: one entry per token of ``tokens``, but for the tokens a stop
string cut off (as llama-server's whole answer leaves a stop word's out) and the end-of-text token a complete grammar
ends the answer with, which is chosen without reading the model's distribution at its position (no entry to list).
``n_keep`` and ``n_discard`` set the context shift of a server started with ``--context-shift`` (llama-server's
``update_slots``): a full context keeps its first ``n_keep`` tokens (-1: the prompt; the BOS the prompt starts with
on top), drops ``n_discard`` after them (0: half of the rest) and the answer goes on; without ``--context-shift``
they change nothing, as in llama-server. ``speculative.n_max``, ``speculative.n_min`` and ``speculative.p_min`` set the
drafts of this answer alone on a server started with ``--draft`` or ``--lookup`` (read on every completion route:
edgesdk/serve/api.py ``_speculative``; the next answer's are the server's again); a server that drafts nothing takes
them and changes nothing, as llama-server does. With the shift on, ``n_predict`` -1 on a server started with ``-n -1`` runs
until the end-of-text token or ten contexts of tokens (edgesdk/serve/completion.py, ``SHIFTED_LIMIT_CONTEXTS``).
Samplers this runtime does not have (mirostat, typical-p, dynamic temperature, XTC, DRY, top-n-sigma, adaptive-p) are
refused by name where set to a value that turns them on in llama.cpp (edgesdk/serve/api.py, ``sampler_off``; a value
llama.cpp's sampler reads as off, such as SillyTavern's ``top_n_sigma: 0``, is taken); fields that only tune llama.cpp's own
machinery (``id_slot`` ...) are ignored as llama-server ignores fields it does not know. ``adaptive_p`` in
``samplers`` without ``adaptive_target`` is llama-server's default target, -1 (off: the sampler picks from the
distribution as it is), and so taken, as with a target below 0.

The answer is llama-server's: ``content``, ``stop``, ``stop_type`` (``eos``, ``limit`` or
``word`` with ``stopping_word``), ``tokens_predicted``, ``tokens_evaluated``, ``tokens_cached``,
``truncated`` (true where the context shifted, or the answer stopped at a full context, as llama-server's
``process_token`` marks a slot that ran out of context), ``generation_settings`` and
``timings`` (``prompt_n``, ``prompt_ms``,
``predicted_n``, ``predicted_ms``, their per-token and per-second forms, ``cache_n``, and ``draft_n`` with
``draft_n_accepted`` where the answer drafted tokens). A stream
sends ``data: {"content": ..., "stop": false}`` events (with the ``completion_probabilities`` of
the tokens whose text they carry) and ends with one holding ``"stop": true`` and the whole
answer's fields but the probabilities (no ``[DONE]``), as llama-server's stream does. Each event names the ids
of the tokens it carries in ``tokens`` (the end-of-text token and a stop string's tokens in an event of "" of their
own), as llama-server's partial results do; the whole answer lists them all only with ``return_tokens: true``.

``prompt`` takes llama-server's forms (tools/server/utils.hpp ``tokenize_input_prompts``): a string, token ids, ids
mixed with strings (``[12, 34, "text"]``: one prompt, a string's BOS only where it comes first), or several prompts
(``["a", [12, 34]]``), each answered in turn: an array of answers, or one stream of each prompt's events and last
event, all with the prompt's ``index``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from edgesdk.runtime.generate import SamplingConfig
from edgesdk.serve.api import (
    LLAMA_DEFAULT_SEED,
    UNTIL_THE_CONTEXT_FILLS,
    ApiError,
    CompletionRequest,
    _flag,
    _object,
    is_mixed_prompt,
    json_shown,
    parse_text_request,
    utf8_stops,
)
from edgesdk.serve.completion import Completion

ROUTE = "/completion"

# llama-server's default adaptive_target (common/common.h: "negative = disabled"), which a request that leaves it out
# gets, as params_from_json_cmpl reads it from the server's params
ADAPTIVE_TARGET_OFF = -1.0


@dataclass(frozen=True)
class NativeRequest(CompletionRequest):
    """A request whose token limit (``n_predict``, ``max_tokens`` or ``max_completion_tokens``) was -1: ``/completion``
    and ``/infill``, and the OpenAI routes (:mod:`edgesdk.serve.api`), which read the same fields.

    llama-server reads a request's -1 as "no limit of its own": the answer is held to the server's ``-n`` all the same
    (tools/server/server-context.cpp: ``slot.n_predict_max = task.params.n_predict != -1 ? task.params.n_predict :
    params_base.n_predict``, older versions' ``has_budget`` alike), so ``max_tokens`` is None here (the server's
    ``--max-new-tokens``, unlimited only where the server's is -1), while ``generation_settings`` shows the -1 asked
    for, as llama-server's ``params.n_predict`` does."""

    predict_minus_one: bool = False


def asked_no_limit(request: CompletionRequest) -> bool:
    """Whether ``request`` is a ``/completion`` request that gave ``n_predict`` -1 (:class:`NativeRequest`)."""
    return getattr(request, "predict_minus_one", False)


def prompts(body: object) -> list[object]:
    """The bodies of the prompts one ``POST /completion`` asks for, as llama-server's ``tokenize_input_prompts``
    (tools/server/utils.hpp) tells one prompt from several: a string, an array of token ids, or an array mixing ids
    and strings (``[12, 34, "text"]``) is one prompt (any array holding a number is, and a 400 names its element that
    is no token id or string); any other array is one prompt per element (``["a", "b"]``,
    ``[[12, 34], "text"]``), each a string, an array of ids or a mixed array, answered by a task of its own. A body
    of one prompt comes back as it is; each of several is the body with that prompt."""
    if not isinstance(body, dict):
        return [body]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and any(_is_number(item) for item in prompt):
        _check_prompt_parts(prompt)  # llama-server's json_is_array_and_contains_numbers: one prompt
        return [body]
    if not isinstance(prompt, list) or len(prompt) < 2 or is_mixed_prompt(prompt):
        return [body]
    for index, item in enumerate(prompt):
        one = isinstance(item, str) or (isinstance(item, list) and item and (
            is_mixed_prompt(item) or all(isinstance(t, int) and not isinstance(t, bool) for t in item)))
        if not one:
            raise ApiError(400, f"'prompt[{index}]' must be a string, an array of token ids or an array mixing token "
                           f"ids and strings (each element of 'prompt' is a prompt of its own), got {json_shown(item)}",
                           param="prompt")
    return [{**body, "prompt": item} for item in prompt]


def _is_number(value: object) -> bool:
    """A JSON number (nlohmann's ``is_number``: true and false are not numbers)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_prompt_parts(prompt: list) -> None:
    """A 400 naming the first element of a one-prompt array (one that holds a number) that is neither a token id nor
    a string: ``[12, 34.5]`` is one prompt whose second element is at fault, not a batch whose first is."""
    for index, item in enumerate(prompt):
        if not (isinstance(item, str) or (_is_number(item) and isinstance(item, int) and item >= 0)):
            raise ApiError(400, f"'prompt[{index}]' must be a token id (a whole number >= 0) or a string: an array "
                           f"holding token ids is one prompt; got {json_shown(item)}", param="prompt")


def return_tokens(body: object) -> bool:
    """``return_tokens``: the whole answer lists the ids of the tokens it generated in ``tokens`` (false: ``[]``),
    as llama-server's ``params_from_json_cmpl`` reads it."""
    return _flag(body, "return_tokens", False) if isinstance(body, dict) else False


def parse_completion_request(body: object, completer=None) -> CompletionRequest:
    """``POST /completion``: the request as the OpenAI text request it means, checked there (with the
    ``completer`` of the model that answers, a prompt mixing token ids and strings is tokenized as llama-server
    does; ``suffix`` stays /infill's)."""
    body = _object(body)  # the samplers this runtime lacks are refused by parse_text_request, as on every route
    probs = _n_probs(body)
    if completer is not None:  # at most every token of the vocabulary (the logits' rows), as llama-server lists them
        probs = min(probs, getattr(completer.runtime.backend, "vocab_size", None) or completer.vocabulary())
    limits = {name: _limit(body, name) for name in ("n_indent", "t_max_predict_ms")}
    text = {key: value for key, value in body.items()
            if key not in ("n_predict", "max_tokens", "max_completion_tokens", "logprobs", "echo", "n_probs",
                           "post_sampling_probs", "n_indent", "t_max_predict_ms")}
    # the limit as llama-server reads it (tools/server/server-task.cpp, params_from_json_cmpl): n_predict, else
    # max_completion_tokens, else max_tokens
    name = next((name for name in ("n_predict", "max_completion_tokens") if body.get(name) is not None), "max_tokens")
    predict = _whole(body.get(name))
    if predict is not None:
        if isinstance(predict, bool) or not isinstance(predict, int) or predict < -1:  # true, false: no count
            raise ApiError(400, f"'{name}' must be the most tokens to generate (>= 1; 0 evaluates the prompt into "
                           f"the cache and generates nothing), or -1 for the server's limit (--max-new-tokens; none but the "
                           f"context where that is -1), got "
                           f"{json_shown(predict)}", param=name)
        if predict != -1:  # -1: the server's limit (NativeRequest), as llama-server holds it to its -n
            text["max_tokens"] = max(predict, 1)  # 0 is set after the check
    if text.get("adaptive_target") is None:  # llama-server's default: adaptive_p in 'samplers' does nothing
        text["adaptive_target"] = ADAPTIVE_TARGET_OFF
    stops = _stop(text.pop("stop", None))  # llama-server's: any number of strings
    request = parse_text_request(text, route="/completion", completer=completer, takes_suffix=False)
    request = replace(request, stop=stops, logprobs=probs or None, llama_probs=bool(probs),
                      end_probs=bool(probs),
                      max_tokens=0 if predict == 0 else request.max_tokens, n_indent=int(limits["n_indent"]),
                      t_max_predict_ms=float(limits["t_max_predict_ms"]))
    if predict == -1:
        request = NativeRequest(**{item.name: getattr(request, item.name) for item in fields(request)},
                                predict_minus_one=True)
    return request


def _whole(value: object) -> object:
    """A JSON whole number as an int (2.0, as a client that writes every number as a float sends it, is 2, as
    llama-server's nlohmann ``get<int>`` reads it and the OpenAI routes' integer fields take it: serve/api.py
    ``_integer``); any other value as it is, for the caller to refuse (true, 2.5, a string)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _limit(body: dict, name: str) -> float:
    """``n_indent`` (a whole number of spaces or tabs) or ``t_max_predict_ms`` (milliseconds), >= 0; 0 when absent
    or null (off)."""
    whole = name == "n_indent"
    value = _whole(body.get(name)) if whole else body.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or value < 0 \
            or value != value:
        what = "a whole number of spaces or tabs" if whole else "milliseconds"
        raise ApiError(400, f"'{name}' must be {what} >= 0 (0: off), got {json_shown(value)}", param=name)
    return value


def _n_probs(body: dict) -> int:
    """``n_probs``: how many of the most likely tokens to list at each answer token (0: no probabilities). Where
    ``n_probs`` is not given (absent, null or its default 0), OpenAI's ``logprobs`` (a whole number; false or null:
    none; true: 1, as llama-server's JSON reader turns a boolean into a number) is read in its place, as
    llama-server's ``params_from_json_cmpl`` reads it (tools/server/server-task.cpp: "Use OpenAI API logprobs only if
    n_probs wasn't provided"; server-schema.cpp: ``n_probs`` with the alias ``logprobs``); errors name the field that
    gave the value. ``post_sampling_probs`` is refused only where probabilities are asked for: without them it
    changes nothing in llama-server's answer (a client that always sends it lists none). No upper bound: llama-server
    lists ``min(n_probs, n_vocab)`` tokens (server-context.cpp ``populate_token_probs``), which
    :func:`parse_completion_request` holds it to; 20, OpenAI's limit on ``top_logprobs``, refused the 50 or 100 its
    clients ask of it."""
    name, value = "n_probs", _whole(body.get("n_probs"))
    if value is None or (value == 0 and not isinstance(value, bool)):
        value = 0
        given = body.get("logprobs")
        if given is not None and given is not False:
            name, value = "logprobs", 1 if given is True else _whole(given)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(400, f"'{name}' must be how many of the most likely tokens to list per answer token (a whole "
                       f"number >= 0, 0 for none), got {json_shown(value)}", param=name)
    post = body.get("post_sampling_probs")
    if value and post not in (None, False):
        raise ApiError(400, f"'post_sampling_probs' = {json_shown(post)} is not supported: this server lists the model's "
                       "own probabilities, before top-k, top-p, min-p and the temperature (llama-server's 'logprob' "
                       "and 'top_logprobs'), not what its samplers leave; leave 'post_sampling_probs' out or false",
                       param="post_sampling_probs", code="unsupported_parameter")
    return value


def _stop(value: object) -> tuple[str, ...]:
    """``stop``: a string or an array of strings, as many as the client likes (empty ones end nothing), each UTF-8."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise ApiError(400, f"'stop' must be a string or an array of strings, got {json_shown(value)}", param="stop")
    utf8_stops(value)
    return tuple(stop for stop in stops if stop)


def stop_type(completion: Completion) -> str:
    """llama-server's ``stop_type``: a stop string (``word``), the token limit or a full context (``limit``), or the
    end-of-text token (``eos``)."""
    if completion.stop_string is not None:
        return "word"
    return "limit" if completion.finish_reason == "length" else "eos"


def ended_at_eos(completion: Completion) -> bool:
    """Whether the model itself ended the answer with its end-of-text token (``stop_type`` ``eos``), not a stop
    string, the token limit or a full context: a thinking block left open then closes where the answer ended."""
    return stop_type(completion) == "eos"


def timings(completion: Completion) -> dict:
    """llama-server's ``timings``: prompt tokens processed (the cached ones apart) and tokens generated, with
    their milliseconds, per token and per second.

    The per-token figures divide by every token generated, the first one too, as llama-server's ``get_timings``
    does (tools/server/server-context.cpp: ``predicted_per_token_ms = t_token_generation / n_decoded``,
    ``predicted_per_second = 1e3 / t_token_generation * n_decoded``), though its ``t_token_generation``, as
    ``predicted_ms`` here, runs from the first token's pick to the last's. ``predicted_n`` is llama-server's
    ``n_decoded``, as ``tokens_predicted`` and ``usage.completion_tokens`` are: every token sampled, the end-of-text
    token an answer stopped at included (``n_decoded`` is bumped before ``process_token`` sees the end of text), its
    pick the last one ``predicted_ms`` runs to. ``prompt_n`` counts the prompt tokens evaluated, ``cache_n`` those
    taken from the KV cache (``n_prompt_tokens_processed``, ``n_prompt_tokens_cache``)."""
    prompt_n = completion.prompt_tokens - completion.cached_tokens
    predicted_n = completion.completion_tokens

    def rates(count: int, ms: float) -> tuple[float, float]:
        return (ms / count if count else 0.0), (count * 1e3 / ms if ms > 0 else 0.0)

    prompt_per_token, prompt_per_second = rates(prompt_n, completion.prompt_ms)
    predicted_per_token, predicted_per_second = rates(predicted_n, completion.predicted_ms)
    body = {"cache_n": completion.cached_tokens, "prompt_n": prompt_n, "prompt_ms": round(completion.prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_per_token, 3), "prompt_per_second": round(prompt_per_second, 3),
            "predicted_n": predicted_n, "predicted_ms": round(completion.predicted_ms, 3),
            "predicted_per_token_ms": round(predicted_per_token, 3),
            "predicted_per_second": round(predicted_per_second, 3)}
    if completion.draft_tokens > 0:  # as llama-server adds them: only where the answer drafted (result_timings::to_json)
        body.update(draft_n=completion.draft_tokens, draft_n_accepted=completion.draft_accepted)
    if completion.thermal_wait_ms is not None:  # edgesdk's: the time the thermal guard held the answer back
        body["thermal_wait_ms"] = round(completion.thermal_wait_ms, 3)
    return body


def generation_settings(request: CompletionRequest, sampling: SamplingConfig, server_keep: int = 0,
                        server_max_tokens: int | None = None, shifts: bool = False,
                        speculative: dict | None = None) -> dict:
    """The settings the answer was generated with, in llama-server's names; ``n_keep`` the request's, else the
    server's ``--keep`` (``server_keep``), as llama-server's slot params show them.

    ``seed`` is the fixed seed (the request's, else the server's ``--seed``), else 4294967295 (a random seed: -1
    given, or none given to a server without one), as llama-server shows its
    ``params.sampling.seed``, a ``uint32_t`` whose default is LLAMA_DEFAULT_SEED (common/common.h; a request's -1
    is read into it as 0xFFFFFFFF: server-task.cpp ``params_from_json_cmpl``), not -1.

    ``n_predict`` is the limit asked for, the request's, else the server's (``server_max_tokens``, its
    ``--max-new-tokens``), as llama-server's ``params.n_predict`` shows it (server-task.cpp ``to_json``): -1 for no
    limit but the context, not the context's size the answer is held to, and a limit past the context as it was
    given; a request's -1 shows -1 though the server's limit holds its answer (:class:`NativeRequest`). An answer that
    ``shifts`` its context without any limit shows the ten contexts it stops at (completion.py,
    ``SHIFTED_LIMIT_CONTEXTS``), a limit llama-server does not have.

    ``speculative``: the request's draft settings in llama-server's names (``speculative.n_max``, ``speculative.n_min``,
    ``speculative.p_min``: the completer's ``speculative_params``), listed after the others as llama-server's
    ``task_params::to_json`` lists them, for ``GET /slots`` and ``GET /props``."""
    asked = request.max_tokens if request.max_tokens is not None else server_max_tokens
    if asked_no_limit(request) and not (shifts and (asked is None or asked >= UNTIL_THE_CONTEXT_FILLS)):
        n_predict = -1  # the request's -1 as asked, though the server's -n holds the answer
    elif asked is None or (shifts and asked >= UNTIL_THE_CONTEXT_FILLS):
        n_predict = sampling.max_new_tokens
    else:
        n_predict = -1 if asked >= UNTIL_THE_CONTEXT_FILLS else asked
    return {"n_predict": n_predict, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "min_p": sampling.min_p, "samplers": list(sampling.samplers),
            "seed": LLAMA_DEFAULT_SEED if sampling.seed is None else sampling.seed,
            "repeat_penalty": sampling.repeat_penalty, "repeat_last_n": sampling.repeat_last_n,
            "presence_penalty": sampling.presence_penalty, "frequency_penalty": sampling.frequency_penalty,
            "stop": list(request.stop), "ignore_eos": request.ignore_eos, "stream": request.stream,
            "n_probs": request.logprobs or 0, "post_sampling_probs": False,
            "n_keep": server_keep if request.n_keep is None else request.n_keep, "n_discard": request.n_discard,
            **(speculative or {})}


def tokens_cached(completion: Completion) -> int:
    """llama-server's ``tokens_cached``: the tokens its slot's KV cache holds once the answer ended
    (server-context.cpp ``send_final_response``: ``slot.prompt.n_tokens()``), the prompt and every token it sampled
    but the last, which ended the answer before it was fed back (the token that reached the limit or a stop string,
    or the end-of-text token, counted in ``completion_tokens`` as in llama-server's ``n_decoded``), less the tokens
    each context shift discarded (``slot.prompt.n_tokens()`` shrinks by ``n_discard`` at a shift: the cache's
    length, not the tokens that ever passed through it)."""
    fed = completion.prompt_tokens + max(completion.completion_tokens - 1, 0)
    return fed - completion.context_discarded


def final_body(request: CompletionRequest, model: str, completion: Completion, settings: dict,
               content: str | None = None, prompt: str | None = None, tokens: bool = False, index: int = 0) -> dict:
    """The whole answer (``content`` defaults to its text; a stream's last event carries ""); ``prompt``: the
    prompt's tokens as text, as llama-server gives it back (the request's prompt where not given). ``tokens``
    (``return_tokens``): ``tokens`` lists the ids of every token the answer sampled, a stop string's and the
    end-of-text token it stopped at too, as llama-server's ``generated_tokens`` holds them (a stream's last event
    lists none: its partial events carried them, as llama-server's ``send_final_response`` leaves them out there).
    ``index``: the prompt's place among the request's prompts."""
    text = completion.text if content is None else content
    ids = list(completion.tokens) if tokens and content is None else []
    body = {"index": index, "id_slot": 0, "content": text, "tokens": ids, "stop": True, "model": model,
            "tokens_predicted": completion.completion_tokens, "tokens_evaluated": completion.prompt_tokens,
            "tokens_cached": tokens_cached(completion),
            "generation_settings": settings, "prompt": request.prompt if prompt is None else prompt, "has_new_line": "\n" in completion.text,
            "truncated": completion.context_shifts > 0 or completion.context_full,
            "stop_type": stop_type(completion), "stopping_word": completion.stop_string or "",
            "timings": timings(completion)}
    if content is None and completion.logprobs:  # a stream's events carried them, as llama-server's do
        body["completion_probabilities"] = completion.logprobs
    return body


def response_fields(body: dict) -> tuple[str, ...]:
    """``response_fields``: the paths of the answer's fields to send back (``"timings/prompt_n"``), none: all."""
    value = body.get("response_fields")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(path, str) for path in value):
        raise ApiError(400, f"'response_fields' must be an array of field paths (strings such as \"content\" or "
                       f"\"timings/prompt_n\"), got {json_shown(value)}", param="response_fields")
    return tuple(value)


def only_fields(body: dict, paths: tuple[str, ...]) -> dict:
    """The answer cut to ``paths``, as llama-server's ``json_get_nested_values`` cuts it: one flat key per path
    (``"timings/prompt_n"`` as written), its value found by the path's "/"-separated keys; a path the answer does
    not have is left out (llama.vim asks for ``[""]`` where it reads nothing: an empty object). No paths: all."""
    if not paths:
        return body
    kept = {}
    for path in paths:
        value: object = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            kept[path] = value
    return kept


def partial_body(text: str, probabilities: list | None = None, tokens: list[int] | None = None,
                 index: int = 0) -> dict:
    """A stream's event for a piece of the answer, with the probabilities and the ids of the tokens that made it
    (llama-server's partial results carry their token's id whether or not ``return_tokens`` is set:
    server-context.cpp ``send_partial_response``); ``index``: the prompt's place among the request's prompts."""
    body = {"index": index, "id_slot": 0, "content": text, "tokens": list(tokens or []), "stop": False}
    if probabilities:
        body["completion_probabilities"] = probabilities
    return body


def slots(completer) -> list[dict]:
    """llama-server's ``GET /slots`` (tools/server README): one slot here, as the board answers one request at a
    time. ``id_task`` is the running task's number, counting the tasks that had their turn, one a completion and one
    each input of an embedding request, as llama-server makes them (-1 while none runs), ``params`` are the running
    request's settings (``generation_settings``; a request that sets none gets these while idle), ``next_token``
    how far its answer got: ``n_decoded`` tokens, ``n_remain`` left to its limit (-1 while idle)."""
    slot = completer.slot  # read once: the request may end meanwhile
    if slot is None:
        idle = CompletionRequest(chat=False)
        params = generation_settings(idle, completer.sampling(idle), completer.defaults.n_keep,
                                     completer.defaults.max_tokens, completer.shifts(idle),
                                     completer.speculative_params(idle))
        task, decoded, remain, new_line = -1, 0, -1, False
    else:
        params = generation_settings(slot.request, slot.sampling, completer.defaults.n_keep,
                                     completer.defaults.max_tokens, completer.shifts(slot.request),
                                     completer.speculative_params(slot.request))
        task, decoded = slot.task, slot.decoded
        # -1 without a limit, as llama-server's n_remaining stays where neither the request nor the server sets one;
        # a request's -1 counts down the server's limit, as llama-server's has_budget does
        limit = params["n_predict"]
        if limit == -1 and asked_no_limit(slot.request) and completer.defaults.max_tokens < UNTIL_THE_CONTEXT_FILLS:
            limit = completer.defaults.max_tokens
        remain = -1 if limit == -1 else max(limit - decoded, 0)
        new_line = slot.has_new_line
    return [{"id": 0, "id_task": task, "n_ctx": completer.runtime.backend.max_context,
             "speculative": completer.lookup is not None, "is_processing": slot is not None, "params": params,
             "next_token": {"has_next_token": slot is not None, "has_new_line": new_line, "n_remain": remain,
                            "n_decoded": decoded}}]

