"""Speculative decoding with a draft model: a small bundle guesses the next tokens, the large one checks them.

A draft model that shares the target's tokenizer (a smaller model of the same family, or the same
model quantized harder) decodes a few tokens greedily; the target checks all of them in one forward
pass over ``k + 1`` positions (:func:`~edgesdk.runtime.generate.generate`, the same check as prompt
lookup decoding, :mod:`edgesdk.runtime.lookup`). The target picks each token from its own logits as
it would token by token, and a drafted token is kept while it equals that pick, so the answer is
exactly the one without a draft, greedy or sampled (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", with the draft's distribution taken as a point mass on its
greedy token). On a board a decode step is bound by reading the weights, so a pass over ``k + 1``
positions costs little more than one, and every accepted token saves a target step for the cost of a
draft step. This is llama.cpp's ``--model-draft`` (``-md``) with ``--draft-max``, ``--draft-min`` and
``--draft-p-min``: drafting stops at a token the draft model gives less than ``p_min`` probability among its
``DRAFT_TOP_K`` most likely tokens, as llama.cpp measures it (:func:`top_probability`).

The draft's vocabulary is checked as llama.cpp's ``common_speculative_are_compatible`` checks it
(:func:`vocab_mismatch`): the same one, or one up to 128 tokens larger or smaller with the same texts over the ids
both have (a fine-tune with added tokens and its base model). An id the bundle has no token for, or whose text
differs, is never proposed, and a text holding an id the draft model has no row for is not drafted for.

The draft model keeps its own KV cache across checks and answers: before each draft it is rewound to
the longest prefix it shares with the text so far, and only what follows is prefilled.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.backend import DecoderBackend, close_backend
from edgesdk.runtime.lookup import MAX_DRAFT
from edgesdk.runtime.prompt_cache import common_prefix_length

# llama.cpp's LLAMA_DRAFT_TOP_K: the draft model's sampler chain keeps its 10 most likely tokens (common/speculative.cpp)
DRAFT_TOP_K = 10


def top_probability(logits: np.ndarray, top_k: int = DRAFT_TOP_K) -> float:
    """The most likely token's probability in a softmax over the ``top_k`` largest logits alone: what llama.cpp's
    drafting compares with ``p_min``. Its draft sampler chain is top-k then dist, whose softmax renormalises over
    the candidates top-k kept, and the draft stops where ``cur_p->data[0].p < p_min`` (common/speculative.cpp,
    the draft-simple drafter; ``common_speculative_gen_draft`` in older releases)."""
    values = np.asarray(logits, np.float64)
    if values.shape[0] > top_k:
        values = np.partition(values, values.shape[0] - top_k)[values.shape[0] - top_k:]
    return 1.0 / float(np.exp(values - values.max()).sum())


@dataclass(frozen=True)
class DraftConfig:
    """How many tokens a draft may hold and when drafting stops early."""

    # draft tokens checked at once (llama.cpp's --draft-max; 2 gave the best rate of 2-8 on the SmolLM2 pair measured)
    max_draft: int = 2
    # stop drafting at a token the draft model is less sure of among its DRAFT_TOP_K most likely tokens (llama.cpp's
    # --draft-p-min, measured as llama.cpp does: top_probability); 0: draft always
    p_min: float = 0.0
    # the fewest tokens a draft is checked with (llama.cpp's --draft-min / --draft-n-min, default 0): a shorter draft
    # is dropped and the step decodes one token, as llama-server ignores a draft under n_min and does not draft where
    # no more than that fits (the context's or the answer's end, tools/server: "the max possible draft is too small")
    min_draft: int = 0

    def __post_init__(self):
        # any whole number (numpy's too, as SamplingConfig takes them), kept as a Python int
        if isinstance(self.max_draft, bool) or not isinstance(self.max_draft, Integral) or \
                not 1 <= self.max_draft <= MAX_DRAFT:
            raise ValueError(f"max_draft must be a whole number from 1 to {MAX_DRAFT}, got {self.max_draft!r}")
        # a value that is not a number ended in Python's own TypeError on the comparison, naming no field
        if isinstance(self.p_min, bool) or not isinstance(self.p_min, Real) or not 0.0 <= self.p_min < 1.0:
            raise ValueError(f"p_min must be in [0, 1), got {self.p_min!r}")  # NaN fails this too
        # above max_draft no draft could be taken: refused rather than quietly drafting for nothing (llama-server
        # lowers a request's n_min to n_max)
        if isinstance(self.min_draft, bool) or not isinstance(self.min_draft, Integral) or \
                not 0 <= self.min_draft <= self.max_draft:
            raise ValueError(f"min_draft must be a whole number from 0 to max_draft ({self.max_draft}), got "
                             f"{self.min_draft!r}")
        object.__setattr__(self, "max_draft", int(self.max_draft))
        object.__setattr__(self, "p_min", float(self.p_min))
        object.__setattr__(self, "min_draft", int(self.min_draft))


class DraftModel:
    """A draft backend and the token ids its KV cache holds; :meth:`drafter` starts the drafts of one answer."""

    def __init__(self, backend: DecoderBackend, config: DraftConfig = DraftConfig(), vocab_size: int | None = None,
                 foreign: frozenset[int] = frozenset()):
        if not callable(getattr(backend, "rewind", None)):
            raise ValueError(f"the draft model's {backend.name} backend cannot rewind its KV cache, which drafting "
                             "needs after each check")
        self.backend, self.config = backend, config
        self.vocab_size = vocab_size  # the target's: a drafted id past it ends the draft
        # ids below it whose text differs between the two vocabularies (:func:`vocab_mismatch` lets ids under
        # SPEC_VOCAB_CHECK_START_TOKEN_ID differ): drafting such an id ends the draft too
        self.foreign = frozenset(foreign)
        # The draft model's own rows: a text holding an id past them (a bundle whose vocabulary is padded wider than
        # the draft's, sampling one of its extra ids) is one the draft model cannot read, so it is not drafted for.
        self.rows: int | None = getattr(backend, "vocab_size", None)
        self.cached: list[int] = []  # what the draft backend's KV cache holds
        # why its backend was or was not used, its threads, a target note (the draft runtime's notes, as
        # :func:`open_draft_model` opened it): for --stats and Model.notes, as the bundle's own are there
        self.notes: list[str] = []
        self.drafted = 0  # tokens drafted over this model's life (statistics)

    def drafter(self, prompt_ids, config: DraftConfig | None = None) -> ModelDrafter:
        """The drafts of one answer after ``prompt_ids``, with ``config`` in place of the model's own for that answer
        alone (a request's speculative.n_max, n_min and p_min on edgesdk serve, as llama-server takes them)."""
        return ModelDrafter(self, prompt_ids, config)

    def logits_after(self, tokens: list[int]) -> np.ndarray:
        """The draft model's next-token logits (vocab,) after ``tokens``, prefilling only what its cache lacks."""
        backend = self.backend
        if len(self.cached) != backend.position:  # a step failed halfway: what the cache holds is unknown
            self.cached = []
            backend.reset()
        keep = min(common_prefix_length(self.cached, tokens), len(tokens) - 1)  # the last token is run for its logits
        if keep < len(self.cached):
            if keep > 0:
                backend.rewind(keep)
            else:
                backend.reset()
            self.cached = self.cached[:keep]
        rows = backend.prefill(np.asarray(tokens[keep:], np.int64), keep_logits=1)  # (1, vocab)
        self.cached = list(tokens)
        return rows[-1]


class ModelDrafter:
    """One answer's text so far (prompt and tokens taken), and drafts of what follows it; the interface
    :func:`~edgesdk.runtime.generate.generate` drives (``push``, ``draft``), as :class:`NgramDrafter`'s."""

    def __init__(self, model: DraftModel, tokens, config: DraftConfig | None = None):
        self.model = model
        self.config = model.config if config is None else config  # this answer's draft settings
        self.tokens = [int(token) for token in tokens]
        # an id the draft model has no row for: its prefill would fail (ONNX Runtime's Gather), so no more drafts
        self.unreadable = model.rows is not None and any(token >= model.rows for token in self.tokens)

    def push(self, token: int) -> None:
        self.tokens.append(int(token))
        if self.model.rows is not None and token >= self.model.rows:
            self.unreadable = True

    def window(self, room: int) -> list[int]:
        """The latest tokens of the text that fit in the draft model's cache with a draft of ``room`` tokens (it holds
        the text and all but the last drafted token): the whole text while it fits.

        Past the draft's context llama.cpp drafts from the text's last ``n_ctx_dft - n_draft`` tokens
        (common/speculative.cpp, ``common_speculative_gen_draft``: ``i_start``) rather than stop drafting for the
        rest of the answer. That window slides a token at a step, and llama.cpp shifts its draft cache's positions
        to reuse it; these backends rewind but do not shift, so the window's start moves in strides of half the
        draft's context instead and the cache is reused between them (a window prefilled once a stride, not at every
        step). The drafts are the draft model's guesses from a shorter text; the bundle checks them as any others."""
        max_context = self.model.backend.max_context
        over = len(self.tokens) + room - 1 - max_context  # tokens that do not fit
        if over <= 0:
            return self.tokens
        stride = max(1, min(max_context // 2, max_context - room))  # keeps at least 2 tokens where room allows
        start = -(-over // stride) * stride  # ``over`` rounded up to a whole number of strides
        return self.tokens[start:]

    def draft(self, limit: int | None = None) -> list[int]:
        """Up to ``max_draft`` (and ``limit``) tokens the draft model decodes greedily after the text (its latest
        tokens where it outgrows the draft's context: :meth:`window`), stopping
        at one it gives less than ``p_min`` (:func:`top_probability`); empty where it has no room or no confidence, or the text holds an id
        it has no row for. With ``min_draft``, empty where fewer than that fit or were drafted (llama-server's
        n_min: the draft model is not run where the room is shorter, and a shorter draft is ignored)."""
        model, config = self.model, self.config
        backend = model.backend
        room = config.max_draft if limit is None else min(limit, config.max_draft)
        room = min(room, backend.max_context)
        if room <= 0 or room < config.min_draft or not self.tokens or self.unreadable:
            return []
        logits = model.logits_after(self.window(room))
        drafted: list[int] = []
        while True:
            token = int(np.argmax(logits))
            if (model.vocab_size is not None and token >= model.vocab_size) or token in model.foreign:
                break
            if config.p_min > 0 and top_probability(logits) < config.p_min:
                break
            drafted.append(token)
            if len(drafted) == room:
                break
            logits = backend.decode(token)
            model.cached.append(token)
        if len(drafted) < config.min_draft:  # the draft cache keeps them: the next draft rewinds past them
            return []
        model.drafted += len(drafted)
        return drafted


# llama.cpp's common_speculative_are_compatible (common/speculative.cpp): the two vocabularies may differ in size by
# this many tokens, and their token texts are compared from this id on over the ids both have
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5


def _texts(tokenizer) -> dict[int, str]:
    """id -> token text of a ``tokenizers.Tokenizer``, added tokens included (llama.cpp's ``llama_vocab_get_text``)."""
    return {index: text for text, index in tokenizer.get_vocab(with_added_tokens=True).items()}


def _added_eos(tokenizer) -> int | None:
    """The token the ChatTokenizer ``tokenizer`` puts after a text it encodes with its special tokens (llama.cpp's
    ``llama_vocab_get_add_eos`` with ``llama_vocab_eos``), None where it puts none."""
    plain, special = tokenizer.encode("a", add_special_tokens=False), tokenizer.encode("a", add_special_tokens=True)
    start = 1 if tokenizer.added_bos() is not None else 0
    after = special[start + len(plain):]
    return after[0] if len(after) == 1 and special[start:start + len(plain)] == plain else None


def vocab_mismatch(target, draft) -> str | None:
    """Why the draft's ChatTokenizer ``draft`` cannot draft for the target's ``target``, as llama.cpp's
    common_speculative_are_compatible (common/speculative.cpp) decides it: another vocabulary type (the tokenizers
    model: BPE, Unigram, ...), another BOS or EOS added to a text (``add_bos`` / ``add_eos`` and the ids), sizes more
    than :data:`SPEC_VOCAB_MAX_SIZE_DIFFERENCE` apart, or a token text that differs from id
    :data:`SPEC_VOCAB_CHECK_START_TOKEN_ID` on over the ids both have. None where it can: a fine-tune with a few
    added tokens (ChatML's) drafted by its base model, as llama.cpp takes it. The ids the two do not share are never
    proposed as drafts (:class:`DraftModel`'s ``vocab_size`` and ``foreign``), so the answer stays the target's."""
    kinds = [type(side.tokenizer.model).__name__ for side in (target, draft)]
    if kinds[0] != kinds[1]:
        return f"its vocabulary is a {kinds[1]} one, the bundle's a {kinds[0]} one"
    for name, read in (("BOS", lambda side: side.added_bos()), ("EOS", _added_eos)):
        ours, theirs = read(target), read(draft)
        if ours != theirs:
            def said(token):
                return "none" if token is None else f"token {token}"

            return f"the {name} it adds to a text is {said(theirs)}, the bundle's {said(ours)}"
    ours, theirs = _texts(target.tokenizer), _texts(draft.tokenizer)
    sizes = [max(texts, default=-1) + 1 for texts in (ours, theirs)]
    if abs(sizes[0] - sizes[1]) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return f"the sizes are {abs(sizes[0] - sizes[1]):,} tokens apart, more than the {SPEC_VOCAB_MAX_SIZE_DIFFERENCE} " \
               "llama.cpp allows"
    differ = [index for index in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(sizes)) if ours.get(index) != theirs.get(index)]
    if differ:
        first = differ[0]
        return (f"{len(differ):,} token texts differ, the first id {first}: {theirs.get(first)!r} there, "
                f"{ours.get(first)!r} here")
    return None


class DraftError(EdgeSDKError):
    """A bundle that cannot be the draft model of another: another tokenizer (:func:`vocab_mismatch`), or no backend
    that can rewind."""


def open_draft_model(runtime, draft_bundle, config: DraftConfig, threads: int | None = None,
                     target: str | None = None, ignore_target: bool = False, terms: str = "cli",
                     verbose: bool = False) -> DraftModel:
    """The draft bundle ``draft_bundle`` opened as the draft model of ``runtime`` (llama.cpp's ``--model-draft``),
    checked against its tokenizer; a :class:`DraftError` naming the draft bundle where it cannot serve (the errors of
    opening it, a damaged bundle or one built for another board, as :func:`~edgesdk.runtime.session.open_runtime`
    raises them; ``terms`` as there: ``"python"`` where :func:`edgesdk.load` opens it).

    The draft runs on the target's backend, which can rewind (llama.cpp's draft takes the main model's devices): the
    draft bundle's own first backend may be another (a Jetson bundle's tensorrt, while the target runs with
    ort-cuda). Its own backends only where that one cannot open it. Both sessions run in turns on the same cores,
    and a pool spinning after its work starves the other (a 2-core host decoded at 0.62x with both spinning), so the
    draft's pool never spins; the target's, which does most of the work, still does.

    The draft model's ``notes`` are the draft runtime's (which backend it opened on and why, its threads), and where
    the bundle's backend could not open it, why; ``verbose`` (``--stats``) also prints them on stderr as the bundle's
    are, each line naming the draft bundle (``edgesdk: draft BUNDLE: ...``).

    The draft's context follows the bundle's run (:func:`draft_context`): a ``-c N`` (``n_ctx``) that holds the
    bundle below the draft's own context holds the draft to N too, as llama-server makes its draft's context the
    target's (``--ctx-size-draft``'s default); a draft whose own context is the smaller keeps it, which a note says."""
    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.session import open_runtime

    name = f"draft {draft_bundle}"  # its line of the backend it opened on, told from the target's (open_runtime)
    held, shorter = draft_context(runtime, draft_bundle)
    try:
        draft = open_runtime(draft_bundle, backend=runtime.backend.name, threads=threads, expected_target=target,
                             ignore_target=ignore_target, spinning=False, terms=terms, name=name, verbose=verbose,
                             context=held)
    except RuntimeBackendError as exc:
        elsewhere = exc
        if verbose:
            print(f"edgesdk: {name}: not on the bundle's {runtime.backend.name} backend: {exc.problem}",
                  file=sys.stderr)
        draft = open_runtime(draft_bundle, threads=threads, expected_target=target, ignore_target=ignore_target,
                             spinning=False, terms=terms, name=name, verbose=verbose, context=held)
    else:
        elsewhere = None
    try:
        model = _checked_draft_model(runtime, draft, draft_bundle, config, elsewhere)
        away = [] if elsewhere is None else [f"not on the bundle's {runtime.backend.name} backend: {elsewhere.problem}"]
        model.notes = [*away, *draft.notes, *([shorter] if shorter else [])]
        if shorter and verbose:
            print(f"edgesdk: {name}: {shorter}", file=sys.stderr)
        return model
    except BaseException:  # the draft's session (its weights) is given back now, not when the error's traceback goes
        close_backend(draft.backend)
        raise


def draft_context(runtime, draft_bundle) -> tuple[int | None, str | None]:
    """(held, note): the context the draft bundle ``draft_bundle`` opens with as ``runtime``'s draft model, and what
    to say of a draft context shorter than the bundle's run.

    ``held`` is the run's context (the bundle's ``max_context``: its own, or the ``-c N`` / ``n_ctx`` that holds it
    to less) where the draft bundle was built with more: llama-server creates its draft's context at the target's
    ``n_ctx`` unless ``--ctx-size-draft`` says otherwise, and a draft that reads no text longer than the bundle holds
    needs no more (opened at its own, a ``-c 512`` run of a Pi kept the draft's whole KV cache and rotary tables'
    reach, while the bundle's was capped). None where the draft's own context is no larger, or its manifest cannot be
    read (:func:`~edgesdk.runtime.session.open_runtime` then refuses it by name). ``note``: where the draft's own
    context is the smaller, that it is (a draft's context is fixed when it was built, as a bundle's is, and is
    not refused for it): past it, the draft drafts from the text's latest tokens (:meth:`ModelDrafter.window`), and
    the answer is still the bundle's."""
    from edgesdk.bundle import read_manifest

    run = getattr(runtime.backend, "max_context", None)
    if isinstance(run, bool) or not isinstance(run, int):
        return None, None
    try:
        graph = read_manifest(Path(draft_bundle)).get("graph")
    except (EdgeSDKError, OSError, ValueError):
        return None, None
    own = graph.get("max_context") if isinstance(graph, dict) else None
    if isinstance(own, bool) or not isinstance(own, int):
        return None, None
    if own > run:
        return run, None
    if own < run:
        return None, (f"context {own} tokens (the draft bundle's own), less than the {run} the bundle runs with: past "
                      f"{own}, drafts are made from the text's latest tokens")
    return None, None


def _checked_draft_model(runtime, draft, draft_bundle, config: DraftConfig, elsewhere) -> DraftModel:
    """The opened runtime ``draft`` as ``runtime``'s draft model, or a :class:`DraftError` where its vocabulary or
    backend cannot serve (``elsewhere``: why the bundle's backend could not open it, None where it did)."""
    limit, foreign = runtime.backend.vocab_size, frozenset()
    ours, theirs = (_texts(rt.tokenizer.tokenizer) for rt in (runtime, draft))
    if ours != theirs:  # llama.cpp's compatibility check (vocab_mismatch), not the same vocabulary
        why = vocab_mismatch(runtime.tokenizer, draft.tokenizer)
        if why is not None:
            raise DraftError(f"{draft_bundle} has another tokenizer than the bundle ({len(theirs):,} tokens against "
                             f"{len(ours):,}: {why}), so its token ids mean other text than those of "
                             f"{runtime.bundle.path}",
                             "pass a draft bundle built from a model with this bundle's tokenizer (a smaller model of "
                             "its family, or the same model quantized harder; as llama.cpp, one with up to "
                             f"{SPEC_VOCAB_MAX_SIZE_DIFFERENCE} tokens more or fewer and the same token texts is taken)")
        # an id the target has no token for, or whose text differs (ids under SPEC_VOCAB_CHECK_START_TOKEN_ID), is
        # never proposed: the draft ends there
        limit = min(limit, max(ours) + 1)
        foreign = frozenset(index for index in range(min(max(ours), max(theirs)) + 1)
                            if ours.get(index) != theirs.get(index))
    try:
        return DraftModel(draft.backend, config, limit, foreign)
    except ValueError as exc:  # a draft backend that cannot rewind: the bundle's backend could not open the draft
        why = "" if elsewhere is None else f", and the bundle's {runtime.backend.name} backend cannot open it " \
                                           f"({elsewhere.problem})"
        raise DraftError(f"{draft_bundle}: {exc}{why}", "pass a draft bundle that runs on the bundle's backend") \
            from exc
