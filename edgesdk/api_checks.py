"""The argument checks of the Python API (:mod:`edgesdk.api`): each refuses a value of the wrong kind before any work
starts, naming the argument, the value, what was expected and the fix.

:func:`check_load_arguments` checks :func:`edgesdk.load`'s arguments (:class:`~edgesdk.errors.EdgeSDKError`);
:func:`configure_gates` sets a power-gated bundle's gates as ``load()``'s and ``edgesdk run``'s / ``serve``'s gate
arguments ask, one rule for both.
The request methods' own arguments (``tokenize``, ``detokenize``, ``perplexity``, ``embed``,
``create_embedding``) and the request fields a route's parser never read (:class:`ReadFields`,
:func:`refuse_unread`) are refused with :class:`edgesdk.api.RequestError`, the HTTP API's 400 named for the method.
Token ids as Python holds them are read as the HTTP body's JSON carries them (:func:`token_ids`,
:func:`embedding_input`).

This module imports nothing heavy, so ``import edgesdk.api`` stays lean.
"""

from __future__ import annotations

import difflib
import json
import math
import operator
import os
import re
from collections.abc import Iterable, Mapping

from edgesdk.errors import EdgeSDKError

# What each load() setting must be, checked before ServeDefaults reads it (whose own checks then bound the values)
SETTING_KINDS = {"max_tokens": int, "temperature": float, "top_p": float, "top_k": int, "min_p": float,
                 "seed": int, "repeat_penalty": float, "repeat_last_n": int,
                 "samplers": list, "prompt_cache": bool, "cache_ram_mib": int, "lookup": int,
                 "prefill_assistant": bool, "reasoning_format": str, "reasoning_budget": int,
                 "max_waiting": int, "pooling": str, "spm_infill": bool}
MODEL_SETTINGS = tuple(SETTING_KINDS)  # the settings load() takes: edgesdk serve's options of those names
# Fields of OpenAI's request bodies that change nothing in how an answer is made here: taken, as 'edgesdk serve' takes
# them (a completion answer names the model a request names, as llama-cpp-python's does)
NO_EFFECT_FIELDS = ("model", "user", "metadata", "store")
# llama-cpp-python's samplers this runtime lacks, at the values its Llama passes by default (off, or mirostat's
# settings that only count with mirostat on): taken there, as serve takes llama-server's at their off values
LLAMA_CPP_PYTHON_DEFAULTS = {"tfs_z": 1.0, "mirostat_mode": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1}
# A field of the other completion method -> how to send it (a call of llama-cpp-python's shape on the wrong method).
# The route's parser leaves some unread (refuse_unread names them), and refuses others in the HTTP API's terms, a
# route or a field Python has not (chat's suffix "send ... to /infill as 'input_suffix'", completions' tools "belong
# to /v1/chat/completions"), which other_method_refusal names in these; and none is the field closest by spelling to
# a misspelt one (chat's input_suffix was told suffix, completions' reasoning_format response_format)
OTHER_METHODS_FIELDS = {
    ("create_chat_completion", "prompt"): "create_completion's field: call create_completion(prompt) for raw text, "
                                          "or send it as messages=[{'role': 'user', 'content': prompt}]",
    ("create_chat_completion", "suffix"): "create_completion's field: call create_completion(prompt, suffix) for what "
                                          "a fill-in-the-middle model writes between the two",
    ("create_chat_completion", "echo"): "create_completion's field: call create_completion(prompt, echo=True) for the "
                                        "prompt before its answer; a chat answer does not repeat the messages",
    ("create_completion", "messages"): "create_chat_completion's field: call create_chat_completion(messages)",
    ("create_completion", "tools"): "create_chat_completion's field: call create_chat_completion(messages, "
                                    "tools=[...])",
    ("create_completion", "tool_choice"): "create_chat_completion's field: call create_chat_completion(messages, "
                                          "tools=[...], tool_choice=...)",
    ("create_completion", "parallel_tool_calls"): "create_chat_completion's field: call create_chat_completion("
                                                  "messages, tools=[...], parallel_tool_calls=...)",
    ("create_completion", "functions"): "OpenAI's legacy chat field: call create_chat_completion(messages, "
                                        "tools=[...])",
    ("create_completion", "function_call"): "OpenAI's legacy chat field: call create_chat_completion(messages, "
                                            "tools=[...], tool_choice=...)",
    ("create_completion", "chat_template_kwargs"): "create_chat_completion's field: a completion's prompt reaches "
                                                   "the model as it is, through no chat template",
    ("create_completion", "reasoning_format"): "create_chat_completion's field: pass it there, or to load() for "
                                               "every call",
    ("create_completion", "top_logprobs"): "create_chat_completion's field: here logprobs=N gives N alternatives "
                                           "per token",
    ("create_completion", "max_completion_tokens"): "create_chat_completion's field (OpenAI's newer name of "
                                                    "max_tokens): pass max_tokens=N",
}
# A field of the other method that this method has its own way to give: the fix names that way first
OTHER_METHODS_OWN_FIXES = {
    ("create_completion", "top_logprobs"): "pass logprobs=N to create_completion, or send top_logprobs to "
                                           "create_chat_completion",
    ("create_completion", "max_completion_tokens"): "pass max_tokens=N to create_completion, or send "
                                                    "max_completion_tokens to create_chat_completion",
}
# load()'s power-gate arguments: edgesdk run's and serve's --gating/--no-gating, --entropy-target, --compute-budget
GATE_ARGUMENTS = ("gating", "entropy_target", "compute_budget")
# load()'s own arguments, then its settings: a misspelt one is named with the closest
LOAD_ARGUMENTS = ("path", "backend", "threads", "target", "ignore_target", "watch_thermal", "n_ctx", "draft", "draft_max",
                  "draft_min", "draft_p_min", *GATE_ARGUMENTS, *MODEL_SETTINGS)
