"""edgesdk from Python: load a bundle and generate with it, or build one.

:func:`load` opens a bundle as ``edgesdk run`` and ``edgesdk serve`` do (hashes and target checked first, the
profile's backend chain) and gives a :class:`Model` shaped like llama-cpp-python's ``Llama``:
``create_completion`` / ``__call__`` and ``create_chat_completion`` take the fields of OpenAI's Completions and
Chat Completions requests (with llama-server's additions: ``grammar``, ``top_k``, ``min_p``, ``ignore_eos`` ...)
and return the bodies ``edgesdk serve`` sends, or an iterator of its stream chunks with ``stream=True``.
Requests go through the server's own engine (:class:`~edgesdk.serve.completion.Completer`), so a request answers
the same in-process and over HTTP: chat template, stop strings, JSON schemas, tools, reasoning, logprobs, and the
KV cache of the previous answer's prefix reused. A bad field raises :class:`RequestError` naming it, and so does a
field the route does not read (where ``edgesdk serve`` ignores it, as HTTP servers ignore unknown JSON fields, a
misspelt keyword here would otherwise change nothing without a word).

:func:`build_bundle` runs the host's build pipeline (``edgesdk build``) and returns the bundle's directory.
The arguments' checks are in :mod:`edgesdk.api_checks`.

Typical use on a board::

    import edgesdk

    with edgesdk.load("bundles/smollm2-135m-rpi5") as model:
        answer = model.create_chat_completion([{"role": "user", "content": "What is the capital of France?"}],
                                              max_tokens=64)
        print(answer["choices"][0]["message"]["content"])
        for chunk in model("Once upon a time", max_tokens=32, stream=True):
            print(chunk["choices"][0]["text"], end="", flush=True)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from edgesdk.api_checks import (
    GATE_ARGUMENTS,
    GATE_FIXES,
    LLAMA_METHODS,
    REQUEST_FIX,
    GateArgumentError,
    ReadFields,
    a_path,
    build_arguments,
    bundle_path,
    chat_limits,
    check_embed_flags,
    check_embedding_model,
    check_gate_arguments,
    check_load_arguments,
    check_max_tokens,
    check_n_ctx,
    check_perplexity_arguments,
    check_tokenize_arguments,
    completion_logprobs,
    configure_gates,
    detokenize_ids,
    drop_fix,
    embedding_input,
    embedding_norm,
    grammar_text,
    json_arrays,
    llama_no_ops,
    llama_tokenize_arguments,
    load_threads,
    logit_bias_keys,
    numpy_int,
    other_method_refusal,
    python_scalar,
    refuse_unread,
    request_limit,
    serve_settings,
    shown,
    split_fix,
    token_ids,
)
from edgesdk.errors import EdgeSDKError

CLOSED_FIX = "load the bundle again (edgesdk.load) to generate; a closed model stays closed"
_END = object()  # the last item a streamed answer's worker puts in its queue
# Pieces of a streamed answer (a token's text, as chunks) its worker generates before the reader has taken them:
# enough that a reader doing some work per chunk (printing it) never holds the answer back, few enough that a stream
# nobody reads stops within a few tokens
STREAM_AHEAD = 8
READER_POLL_S = 0.1  # how often a worker waiting for its reader asks whether it should go on without it


def load(path: str | Path | None = None, *, backend: str | None = None, threads: int | None = None, target: str | None = None,
         ignore_target: bool = False, watch_thermal: bool = False, n_ctx: int | None = None,
         draft: str | Path | None = None, draft_max: int | None = None, draft_min: int | None = None, draft_p_min: float | None = None,
         gating: bool | None = None, entropy_target: float | None = None, compute_budget: float | None = None,
         model_path: str | Path | None = None, **settings) -> Model:
    """Open the bundle at ``path`` for generation (``model_path``, llama-cpp-python's ``Llama(model_path=)``, names it
    too; given both, load() refuses them).

    ``backend`` forces one backend (``ort-cpu``, ``ort-cuda``, ``ort-trt``, ``tensorrt``, ``triton``) instead of the
    profile's chain; ``threads`` the intra-op threads (default, and for 0 or below as ``--threads`` reads them: the
    profile's, at most the usable cores);
    ``target`` refuses a bundle built for another board and ``ignore_target`` runs one anyway, as ``edgesdk run``'s
    options of those names. ``watch_thermal`` guards the board's temperature around every step, as
    ``edgesdk run --watch-thermal`` (the sensors it found, or what it fell back to, are in :attr:`Model.notes`).
    ``n_ctx`` is the run's context, as llama-cpp-python's ``Llama(n_ctx=N)`` and ``edgesdk run -c N`` set it: N up to
    the bundle's (None or 0: the bundle's own), so a prompt past N is refused and an answer stops there; more than
    the bundle's is refused naming the build_bundle(max_context=N) that holds it (:meth:`Model.n_ctx` says it).
    ``draft`` is a draft bundle for speculative decoding, as ``edgesdk serve --draft`` with ``draft_max``,
    ``draft_min`` and ``draft_p_min`` (llama.cpp's ``--model-draft``, ``--draft-max``, ``--draft-min`` /
    ``--draft-n-min``, ``--draft-p-min``; left out, 2, 0 and 0): answers stay the same. ``draft_min`` is the fewest
    tokens a draft is checked with (a shorter one is dropped, and none is drafted where fewer fit), at most
    ``draft_max``. Given without ``draft`` they change nothing, which :attr:`Model.notes` says, as ``edgesdk serve``
    says of ``--draft-max`` without ``--draft``.
    ``gating``, ``entropy_target`` and ``compute_budget`` steer a power-gated bundle's gates as ``edgesdk run``'s
    ``--gating/--no-gating``, ``--entropy-target`` and ``--compute-budget`` do: left out, the gates are off (every FFN
    block runs); ``gating=True``, or a target (nats) or budget (the largest fraction of FFN blocks a decode step runs)
    given, turns them on, and ``watch_thermal``'s guard then lowers the gate's budget where it would pace the board.
    A target or budget beside ``gating=False``, and any of them but ``gating=False`` on a bundle without gates, are
    refused naming the argument. A model whose gates are steered prefills every prompt whole (its answers are those
    of a fresh model) and keeps no prompt cache file, as ``run`` neither reads nor writes one then.

    ``settings`` are what a request that leaves a field out gets (``edgesdk serve``'s options): ``max_tokens``
    (512; -1: no limit but the context, as serve's ``-n -1``), and the sampling settings ``temperature`` (0, or
    below as serve's ``--temp``: greedy), ``top_p``, ``top_k`` (0 or below: off, as serve's ``--top-k``), ``min_p``,
    ``repeat_penalty`` (1: off), ``repeat_last_n`` (64) and ``samplers`` (each of these seven not given: the model's own
    setting where its bundle records one, as ``edgesdk serve`` takes them; :attr:`Model.notes` says which), ``prompt_cache`` (True),
    ``cache_ram_mib``, ``lookup``, ``prefill_assistant``, ``reasoning_format``, ``reasoning_budget``, ``max_waiting``
    (8: the calls that may wait behind the one generating; more are refused, as serve's ``--max-queue``), ``seed``,
    the seed of every call that sends none, as llama-cpp-python's ``Llama(seed=N)`` and serve's ``-s`` (-1 or
    4294967295, the default: a random seed for each such call; a call's own ``seed`` goes over it, its -1 a random
    seed still), and ``pooling``, how :meth:`Model.embed` and :meth:`Model.create_embedding` pool a text's hidden
    states (llama.cpp's ``--pooling``, llama-cpp-python's ``Llama(pooling_type=...)``): ``last`` (the last token's, what decoder
    embedding models are trained for), ``mean``, ``cls`` (the first token's) or ``none`` (every token's); left out,
    the pooling the bundle's model declares, else ``mean`` (:func:`edgesdk.runtime.embedding.bundle_pooling`).
    ``spm_infill`` (False) puts a ``create_completion(prompt, suffix)``'s suffix before its prompt, for the
    fill-in-the-middle models trained so (llama-cpp-python's ``Llama(spm_infill=True)``, serve's ``--spm-infill``).
    llama-cpp-python's ``verbose``, ``embedding`` and ``logits_all``, True or False, are taken and change nothing
    (:data:`~edgesdk.api_checks.LLAMA_NO_OPS`; :attr:`Model.notes` says so); its other ``Llama(...)`` arguments are
    refused naming what does their work here.
    """
    return Model(path, backend=backend, threads=threads, target=target, ignore_target=ignore_target,
                 watch_thermal=watch_thermal, n_ctx=n_ctx, draft=draft, draft_max=draft_max, draft_min=draft_min,
                 draft_p_min=draft_p_min, gating=gating, entropy_target=entropy_target, compute_budget=compute_budget,
                 model_path=model_path, **settings)


class Model:
    """A loaded bundle answering OpenAI-shaped requests in this process (llama-cpp-python's ``Llama`` for
    edgesdk bundles). One answer is generated at a time; calls from several threads take turns in order.
    :meth:`save_prompt_cache` and :meth:`load_prompt_cache` keep the KV cache in a file between processes.
    Close it (or use it in a ``with`` block) to give back the thermal guard's sensors and clock cap."""

    def __init__(self, path: str | Path | None = None, *, backend: str | None = None, threads: int | None = None,
                 target: str | None = None, ignore_target: bool = False, watch_thermal: bool = False,
                 n_ctx: int | None = None, draft: str | Path | None = None, draft_max: int | None = None, draft_min: int | None = None,
                 draft_p_min: float | None = None, gating: bool | None = None, entropy_target: float | None = None,
                 compute_budget: float | None = None, model_path: str | Path | None = None, **settings):
        from edgesdk.runtime import cache_file
        from edgesdk.runtime.session import open_runtime
        from edgesdk.serve.completion import ServeDefaults
        from edgesdk.serve.openai_answer import served_model_name

        # np.int64(4), as llama-cpp-python's n_threads takes it, and np.True_
        threads, ignore_target, watch_thermal = map(python_scalar, (threads, ignore_target, watch_thermal))
        gates = dict(zip(GATE_ARGUMENTS, map(python_scalar, (gating, entropy_target, compute_budget)), strict=True))
        settings = {name: python_scalar(value) for name, value in settings.items()}
        path = bundle_path(path, model_path)  # Llama(model_path=...) kept by a port
        settings, unused = llama_no_ops(settings)  # Llama(verbose=False, embedding=True ...): noted below
        check_load_arguments(path, backend, threads, target, ignore_target, watch_thermal, settings)
        check_gate_arguments(**gates)
        context = check_n_ctx(python_scalar(n_ctx))  # the run's context (-c N): None, the bundle's
        threads = load_threads(threads)  # 0 or below: the profile's count, as --threads
        try:
            defaults = ServeDefaults(**serve_settings(settings))
        except (TypeError, ValueError) as exc:
            raise EdgeSDKError(f"load(): {exc}", "pass a value the message allows, or leave the setting out for "
                               "edgesdk serve's default (the model's own where its bundle records one)") from exc
        # the draft's arguments are checked before anything opens, as the others are
        draft_config = None if draft is None else _draft_config(draft, draft_max, draft_min, draft_p_min, settings)
        try:
            self.runtime = open_runtime(Path(path), backend=backend, threads=threads, expected_target=target,
                                        ignore_target=ignore_target, terms="python")
        except EdgeSDKError as exc:  # its fix names run's options: the same choices are load()'s arguments here
            raise _in_python_terms(exc) from exc
        self._thermal = self._release_guard = self._completer = self._drafter = None
        try:
            if context is not None:
                _hold_context(self.runtime, context)
            self._open(settings, defaults, watch_thermal, gates, draft, draft_config, threads, target, ignore_target)
        except BaseException:  # a draft bundle that cannot serve ...: what was opened goes back now, not when the
            self._give_back()  # traceback (kept at a REPL) lets this half-made model go
            raise
        if draft is None:  # as edgesdk serve's --draft-max, --draft-min and --draft-p-min without --draft
            self.notes += [f"{name}: not used: it works with draft=BUNDLE" for name, value in  # (cli_options.draft_model)
                           (("draft_max", draft_max), ("draft_min", draft_min), ("draft_p_min", draft_p_min))
                           if value is not None]
        self.notes += unused
        self.model_name = served_model_name(self.runtime.bundle.manifest)
        # Whether save_prompt_cache / load_prompt_cache can work here: asked now, as the question empties the
        # backend's KV cache (edgesdk/runtime/cache_file.py)
        self._cache_file_fits = self._completer.prompt_cache is not None and cache_file.supported(self.runtime.backend)
        self._closed = False

    def _open(self, settings: dict, defaults, watch_thermal: bool, gates: dict, draft, draft_config, threads, target,
              ignore_target: bool) -> None:
        """What :func:`load` opens once the bundle's runtime is open: the power gates set (``gates``: load()'s
        ``gating``, ``entropy_target`` and ``compute_budget``), then the thermal guard, which takes the gate where it
        skips blocks, the draft bundle and the engine answering requests, with the notes on each."""
        from edgesdk.serve.completion import Completer

        self.notes: list[str] = list(self.runtime.notes)  # why each backend was or was not used, the thermal guard
        defaults = _with_model_defaults(defaults, settings, self.runtime.bundle.manifest, self.notes)
        # before the guard, which lowers the budget of gates that are on
        _configure_gates(self.runtime.backend, gates, self.runtime.bundle.path)
        self._thermal = _open_guard(self.runtime, self.notes) if watch_thermal else None
        # The guard's sensors, poller thread and clock cap go back with close(), or when a model nobody closed is
        # collected or the interpreter exits
        self._release_guard = weakref.finalize(self, self._thermal.close) if self._thermal else None
        if draft is not None:  # kept, so that a failure before the engine holds it gives its backend back too
            try:
                self._drafter = self._open_draft(draft, draft_config, threads, target, ignore_target)
            except EdgeSDKError as exc:  # opened in Python terms, but a draft no backend here runs is refused
                raise _in_python_terms(exc) from exc  # naming --backend (PYTHON_TERMS), as the bundle is
        self._completer = Completer(self.runtime, defaults, hook=self._thermal.hook if self._thermal else None,
                                    draft=self._drafter)
        self.notes += _unused_settings(settings, self.runtime.backend.name, self._completer)

    def _give_back(self) -> None:
        """Give back what a :func:`load` that failed halfway had opened: the engine (the backend's and a draft
        bundle's buffers with it) or, before the engine was made, the backend and the draft bundle's backend
        alone, and the thermal guard."""
        from edgesdk.runtime.backend import close_backend

        try:
            if self._completer is not None:
                self._completer.close()
            else:
                for backend in (self.runtime.backend, *([self._drafter.backend] if self._drafter else [])):
                    close_backend(backend)
        finally:
            if self._release_guard is not None:
                self._release_guard()

    @property
    def manifest(self) -> dict:
        """The bundle's manifest (model, target, stages, graph, tokenizer)."""
        return self.runtime.bundle.manifest

    @property
    def max_context(self) -> int:
        """The longest sequence (prompt and answer) the bundle takes, in tokens."""
        return self.runtime.backend.max_context

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, *, stream: bool = False,
                          **fields) -> dict | Iterator[dict]:
        """OpenAI's ``POST /v1/completions`` for ``prompt`` (text fed as it is, or token ids): its body, or an
        iterator of its chunks with ``stream``. ``suffix`` (second, as llama-cpp-python's ``create_completion``
        takes it): the text after the completion, for a model with fill-in-the-middle tokens; the answer is the
        middle (:func:`edgesdk.serve.api.suffix_request`). ``fields`` are the request's other fields
        (``max_tokens``, ``temperature``, ``stop``, ``seed``, ``logprobs``, ``echo``, ``grammar``,
        ``response_format`` ...). ``max_tokens`` None, 0 or -1 is no limit but the context, as llama-cpp-python's
        (:func:`~edgesdk.api_checks.request_limit`); left out, :func:`load`'s ``max_tokens``. ``model`` is the
        answer's ``model``, as llama-cpp-python's (left out: the bundle's name, :attr:`model_name`).

        One prompt per call, as llama-cpp-python's ``create_completion`` takes it: an array of several prompts
        (``["a", "b"]``, ``[[1, 2], [3, 4]]``), which ``edgesdk serve``'s ``POST /v1/completions`` answers with a
        choice each, is refused naming ``prompt``; a one-prompt array (``["a"]``) is that prompt. An empty prompt
        (``""``) is the tokenizer's BOS alone, which llama-cpp-python generates from too (refused naming ``prompt``
        for a model whose tokenizer adds none)."""
        from edgesdk.serve import llama_native
        from edgesdk.serve.api import ApiError, parse_text_request

        def parse(request: dict):
            count = len(llama_native.prompts(request))  # as the HTTP route tells one prompt from several
            if count > 1:
                raise ApiError(400, f"'prompt' holds {count} prompts; create_completion answers one prompt per call "
                               "(as llama-cpp-python's does): call it once per prompt, or send them together to "
                               "'edgesdk serve' (POST /v1/completions answers a choice per prompt)", param="prompt")
            # the limit is max_tokens alone, as llama-cpp-python's create_completion takes it: llama-server's
            # n_predict and max_completion_tokens, which the HTTP route reads too, stay refused by name here
            # a fill-in-the-middle prompt past the context is refused there naming the prompt or the suffix
            # "" is the tokenizer's BOS alone, as llama-cpp-python generates from it (refused where it adds none)
            return parse_text_request(request, completer=self._completer, limit_fields=("max_tokens",),
                                      empty_prompt=True)

        check_max_tokens("create_completion", fields)
        body = {"prompt": token_ids(prompt), **({} if suffix is None else {"suffix": suffix}),
                **completion_logprobs(request_limit(fields))}
        return self._answer("create_completion", parse, body, stream)

    __call__ = create_completion

    def create_chat_completion(self, messages: list[dict], *, stream: bool = False,
                               **fields) -> dict | Iterator[dict]:
        """OpenAI's ``POST /v1/chat/completions`` for ``messages`` through the bundle's chat template: its body,
        or an iterator of its chunks with ``stream``. ``fields`` are the request's other fields (``max_tokens``,
        ``temperature``, ``stop``, ``tools``, ``tool_choice``, ``response_format``, ``logprobs``,
        ``chat_template_kwargs`` ...). ``max_tokens`` None, 0 or -1 is no limit but the context, as
        llama-cpp-python's (:func:`~edgesdk.api_checks.request_limit`); left out, :func:`load`'s ``max_tokens``.
        ``max_completion_tokens``, OpenAI's newer name of it, is read first; given with ``max_tokens`` the two must
        agree (:func:`~edgesdk.api_checks.chat_limits`). ``model`` is the answer's ``model``, as llama-cpp-python's
        (left out: the bundle's name)."""
        from edgesdk.serve.api import parse_chat_request

        messages = list(messages) if isinstance(messages, tuple) else messages
        def parse(request: dict):  # OpenAI's two limits; llama-server's n_predict is refused by name, as before
            return parse_chat_request(request, limit_fields=("max_completion_tokens", "max_tokens"))

        check_max_tokens("create_chat_completion", fields)
        body = {"messages": messages, **request_limit(chat_limits(fields))}
        return self._answer("create_chat_completion", parse, body, stream)

    def tokenize(self, text: str | bytes, add_bos: bool | None = None, special: bool | None = None, *,
                 add_special: bool = True, parse_special: bool = False) -> list[int]:
        """The token ids of ``text``: with the tokenizer's special tokens added (a BOS where the model has one) by
        default, and special tokens written in the text read as plain text unless ``parse_special``.

        llama-cpp-python's ``Llama.tokenize(text: bytes, add_bos=True, special=False)`` (llama_cpp/llama.py) is
        taken too: ``text`` may be UTF-8 bytes, ``add_bos`` is ``add_special`` and ``special`` is ``parse_special``
        (both are llama.cpp's ``llama_tokenize(add_special, parse_special)``, which llama-cpp-python passes them
        to); a flag given under both names with two values is refused."""
        from edgesdk.serve.api import TokenizeRequest

        text, add_special, parse_special = llama_tokenize_arguments(text, add_bos, special, add_special, parse_special)
        check_tokenize_arguments(text, add_special, parse_special)
        self._check_open("tokenize")
        request = TokenizeRequest(content=text, add_special=add_special, parse_special=parse_special)
        return self._call("tokenize", lambda: self._completer.tokenize(request)["tokens"])

    def detokenize(self, tokens: Iterable[int], prev_tokens: Iterable[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of token ids, as llama-cpp-python's ``Llama.detokenize(tokens, prev_tokens=None,
        special=False) -> bytes`` (llama_cpp/llama.py, _internals.py ``LlamaModel.detokenize``): each token's
        piece (``llama_token_to_piece``) joined, a special token's text written only with ``special=True``, one
        leading space dropped after a first BOS token; ``.decode('utf-8')`` gives the text (a token that ends
        inside a character gives its bytes alone). ``prev_tokens``, the ids before them, changes nothing in
        pieces joined this way (llama-cpp-python's own tokenizer ignores it too) and is checked as ids."""
        ids = detokenize_ids(tokens)
        if prev_tokens is not None:
            detokenize_ids(prev_tokens, "prev_tokens")
        if not isinstance(python_scalar(special), bool):
            raise RequestError("detokenize", f"special is {shown(special)}; expected True or False", param="special",
                               fix="pass special=True to write special tokens' text, or leave it out")
        self._check_open("detokenize")
        # checked here, as tokens[i] (the route's own check names its JSON field, tokens[i], and OpenAI's bodies)
        vocabulary = self._completer.vocabulary()
        outside = next((index for index, token in enumerate(ids) if token >= vocabulary), None)
        if outside is not None:
            raise RequestError("detokenize", f"tokens[{outside}] is {ids[outside]}; this model's vocabulary has ids 0 "
                               f"to {vocabulary - 1}", param=f"tokens[{outside}]",
                               fix="pass token ids the model's vocabulary holds (tokenize() gives them)")
        return self._call("detokenize", lambda: _token_text(self.runtime.tokenizer, ids, bool(special),
                                                            self.token_bos()))

    def n_ctx(self) -> int:
        """llama-cpp-python's ``Llama.n_ctx()``: the context, in tokens (:attr:`max_context`): load()'s ``n_ctx``
        where it held the run below the bundle's, else the bundle's."""
        return self.max_context

    def n_vocab(self) -> int:
        """llama-cpp-python's ``Llama.n_vocab()``: the tokens of the vocabulary, added tokens included (ids 0 to
        ``n_vocab() - 1``)."""
        return self._completer.vocabulary()

    def n_embd(self) -> int:
        """llama-cpp-python's ``Llama.n_embd()``: the model's hidden size (the width of its embeddings)."""
        from edgesdk.serve.embeddings import embedding_width

        return embedding_width(self.manifest)

    def token_bos(self) -> int:
        """llama-cpp-python's ``Llama.token_bos()``: the beginning-of-sequence token's id, -1 where the model has
        none (llama.cpp's LLAMA_TOKEN_NULL)."""
        return _token_of(self.runtime.tokenizer, self.manifest.get("tokenizer", {}).get("bos_token"))

    def token_eos(self) -> int:
        """llama-cpp-python's ``Llama.token_eos()``: the end-of-sequence token's id, -1 where the model has none."""
        tokenizer = self.runtime.tokenizer
        token = _token_of(tokenizer, self.manifest.get("tokenizer", {}).get("eos_token"))
        return token if token >= 0 or not tokenizer.eos_token_ids else min(tokenizer.eos_token_ids)

    def token_nl(self) -> int:
        """llama-cpp-python's ``Llama.token_nl()``: the newline's token (llama.cpp's ``linefeed_id``: the token of
        the byte ``\\n``), -1 where the vocabulary has none."""
        return _newline_token(self.runtime.tokenizer)

    def reset(self) -> None:
        """llama-cpp-python's ``Llama.reset()``: the next prompt is prefilled whole, nothing taken from the KV
        cache the last answer left. It takes the model's turn, as :meth:`save_prompt_cache` does."""
        self._check_open("reset")
        with self._completer.exclusive():  # empties the prompt cache and the backend's KV cache as it ends
            self._check_open("reset")

    def set_compute_budget(self, budget: float) -> None:
        """Set the compute budget of a power-gated model whose gates are on: the largest mean fraction of FFN blocks a
        decode step runs, in (0, 1] (1: no limit), as :func:`load`'s ``compute_budget`` and ``edgesdk run
        --compute-budget`` set it, from the next decode step on (an answer generating too). The thermal guard of
        ``watch_thermal`` keeps its own, lower, budget while the board is warm: the budget in force is the smaller of
        the two (:meth:`power_stats`' ``compute_budget``). Refused for a bundle without power gates, a model whose
        gates are off (:func:`load` without ``gating``, ``entropy_target`` or ``compute_budget``) and a budget
        outside (0, 1]."""
        budget = python_scalar(budget)
        controller = self._gate_controller("set_compute_budget")
        fix = "pass a budget B with 0 < B <= 1 (e.g. 0.5: at most half the FFN blocks run), or 1 for no limit"
        if not isinstance(budget, (int, float)) or isinstance(budget, bool):
            raise RequestError("set_compute_budget", f"budget is {shown(budget)}; expected a number", param="budget",
                               fix=fix)
        try:  # ControllerConfig checks it as it checks load()'s compute_budget
            config = dataclasses.replace(controller.config, compute_budget=float(budget))
        except OverflowError as exc:  # an int too large for a float (10**400)
            raise RequestError("set_compute_budget", f"budget is {shown(budget)}; expected a number in (0, 1]",
                               param="budget", fix=fix) from exc
        except ValueError as exc:
            raise RequestError("set_compute_budget", str(exc), param="budget", fix=fix) from exc
        controller.config = config
        controller.set_compute_budget(controller.limit)  # the budget in force: the guard's limit and this one

    def power_stats(self) -> dict:
        """A power-gated model's gate figures, as ``edgesdk run --stats`` prints them on its ``[power]`` line, for
        the answer generating or else the last one (its decode steps): ``mean_entropy``, the realised windowed power
        entropy in nats (None for an answer shorter than one window), and the controller's ``entropy_target``;
        ``blocks_skipped`` of ``blocks_total`` FFN blocks and the ``executed_fraction`` run; ``tau``, the gates'
        threshold now; ``compute_budget``, the budget in force, the smaller of ``budget_set`` (:func:`load`'s
        ``compute_budget`` or :meth:`set_compute_budget`'s, 1 where neither gave one) and ``thermal_limit`` (the
        thermal guard's, 1 until ``watch_thermal``'s guard lowers it). Refused for a bundle without power gates and a
        model whose gates are off."""
        backend = self.runtime.backend
        controller = self._gate_controller("power_stats")
        figures = backend.stats()
        return {"mean_entropy": figures["mean_entropy"], "entropy_target": controller.config.entropy_target,
                "blocks_skipped": figures["blocks_skipped"], "blocks_total": figures["blocks_total"],
                "executed_fraction": figures["executed_fraction"], "tau": figures["tau"],
                "compute_budget": controller.budget, "budget_set": controller.config.compute_budget,
                "thermal_limit": controller.limit}

    def __getattr__(self, name: str):
        """llama-cpp-python's ``Llama`` names this model lacks, refused with what to use instead (an
        AttributeError, as for any missing attribute)."""
        if name in LLAMA_METHODS:
            raise AttributeError(f"'Model' object has no attribute {name!r} (llama-cpp-python's Llama.{name}): "
                                 f"{LLAMA_METHODS[name]}", name=name, obj=self)
        raise AttributeError(f"'Model' object has no attribute {name!r}", name=name, obj=self)

    def create_embedding(self, input: str | list, model: str | None = None, *, encoding_format: str = "float",
                         dimensions: int | None = None) -> dict:
        """OpenAI's ``POST /v1/embeddings`` for ``input`` (a text, a list of texts, token ids or a list of token id
        lists): the body ``edgesdk serve`` answers, ``{"object": "list", "data": [{"object": "embedding", "index",
        "embedding"}], "model", "usage"}``, as llama-cpp-python's ``create_embedding`` returns it. ``model`` names
        the answer's model (default: the bundle's), ``encoding_format`` is ``float`` or ``base64``, ``dimensions``
        keeps each vector's first N values, normalised again.

        Each text is pooled as :func:`load`'s ``pooling`` says (by default as the model declares, else mean) and
        the vectors have unit length, as llama-server's and OpenAI's ``/v1/embeddings`` answer; an input longer
        than the bundle's context is refused, as there, and so is a ``dimensions`` past the model's width, before
        any input runs. llama-cpp-python's ``create_embedding`` differs in both: it returns the vectors as
        the model gives them and cuts a long input (its ``embed``'s defaults, which :meth:`embed` keeps)."""
        from edgesdk.runtime.embedding import EmbeddingConfig
        from edgesdk.serve.api import ApiError
        from edgesdk.serve.embeddings import (
            check_dimensions,
            embedding_width,
            openai_embeddings_body,
            parse_embedding_request,
        )

        method = "create_embedding"
        inputs = embedding_input(input)
        check_embedding_model(model)
        self._check_open(method)
        try:
            request = parse_embedding_request({"input": inputs, "encoding_format": encoding_format,
                                               "dimensions": numpy_int(dimensions)})
        except ApiError as exc:
            raise _embedding_error(method, exc) from exc
        pooling = self._completer.defaults.pooling
        if pooling == "none":  # a vector per token is not OpenAI's answer (llama-server refuses it too)
            raise RequestError(method, "this model pools embeddings with 'none' (a vector per token), which OpenAI's "
                               "embeddings answer cannot carry", fix="load the bundle with pooling='last', 'mean' or "
                               "'cls', or call embed() for every token's vector")
        try:
            check_dimensions(request, embedding_width(self.manifest))  # before any input runs
        except ApiError as exc:
            raise _embedding_error(method, exc) from exc
        embeddings = self._embeddings(method, request.inputs, EmbeddingConfig(pooling=pooling, normalize=2),
                                      truncate=False)
        return self._call(method, lambda: openai_embeddings_body(embeddings, model or self.model_name, request))

    def embed(self, input: str | list, normalize: bool | int = False, truncate: bool = True,
              return_count: bool = False):
        """The embedding of ``input``, as llama-cpp-python's ``Llama.embed``: a list of floats for one text (or one
        list of token ids, or one list mixing token ids and texts, ``[1, "text"]``, which llama-server reads as one
        prompt), a list of them for a list of texts or of such lists (``[[1, "text"]]`` too); with
        ``load(..., pooling='none')`` each input gives a list of its tokens' vectors instead. ``return_count``
        returns ``(embeddings, tokens)``, the tokens read.

        ``normalize`` is False by default, as llama-cpp-python's: the vectors are returned as the model gives them,
        where llama-server and ``edgesdk embed`` (``--embd-normalize 2``) give unit vectors; True scales each to
        unit length, and a number is llama.cpp's ``--embd-normalize`` (-1 none, 0 max-abs scaled to int16, 1
        taxicab, 2 euclidean, > 2 p-norm). ``truncate`` (True, as llama-cpp-python's) embeds the first
        ``max_context`` tokens of a longer input, a text's end token that its tokenizer appends (an EOS or SEP) kept
        last, as Ollama keeps it (llama-cpp-python cuts it off); False refuses it. Each text is tokenized with the model's
        special tokens (a BOS where it has one) and pooled as :func:`load`'s ``pooling`` says (by default as the
        model declares, else mean).

        An empty list gives an empty list (``([], 0)`` with ``return_count``), as llama-cpp-python's ``embed([])``
        does: LangChain's ``LlamaCppEmbeddings.embed_documents`` and a vector store filled from no documents call it
        so. :meth:`create_embedding` refuses it, as OpenAI's ``/v1/embeddings`` does."""
        from edgesdk.runtime.embedding import EmbeddingConfig
        from edgesdk.serve.api import ApiError
        from edgesdk.serve.embeddings import embedding_inputs

        method = "embed"
        inputs = embedding_input(input)
        norm = embedding_norm(normalize)
        truncate, return_count = python_scalar(truncate), python_scalar(return_count)  # np.True_ is True
        check_embed_flags(truncate=truncate, return_count=return_count)
        self._check_open(method)
        if isinstance(inputs, list) and not inputs:  # no texts: no vectors
            return ([], 0) if return_count else []
        try:
            parsed = embedding_inputs(inputs)
        except ApiError as exc:
            raise _embedding_error(method, exc) from exc
        embeddings = self._embeddings(method, parsed, EmbeddingConfig(pooling=self._completer.defaults.pooling,
                                                                      normalize=norm), truncate)
        vectors = [embedding.vectors.tolist() for embedding in embeddings]
        output = vectors[0] if _one_embedding_input(inputs) else vectors
        return (output, sum(embedding.tokens for embedding in embeddings)) if return_count else output

    def perplexity(self, text: str, *, context: int | None = None, stride: int | None = None,
                   max_chars: int | None = None) -> float:
        """Perplexity of ``text`` through the bundle's runtime, as ``edgesdk eval --text`` measures it:
        windows of ``context`` tokens every ``stride`` (default: not overlapping), every token but each window's
        first scored, once (where windows overlap, the overlap is the later window's context, not scored again:
        edgesdk/evaluate.py ``windows``); ``max_chars`` scores only the text's first characters (default: all of it).
        ``context`` left out is 512, or the bundle's context (:attr:`max_context`) where that is shorter (a bundle
        built with ``--max-context 256``), as ``edgesdk eval`` with no ``--context`` scores it rather than refusing;
        a ``context`` passed longer than the bundle's is refused, not shortened.

        With ``load(..., watch_thermal=True)`` each window is a step of the thermal guard, as a prompt's prefill is
        in an answer: on a board past its hard limit the guard pauses before the next window until it has cooled
        (the figure stays the same), and :meth:`close` ends such a wait at once (a :class:`RequestError`, 503).

        The prompt cache is left as it was found: the KV cache the last answer left (what :meth:`save_prompt_cache`
        writes and the next turn reuses) is copied before the windows run on the backend and put back after them,
        as llama.cpp keeps a sequence's state aside (``llama_state_seq_get_data`` / ``set_data``). A backend that
        keeps no host copy of its cache (``tensorrt``) starts the next answer from an empty cache instead."""
        from edgesdk.evaluate import PerplexityConfig, bundle_perplexity

        # np.int64(512) is the whole number it holds, as the request fields' NumPy scalars are (python_scalar)
        context, stride, max_chars = map(python_scalar, (context, stride, max_chars))
        if context is None:  # the default: 512, or the bundle's shorter context, as edgesdk eval's (cli_eval.py)
            context = min(512, self.max_context)
        stride = context if stride is None else stride
        check_perplexity_arguments(text, context, stride, max_chars)
        self._check_open("perplexity")
        if context > self.max_context:  # as edgesdk eval refuses --context past the bundle's
            raise RequestError("perplexity", f"context is {context}, longer than the bundle's max_context "
                               f"{self.max_context}", param="context",
                               fix=f"pass context={self.max_context} or less")
        config = PerplexityConfig(context=context, stride=stride, max_chars=max_chars)
        hook = self._completer.hook  # the thermal guard's, with watch_thermal
        waits = hasattr(hook, "abandon_wait")

        def end_wait_when_closed() -> None:  # the guard asks after every chunk of a wait
            if self._completer.stopping:
                raise _closed_midway("perplexity")

        cache, backend = self._completer.prompt_cache, self.runtime.backend
        with self._completer.exclusive(keep_cache=True):  # the cache put back below, or started over
            self._check_open("perplexity")  # closed while it waited for its turn
            kept = None  # (tokens, KV state, whether a store holds it) of the last answer's cache, to put back
            if cache is not None and cache.tokens and len(cache.tokens) == backend.position and \
                    all(callable(getattr(backend, name, None)) for name in ("save_cache", "load_cache")):
                kept = (list(cache.tokens), backend.save_cache()[0], cache._live_saved)
            if waits:
                hook.abandon_wait = end_wait_when_closed
            try:
                return bundle_perplexity(self.runtime, text, config, hook=hook).perplexity
            except EdgeSDKError as exc:
                # a backend's failure (RuntimeBackendError ...), the model closed, a simulated board that never
                # cooled: as it is
                if type(exc) is not EdgeSDKError:
                    raise
                # evaluate's refusal of a text too short to score, whose fix names its command line's options
                raise RequestError("perplexity", exc.problem, param="text",
                                   fix="pass a longer text, or a larger max_chars") from exc
            finally:
                if waits:
                    hook.abandon_wait = None
                if kept is None and cache is not None:  # nothing to put back: the next prompt starts over
                    cache.forget()
                elif kept is None:
                    backend.reset()
                else:
                    try:
                        backend.reset()
                        backend.load_cache(kept[1])
                        cache.tokens, cache._live_saved = kept[0], kept[2]
                    except BaseException:  # a Ctrl-C inside the load: what the cache holds is unknown
                        cache.forget()
                        raise

    def save_prompt_cache(self, path: str | os.PathLike) -> int:
        """Write the KV cache the last answer left (its prompt and answer) and its token ids to ``path``; returns
        the number of tokens written.

        This is llama-cpp-python's ``Llama.save_state()`` kept in a file, and the file ``edgesdk run
        --prompt-cache FILE --prompt-cache-all`` writes after each answer (llama-cli's options of those names; without
        ``--prompt-cache-all`` run writes the prompt's cache alone, as llama-cli does):
        a later process (or another Model of the same bundle) loads it with :meth:`load_prompt_cache` and prefills
        only what its next prompt adds to the tokens it holds, so a long system prompt is not prefilled again after
        a restart. The two files are one format; each loads where the other was written. The write is atomic (a
        temporary file renamed over ``path``): a process killed while it writes leaves the previous file whole.

        It takes the model's turn, as an answer does: it waits for the answer generating (a stream read in another
        thread) and those asked before it, and writes the cache as that answer left it; the cache stays live for
        the next answer (a :meth:`perplexity` since leaves it as it was). Where the cache holds no tokens (nothing
        answered yet) nothing is written and an existing file is left as it is, as ``edgesdk run`` writes only after an answer.
        A path it must not write is refused and left as it is: a file marked read-only (``chmod a-w``, or one this
        user may not write, which ``edgesdk run --prompt-cache`` reads as ``--prompt-cache-ro``), a file that is no
        cache file (a mistyped path to a text of the user's), a directory, a FIFO or a device.
        Refused (:class:`~edgesdk.errors.EdgeSDKError`) where the model keeps no prompt cache
        (``load(..., prompt_cache=False)``) or its backend keeps no host copy of it, where it steers its power gates
        (``gating=True``, ``entropy_target``, ``compute_budget``: no answer reuses such a cache), and for a closed
        model."""
        from edgesdk.cli_prompt_cache import write_fix
        from edgesdk.runtime import cache_file

        path = self._cache_path("save_prompt_cache", path)
        with self._completer.exclusive(keep_cache=True):
            self._check_open("save_prompt_cache")  # closed while it waited for its turn
            cache = self._completer.prompt_cache
            # nothing answered, or a step that failed halfway (the backend's length is not the tokens listed, as
            # edgesdk run checks before it writes the cache of an answer Ctrl-C stopped)
            if not cache.tokens or len(cache.tokens) != self.runtime.backend.position:
                return 0
            _check_cache_target(path)
            try:
                cache_file.save(path, cache, self.runtime.bundle.bundle_id)
            except OSError as exc:
                raise EdgeSDKError(f"save_prompt_cache: cannot write the prompt cache {path} ({exc.strerror or exc})",
                                   write_fix(exc, path, another="a path")) from exc
            return len(cache.tokens)

    def load_prompt_cache(self, path: str | os.PathLike) -> LoadedPromptCache:
        """Put the KV cache :meth:`save_prompt_cache` (or ``edgesdk run --prompt-cache``) wrote at ``path`` into
        this model, in place of the one it holds: the next prompt that starts with its tokens prefills only what
        follows them (its answer's ``usage`` counts the rest as ``cached_tokens``), and answers as without it.

        Returns :class:`LoadedPromptCache` ``(tokens, refused)``: the tokens loaded, and why nothing was loaded.
        A missing file loads nothing and is no error (``refused`` None), as llama-cli's ``--prompt-cache`` takes
        a file that does not exist yet ("session file does not exist, will create"). A file written with another
        bundle, another edgesdk release or another backend, a damaged one, or one that does not fit this bundle's
        context, is not loaded and ``refused`` says why: where llama-cpp-python's ``load_state`` raises and
        llama-cli stops, this is what ``edgesdk run --prompt-cache`` does (it names the file and the next write
        replaces it), so a service whose edgesdk was upgraded starts with an empty cache rather than not at all.
        After a refusal the model's KV cache is empty.

        It takes the model's turn as :meth:`save_prompt_cache` does. Refused
        (:class:`~edgesdk.errors.EdgeSDKError`) where the model keeps no prompt cache or its backend keeps no host
        copy of it, where it steers its power gates, and for a closed model."""
        from edgesdk.runtime import cache_file

        path = self._cache_path("load_prompt_cache", path)
        with self._completer.exclusive(keep_cache=True):
            self._check_open("load_prompt_cache")  # closed while it waited for its turn
            cache = self._completer.prompt_cache
            cache.forget()  # the live cache is replaced, and stays empty where the file is refused
            try:
                tokens, refused = cache_file.load(path, cache, self.runtime.bundle.bundle_id)
            except BaseException:  # a Ctrl-C inside the backend's load: what its cache holds is unknown
                cache.forget()
                raise
            if not tokens:
                cache.forget()  # cache_file.load resets the backend to learn its cache's layout
            return LoadedPromptCache(tokens, refused)

    def close(self) -> None:
        """Stop taking requests and give back the thermal guard's sensors and clock cap. An answer generating
        (a stream read in another thread, or one nobody reads) ends at its next token and those waiting get a
        :class:`RequestError` (503); close returns once they have, so no step of theirs runs after the guard is given
        back (as ``edgesdk serve`` stops its answers before it closes its thermal session). A wait of the thermal
        guard (a pause on a board past its hard limit, which on a real board lasts until it has cooled, or pacing)
        ends at once, within the guard's poll interval (0.5 s), for an answer and for a perplexity alike (their
        callers get the 503), so close never waits for the board to cool. It does wait for the backend's step
        running (a token, a prompt's prefill), and for a perplexity being measured, whose remaining windows run to
        the end first unless the guard holds them. Then what the model holds is given back, as ``edgesdk serve``
        unloading a bundle gives it back: the prompt cache and the saved KV caches of other conversations, and the
        backend's (and a draft bundle's) session and buffers at once, as llama-cpp-python's ``Llama.close()`` frees
        its model, not when the last reference to this model goes: an ONNX Runtime session with the model's weights,
        TensorRT's device buffers and stream (its engine goes with the last reference)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._completer.close()  # the answers in flight and waiting end: their turns pass before this one
        except BaseException:  # a Ctrl-C while it waited for them: the guard is still held, and close() may be
            self._closed = False  # called again to give it back (new calls get the 503 of a model stopping)
            raise
        if self._release_guard is not None:
            self._release_guard()

    def __enter__(self) -> Model:
        """The model, open: a closed one is refused here (as ``with`` refuses a closed file), not at the block's
        first call, or never where the block only reads its notes or manifest."""
        self._check_open("with")
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Model({str(self.runtime.bundle.path)!r}, backend={self.runtime.backend.name!r})"

    # ---------------------------------------------------------------------------------------------------------

    def _open_draft(self, draft, config, threads, target, ignore_target):
        """The draft model of ``load(draft=...)``, or None with a note where this backend cannot check drafts."""
        from edgesdk.runtime.generate import can_draft
        from edgesdk.runtime.speculative import open_draft_model

        if not can_draft(self.runtime.backend):
            self.notes.append(f"draft: not used: the {self.runtime.backend.name} backend cannot check drafts; it "
                              "decodes token by token")
            return None
        model = open_draft_model(self.runtime, Path(draft), config, threads, target, ignore_target, terms="python")
        self.notes += [f"draft: {note}" for note in model.notes]
        return model

    def _cache_path(self, method: str, path: object) -> Path:
        """``path`` of :meth:`save_prompt_cache` / :meth:`load_prompt_cache`, once this model can keep its cache
        in a file."""
        from edgesdk.runtime.prompt_cache import steers_gates

        # "" (an unset variable's value) is no file: as a Path it is the working directory, which save would refuse
        # as "." and load would read as a directory that holds no cache
        if not isinstance(path, (str, os.PathLike)) or os.fspath(path) == "":
            raise RequestError(method, f"path is {shown(path)}; expected a file path (a non-empty str or a "
                               "pathlib.Path)",
                               param="path", fix=f"pass the cache file's path, e.g. model.{method}('prompt.cache')")
        self._check_open(method)
        backend = self.runtime.backend
        if self._completer.prompt_cache is None:
            raise EdgeSDKError(f"{method}: this model was loaded with prompt_cache=False: it keeps no KV cache "
                               "between answers to write or to load into",
                               "load the bundle without prompt_cache=False (edgesdk.load's default keeps it)")
        if not self._cache_file_fits:
            raise EdgeSDKError(f"{method}: the {backend.name} backend keeps no host copy of its KV cache (as NumPy "
                               "arrays) to write or to load into",
                               "load the bundle with an ONNX Runtime backend (backend='ort-cpu', 'ort-cuda' or "
                               "'ort-trt') to keep its cache in a file")
        if steers_gates(backend):  # as edgesdk run --gating leaves its --prompt-cache file (cli_prompt_cache.py)
            raise EdgeSDKError(f"{method}: this model steers its power gates (gating=True, entropy_target or "
                               "compute_budget): the gates decide the keys and values, and the controller's path no "
                               "later answer retraces, so no cache of it is reused; the file is left as it is",
                               "load the bundle without gating, entropy_target and compute_budget to keep its cache "
                               "in a file")
        return Path(path)

    def _gate_controller(self, method: str):
        """The gate controller of this open model's power gates, refused naming ``method`` where the bundle has no
        power gates or they are off."""
        self._check_open(method)
        backend = self.runtime.backend
        if not hasattr(backend, "configure"):
            raise EdgeSDKError(f"{method}: the bundle {self.runtime.bundle.path} has no power gates (no compute budget "
                               "or gate figures to set or read)",
                               "build the bundle with the power stage (edgesdk build --target T --recipe power, or "
                               "edgesdk.build_bundle(..., recipe='power')) and load that one")
        if not backend.gating:
            raise EdgeSDKError(f"{method}: this model's power gates are off (edgesdk.load without gating, "
                               "entropy_target or compute_budget): every FFN block runs and no compute budget acts",
                               "load the bundle with gating=True (or compute_budget=B) to turn the gates on")
        return backend.controller

    def _answer(self, method: str, parse: Callable[[object], object], body: dict, stream: bool):
        """The answer to ``body`` as the HTTP route whose parser is ``parse`` gives it: its body, or its chunks
        with ``stream``; a field the parser refuses or never reads is a :class:`RequestError` naming it. Its
        ``model`` is the request's where it names one, as llama-cpp-python's ``create_completion`` answers
        (``model if model is not None else self.model_path``) and :meth:`create_embedding` does here; else the
        bundle's."""
        from edgesdk.serve.openai_answer import whole_answer

        self._check_open(method)
        check_embedding_model(body.get("model"), method)  # a model that is no name: serve's 400, not the bundle's
        body = grammar_text(method, body)  # llama-cpp-python's LlamaGrammar: the GBNF text it keeps
        stream = python_scalar(stream)  # np.True_, as the other fields' NumPy scalars (json_arrays)
        if stream is None:  # every field's default, as the routes read JSON null (serve/api.py _common_fields)
            stream = False
        if not isinstance(stream, bool):
            raise RequestError(method, f"'stream' must be true or false, got {stream!r}", param="stream")
        fields = ReadFields({**logit_bias_keys(method, json_arrays(body)), "stream": stream})
        request = self._call(method, lambda: parse(fields))
        refuse_unread(method, fields)
        asked = body.get("model")
        model_name = asked if isinstance(asked, str) and asked else self.model_name
        if stream:
            return self._streamed(method, request, model_name)
        return self._call(method, lambda: whole_answer(self._completer, request, model_name,
                                                       self._completer.complete(request)))

    def _streamed(self, method: str, request, model_name: str) -> Iterator[dict]:
        """The chunks of a streamed answer, ``model_name`` their ``model``, generated by a worker thread as they are
        read. Closing the iterator (a ``break`` out of the loop that reads it) ends the generation at its next
        token, as a client that disconnects ends llama-server's. The worker runs at most :data:`STREAM_AHEAD`
        pieces ahead of the reader (:class:`_Chunks`): a stream whose reader stopped reading without closing it (a Ctrl-C in the loop's body
        while a variable or the traceback holds the iterator) stops generating there, as llama-cpp-python's
        generator does, until it is read, closed or collected, or until another call waits for the model's turn;
        then it generates on to its end, so the kept iterator still holds the whole answer."""
        from edgesdk.serve.openai_answer import StreamedAnswer

        # the template's refusal of the messages (rendered for the reasoning splitter and the tools' think block) is
        # the call's RequestError, as the answer's own refusals are
        answer = self._call(method, lambda: StreamedAnswer(self._completer, request, model_name))
        abandoned = threading.Event()
        completer = self._completer
        chunks = _Chunks(lambda: abandoned.is_set() or completer.stopping or completer.others_waiting)

        def work() -> None:
            try:
                completion = completer.complete(
                    request, on_text=lambda text, logprobs: chunks.put(answer.piece(text, logprobs)),
                    on_start=lambda: chunks.put(answer.opening()), client_gone=abandoned.is_set)
                # the turn has passed on: the last items wait for nobody
                chunks.put(answer.closing(completion), wait=False)
                chunks.put(_END, wait=False)
            except BaseException as exc:  # handed to the reader, who raises it
                chunks.put(exc, wait=False)

        def read() -> Iterator[dict]:
            worker = threading.Thread(target=work, name="edgesdk-answer", daemon=True)
            worker.start()
            try:
                while (item := chunks.get()) is not _END:
                    if isinstance(item, BaseException):
                        raise _request_error(method, item, self._built_context()) from item
                    yield from item
            finally:
                abandoned.set()
                chunks.wake()  # a worker waiting for this reader goes on, and the answer ends at its next token
                worker.join()

        return read()

    def _embeddings(self, method: str, inputs: tuple, config, truncate: bool) -> list:
        """The :class:`~edgesdk.runtime.embedding.Embedding` of each of ``inputs`` (texts or token id tuples), in
        one turn on the model as ``edgesdk serve`` makes them; refused in Python's terms where the backend gives
        no hidden states or an input is longer than the bundle's context."""
        from edgesdk.runtime.embedding import hidden_states_problem
        from edgesdk.serve.api import ApiError

        # the fix for this bundle, in load()'s terms: which backend embeds it, if any, is the bundle's
        problem = hidden_states_problem(self.runtime.backend, self.manifest, terms="python")
        if problem is not None:
            raise RequestError(method, problem.problem, status=501, fix=problem.fix)
        try:
            return self._completer.embed(inputs, config, truncate=truncate)
        except ApiError as exc:
            raise _embedding_error(method, exc) from exc

    def _call(self, method: str, action: Callable[[], object]):
        """``action()``, its API errors raised as :class:`RequestError` naming ``method`` and the field."""
        try:
            return action()
        except Exception as exc:
            raise _request_error(method, exc, self._built_context()) from exc

    def _built_context(self) -> int | None:
        """The context the bundle was built with where load()'s ``n_ctx`` holds the run below it (the backend's
        ``built_context``, :meth:`~edgesdk.runtime.session.Runtime.cap_context`); None where the run has it whole."""
        return getattr(self.runtime.backend, "built_context", None)

    def _check_open(self, method: str) -> None:
        """Refuse ``method`` on a closed model (503, as ``edgesdk serve`` answers once it stops)."""
        if self._closed:
            raise RequestError(method, "the model is closed", status=503, fix=CLOSED_FIX)


class _Chunks:
    """A streamed answer's items (lists of chunks, then the end or an error) passed from its worker to its reader.

    :meth:`put` waits while :data:`STREAM_AHEAD` items are unread, so the answer generates no further than that
    ahead of its reader (backpressure), unless ``go_on()`` says to generate without the reader: the iterator was
    closed (the answer ends at its next token), the model is closing, or another call waits for the model's turn,
    which the waiting worker holds (the caller may be the reader's own thread, which cannot read meanwhile)."""

    def __init__(self, go_on: Callable[[], bool]):
        self._items: deque = deque()
        self._changed = threading.Condition()
        self._go_on = go_on

    def put(self, item: object, wait: bool = True) -> None:
        if isinstance(item, list) and not item:  # text held back (a tag's or a tool call's possible start)
            return
        with self._changed:
            while wait and len(self._items) >= STREAM_AHEAD and not self._go_on():
                self._changed.wait(READER_POLL_S)  # go_on's causes notify nobody: asked again at each poll
            self._items.append(item)
            self._changed.notify_all()

    def get(self) -> object:
        with self._changed:
            while not self._items:
                self._changed.wait()
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def wake(self) -> None:
        """Have a waiting :meth:`put` ask ``go_on()`` again now."""
        with self._changed:
            self._changed.notify_all()


class LoadedPromptCache(NamedTuple):
    """What :meth:`Model.load_prompt_cache` loaded: ``tokens`` (0 where nothing was), and ``refused``, why a file
    that exists was not loaded (None where it was, or where there was no file)."""

    tokens: int
    refused: str | None


class RequestError(EdgeSDKError, ValueError):
    """A request field a :class:`Model` method cannot take (the HTTP API's 400), or a request it cannot answer
    now (``status``: 503 while the model stops); ``param`` names the field at fault. A 400 given no ``fix`` takes the
    one its message says (the routes' refusals end with what to do: "...; send true to ..."), cut from the message,
    else points to the README's section on the Python API (:func:`~edgesdk.api_checks.split_fix`): one fix for
    every refusal sent the user to the HTTP server's section, past the message's own words."""

    def __init__(self, method: str, message: str, param: str | None = None, status: int = 400, fix: str | None = None):
        self.method, self.param, self.status = method, param, status
        field = f" ({param})" if param else ""
        if fix is None and status == 400:
            message, fix = split_fix(message)
            fix = fix or REQUEST_FIX
        super().__init__(f"{method}{field}: {message}", fix)


def override_items(overrides: Mapping[str, object] | Iterable[str] | str) -> tuple[str, ...]:
    """``build_bundle``'s ``overrides`` as ``--set`` items: a mapping's values written as JSON, which the recipe
    reads as YAML, so None, tuples and strings keep their meaning (``str()`` gave 'None' and '(1, 2)'), and a NumPy
    scalar is the number it holds (:func:`~edgesdk.api_checks.json_arrays`; ``default=str`` wrote ``np.int64(100)``
    as the string "100")."""
    if isinstance(overrides, Mapping):
        items = tuple(f"{key}={json.dumps(json_arrays(value), default=str)}" for key, value in overrides.items())
    elif isinstance(overrides, str):
        items = (overrides,)
    else:
        items = tuple(overrides) if isinstance(overrides, Iterable) and not isinstance(overrides, bytes) else None
    if items is None or not all(isinstance(item, str) for item in items):
        wrong = (f"is {shown(overrides)}" if items is None else
                 f"holds {shown(next(item for item in items if not isinstance(item, str)))}")
        raise EdgeSDKError(f"build_bundle(): overrides {wrong}; expected a mapping "
                           "{'stage.field': value} or --set's 'stage.field=value' strings",
                           "pass e.g. overrides={'prune.ffn_ratio': 0.5} or overrides=['prune.ffn_ratio=0.5']")
    return items


def build_bundle(target: str, model: str | None = None, *, out: str | Path | None = None, recipe: str | None = None,
                 max_context: int = 4096, data: str | os.PathLike | Iterable[str | os.PathLike] = (),
                 data_skip_chars: int = 0,
                 generated_sequences: int = 32, overrides: Mapping[str, object] | Iterable[str] = (),
                 weight_bits: int | None = None, lora: str | os.PathLike | tuple | Mapping | Iterable | None = None,
                 resume: bool = False, keep_work: bool = False, progress: bool = True) -> Path:
    """Build a bundle for the board ``target`` from ``model`` (an alias, a Hugging Face directory or a GGUF file;
    default SmolLM2-135M-Instruct), as ``edgesdk build`` does with the options of the same names, and return its
    directory. ``overrides`` change the recipe: ``{"prune.ffn_ratio": 0.5}`` or ``["prune.ffn_ratio=0.5"]``
    (``--set``). ``data``: the training text, one file or several (``--data``). Host only: it needs
    ``edgesdk[host]`` (torch, transformers, onnx), and without them raises EdgeSDKError naming those missing.

    ``lora``: LoRA adapters (a PEFT adapter directory or a GGUF LoRA adapter each) merged into the model's weights
    at build time, before any stage, as ``--lora`` / ``--lora-scaled`` do: the bundle computes the fine-tuned model
    and runs no adapter (llama-cpp-python's ``lora_path`` / ``lora_scale`` apply one when the model loads). One
    path (scale 1), a ``(path, scale)`` pair, a mapping ``{path: scale}``, or a list whose items are paths or
    ``(path, scale)`` pairs; a path is a str or a ``pathlib.Path``, a scale a finite number. The adapters merge in
    the order given, and the manifest records each with its scale."""
    from edgesdk.cli_build import host_modules

    with host_modules("build_bundle()"):  # on a board's install: the missing host modules named, not a traceback
        from edgesdk.build.pipeline import BuildConfig
        from edgesdk.build.pipeline import build as run_build
        from edgesdk.compress.data import DataConfig
        from edgesdk.export.onnx_export import ExportConfig
        from edgesdk.models.sources import DEFAULT_MODEL

    # np.int64(16) and np.True_ are the int and bool they hold, as load()'s arguments and the request fields read them
    max_context, data_skip_chars, generated_sequences, weight_bits, resume, keep_work, progress = map(
        python_scalar, (max_context, data_skip_chars, generated_sequences, weight_bits, resume, keep_work, progress))
    # one file given alone is that file, as --data FILE: a str iterated gave a "file" per character
    target, model, recipe, files = build_arguments(
        target, model, out, recipe, data,
        {"max_context": max_context, "data_skip_chars": data_skip_chars, "generated_sequences": generated_sequences,
         "weight_bits": weight_bits}, {"resume": resume, "keep_work": keep_work, "progress": progress})
    changes = override_items(overrides)
    adapters = _lora_adapters(lora)
    data_config = DataConfig(files=files, skip_chars=data_skip_chars,
                             generated_sequences=generated_sequences)
    if data_skip_chars and not data_config.files:  # as edgesdk build warns of --data-skip-chars without --data
        import warnings

        warnings.warn(f"build_bundle(): data_skip_chars={data_skip_chars} is not used: it leaves out the head of "
                      "each data file, and no data is given", UserWarning, stacklevel=2)
    config = BuildConfig(target=target, model=model or DEFAULT_MODEL, out=None if out is None else Path(out),
                         recipe=recipe, overrides=changes, data=data_config, weight_bits=weight_bits,
                         export=ExportConfig(max_context=max_context), resume=resume, keep_work=keep_work,
                         progress=progress, adapters=adapters, terms="python")  # errors name these arguments
    return run_build(config).path


LORA_FORMS = ("a path (a str or a pathlib.Path) to a PEFT adapter directory or a GGUF LoRA adapter, a (path, scale) "
              "pair, a mapping {path: scale}, or a list of paths and (path, scale) pairs")


def _lora_adapters(lora) -> tuple:
    """build_bundle's ``lora`` as the build's adapters (edgesdk.models.lora.LoraAdapter), in the order given, each
    path checked as ``--lora`` checks it (edgesdk.models.lora.check_adapter) before the model loads; a form or a
    scale it cannot take raises naming ``lora``, the value and the forms it takes."""
    from numbers import Real

    from edgesdk.errors import ModelSourceError
    from edgesdk.models.lora import LoraAdapter, check_adapter

    def path_of(value, where: str) -> str:
        if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
            text = os.fspath(value)
            if isinstance(text, str) and text:
                return text
        raise EdgeSDKError(f"build_bundle(): {where} is {shown(value)}; expected a path (a non-empty str or a "
                           "pathlib.Path) to a PEFT adapter directory or a GGUF LoRA adapter",
                           f"pass lora as {LORA_FORMS}")

    def scale_of(value, where: str) -> float:
        if isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise EdgeSDKError(f"build_bundle(): {where} is {shown(value)}; expected a finite number (the adapter's "
                           "scale, as --lora-scaled ADAPTER SCALE takes it; 1 merges the adapter as trained)",
                           f"pass lora as {LORA_FORMS}")

    def pair(value, where: str) -> LoraAdapter:
        return LoraAdapter(path_of(value[0], f"{where}[0]"), scale_of(value[1], f"{where}[1]"))

    def a_scale(value) -> bool:
        """A number, or a str that reads as one ("0.5": a scale given as text, refused as a scale by scale_of)."""
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                return False
            return True
        return isinstance(value, Real) and not isinstance(value, bool)

    if lora is None:
        return ()
    if isinstance(lora, (str, os.PathLike)):
        adapters = [LoraAdapter(path_of(lora, "lora"))]
    elif isinstance(lora, tuple) and len(lora) == 2 and a_scale(lora[1]):
        adapters = [pair(lora, "lora")]  # one (path, scale) pair: llama-cpp-python's lora_path with lora_scale
    elif isinstance(lora, Mapping):
        adapters = [LoraAdapter(path_of(path, f"lora key {shown(path)}"), scale_of(scale, f"lora[{shown(path)}]"))
                    for path, scale in lora.items()]
    elif isinstance(lora, Iterable) and not isinstance(lora, bytes):
        adapters = []
        for index, item in enumerate(lora):
            where = f"lora[{index}]"
            if isinstance(item, (tuple, list)):
                if len(item) != 2:
                    raise EdgeSDKError(f"build_bundle(): {where} is {shown(item)}; expected a path or a (path, "
                                       f"scale) pair, not {len(item)} items", f"pass lora as {LORA_FORMS}")
                adapters.append(pair(item, where))
            else:
                adapters.append(LoraAdapter(path_of(item, where)))
    else:
        raise EdgeSDKError(f"build_bundle(): lora is {shown(lora)}; expected {LORA_FORMS}",
                           "pass e.g. lora='adapter-dir', lora=('adapter.gguf', 0.5) or "
                           "lora=['a-dir', ('b.gguf', 0.5)]")
    for adapter in adapters:  # --lora's checks, in build_bundle's words
        try:
            check_adapter(adapter)
        except ModelSourceError as exc:
            problem = exc.problem.replace(adapter.named, f"build_bundle(): lora {adapter.path!r}", 1)
            fix = (exc.fix or "").replace("with --model", "as model").replace("with --lora", "in lora")
            raise ModelSourceError(problem, fix) from exc
    return tuple(adapters)


def _draft_config(draft, draft_max, draft_min, draft_p_min, settings: dict):
    """:func:`load`'s ``draft``, ``draft_max``, ``draft_min`` and ``draft_p_min`` as the draft's configuration
    (:class:`~edgesdk.runtime.speculative.DraftConfig`: ``max_draft``, ``min_draft``, ``p_min``, as
    ``cli_options.draft_model`` builds it from ``--draft-max``, ``--draft-min``, ``--draft-p-min``), or refused
    naming the argument."""
    from edgesdk.runtime.speculative import DraftConfig

    if not a_path(draft):  # "" was read as the working directory, named "."
        raise EdgeSDKError(f"load(): draft={shown(draft)}: expected a draft bundle's directory (a non-empty str or a "
                           "pathlib.Path)", "pass the folder of a bundle built from a smaller model of this "
                           "bundle's family, or leave draft out")
    if settings.get("lookup"):
        raise EdgeSDKError("load(): draft and lookup both draft tokens", "pass one of them")
    try:
        return DraftConfig(**({} if draft_max is None else {"max_draft": draft_max}),
                           **({} if draft_min is None else {"min_draft": draft_min}),
                           **({} if draft_p_min is None else {"p_min": draft_p_min}))
    except ValueError as exc:
        problem = str(exc).replace("max_draft", "draft_max").replace("min_draft", "draft_min")
        raise EdgeSDKError(f"load(): {problem.replace('p_min', 'draft_p_min')}",
                           "pass draft_max, draft_min (at most draft_max, whose default is 2) and draft_p_min in "
                           "those ranges, or leave them out") from exc


# a fix's words for run's command-line options -> the load() arguments that make the same choice
PYTHON_TERMS = {"pass --ignore-target": "pass ignore_target=True", "pass --backend ort-cpu": "pass backend='ort-cpu'"}


def _hold_context(runtime, context: int) -> None:
    """Hold ``runtime`` to load()'s ``n_ctx`` of ``context`` tokens (:meth:`Runtime.cap_context`, as open_runtime's
    ``context`` holds it), or refuse a context past the bundle's naming the build that holds it, in Python's words
    (the runtime's own refusal names the command line's). The cap is recorded as n_ctx's, so that a refusal past it
    names n_ctx, not the command line's -c, which a Python caller never passed."""
    from edgesdk.bundle import rebuild_with

    built = int(runtime.backend.max_context)
    if context > built:
        raise EdgeSDKError(f"load(): n_ctx={context} is more than the {built} tokens of context bundle "
                           f"{runtime.bundle.path} was built with",
                           f"pass n_ctx={built} or less (0: the bundle's), or {rebuild_with(context, 'python')}")
    runtime.cap_context(context, "n_ctx")


def _in_python_terms(exc: EdgeSDKError) -> EdgeSDKError:
    """``exc`` with its fix naming load()'s arguments where it names the command line's options (a bundle built
    for another board, no backend that runs here); the same error where it names none."""
    fix = exc.fix or ""
    for option, argument in PYTHON_TERMS.items():
        fix = fix.replace(option, argument)
    if fix == (exc.fix or ""):
        return exc
    return type(exc)(exc.problem, fix)


def _check_cache_target(path: Path) -> None:
    """Refuse to write the prompt cache over ``path`` where ``edgesdk run --prompt-cache`` leaves it as it is
    (edgesdk/cli_prompt_cache.py): a file marked read-only, which the write (a new file renamed over it) replaced
    and kept read-only; a file that is no cache file (:func:`edgesdk.runtime.cache_file.foreign`), which it
    destroyed; and a directory, a FIFO or a device (:func:`edgesdk.runtime.cache_file.not_a_file`)."""
    from edgesdk.cli_prompt_cache import read_only_file
    from edgesdk.runtime.cache_file import foreign, not_a_file

    where = f"save_prompt_cache: the prompt cache {path}"
    if read_only_file(path):
        what, fix = _why_read_only(path)
        raise EdgeSDKError(f"{where} {what} and is left as it is", fix)
    kind = not_a_file(path)
    if kind is not None:
        fix = (f"pass the path of a file in it ({path / 'prompt.cache'})" if kind == "a directory" else
               "pass the path of a regular file (or of a new one)")
        raise EdgeSDKError(f"{where} is {kind}, not a file a cache can be written to", fix)
    why = foreign(path)
    if why is not None:
        raise EdgeSDKError(f"{where} is not a prompt cache file: {why}; it is left as it is",
                           "pass the path of a cache file (or of a new one), or remove that file if it is yours to lose")


def _why_read_only(path: Path) -> tuple[str, str]:
    """What the read-only cache file at ``path`` is (edgesdk/cli_prompt_cache.py ``unwritable_cause``: no write bit
    for anyone, a read-only file system, this user's own file without its owner's bit, another user's file), and
    the Python API's fix."""
    from edgesdk.cli_prompt_cache import unwritable_cause

    cause, what = unwritable_cause(path)
    fixes = {"read-only": f"make it writable (chmod u+w {path}), or pass another path",
             "read-only-fs": "pass a path on a writable file system, or remount this one read-write",
             "owner-bit": f"make it writable (chmod u+w {path}), or pass another path",
             "other-user": "have its owner let this user write it, or pass a path of this user's"}
    return what, fixes[cause]


def _request_error(method: str, exc: BaseException, built: int | None = None) -> BaseException:
    """The error a :class:`Model` method raises for ``exc``: the HTTP API's errors (``ApiError``) as a
    :class:`RequestError` naming ``method`` and the field, its fix the route's own (``exc.fix``), else the message's
    where it says what to do (:func:`split_fix`), anything else as it is. ``built``: the bundle's context where
    load()'s ``n_ctx`` holds the run below it, which a prompt past the run's context names (:func:`_too_long`)."""
    from edgesdk.serve.api import ApiError

    if isinstance(exc, ApiError) and exc.code == "server_stopping":  # Completer.stop(): close() was called
        return _closed_midway(method)
    if isinstance(exc, ApiError) and exc.code == "server_busy":  # its message names serve's option
        return RequestError(method, "the model is busy: one answer is generating and as many calls as its "
                            "max_waiting setting allows wait behind it", status=503,
                            fix="retry later, or load the model with a larger max_waiting (8 by default)")
    # a field of the other method, which the route refuses naming HTTP routes (/infill, /v1/chat/completions)
    other = other_method_refusal(method, exc.param) if isinstance(exc, ApiError) and \
        exc.code == "unsupported_parameter" else None
    if other is not None:
        return other
    too_long = isinstance(exc, ApiError) and exc.code == "context_length_exceeded"
    if too_long and exc.param in ("prompt", "messages", "suffix"):  # the suffix of a fill-in-the-middle prompt
        return _too_long(method, exc, built)
    refused = getattr(exc, "template_refusal", None)  # the chat template's own refusal: its fix in Python's words
    if isinstance(exc, ApiError) and refused is not None:
        from edgesdk.runtime.text import template_refusal_fix

        return RequestError(method, refused[0], param=exc.param, status=exc.status,
                            fix=template_refusal_fix(refused[1], "python"))
    if isinstance(exc, ApiError) and exc.fix is not None:  # the route's own fix, which its message ends with
        return RequestError(method, drop_fix(exc.message, exc.fix), param=exc.param, status=exc.status, fix=exc.fix)
    if isinstance(exc, ApiError):
        return RequestError(method, exc.message, param=exc.param, status=exc.status)
    return exc


def _too_long(method: str, exc, built: int | None = None) -> RequestError:
    """A prompt past the bundle's context, in Python's terms: the route's message names its HTTP route to count
    tokens (POST /tokenize) and the command line's build ('edgesdk build --max-context N'), and a generic fix says
    nothing of what to do. Where the refusal carries its facts (``context``: the
    prompt's tokens, the bundle's context and the model's max_position_embeddings, edgesdk.bundle.model_positions;
    ``headline``: the route's message before its fix), message and fix name the max_context to build the bundle
    again with, the most the model allows, or say that no build holds more: edgesdk.bundle.context_fix's words for
    the command line, in build_bundle's terms. ``built``: the bundle's context where load()'s ``n_ctx`` holds the
    run below it: loading with a larger n_ctx comes first (a rebuild to the context the bundle has already was named
    where the refusal did not know it)."""
    from edgesdk.bundle import context_fix

    shorten = (f"shorten the {exc.param} (model.tokenize(text) counts a text's tokens, model.n_ctx() is the "
               "context)")
    tokens, limit, positions = getattr(exc, "context", None) or (None, None, None)
    fix = context_fix(shorten, limit, positions, tokens, terms="python", built=built)
    headline = getattr(exc, "headline", None)
    message = f"{headline}: {fix}" if headline else exc.message.replace("POST /tokenize", "tokenize()")
    return RequestError(method, message, param=exc.param, fix=fix)


def _closed_midway(method: str) -> RequestError:
    """The error of a call that :meth:`Model.close` ended while it waited or ran (503, as ``edgesdk serve``'s
    ``server_stopping``)."""
    return RequestError(method, "the model was closed while this request waited or generated", status=503,
                        fix=CLOSED_FIX)


EMBEDDING_INPUT_FIX = ("pass a str, a list of str, token ids (a list of ints, as tokenize returns them) or a list of "
                       "such lists")


def _one_embedding_input(inputs: object) -> bool:
    """Whether :meth:`Model.embed`'s ``inputs`` (checked by ``embedding_inputs``) are one input, answered with its
    vector, rather than a list of inputs, answered with a list of vectors: a text, an array of token ids, or an
    array mixing token ids and texts (``[1, "text"]``), which llama-server's ``tokenize_input_prompts``
    (tools/server/utils.hpp) reads as one prompt."""
    from edgesdk.serve.api import is_mixed_prompt

    if isinstance(inputs, str) or is_mixed_prompt(inputs):
        return True
    return isinstance(inputs, list) and not any(isinstance(item, (str, list)) for item in inputs)


def _embedding_error(method: str, exc: BaseException) -> BaseException:
    """The error :meth:`Model.embed` / :meth:`Model.create_embedding` raise for ``exc``: an input past the bundle's
    context names ``truncate``, another refused input names the input forms these methods take; anything else as
    :func:`_request_error` gives it."""
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.completion import EMPTY_INPUT, NOT_UTF8, TOKEN_OUT_OF_VOCABULARY

    if not isinstance(exc, ApiError) or exc.status != 400 or not (exc.param or "").startswith("input"):
        return _request_error(method, exc)
    if exc.code == "context_length_exceeded":
        fix = ("pass truncate=True to embed its first max_context tokens, or shorten it" if method == "embed" else
               "shorten it or split it into passages, or call embed(..., truncate=True) for its first max_context "
               "tokens")
    else:
        fix = {EMPTY_INPUT: "pass a non-empty text or list of token ids",
               TOKEN_OUT_OF_VOCABULARY: "pass token ids the model's vocabulary holds (tokenize() gives them)",
               NOT_UTF8: "pass text that is valid UTF-8 (no lone surrogates)"}.get(exc.code, EMBEDDING_INPUT_FIX)
    # the route's own fix, which its message ends with, dropped: the caller reads one fix, the Python one
    return RequestError(method, drop_fix(exc.message, exc.fix), param=exc.param, fix=fix)


def _unused_settings(settings: dict, backend: str, completer) -> list[str]:
    """Notes for settings given that change nothing here, as ``edgesdk serve`` says of its options: ``lookup`` on
    a backend that cannot check drafts (one that cannot rewind its KV cache, or steps a power controller with every
    decode: it decodes token by token, as ``draft`` there notes), ``cache_ram_mib`` with ``prompt_cache=False``."""
    notes = []
    if settings.get("lookup") and completer.lookup is None:
        notes.append(f"lookup: not used: the {backend} backend cannot check drafts; it decodes token by token")
    if "cache_ram_mib" in settings and settings.get("prompt_cache") is False:
        notes.append("cache_ram_mib: not used: prompt_cache=False keeps no KV cache between answers")
    return notes


def _with_model_defaults(defaults, settings: dict, manifest: dict, notes: list[str]):
    """``defaults`` with the model's own sampling settings (the bundle's ``generation`` section) for each sampling
    setting not among ``settings``, as ``edgesdk serve`` takes them for the options not given (llama.cpp's
    common_init_sampler_from_model); a note says which."""
    from edgesdk.models.generation_defaults import with_model_defaults

    defaults, line = with_model_defaults(defaults, manifest, lambda name: name in settings, "temperature=0")
    if line is not None:
        notes.append(line)
    return defaults


def _configure_gates(backend, gates: dict, bundle: object) -> None:
    """Set a power-gated ``backend``'s gates from :func:`load`'s ``gating``, ``entropy_target`` and
    ``compute_budget`` (``gates``) as ``edgesdk run`` sets them from its options of those names
    (:func:`~edgesdk.api_checks.configure_gates`); one that cannot apply is refused naming it, and ``bundle`` (its
    path) where it has no gates."""
    try:
        configure_gates(backend, gates["entropy_target"], gates["compute_budget"], gates["gating"], terms="python",
                        bundle=bundle)
    except GateArgumentError as exc:
        raise EdgeSDKError(f"load(): {exc.argument}={shown(gates[exc.argument])}: {exc}",
                           GATE_FIXES[exc.argument]) from exc


def _open_guard(runtime, notes: list[str]):
    """The thermal guard of ``edgesdk run --watch-thermal`` for ``runtime``'s board, with the bundle's power gate
    and model facts as ``run`` hands them over (:func:`~edgesdk.thermal.watch.bundle_gate`): its notes go to
    ``notes``. A power-gated bundle whose gates are off (:func:`load` without ``gating``, ``entropy_target`` or
    ``compute_budget``) is paced by its guard, which a note says."""
    from edgesdk.profile import bundle_profile
    from edgesdk.thermal.cpufreq import recover_left_cap
    from edgesdk.thermal.watch import GATES_OFF, bundle_gate, open_session

    profile = bundle_profile(runtime.bundle.manifest["target"], runtime.bundle.path)  # before any clock is touched
    notes += recover_left_cap()
    gate = bundle_gate(runtime)
    if gate.gates_off:
        notes.append(f"watch_thermal: {GATES_OFF} (load() runs them off unless asked; gating=True turns them on, "
                     "as edgesdk run's or serve's --gating)")
    session = open_session(profile, guard=True, status=False, warn=notes.append, budget_target=gate.budget_target,
                           model_facts=gate.model_facts)
    notes += session.notes
    return session


__all__ = ["LoadedPromptCache", "Model", "RequestError", "build_bundle", "load"]


def _token_of(tokenizer, text: str | None) -> int:
    """The id of the special token written ``text`` (the manifest's ``bos_token``), -1 where there is none, as
    llama.cpp's ``llama_vocab_bos`` / ``llama_vocab_eos`` give LLAMA_TOKEN_NULL."""
    token = tokenizer.token_id(text) if isinstance(text, str) and text else None
    return -1 if token is None else int(token)


def _newline_token(tokenizer) -> int:
    """llama.cpp's ``linefeed_id`` (src/llama-vocab.cpp): the token of the byte ``\\n`` (SentencePiece's ``<0x0A>``,
    byte-level BPE's ``Ċ``), else the first token of ``"\\n"`` tokenized as plain text; -1 where neither is."""
    try:
        table = tokenizer.token_bytes()
    except EdgeSDKError:  # a tokenizer whose token bytes cannot be read
        table = []
    token = next((index for index, piece in enumerate(table) if piece == b"\n"), None)
    if token is None:
        ids = tokenizer.plain_text().encode("\n", add_special_tokens=False).ids
        token = ids[0] if ids else -1
    return int(token)


def _token_text(tokenizer, tokens: tuple[int, ...], special: bool, bos: int) -> bytes:
    """llama-cpp-python's ``LlamaModel.detokenize`` (llama_cpp/_internals.py): each token's bytes as llama.cpp's
    ``llama_token_to_piece(lstrip=0, special)`` gives them (a special token's text only with ``special``, an
    ordinary added token's always; a control token llama.cpp's vocab loader makes of a token the model marks not
    special, such as Qwen2.5-Coder's ``<|fim_middle|>``, counts as special), joined, and one leading space dropped
    where the first token is the BOS. A tokenizer whose token bytes cannot be read (neither byte-level nor
    SentencePiece) is decoded as text."""
    try:
        table = tokenizer.token_bytes()
    except EdgeSDKError:
        if not special:  # special and control tokens left out, as the answer's text leaves them out
            return tokenizer.decode(list(tokens)).encode("utf-8")
        return tokenizer.tokenizer.decode(list(tokens), skip_special_tokens=False).encode("utf-8")
    control = tokenizer.control_ids()
    pieces = []
    for token in tokens:
        piece = table[token] if token < len(table) and token not in control else None
        if piece is None:  # a special token (or an id the table lacks): its text, with special=True
            piece = (tokenizer.tokenizer.id_to_token(token) or "").encode("utf-8") if special else b""
        pieces.append(piece)
    output = b"".join(pieces)
    return output[1:] if tokens and tokens[0] == bos and output[:1] == b" " else output
