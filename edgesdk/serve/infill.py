"""llama-server's code infill, ``POST /infill``, on the same completer as ``POST /completion``.

Editor plugins (llama.vscode, llama.vim) send the code before the cursor as ``input_prefix``, the code after it as
``input_suffix``, other files' chunks as ``input_extra`` (an array of ``{"filename", "text"}``; the file name is
``tmp`` where left out) and the cursor line's text so far as ``prompt``, with any field ``/completion`` takes
(``n_predict``, ``temperature``, ``stop``, ``stream``, ``n_probs`` ...). The prompt is built from them as
llama-server builds it (tools/server/server-context.cpp, ``post_infill``, and server-common.cpp,
``format_prompt_infill``; edgesdk/runtime/fim.py): ``input_prefix`` and ``input_suffix`` (a string, or an array of
strings and token ids) and the chunks read as plain text, ``prompt`` with special tokens parsed, nothing added
but the BOS the model's tokenizer adds; the server's ``-b/--batch-size`` (llama-server's, default 2048) sets the
budget of prefix and suffix, ``--spm-infill`` puts the suffix first, and llama-server's ``--n-predict`` is here the
server's ``--max-new-tokens``. The prompt goes on as a ``/completion``
request of those token ids, and is answered as ``/completion`` answers (edgesdk/serve/llama_native.py).

llama.vscode and llama.vim send more, all taken: ``samplers`` with llama.cpp's
``infill`` sampler (``["top_k", "top_p", "infill"]``), run where the chain names it
(edgesdk/runtime/infill_sampler.py: it keeps the end-of-generation tokens where they are likely enough against the
text, and merges tokens whose text is a prefix of another's); ``response_fields``, the fields
of the answer to send back (edgesdk/serve/llama_native.py); ``cache_prompt``, so a next request that starts with
the same extra context and prefix prefills only what follows (``timings.cache_n``); ``t_max_predict_ms`` and
``n_indent``, applied as llama-server applies them (edgesdk/serve/line_limits.py: a line indented less than
``n_indent`` ends the answer, and past ``t_max_predict_ms`` a new line does); ``t_max_prompt_ms``, which
llama-server does not apply either; ``input_extra`` chunks' ``time`` (the plugins' own bookkeeping) is ignored,
as llama-server ignores it.

A model whose vocabulary lacks the FIM prefix, suffix or middle token is answered 501 ``not_supported_error``
("Infill is not supported by this model"), as llama-server answers it.
"""

from __future__ import annotations

from edgesdk.runtime.fim import DEFAULT_CHUNK_FILE, framing_count, infill_ids, leading_bos
from edgesdk.serve.api import (
    UNTIL_THE_CONTEXT_FILLS,
    ApiError,
    CompletionRequest,
    _object,
    context_refusal,
    json_shown,
    overflow_headline,
    utf8_field,
)
from edgesdk.serve.llama_native import parse_completion_request

ROUTE = "/infill"
INFILL_FIELDS = ("input_prefix", "input_suffix", "input_extra", "prompt")


def parse_infill_request(body: object, completer) -> CompletionRequest:
    """``POST /infill``: the ``/completion`` request of the infill prompt's token ids, or the error naming the
    field at fault (a model without FIM tokens first, as llama-server checks the model before the request)."""
    body = _object(body)
    require_fim(completer, ROUTE)
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ApiError(400, f"'prompt' must be a string (the text the infill goes on from, after the prefix), got "
                       f"{json_shown(prompt)}", param="prompt")
    for name, what in (("input_prefix", "the code before the cursor"), ("input_suffix", "the code after the cursor")):
        if name not in body:
            raise ApiError(400, f"'{name}' is required: {what}, a string (or an array of strings and token ids); "
                           "send \"\" for none", param=name)
    tokenizer = completer.runtime.tokenizer
    prefix = _mixed(completer, body["input_prefix"], "input_prefix")
    suffix = _mixed(completer, body["input_suffix"], "input_suffix")
    extra = _extra(body.get("input_extra"))
    for index, (filename, text) in enumerate(extra):
        _check_text(filename, f"input_extra[{index}].filename")
        _check_text(text, f"input_extra[{index}].text")
    _check_text(prompt or "", "prompt")
    cursor = tokenizer.encode(prompt or "", add_special_tokens=False)
    ids = prompt_ids(completer, prefix, suffix, cursor, extra)
    if len(ids) > completer.runtime.backend.max_context:
        raise _too_long(completer, ids, prefix, suffix, cursor)
    rest = {key: value for key, value in body.items() if key not in INFILL_FIELDS}
    try:
        return parse_completion_request({**rest, "prompt": ids})
    except ApiError as exc:
        raise _on_this_route(exc) from exc