# llama-cpp-python's Llama(...) arguments (and llama.cpp's names below) -> what load() or the bundle does in their
# place
LLAMA_ARGUMENTS = {
    "n_threads": "pass threads=N", "n_threads_batch": "pass threads=N (one count for prefill and decode)",
    # llama-cpp-python's pooling_type is a number, llama.cpp's enum llama_pooling_type (include/llama.h): each named
    # with the word load() takes for it, so pooling_type=1 reads as pooling='mean', not as a guess among four words
    "pooling_type": "pass pooling= by name: llama.cpp's LLAMA_POOLING_TYPE numbers are 0 NONE (pooling='none'), "
                    "1 MEAN (pooling='mean'), 2 CLS (pooling='cls'), 3 LAST (pooling='last'), -1 UNSPECIFIED (leave "
                    "pooling out: the model's own, else mean); 4 RANK is a reranker's score of a query and a document "
                    "read together, which edgesdk does not compute (compare embeddings instead)",
    "draft_model": "pass draft=DRAFT_BUNDLE",
    "lora_path": "a bundle carries its adapters merged: build_bundle(lora=PATH)",
    "lora_scale": "a bundle carries its adapters merged: build_bundle(lora=(PATH, SCALE))",
    "lora_base": "a bundle carries its adapters merged into its own weights: build_bundle(lora=PATH)",
    "n_gpu_layers": "a bundle runs whole on its backend: pass backend='ort-cuda', 'ort-trt' or 'tensorrt' for the "
                    "GPU, or leave backend out for the profile's chain",
    "chat_format": "the bundle's own chat template formats create_chat_completion's messages",
    "chat_handler": "the bundle's own chat template formats create_chat_completion's messages, and tools= and "
                    "response_format= need no handler: leave it out",
    "tokenizer": "the bundle carries its model's tokenizer (model.tokenize() and detokenize() use it): leave it out",
    "vocab_only": "a bundle loads whole: load it and use model.tokenize() / detokenize() for its vocabulary",
    # llama.cpp's performance and placement knobs: what the bundle's graph and its runtime (ONNX Runtime, TensorRT)
    # decide here, as edgesdk run / serve say of llama.cpp's options of those names (cli_llama.py)
    **dict.fromkeys(("n_batch", "n_ubatch"), "the prompt is prefilled as the backend runs the bundle's graph, "
                                             "whatever the batch: leave it out"),
    **dict.fromkeys(("use_mmap", "use_mlock"), "the runtime (ONNX Runtime or TensorRT) loads the bundle's weights "
                                               "itself: leave it out"),
    "flash_attn": "attention runs as the bundle's graph computes it, with the kernels its backend picks: leave it out",
    **dict.fromkeys(("main_gpu", "tensor_split", "split_mode", "offload_kqv", "op_offload", "rpc_servers"),
                    "the backend and where it runs come from the bundle's target profile: pass backend='ort-cpu', "
                    "'ort-cuda', 'ort-trt' or 'tensorrt' to force one, or leave it out"),
    **dict.fromkeys(("type_k", "type_v", "swa_full"), "the KV cache's type and layout are the bundle's: leave it out"),
    **dict.fromkeys(("rope_freq_base", "rope_freq_scale", "rope_scaling_type", "yarn_ext_factor", "yarn_attn_factor",
                     "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx"),
                    "the model's rotary settings are its config's, built into the bundle's graph: leave it out "
                    "(build_bundle(..., max_context=N) sets the context)"),
    "numa": "the runtime places its threads itself (threads=N sets how many): run the process under numactl for a "
            "NUMA policy",
    "kv_overrides": "a bundle has no GGUF key-value metadata to override: the model's settings were read from its "
                    "config when the bundle was built (build_bundle from a changed model to change them)",
    "no_perf": "load() prints no timings: each answer's 'timings' and 'usage' carry them",
    "last_n_tokens_size": "pass repeat_last_n=N (the tokens the repeat penalty looks back over)",
    # edgesdk serve's and llama-server's names of load()'s settings, whose closest load() argument by spelling is
    # another setting (cache_prompt: cache_ram_mib)
    "max_queue": "pass max_waiting=N (edgesdk serve's --max-queue)",
    "cache_prompt": "pass prompt_cache=True or False (llama-server's cache_prompt is a request's field)",
    # llama.cpp's other names of the draft settings (common/arg.cpp: --draft-n is --draft-max, --draft-n-min is
    # --draft-min), whose closest load() argument by spelling is another setting (draft_min, draft_p_min)
    "draft_n": "pass draft_max=N (llama.cpp's --draft-n is --draft-max)",
    "draft_n_min": "pass draft_min=N (llama.cpp's --draft-n-min is --draft-min)",
}
# llama-cpp-python's Llama(...) switches that change nothing here, taken when True or False with a note in
# model.notes: what they switch on is what every loaded bundle does (llama_cpp/llama.py refuses logprobs "for models
# created with logits_all=False" and create_embedding without Llama(embedding=True)), and load() prints nothing
LLAMA_NO_OPS = {
    "verbose": "load() prints nothing either way; model.notes says which backend and thermal guard it uses",
    "embedding": "embed() and create_embedding() work on every model here, with no switch (pooling= sets how they "
                 "pool)",
    "logits_all": "logprobs, and echo's prompt logprobs, work on every model here, with no switch "
                  "(create_completion(..., logprobs=N, echo=True))",
}
# llama-cpp-python's request arguments that take a Python callback, which the answer's engine (shared with edgesdk
# serve, whose requests are JSON) does not call: named with the fields that do the same, never the closest by spelling
LLAMA_CALLBACKS = {
    "stopping_criteria": ("a callback asked after each token whether to stop",
                          "pass stop=[...] (strings that end the answer), or stream=True and break out of the loop "
                          "where your own test says to stop (the answer ends at its next token)"),
    "logits_processor": ("a callback that changes the scores before each token is sampled",
                         "pass logit_bias={token_id: bias} to favour or ban tokens, or grammar=<GBNF text> or "
                         "response_format={'type': 'json_object', 'schema': ...} to hold the answer to a form"),
}
# What to pass for llama-cpp-python's LlamaGrammar where its GBNF text cannot be read from it
GRAMMAR_OBJECT_FIX = ("pass grammar=<the GBNF string> (for LlamaGrammar.from_string(text), that text), or for "
                      "LlamaGrammar.from_json_schema(schema) response_format={'type': 'json_object', 'schema': schema}")
# The verbs a route's refusal begins its fix with, after '; ' or ': ' ("...; send true to have each ..."): the fix
# of a RequestError made of it (split_fix)
FIX_VERBS = ("pass", "send", "give", "write", "use", "call", "put", "remove", "shorten", "leave", "drop", "add",
             "split", "lower", "raise", "load", "build", "quote", "escape", "replace", "retry", "turn", "choose",
             "make", "keep", "wrap", "rename", "move", "define", "correct", "fix", "spell", "omit", "ask", "set")
_FIX_VERB = re.compile(r"(?:" + "|".join(FIX_VERBS) + r") ")
REQUEST_FIX = ("correct the field named: README's 'From Python' section lists how create_completion and "
               "create_chat_completion take OpenAI's request fields as keywords")
# Fields of a request alone, which load() does not take as settings: named as such, not as the load() argument
# closest by spelling (stop: top_p, stream: threads, response_format: reasoning_format, ignore_eos: ignore_target),
# with the one method that takes the chat's and the completion's own fields
REQUEST_ONLY_FIELDS = ("stop", "stream", "grammar", "response_format", "json_schema", "logit_bias", "logprobs",
                       "top_logprobs", "echo", "suffix", "presence_penalty", "frequency_penalty", "ignore_eos",
                       "tools", "tool_choice")
ONE_METHOD_FIELDS = {"tools": "create_chat_completion", "tool_choice": "create_chat_completion",
                     "echo": "create_completion", "suffix": "create_completion"}
# the token limit's other names, which create_completion refuses by name (and create_chat_completion n_predict)
LIMIT_HINTS = {
    "n_predict": "pass max_tokens=N (llama.cpp's n_predict): to load() for every call's default, or to "
                 "create_completion / create_chat_completion per call",
    "max_completion_tokens": "a create_chat_completion field alone (OpenAI's newer name of max_tokens): pass "
                             "max_completion_tokens= to create_chat_completion, or max_tokens=N to load() for every "
                             "call's default",
}
# Other APIs' names of a request's fields (llama-server's n_predict, Ollama's num_predict, transformers' generate()
# and pipeline arguments, Anthropic's stop_sequences) -> (the field that does it here, what to pass); the closest
# field by spelling was no help (do_sample: samplers) or none was close
FOREIGN_FIELDS = {
    "n_predict": ("max_tokens", "max_tokens=N (llama-server's n_predict)"),
    "num_predict": ("max_tokens", "max_tokens=N (Ollama's num_predict)"),
    "max_new_tokens": ("max_tokens", "max_tokens=N (transformers' max_new_tokens)"),
    "do_sample": ("temperature", "temperature=0 for greedy answers (transformers' do_sample=False), or a temperature "
                                 "above 0 to sample"),
    "repetition_penalty": ("repeat_penalty", "repeat_penalty=X (transformers' repetition_penalty)"),
    "stop_strings": ("stop", "stop=[...] (transformers' stop_strings)"),
    "stop_sequences": ("stop", "stop=[...] (Anthropic's stop_sequences)"),
}
SHOWN_CHARS = 60  # the longest repr an error message shows, as the HTTP API's messages cut theirs
_KIND_WORDS = {int: "a whole number", float: "a number", bool: "True or False", str: "a string",
               list: "a string of sampler letters, sampler names separated by ';' or a list of sampler names"}
_IDS_EXPECTED = "expected token ids (a list of whole numbers >= 0, as tokenize returns them)"
_IDS_FIX = "pass the list tokenize returned, e.g. model.detokenize(model.tokenize(text))"
# llama-cpp-python's Llama methods and attributes a bundle cannot give as they are there -> what to use instead
LLAMA_METHODS = {
    "save_state": "a bundle's KV cache is kept in a file instead: model.save_prompt_cache(path), then "
                  "model.load_prompt_cache(path) (in this process or another)",
    "load_state": "load what model.save_prompt_cache(path) wrote with model.load_prompt_cache(path)",
    "metadata": "a bundle has no GGUF key-value metadata: model.manifest holds its model, tokenizer, chat template "
                "and target (model.n_ctx(), n_vocab(), n_embd(), token_bos(), token_eos() give the numbers)",
    "eval": "a bundle evaluates tokens inside a request: pass them as the prompt, model(tokens, max_tokens=N)",
    "sample": "a bundle samples inside a request: model(prompt, temperature=..., top_k=..., top_p=..., seed=...)",
    "generate": "a bundle generates inside a request: for chunk in model(tokens, stream=True, max_tokens=N)",
    "set_cache": "load() keeps a prompt cache by default (prompt_cache=True); save_prompt_cache / "
                 "load_prompt_cache keep it in a file",
    "set_seed": "load the bundle with seed=N (the seed of every call that sends none), or pass seed=N to "
                "create_completion / create_chat_completion",
    "scores": "pass logprobs=N to create_completion for the tokens' log-probabilities",
    "input_ids": "a request's usage says its prompt_tokens; tokenize(text) gives a text's ids",
}