def _on_this_route(error: ApiError) -> ApiError:
    """``error``, a refusal of a field by the ``/completion`` request an infill becomes, naming the route the client
    called (``'n' = 2 is not supported: /infill here gives ...``), not ``/completion``."""
    message = error.message.replace("/completion here", f"{ROUTE} here")
    return ApiError(error.status, message, param=error.param, code=error.code, kind=error.kind)


# What to send instead where a field's tokens fill most of an infill prompt past the context (llama-server keeps the
# prefix's last 3/4 of its batch, the suffix's first quarter less the prompt's, the prompt whole, and of the extra
# context the last context-less-batch tokens: edgesdk/runtime/fim.py, infill_ids)
TOO_LONG_FIXES = {
    "prompt": "send a shorter 'prompt' (the cursor line's text, which is kept whole), or put its head in "
              "'input_prefix'",
    "input_prefix": "send a shorter 'input_prefix', or serve with a smaller --batch-size (its last 3/4 are kept)",
    "input_suffix": "send a shorter 'input_suffix', or serve with a smaller --batch-size (its first quarter, less the "
                    "prompt's tokens, is kept)",
    "input_extra": "send fewer or shorter 'input_extra' chunks, or serve with a larger --batch-size (of the chunks, "
                   "the last context-less-batch tokens are kept)",
}


def _too_long(completer, ids: list[int], prefix: list[int], suffix: list[int], prompt: list[int]) -> ApiError:
    """The 400 of an infill prompt ``ids`` past the model's context, naming the field whose kept tokens fill most of
    it (a long ``prompt``, kept whole, is no shorter prefix's or suffix's to mend), with each field's count. It opens
    with OpenAI's words for an overflow (:func:`overflow_headline`), which the clients that trim and retry look for,
    and goes on with the fix any overflow takes (:func:`edgesdk.serve.api.context_refusal`)."""
    settings, tokenizer = completer.defaults, completer.runtime.tokenizer
    quarter = settings.batch_size // 4
    kept = {"input_prefix": min(len(prefix), 3 * quarter), "prompt": len(prompt),
            "input_suffix": min(len(suffix), max(0, quarter - (2 + len(prompt))))}
    framing = framing_count(tokenizer)
    kept["input_extra"] = len(ids) - framing - sum(kept.values())
    param = max(kept, key=kept.get)
    counts = ", ".join(f"'{name}' {count}" for name, count in kept.items())
    limit = completer.runtime.backend.max_context
    headline = (f"{overflow_headline(len(ids), limit, 'infill prompt')} ({counts} and {framing} special tokens, as "
                f"llama-server keeps them within its batch of {settings.batch_size})")
    # the fix a bundle's context takes after the field's own (-c up to the bundle's, a rebuild), and the refusal's
    # facts (context, headline) that the Python API words its own message with, as every other overflow's
    return context_refusal(headline, TOO_LONG_FIXES[param], param, len(ids), limit, completer.runtime.bundle.manifest,
                           getattr(completer.runtime.backend, "built_context", None),
                           getattr(completer.runtime.backend, "context_source", "-c"))


def require_fim(completer, route: str, param: str | None = None, status: int = 501, model: str | None = None):
    """The model's FIM tokens, or the refusal naming the ones its vocabulary lacks: llama-server's 501
    ``not_supported_error`` on /infill, Ollama's 400 "does not support insert" where ``model`` is given."""
    fim = completer.runtime.tokenizer.fim_tokens()
    if fim.can_infill:
        return fim
    if model is not None:
        raise ApiError(status, f"\"{model}\" does not support insert: {fim.lacking()}; leave '{param}' out, or "
                       f"serve {FIM_MODELS}", param=param)
    raise ApiError(status, f"Infill is not supported by this model: {fim.lacking()}; {route} needs {FIM_MODELS}, or "
                   "send the prompt to /completion", param=param, code="not_supported", kind="not_supported_error")


# models whose vocabularies hold the FIM prefix, suffix and middle tokens; SmolLM2's holds none of them (its only
# FIM-looking token, <reponame>, is llama.cpp's FIM_REP, which an infill does not need)
FIM_MODELS = ("a code model built with them (Qwen2.5-Coder, StarCoder2, CodeLlama, DeepSeek-Coder, Granite Code; "
              "SmolLM2 has none)")