def bundle_path(path: object, model_path: object) -> object:
    """load()'s bundle directory: ``path``, or llama-cpp-python's name of it, ``model_path`` (``Llama(model_path=)``,
    which a port keeps: it was a bare TypeError naming ``path``). Both given is refused; neither is ``path`` None, which
    :func:`check_load_arguments` refuses naming it."""
    if model_path is None:
        return path
    if path is not None:
        raise EdgeSDKError(f"load(): path={shown(path)} and model_path={shown(model_path)} both name the bundle "
                           "(model_path is llama-cpp-python's name of path)", "pass one of them")
    return model_path


def llama_no_ops(settings: dict) -> tuple[dict, list[str]]:
    """``settings`` less llama-cpp-python's ``Llama(...)`` switches that change nothing here (:data:`LLAMA_NO_OPS`:
    ``verbose``, ``embedding``, ``logits_all``), and a note for each given; one given other than True or False is
    refused naming it. A port that forwards ``Llama(verbose=False)`` was refused, its model being the same without."""
    taken = {name: value for name, value in settings.items() if name in LLAMA_NO_OPS}
    for name, value in taken.items():
        if not isinstance(value, bool):
            raise EdgeSDKError(f"load(): {name}={shown(value)}: expected True or False (llama-cpp-python's switch, "
                               f"which changes nothing here: {LLAMA_NO_OPS[name]})", f"leave {name} out")
    notes = [f"{name}={value}: not used: {LLAMA_NO_OPS[name]}" for name, value in taken.items()]
    return {name: value for name, value in settings.items() if name not in LLAMA_NO_OPS}, notes


def split_fix(message: str) -> tuple[str, str | None]:
    """A route's refusal ``message`` as (what is wrong, what to do): its last clause after a '; ' (else a ': ') that
    begins with one of :data:`FIX_VERBS` ("...; send true to have each ..."), cut from the problem so that a
    :class:`~edgesdk.api.RequestError` does not print it twice; (``message``, None) where it says nothing to do.
    Only separators outside quotes and brackets count: a refusal quotes the client's value before its own fix (got
    "hot; use 0.7"; ...), whose words are no fix of ours, and a parenthesis describes a value ("(0: keep no
    responses)"). A quote or bracket left open (a value cut short) finds none rather than guess."""
    separators: dict[str, int] = {}
    depth, quote, escaped, before = 0, "", False, " "
    for index, char in enumerate(message):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char == '"' or (char == "'" and not before.isalnum()):  # an apostrophe ("the bundle's") opens none
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and char in ";:" and message.startswith(" ", index + 1) and \
                _FIX_VERB.match(message, index + 2):
            separators[char] = index  # the last of each
        before = char
    if quote or depth or not separators:
        return message, None
    cut = separators.get(";", separators.get(":"))
    return message[:cut].rstrip(), message[cut + 2:]


def drop_fix(message: str, fix: str) -> str:
    """``message`` less its tail "; <fix>" or ": <fix>" where it ends with ``fix``: a route's refusal whose structured
    fix (:class:`~edgesdk.serve.api.ApiError`'s ``fix``) its message also ends with, so that a
    :class:`~edgesdk.api.RequestError` prints it once, on its line."""
    for separator in ("; ", ": "):
        if fix and message.endswith(separator + fix) and len(message) > len(separator + fix):
            return message[:-len(separator + fix)].rstrip()
    return message


def grammar_text(method: str, fields: dict) -> dict:
    """``fields`` with a ``grammar`` given as llama-cpp-python's ``LlamaGrammar`` (``LlamaGrammar.from_string(text)``,
    ``from_file``, ``from_json_schema``) as the GBNF text it keeps (its ``_grammar`` attribute, llama_cpp/
    llama_grammar.py), the string the route reads; a grammar object whose text cannot be read, or whose start rule
    is not ``root`` (the rule llama-server's grammars start at), is refused naming what to pass. A str, None and
    JSON's other types are left for the route to read or refuse."""
    from edgesdk.api import RequestError

    grammar = fields.get("grammar")
    if grammar is None or isinstance(grammar, (str, int, float, list, tuple, dict)):
        return fields
    kind = type(grammar).__name__
    text = getattr(grammar, "_grammar", None)
    if not isinstance(text, str):
        raise RequestError(method, f"grammar is {_article(kind)} {kind} object; expected GBNF text (a str)",
                           param="grammar", fix=GRAMMAR_OBJECT_FIX)
    root = getattr(grammar, "_root", "root")
    if root != "root":
        raise RequestError(method, f"grammar is {_article(kind)} {kind} whose start rule is {shown(root)}; a grammar "
                           "starts at its rule root here, as llama-server's", param="grammar",
                           fix="name the start rule root in the GBNF text and pass grammar=<that text>")
    return {**fields, "grammar": text}


def check_n_ctx(n_ctx) -> int | None:
    """load()'s ``n_ctx``, llama-cpp-python's ``Llama(n_ctx=)``: the run's context, as ``-c N`` sets it (None or 0:
    the bundle's own; a count past the bundle's is refused once it is open, naming the build that holds it). Checked
    before the bundle opens; returns the count to hold the run to, None for the bundle's."""
    if n_ctx is None:
        return None
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 0:
        raise EdgeSDKError(f"load(): n_ctx={shown(n_ctx)}: expected a whole number of tokens, 0 or more (0: the "
                           "bundle's context)", "pass n_ctx=N with N from 1 to the bundle's context (model.max_context "
                           "says it), or leave it out (or pass 0) for the bundle's context")
    return n_ctx or None


def check_load_arguments(path, backend, threads, target, ignore_target, watch_thermal, settings: dict) -> None:
    """Refuse an argument of :func:`edgesdk.load` of the wrong kind, or a setting it does not take, before the
    bundle is opened, naming it."""
    from edgesdk.runtime.session import OPENERS

    unknown = sorted(set(settings) - set(MODEL_SETTINGS))
    if unknown:
        hints = [_unknown_setting_hint(name) for name in unknown if _unknown_setting_hint(name)]
        raise EdgeSDKError(f"load() got the setting(s) {', '.join(map(repr, unknown))}, which it does not take"
                           + "".join(f"; {hint}" for hint in hints),
                           f"pass only load()'s arguments ({', '.join(LOAD_ARGUMENTS[:-len(MODEL_SETTINGS)])}) and "
                           f"the settings {', '.join(MODEL_SETTINGS)} (a request's own fields go to create_completion / "
                           "create_chat_completion)")

    def refuse(name: str, value: object, expected: str, fix: str) -> None:
        raise EdgeSDKError(f"load(): {name}={shown(value)}: expected {expected}", fix)

    if not a_path(path):  # "" (an unset variable's value) was read as the working directory, named "."
        refuse("path", path, "the bundle's directory (a non-empty str or a pathlib.Path)", "pass the folder "
               "'edgesdk build' wrote, e.g. edgesdk.load('bundles/smollm2-135m-rpi5')")
    # a str first: a list (a chain of backends, as the profile holds one) is no key of OPENERS, and raised TypeError
    if backend is not None and (not isinstance(backend, str) or backend not in OPENERS):
        refuse("backend", backend, f"one of {', '.join(OPENERS)} (one backend's name, a str)",
               "pass one of them, or leave backend out for the bundle's own chain (the profile's backends, tried in "
               "order)")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
        refuse("threads", threads, "a whole number (0 or below: the profile's count, as --threads reads it)",
               "pass threads=N with N >= 1, or leave it out (or pass 0 or below) for the profile's count")
    if target is not None and not isinstance(target, str):
        refuse("target", target, "a board's name (a str, as 'edgesdk targets' lists them)",
               "pass the name of the board the bundle must be built for, e.g. target='rpi5'")
    for name, flag in (("ignore_target", ignore_target), ("watch_thermal", watch_thermal)):
        if not isinstance(flag, bool):
            refuse(name, flag, "True or False", f"pass {name}=True or {name}=False")
    for name, (choices, fix) in _setting_choices().items():  # of another kind too: told the names
        if name in settings and (not isinstance(settings[name], str) or settings[name] not in choices):
            refuse(name, settings[name], f"one of {', '.join(choices)} (a str)", fix)
    for name, value in settings.items():
        kind = SETTING_KINDS[name]
        taken, words = SETTING_BOUNDS.get(name, (None, ""))
        if not _of_kind(value, kind) or (taken is not None and not taken(value)):
            expected = _KIND_WORDS[kind] + words
            refuse(name, value, expected, f"pass {name} as {expected}, or leave it out for edgesdk serve's default")


def check_gate_arguments(gating: object, entropy_target: object, compute_budget: object) -> None:
    """Refuse a power-gate argument of :func:`edgesdk.load` of the wrong kind before the bundle is opened, naming it
    (:func:`configure_gates` applies them once it is)."""
    if gating is not None and not isinstance(gating, bool):
        raise EdgeSDKError(f"load(): gating={shown(gating)}: expected True, False or None",
                           "pass gating=True to turn a power-gated bundle's gates on, gating=False to keep them off, "
                           "or leave it out (on where entropy_target or compute_budget is given, else off)")
    for name, value in (("entropy_target", entropy_target), ("compute_budget", compute_budget)):
        if value is not None and not _of_kind(value, float):
            raise EdgeSDKError(f"load(): {name}={shown(value)}: expected a number or None", GATE_FIXES[name])


# How edgesdk run / serve (``cli``) and load() (``python``) name the power-gate arguments in configure_gates' refusals
GATE_TERMS = {"cli": {"gating": "--gating", "no_gating": "--no-gating", "entropy_target": "--entropy-target",
                      "compute_budget": "--compute-budget"},
              "python": {"gating": "gating=True", "no_gating": "gating=False", "entropy_target": "entropy_target",
                         "compute_budget": "compute_budget"}}
# What to pass instead of a gate value load() refuses
GATE_FIXES = {"entropy_target": "pass entropy_target=X with X in nats between the least and the most a window of the "
                                "gate's tokens holds (0.366 and 2.079 for the power stage's window 8), or leave it out "
                                "for the bundle's own target",
              "compute_budget": "pass compute_budget=B with 0 < B <= 1 (e.g. 0.5: at most half the FFN blocks), or "
                                "leave it out (1: no limit)",
              "gating": "leave gating out (entropy_target and compute_budget turn the gates on), or leave "
                        "entropy_target and compute_budget out to run with the gates off"}


def gate_options_given(entropy_target: float | None, compute_budget: float | None, gating: bool | None) -> list[str]:
    """The power-gate options of ``edgesdk run`` / ``serve`` given, as typed (``--compute-budget 0.5``,
    ``--gating``), for a refusal that names only those: each value as Python writes the number read
    (``0.1234567`` whole, not rounded to six digits)."""
    names = GATE_TERMS["cli"]
    options = [f"{names[name]} {value!r}" for name, value in (("entropy_target", entropy_target),
                                                              ("compute_budget", compute_budget)) if value is not None]
    if gating is not None:
        options.append(names["gating"] if gating else names["no_gating"])
    return options


class GateArgumentError(ValueError):
    """A power-gate argument :func:`configure_gates` cannot apply to a gated bundle: ``argument`` is the one to name
    (``gating``, ``entropy_target`` or ``compute_budget``), under the name its caller knows it by (an option, a
    keyword); the message names it in those terms and says what to do."""

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument


def configure_gates(backend, entropy_target: float | None, compute_budget: float | None, gating: bool | None,
                    terms: str = "cli", bundle: object = None) -> None:
    """Set a power-gated ``backend``'s gates as ``edgesdk run`` and ``serve`` read ``--gating/--no-gating``,
    ``--entropy-target`` and ``--compute-budget`` (and :func:`edgesdk.load` its ``gating``, ``entropy_target`` and
    ``compute_budget``; ``terms`` ``cli`` or ``python`` names them so): the controller takes the target and the
    budget given (the bundle's own and 1 where left out), and the gates skip blocks where ``gating`` is True, or
    where it is None and a target or a budget is given.

    Refused: any of them on a bundle without gates (:class:`~edgesdk.errors.EdgeSDKError`, with the recipe that
    builds the gates; ``bundle``, its path, is named there), but gating off, which is what such a bundle does anyway;
    and, on a gated bundle, a target or budget beside gating off or a value the controller refuses
    (:class:`GateArgumentError`, naming the argument)."""
    names = GATE_TERMS[terms]
    given = {name: value for name, value in (("entropy_target", entropy_target), ("compute_budget", compute_budget))
             if value is not None}
    if not hasattr(backend, "configure"):
        if given or gating:  # gating off asks for what a bundle without gates does anyway
            where = ("this bundle" if terms == "cli" else "this one") if bundle is None else str(bundle)
            if terms == "cli":
                options = gate_options_given(entropy_target, compute_budget, gating or None)  # not --no-gating
                raise EdgeSDKError(f"{', '.join(options)}: {'needs' if len(options) == 1 else 'need'} a bundle with "
                                   f"power gates, and {where} has none",
                                   f"build the bundle with the power stage (edgesdk build --target T --recipe power), "
                                   f"or drop {' and '.join(option.split()[0] for option in options)}")
            asked = {**given, **({"gating": gating} if gating else {})}
            shown_asked = ", ".join(f"{name}={shown(value)}" for name, value in asked.items())
            raise EdgeSDKError(f"load(): {shown_asked}: {'needs' if len(asked) == 1 else 'need'} a bundle with power "
                               f"gates, and {where} has none",
                               "build the bundle with a recipe holding the power stage (edgesdk build --target T "
                               "--recipe power, "
                               f"or edgesdk.build_bundle(..., recipe='power')), or leave {' and '.join(asked)} out")
        return
    if given and gating is False:
        raise GateArgumentError("gating", f"{names['entropy_target']} and {names['compute_budget']} steer the gates, "
                                f"which {names['no_gating']} turns off; drop one or the other")
    try:
        backend.configure(backend.controller_config(entropy_target, compute_budget))
    except ValueError as exc:  # a ValueError of ControllerConfig starts with the field's name
        argument = next((name for name in given if str(exc).startswith(name)), None)
        if argument is None:
            raise
        raise GateArgumentError(argument, str(exc)) from exc
    backend.gating = bool(given) if gating is None else gating


def _setting_choices() -> dict[str, tuple[tuple[str, ...], str]]:
    """load()'s settings that take one of a few names (``edgesdk serve``'s ``click.Choice`` options) -> (the names,
    the fix of a value that is none of them)."""
    from edgesdk.runtime.embedding import POOLINGS
    from edgesdk.serve.reasoning import FORMATS as REASONING_FORMATS

    return {"pooling": (POOLINGS, "pass pooling='last' (decoder embedding models), 'mean', 'cls' or 'none' (every "
                                  "token's vector), or leave it out for the pooling the model declares (else mean)"),
            "reasoning_format": (REASONING_FORMATS, "pass reasoning_format='auto' (where the template thinks), "
                                                    "'none', 'deepseek' or 'deepseek-legacy', or leave it out (auto)")}


SEED_WRAP = 2**32  # llama.cpp's seed is a ``uint32_t`` (common/common.h, ``common_params_sampling::seed``)
# LLAMA_DEFAULT_SEED (include/llama.h): the sampler draws a seed for it (edgesdk/serve/api.py's LLAMA_DEFAULT_SEED)
RANDOM_SEED_VALUE = SEED_WRAP - 1
STOUL_MAX = 2**64 - 1  # ``std::stoul``'s largest magnitude (a 64-bit unsigned long): past it, out_of_range
# the token limit -n below 0 stands for: no count ends the answer (edgesdk/serve/api.py's UNTIL_THE_CONTEXT_FILLS)
UNLIMITED_TOKENS = 2**31 - 1