def prompt_ids(completer, prefix: list[int], suffix: list[int], prompt: list[int], extra: list[tuple[str, str]]):
    """The infill prompt's token ids for this server's model (edgesdk/runtime/fim.py, ``infill_ids``): its context
    as ``n_ctx``, the server's answer limit as llama-server's ``--n-predict``."""
    tokenizer, settings = completer.runtime.tokenizer, completer.defaults
    limit = settings.max_tokens
    return infill_ids(tokenizer.fim_tokens(), prefix, suffix, prompt, extra, tokenizer.encode_plain,
                      leading_bos(tokenizer), n_ctx=completer.runtime.backend.max_context,
                      n_predict=-1 if limit >= UNTIL_THE_CONTEXT_FILLS else limit, n_batch=settings.batch_size,
                      spm_infill=settings.spm_infill)


def ollama_template(completer) -> str:
    """The fill-in-the-middle prompt in Ollama's template language, as Ollama's code models' templates begin
    (qwen2.5-coder's ``{{- if .Suffix }}<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|>``,
    the suffix first with ``--spm-infill``), for ``/api/show`` to put before the chat template: Continue's Ollama
    provider sends a ``suffix`` only to a model whose template reads ``.Suffix``. "" for a model without FIM
    tokens."""
    fim = completer.runtime.tokenizer.fim_tokens()
    if not fim.can_infill:
        return ""
    text = completer.runtime.tokenizer.tokenizer.id_to_token
    head, tail = f"{text(fim.pre)}{{{{ .Prompt }}}}", f"{text(fim.suf)}{{{{ .Suffix }}}}"
    first, end = (tail, head) if completer.defaults.spm_infill else (head, tail)
    return f"{{{{- if .Suffix }}}}{first}{end}{text(fim.mid)}{{{{- end }}}}\n"


def plain_ids(completer, text: str, param: str) -> list[int]:
    """``text`` as plain text's token ids (llama.cpp's ``common_tokenize(vocab, text, false, false)``)."""
    _check_text(text, param)
    return completer.runtime.tokenizer.encode_plain(text)


def _mixed(completer, value: object, name: str) -> list[int]:
    """``input_prefix`` / ``input_suffix``: a string, or an array of strings and token ids, as llama-server's
    ``tokenize_mixed`` reads it (the strings as plain text, no special token added)."""
    parts = [value] if isinstance(value, str) else value
    if not isinstance(parts, list) or not all(
            isinstance(part, str) or (isinstance(part, int) and not isinstance(part, bool) and part >= 0)
            for part in parts):
        raise ApiError(400, f"'{name}' must be a string, or an array of strings and token ids (whole numbers >= 0), "
                       f"got {json_shown(value)}", param=name)
    ids: list[int] = []
    tokenizer, vocabulary = completer.runtime.tokenizer, completer.token_id_limit()
    for part in parts:
        if isinstance(part, str):
            _check_text(part, name)
            ids += tokenizer.encode_plain(part)
        elif part >= vocabulary:
            raise ApiError(400, f"'{name}' holds token id {part}; this model's vocabulary has ids 0 to "
                           f"{vocabulary - 1}", param=name)
        else:
            ids.append(part)
    return ids


def _extra(value: object) -> list[tuple[str, str]]:
    """``input_extra``: an array of ``{"filename": string, "text": string}`` (the file name ``tmp`` where left out),
    as llama-server's post_infill checks it."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ApiError(400, f"'input_extra' must be an array of {{\"filename\": string, \"text\": string}} objects, "
                       f"got {json_shown(value)}", param="input_extra")
    chunks = []
    for index, chunk in enumerate(value):
        where = f"input_extra[{index}]"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(400, f"'{where}' must be an object with a \"text\" string (and a \"filename\" string), got "
                           f"{json_shown(chunk)}", param=f"{where}.text")
        filename = chunk.get("filename", DEFAULT_CHUNK_FILE)
        if not isinstance(filename, str):
            raise ApiError(400, f"'{where}.filename' must be a string (the chunk's file name), got "
                           f"{json_shown(filename)}", param=f"{where}.filename")
        chunks.append((filename, chunk["text"]))
    return chunks


def _check_text(text: str, param: str) -> None:
    utf8_field(text, param, f"'{param}'")  # lone surrogates from JSON escapes