def llama_seed(seed: int) -> int:
    """A whole-number seed as llama.cpp's ``-s`` reads it (common/arg.cpp: ``params.sampling.seed =
    std::stoul(value)``), for ``run -s``, ``serve -s`` and :func:`edgesdk.load`'s ``seed``: a number below 0 is
    negated in unsigned arithmetic, as strtoul does, and the 32-bit seed keeps its low bits (the number mod 2**32), so
    -1 is 4294967295 (LLAMA_DEFAULT_SEED, a random seed: src/llama-sampling.cpp ``get_rng_seed``), -2 the fixed seed
    4294967294, -4294967296 the seed 0 and -4294967297 4294967295 again. A number >= 0 is the seed as given, past 32
    bits too (a fixed seed of its own, where llama.cpp's would keep its low 32 bits). One past stoul's range (an
    unsigned long's, 2**64 - 1, either way) raises ValueError, as its out_of_range makes llama.cpp refuse it."""
    if not -STOUL_MAX <= seed <= STOUL_MAX:
        raise ValueError(f"{seed} is past what llama.cpp's -s reads (std::stoul: out of range); give a whole number "
                         f"from -{STOUL_MAX} to {STOUL_MAX} (-1 or {RANDOM_SEED_VALUE}: a random seed)")
    return seed % SEED_WRAP if seed < 0 else seed


def token_count(value: int) -> int:
    """A nonzero ``-n`` as llama.cpp's common/arg.cpp reads it for llama-cli and llama-server ("-1 = infinity", any
    int taken), for ``run -n``, ``serve -n`` (edgesdk/cli_options.py ``token_limit``, which takes 0 itself: run's
    prompt prefilled only, as llama.cpp's -n 0, and refused by serve) and
    :func:`edgesdk.load`'s ``max_tokens``: a count >= 1 as it is, any number below 0 :data:`UNLIMITED_TOKENS`, no
    count at all (tools/main/main.cpp counts ``n_remain`` down from it and tools/server stops a slot at ``n_predict >
    0 && n_decoded >= n_predict``: one below 0 never stops there, so -5 is -1's infinity)."""
    return UNLIMITED_TOKENS if value < 0 else value


def _seed_taken(seed: int) -> bool:
    """Whether ``serve -s`` takes the whole number ``seed`` (:func:`llama_seed`: within ``std::stoul``'s range)."""
    return -STOUL_MAX <= seed <= STOUL_MAX


# A whole-number setting's check of a value of its kind (as edgesdk serve's option of that name takes it) and the
# words for what it takes
SETTING_BOUNDS = {"max_tokens": (lambda value: value != 0, " of at least 1, or -1 for no limit but the context (any "
                                                           "number below 0, as serve's -n)"),
                  "seed": (_seed_taken, " from -(2**64 - 1) to 2**64 - 1 (the seed of a call that sends none), or -1 "
                                        "for a random seed for each call, as serve -s reads it (below 0: its 32-bit "
                                        "wrap, -2 the fixed seed 4294967294)")}
# the weight bits build_bundle's weight_bits takes: edgesdk build --weight-bits' choices
WEIGHT_BITS = (8, 4)
# build_bundle's whole-number arguments that must not be negative -> what 0 means
NOT_NEGATIVE_NUMBERS = {"data_skip_chars": "the characters left out of the head of each data file; 0: none",
                        "generated_sequences": "the teacher's continuations added to the training text; 0: none"}


def load_threads(threads: int | None) -> int | None:
    """:func:`edgesdk.load`'s ``threads`` (checked by :func:`check_load_arguments`) as ``edgesdk run`` and ``edgesdk
    serve`` read ``--threads`` (edgesdk/cli_options.py ``_threads_or_default``, which calls this, after llama.cpp's
    common/arg.cpp: ``if (n_threads <= 0) n_threads = std::thread::hardware_concurrency()``, -1 its default): 0 or
    below is None, the profile's count at most the usable cores, as llama-cpp-python's ``Llama(n_threads=0)`` takes
    its default too."""
    return None if threads is None or threads <= 0 else threads


def serve_settings(settings: dict) -> dict:
    """:func:`edgesdk.load`'s settings (checked by :func:`check_load_arguments`) as ``edgesdk serve`` reads its
    options of those names (:func:`token_count` and :func:`llama_seed`, after llama-server's
    common/arg.cpp, "-1 = infinity" and ``std::stoul``): ``max_tokens`` below 0 no limit but the context (serve's
    ``-n -1``, a request's and llama-cpp-python's ``max_tokens=-1``); ``seed`` below 0 its 32-bit wrap (serve's
    ``-s -2``, the seed 4294967294), and -1 or 4294967295 (llama.cpp's LLAMA_DEFAULT_SEED, what -1 wraps to) None, a
    random seed for each call that sends none (serve's ``-s -1``, edgesdk/serve/api.py ``default_seed``); ``top_k`` below 0
    0, off (serve's ``--top-k -1``, llama.cpp's top-k keeping every token for k <= 0, as a request's ``top_k: -1``
    reads); ``temperature`` below 0 0, greedy (serve's ``--temp -1``, llama.cpp's ``std::max(temp, 0)``);
    ``samplers`` given as text as :func:`sampler_text` reads it. Other values as they are, for ``ServeDefaults`` to
    bound."""
    from edgesdk.serve.api import default_seed

    read = dict(settings)
    if isinstance(read.get("max_tokens"), int):  # a bool and 0 were refused by check_load_arguments
        read["max_tokens"] = token_count(read["max_tokens"])
    if isinstance(read.get("top_k"), int) and read["top_k"] < 0:  # as cli_serve reads --top-k (max(top_k, 0))
        read["top_k"] = 0
    if isinstance(read.get("samplers"), str):
        read["samplers"] = sampler_text(read["samplers"])
    temperature = read.get("temperature")  # a bool was refused by check_load_arguments, and NaN is no number < 0
    if isinstance(temperature, (int, float)) and temperature < 0:  # as cli_serve reads --temperature
        read["temperature"] = 0.0
    if "seed" in read:
        read["seed"] = default_seed(llama_seed(read["seed"]) if isinstance(read["seed"], int) else read["seed"])
    return read


def sampler_text(text: str) -> str | list[str]:
    """:func:`edgesdk.load`'s ``samplers`` given as a str, as ``edgesdk serve`` reads its two options for the chain:
    sampler letters (``"kpt"``, ``--sampling-seq``) where every character is one (or llama.cpp's ``a``, adaptive_p,
    refused by name later) and the text is no sampler's name, else names separated by ``;`` (``"top_k;temperature"``,
    ``--samplers``). A name all of whose characters are letters is read as that name (llama.cpp's aliases ``"temp"``
    and ``"typ"``: temperature alone, as ``--samplers temp``, not temperature, penalties, min_p and top_p)."""
    from edgesdk.runtime.generate import SAMPLER_LETTERS, sampler_chain

    if ";" not in text and set(text) <= {*SAMPLER_LETTERS, "a"} and not sampler_chain([text], skipped=[]):
        return text
    return [name for name in text.split(";") if name]


def request_limit(fields: dict) -> dict:
    """A request's ``fields`` with ``max_tokens`` read as llama-cpp-python's ``create_completion`` and
    ``create_chat_completion`` read it: None or 0 is no limit but the context ("If max_tokens <= 0 or None, the
    maximum number of tokens to generate is unlimited and depends on n_ctx", llama_cpp/llama.py), which the routes'
    parser takes as -1 (-1 itself too; below -1 :func:`check_max_tokens` refuses it, naming the field, rather than
    read a typo as no limit). Left out, the field stays out (:func:`edgesdk.load`'s ``max_tokens`` holds the answer);
    other values as they are, for the parser to take or name; and so is ``max_tokens`` beside a chat's
    ``max_completion_tokens``, which the parser reads first (None there is the field left out)."""
    if "max_tokens" not in fields or fields.get("max_completion_tokens") is not None:
        return fields
    value = python_scalar(fields["max_tokens"])
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0):
        return {**fields, "max_tokens": -1}
    return fields


def check_max_tokens(method: str, fields: dict) -> None:
    """Refuse a request's ``max_tokens`` that is none of what :func:`request_limit` reads: a whole number >= 1, or
    None, 0 or -1 for no limit but the context. The routes' parser names it too, but in the HTTP API's terms, where
    ``/v1/completions`` reads 0 as "the prompt only", which here is no limit, as llama-cpp-python's."""
    from edgesdk.api import RequestError

    value = python_scalar(fields.get("max_tokens"))
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # 3.0 too, as the parser
    if value is None or (whole and not isinstance(value, bool) and value >= -1):
        return
    raise RequestError(method, f"max_tokens is {shown(value)}; expected a whole number of tokens >= 1, or None, 0 or "
                       "-1 for no limit but the context (as llama-cpp-python reads max_tokens)", param="max_tokens",
                       fix="pass max_tokens=N with N >= 1, or max_tokens=None for an answer that ends only where the "
                       "model stops or the context fills")


def chat_limits(fields: dict) -> dict:
    """``create_chat_completion``'s ``fields`` with OpenAI's two names of the token limit read as one. The routes'
    parser reads ``max_completion_tokens`` first and, where it is given, never looks at ``max_tokens``: the same
    value under both names (as an OpenAI client that sends the old and the new name writes it) is that one limit,
    ``max_tokens`` dropped; two values are refused naming both, as ``tokenize`` refuses a flag given under its two
    names with two values. ``max_tokens`` 0 is read as :func:`request_limit` reads it (-1); None under either name
    is the field left out."""
    from edgesdk.api import RequestError

    newer, older = python_scalar(fields.get("max_completion_tokens")), python_scalar(fields.get("max_tokens"))
    if newer is None or older is None:
        return fields
    read = request_limit({"max_tokens": older})["max_tokens"]  # 0 as -1
    if isinstance(older, bool) and not isinstance(newer, bool):
        raise RequestError("create_chat_completion", f"max_tokens={shown(older)} is a flag, not a token limit",
                           param="max_tokens", fix="pass a whole number >= 1 (or -1 for no limit but the context), "
                           "or leave max_tokens out beside max_completion_tokens")
    if isinstance(newer, bool) or older == newer or read == newer:
        # one value under both names (or a flag under the newer, which the parser refuses): judged as that value
        return {name: value for name, value in fields.items() if name != "max_tokens"}
    raise RequestError("create_chat_completion", f"max_tokens={shown(older)} and max_completion_tokens={shown(newer)} "
                       "disagree; they name one token limit (max_completion_tokens is OpenAI's newer name of "
                       "max_tokens, and is read first)", param="max_tokens",
                       fix="pass one of them (max_tokens= or max_completion_tokens=)")


def build_arguments(target: object, model: object, out: object, recipe: object, data: object, numbers: dict,
                    flags: dict) -> tuple[str, str | None, str | None, tuple[str, ...]]:
    """:func:`edgesdk.build_bundle`'s ``target``, ``model`` and ``recipe`` as the str the build reads (each may be a
    ``pathlib.Path``: a profile's or a recipe's YAML file, a model's directory or GGUF file) and ``data`` as its
    files, once every argument is of its kind: ``out`` a path, ``numbers`` whole numbers (``weight_bits`` or None),
    ``flags`` True or False; refused (:class:`~edgesdk.errors.EdgeSDKError`) naming the argument before any work."""

    def refuse(name: str, value: object, expected: str, fix: str) -> None:
        raise EdgeSDKError(f"build_bundle(): {name}={shown(value)}: expected {expected}", fix)

    if not a_path(target):  # "" too is refused: the build read it as left out (the default model)
        refuse("target", target, "a board's name or a profile's YAML file (a str or a pathlib.Path)",
               "pass the board's name as 'edgesdk targets' lists it, e.g. build_bundle('rpi5')")
    for name, value, expected, fix in (
            ("model", model, "an alias, a Hugging Face directory or a GGUF file (a str or a pathlib.Path)",
             "pass e.g. model='smollm2-135m' or model=pathlib.Path('my-model'), or leave it out for the default"),
            ("out", out, "the bundle's directory (a str or a pathlib.Path)",
             "pass the folder to write, or leave out for bundles/<model>-<target>"),
            ("recipe", recipe, "a shipped recipe's name or a recipe's YAML file (a str or a pathlib.Path)",
             "pass e.g. recipe='default', or leave it out for the target's default recipe")):
        if value is not None and not a_path(value):
            refuse(name, value, expected, fix)
    single = isinstance(data, (str, os.PathLike))  # one file given alone, as --data FILE
    files = (data,) if single else data
    if isinstance(data, (bytes, bytearray, Mapping)) or not isinstance(files, Iterable):
        refuse("data", data, "a text file's path, or a list of them (each a str or a pathlib.Path)",
               "pass data='train.txt' or data=['a.txt', pathlib.Path('b.txt')]")
    files = tuple(files)
    for index, file in enumerate(files):
        if not a_path(file):
            refuse("data" if single else f"data[{index}]", file, "a text file's path (a str or a pathlib.Path)",
                   "pass data='train.txt' or data=['a.txt', pathlib.Path('b.txt')]")
    for name, value in numbers.items():
        if not (value is None and name == "weight_bits") and (isinstance(value, bool) or not isinstance(value, int)):
            refuse(name, value, "a whole number" + (" or None" if name == "weight_bits" else ""),
                   f"pass {name} as an int" + (", or leave it out" if name == "weight_bits" else ""))
    # --data-skip-chars' and --generated-sequences' range (click.IntRange(min=0)): DataConfig's own refusal named
    # its fields and the command line's options
    for name in NOT_NEGATIVE_NUMBERS:
        if name in numbers and numbers[name] < 0:
            refuse(name, numbers[name], f"a whole number >= 0 ({NOT_NEGATIVE_NUMBERS[name]})",
                   f"pass {name}=0 or more, or leave it out for build_bundle's default")
    # --weight-bits' choices (edgesdk/cli_build.py): 16 (read as fp16) went on as --set export.weights=int16
    bits = numbers.get("weight_bits")
    if bits is not None and bits not in WEIGHT_BITS:
        refuse("weight_bits", bits, f"{' or '.join(map(str, WEIGHT_BITS))} (integer weights of that many bits, as "
               "edgesdk build --weight-bits takes them)", "pass weight_bits=8 or weight_bits=4, or leave it out for "
               "the recipe's own (a recipe keeps float weights where it quantizes none: recipe='fp32-fused')")
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            refuse(name, flag, "True or False", f"pass {name}=True or {name}=False")
    return (os.fspath(target), None if model is None else os.fspath(model),
            None if recipe is None else os.fspath(recipe), tuple(os.fspath(file) for file in files))


def a_path(value: object) -> bool:
    """Whether ``value`` is a path as the API's arguments take one: a str or a ``pathlib.Path`` naming something,
    not "" (an unset variable's value, which ``Path("")`` reads as the working directory)."""
    return isinstance(value, (str, os.PathLike)) and isinstance(os.fspath(value), str) and os.fspath(value) != ""


def check_tokenize_arguments(text: object, add_special: object, parse_special: object) -> None:
    """Refuse :meth:`Model.tokenize <edgesdk.api.Model.tokenize>`'s arguments of the wrong kind: the text is a str
    (llama-cpp-python's UTF-8 bytes are decoded before, :func:`llama_tokenize_arguments`), the flags True or False."""
    from edgesdk.api import RequestError

    if not isinstance(text, str):
        raise RequestError("tokenize", f"text is {shown(text)}; expected the text to tokenize (a str, or its UTF-8 "
                           "bytes)", param="text", fix="pass a str")
    for name, flag in (("add_special", add_special), ("parse_special", parse_special)):
        if not isinstance(flag, bool):
            raise RequestError("tokenize", f"{name} is {shown(flag)}; expected True or False", param=name,
                               fix=f"pass {name}=True or {name}=False")


def detokenize_ids(ids: object, name: str = "tokens") -> tuple[int, ...]:
    """:meth:`Model.detokenize <edgesdk.api.Model.detokenize>`'s ``tokens`` (or ``prev_tokens``, ``name``) as the
    tuple of token ids they are (a list, a tuple, a numpy array, numpy integers), or refused naming the first that is
    not a whole number >= 0."""
    from edgesdk.api import RequestError

    if isinstance(ids, (str, bytes, bytearray, Mapping)):
        raise RequestError("detokenize", f"{name} is {shown(ids)}; {_IDS_EXPECTED}", param=name, fix=_IDS_FIX)
    try:
        tokens = tuple(token_ids(list(ids)))
    except TypeError:
        raise RequestError("detokenize", f"{name} is {shown(ids)}; {_IDS_EXPECTED}", param=name, fix=_IDS_FIX) from None
    for index, token in enumerate(tokens):
        if not _whole_number(token, least=0):
            raise RequestError("detokenize", f"{name}[{index}] is {shown(token)}; expected a token id (a whole "
                               "number >= 0)", param=f"{name}[{index}]", fix=_IDS_FIX)
    return tokens


def llama_tokenize_arguments(text: object, add_bos: object, special: object, add_special: object,
                             parse_special: object) -> tuple[object, object, object]:
    """:meth:`Model.tokenize <edgesdk.api.Model.tokenize>`'s text and flags with llama-cpp-python's
    ``Llama.tokenize(text: bytes, add_bos=True, special=False)`` read (llama_cpp/llama.py): UTF-8 bytes are the
    text they encode, ``add_bos`` is ``add_special`` and ``special`` is ``parse_special`` (llama-cpp-python passes
    them to llama.cpp's ``llama_tokenize`` as those). A flag given under both names with two values, and bytes that
    are not UTF-8, are refused naming them."""
    from edgesdk.api import RequestError

    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError("tokenize", f"text is {shown(bytes(text))}; expected UTF-8 bytes (byte {exc.start} "
                               "is not)", param="text", fix="pass the text as a str, or its UTF-8 encoding "
                               "(text.encode('utf-8'))") from None
    flags = {}
    for ours, default, theirs, value in (("add_special", True, "add_bos", add_bos),
                                         ("parse_special", False, "special", special)):
        # np.True_ is True, as llama-cpp-python's flags and the other methods' take it
        mine = python_scalar({"add_special": add_special, "parse_special": parse_special}[ours])
        value = python_scalar(value)
        if value is not None and not isinstance(value, bool):
            raise RequestError("tokenize", f"{theirs} is {shown(value)}; expected True or False", param=theirs,
                               fix=f"pass {theirs}=True or {theirs}=False")
        if value is not None and mine != default and mine != value:
            raise RequestError("tokenize", f"{theirs}={shown(value)} and {ours}={shown(mine)} disagree; "
                               f"{theirs} is llama-cpp-python's name of {ours}", param=theirs,
                               fix=f"pass one of them ({ours}= or {theirs}=)")
        flags[ours] = mine if value is None else value
    return text, flags["add_special"], flags["parse_special"]


def completion_logprobs(fields: dict) -> dict:
    """``create_completion``'s ``logprobs`` True or False as llama-cpp-python's ``create_completion`` reads it:
    the count of alternatives per token (llama_cpp/llama.py slices ``sorted_logprobs[:logprobs]``: True is 1, False
    0 with the tokens' own logprobs still given). The routes' parser takes a whole number (OpenAI's legacy
    completions' ``logprobs``); other values go to it as they are."""
    value = python_scalar(fields.get("logprobs"))
    return {**fields, "logprobs": int(value)} if isinstance(value, bool) else fields


def check_perplexity_arguments(text: object, context: object, stride: object, max_chars: object) -> None:
    """Refuse :meth:`Model.perplexity <edgesdk.api.Model.perplexity>`'s arguments of the wrong kind or range
    (``stride`` already defaulted to ``context``); the bundle's own bound on ``context`` is checked there."""
    from edgesdk.api import RequestError

    if not isinstance(text, str):
        kind = type(text).__name__
        raise RequestError("perplexity", f"expected the text to score (a string), got {_article(kind)} {kind}: "
                           f"{shown(text)}", param="text",
                           fix="pass the text as a str (a file's: pathlib.Path(FILE).read_text())")
    for name, value, least, most in (("context", context, 2, None), ("stride", stride, 1, context)):
        if not _whole_number(value, least) or (most and value > most):
            bounds = f"from {least} to the context, {most}" if most else f"of at least {least}"
            raise RequestError("perplexity", f"{name} is {shown(value)}; expected a whole number of tokens {bounds}",
                               param=name, fix="pass context >= 2 and 1 <= stride <= context (stride "
                               "left out: windows that do not overlap)")
    if max_chars is not None and not _whole_number(max_chars, least=1):
        raise RequestError("perplexity", f"max_chars is {shown(max_chars)}; expected a whole number of "
                           "characters >= 1", param="max_chars",
                           fix="pass max_chars >= 1, or leave it out to score the whole text")


def embedding_input(value: object) -> object:
    """The ``input`` of :meth:`Model.embed <edgesdk.api.Model.embed>` / ``create_embedding`` as the HTTP API's JSON
    carries it: tuples and numpy arrays of token ids (one, or one per input) as lists of ints; anything else as it
    is, for the request's parser to name. A list may mix texts and token id arrays."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()  # a numpy array: token ids, or one row of them per input
    if isinstance(value, (list, tuple)) and any(isinstance(item, (str, list, tuple)) or getattr(item, "ndim", 0)
                                                for item in value):
        return [item if isinstance(item, str) else token_ids(item) for item in value]
    return token_ids(value)


def numpy_int(value: object) -> object:
    """A numpy integer scalar (``np.int64(8)``) as the int it holds; anything else (a bool too) as it is."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(value, "ndim", None) == 0 and getattr(dtype, "kind", "") in ("i", "u"):
        return int(value)
    return value


def embedding_norm(normalize: object) -> int:
    """:meth:`Model.embed <edgesdk.api.Model.embed>`'s ``normalize`` as llama.cpp's ``--embd-normalize`` number:
    False (llama-cpp-python's default) -1, the vectors as the model gives them; True 2, unit length (what
    llama-cpp-python's ``normalize=True`` does); a whole number >= -1 as it is. A bool is read before a number, so
    False is not 0 (0 scales the largest magnitude to the int16 range)."""
    from edgesdk.api import RequestError

    normalize = python_scalar(normalize)  # np.True_ is True, np.int64(2) is 2
    if isinstance(normalize, bool):
        return 2 if normalize else -1
    if _whole_number(normalize, least=-1):
        return int(normalize)
    raise RequestError("embed", f"normalize is {shown(normalize)}; expected True (unit length), False (the vectors "
                       "as the model gives them) or llama.cpp's --embd-normalize number (-1 none, 0 max-abs scaled "
                       "to int16, 1 taxicab, 2 euclidean, > 2 p-norm)", param="normalize",
                       fix="pass normalize=True for unit vectors, or leave it out")


def check_embed_flags(**flags: object) -> None:
    """Refuse :meth:`Model.embed <edgesdk.api.Model.embed>`'s ``truncate`` or ``return_count`` when not a bool."""
    from edgesdk.api import RequestError

    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise RequestError("embed", f"{name} is {shown(flag)}; expected True or False", param=name,
                               fix=f"pass {name}=True or {name}=False")


def check_embedding_model(model: object, method: str = "create_embedding") -> None:
    """Refuse ``model``, the name the answer of ``method`` carries, when not a str or None: as ``edgesdk serve``
    refuses a request whose ``model`` is no name (edgesdk/serve/model_pool.py ``resolve``), where
    ``create_completion`` and ``create_chat_completion`` took it and answered with the bundle's name."""
    from edgesdk.api import RequestError

    if model is not None and not isinstance(model, str):
        raise RequestError(method, f"model is {shown(model)}; expected the name the answer carries (a "
                           "str)", param="model", fix="pass a str, or leave model out for the bundle's name")


class ReadFields(dict):
    """A request body that records the fields its parser looks up (:func:`refuse_unread`)."""

    def __init__(self, body: dict):
        super().__init__(body)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)


def refuse_unread(method: str, fields: ReadFields) -> None:
    """Refuse a keyword the route's parser never read (a misspelt field, or one of another API such as
    llama-cpp-python's ``stopping_criteria``): over HTTP it would be ignored, here it is named. None (every field's
    default, as a wrapper passing its own defaults sends it) and llama-cpp-python's sampler defaults pass."""
    from edgesdk.api import RequestError

    unread = [(name, value) for name, value in dict.items(fields)
              if name not in fields.read and name not in NO_EFFECT_FIELDS and not _neutral(name, value)]
    if not unread:
        return
    name, value = unread[0]
    if name in LLAMA_CALLBACKS:
        what, fix = LLAMA_CALLBACKS[name]
        raise RequestError(method, f"{method}() takes no field {name!r} (llama-cpp-python's {name} is {what}, and "
                           "the answer's engine, edgesdk serve's, calls no Python code)", param=name, fix=fix)
    if name in LLAMA_CPP_PYTHON_DEFAULTS:
        raise RequestError(method, f"{name}={shown(value)} sets a sampler of llama-cpp-python's that "
                           "edgesdk's runtime does not have", param=name,
                           fix=f"leave {name} out, or at {LLAMA_CPP_PYTHON_DEFAULTS[name]!r}")
    refusal = other_method_refusal(method, name)
    if refusal is not None:
        raise refusal
    others = {field for caller, field in OTHER_METHODS_FIELDS if caller == method}  # read only to be refused
    known = sorted(field for field in fields.read | set(NO_EFFECT_FIELDS) if isinstance(field, str)
                   and field not in others)
    close = difflib.get_close_matches(str(name), known, n=1)
    route = "Chat Completions" if method == "create_chat_completion" else "Completions"
    foreign = FOREIGN_FIELDS.get(name)
    note = (f" (another API's name: pass {foreign[1]})" if foreign else
            f" (did you mean {close[0]!r}?)" if close else "")
    raise RequestError(method, f"{method}() takes no field {name!r}{note}",
                       param=str(name), fix=f"pass the fields of OpenAI's {route} request as 'edgesdk serve' "
                       f"reads them ({', '.join(known)})")


def other_method_refusal(method: str, name: object):
    """The :class:`~edgesdk.api.RequestError` of ``method`` given ``name``, a field of the other completion method
    (:data:`OTHER_METHODS_FIELDS`), naming that method and how to call it, or first this method's own way where it
    has one (:data:`OTHER_METHODS_OWN_FIXES`); None for any other field."""
    from edgesdk.api import RequestError

    how = OTHER_METHODS_FIELDS.get((method, name))
    if how is None:
        return None
    other = "create_completion" if method == "create_chat_completion" else "create_chat_completion"
    # OpenAI's legacy functions are refused by both methods: tools take their place
    send = "tools (and tool_choice) to create_chat_completion" if name in ("functions", "function_call") else \
        f"{name} to {other}"
    fix = OTHER_METHODS_OWN_FIXES.get((method, name), f"send {send}, or leave {name} out of {method}")
    return RequestError(method, f"{method}() takes no field {name!r} ({how})", param=str(name), fix=fix)


def token_ids(value: object) -> object:
    """Token ids given as Python holds them (a tuple, a numpy array, numpy integers) as the list of ints the HTTP
    API's JSON carries; anything else as it is, for the request's parser to name."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()  # a numpy array (or integer)
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list):
        return [operator.index(item) if hasattr(type(item), "__index__") and not isinstance(item, bool) else item
                for item in value]
    return value


def json_arrays(value: object) -> object:
    """``value`` with every tuple in it (in dict values and lists, at any depth) a list, as the HTTP body's JSON
    carries it (``json.dumps`` writes a tuple as an array): ``stop=("Q:",)``, ``tools=(tool,)``, a message's
    content parts or a schema's ``enum`` given as a tuple are read as over HTTP, not refused as "not an array".
    A NumPy scalar in it is the number it holds (:func:`python_scalar`)."""
    if isinstance(value, (list, tuple)):
        return [json_arrays(item) for item in value]
    if isinstance(value, dict):
        return {key: json_arrays(item) for key, item in value.items()}
    return python_scalar(value)


def python_scalar(value: object) -> object:
    """A NumPy scalar (``np.int64(3)``, ``np.float32(0.5)``, ``np.True_``) as the Python int, float or bool it
    holds, the number the HTTP body's JSON carries; anything else as it is. llama-cpp-python's ``Llama`` takes them
    (its checks are comparisons); the routes' checks, written for JSON's types, refused ``max_tokens=np.int64(3)``
    as "must be a whole number". ``np.float64`` is a float already."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(value, "ndim", None) == 0 and getattr(dtype, "kind", "") in ("b", "i", "u", "f"):
        return value.item()
    return value


def logit_bias_keys(method: str, fields: dict) -> dict:
    """``fields`` with a ``logit_bias`` mapping's keys as the HTTP body's JSON carries them: a JSON object's keys are
    strings, so ``{15043: -100}`` (llama-cpp-python's ``logit_bias: Dict[int, float]``; numpy integers too) is
    ``{"15043": -100}``, and a float, bool or None key the string ``json.dumps`` writes for it, for the route to read
    as a token id or text, or refuse by name. A key JSON cannot write (a tuple ...) is refused here, naming it."""
    from edgesdk.api import RequestError

    bias = fields.get("logit_bias")
    if not isinstance(bias, Mapping):
        return fields

    def json_key(key: object) -> str:
        if isinstance(key, str):
            return key
        if hasattr(type(key), "__index__") and not isinstance(key, bool):
            return str(operator.index(key))
        if key is None or isinstance(key, (bool, float)):
            return json.dumps(key)
        raise RequestError(method, f"logit_bias key {shown(key)} is not a token id; expected token ids (whole "
                           "numbers >= 0) or text", param="logit_bias",
                           fix="pass logit_bias as {token_id: bias}, e.g. {15043: -100}")

    return {**fields, "logit_bias": {json_key(key): value for key, value in bias.items()}}


def shown(value: object) -> str:
    """``value`` as an error message shows it: its repr, cut at :data:`SHOWN_CHARS` characters.

    Two kinds are never cut, so the caller sees what to fix: a str or path naming a file or directory that exists
    is shown whole (a temporary or home directory's path is often longer than the cut), and a tuple or list of at
    most two items, a (path, scale) pair, shows each item as it would be shown alone."""
    if type(value) in (tuple, list) and len(value) <= 2:
        items = ", ".join(shown(item) for item in value) + ("," if len(value) == 1 and isinstance(value, tuple) else "")
        return f"({items})" if isinstance(value, tuple) else f"[{items}]"
    text = repr(value)
    if len(text) <= SHOWN_CHARS or (isinstance(value, (str, os.PathLike)) and _existing_path(value)):
        return text
    return text[:SHOWN_CHARS - 3] + "..."


def _existing_path(value: str | os.PathLike) -> bool:
    """Whether ``value`` names a file or directory that exists (False for text no path can be, e.g. with a NUL)."""
    try:
        return os.path.exists(value)
    except (OSError, TypeError, ValueError):
        return False


def _neutral(name: str, value: object) -> bool:
    """Whether an unread field's value changes nothing: None, or a llama-cpp-python sampler at its default."""
    if value is None:
        return True
    if name not in LLAMA_CPP_PYTHON_DEFAULTS or isinstance(value, bool):
        return False
    # tail-free sampling does nothing from 1 up (llama.cpp's sampler returns at once), as serve's Ollama route reads it
    if name == "tfs_z" and isinstance(value, (int, float)) and math.isfinite(value):
        return value >= 1.0
    return value == LLAMA_CPP_PYTHON_DEFAULTS[name]


def _unknown_setting_hint(name: str) -> str | None:
    """What to pass instead of ``name``, a setting :func:`edgesdk.load` does not take: llama-cpp-python's or
    llama.cpp's argument's counterpart, the token limit's other names sent to max_tokens, a request's field sent to
    the method that takes it, another API's name of a setting or field (:data:`FOREIGN_FIELDS`), else the closest
    load() argument by spelling; None where none is close."""
    if name in LLAMA_ARGUMENTS:
        return f"{name}: {LLAMA_ARGUMENTS[name]}"
    if name in LIMIT_HINTS:
        return f"{name}: {LIMIT_HINTS[name]}"
    if name in REQUEST_ONLY_FIELDS:
        method = ONE_METHOD_FIELDS.get(name, "create_completion / create_chat_completion")
        return f"{name}: a request's field: pass {name}= to {method}"
    if name in FOREIGN_FIELDS:  # another API's name of a setting, or of a request's field (stop)
        field, what = FOREIGN_FIELDS[name]
        return f"{name}: pass {what}" + ("" if field in MODEL_SETTINGS else
                                          " to create_completion / create_chat_completion")
    close = difflib.get_close_matches(name, LOAD_ARGUMENTS, n=1)
    return f"{name}: did you mean {close[0]}?" if close else None


def _article(word: str) -> str:
    """The indefinite article before ``word`` ("an int", "a list")."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _whole_number(value: object, least: int) -> bool:
    """Whether ``value`` is an int (not a bool) of at least ``least``."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= least


def _of_kind(value: object, kind: type) -> bool:
    """Whether a load() setting's ``value`` is of its ``kind`` (:data:`SETTING_KINDS`): a number for a float, a
    string or a list of strings for the sampler chain, and a bool only where a bool is asked for."""
    if kind is list:
        return isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(item, str)
                                                                                   for item in value))
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
