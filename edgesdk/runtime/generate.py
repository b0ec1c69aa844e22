"""The generation loop: sampling, stopping, streaming and timing.

A :class:`StepHook` (the thermal guard, a simulated board, telemetry) is called around every
step. It may block before a step to pace or pause generation; the KV cache and the tokens
produced so far stay where they are, so a paused request resumes exactly where it stopped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import TYPE_CHECKING, Protocol

import numpy as np

# numpy loads numpy.random on its first use (np.random.default_rng in the first Sampler); a Ctrl-C that lands inside
# that import (its Cython modules' init) was lost, and the run went on to its end: imported with this module instead
import numpy.random  # noqa: F401

from edgesdk.errors import EdgeSDKError, RuntimeBackendError
from edgesdk.runtime.backend import DecoderBackend
from edgesdk.runtime.logprobs import LogprobRecorder
from edgesdk.runtime.lookup import LookupConfig
from edgesdk.runtime.prompt_cache import PromptCache, steers_gates

if TYPE_CHECKING:
    from edgesdk.runtime.speculative import DraftModel


# llama.cpp's sampler names (common/sampling.cpp ``common_sampler_types_from_names``): canonical name -> name here.
# The ones carried are applied in the order given (``infill``: edgesdk/runtime/infill_sampler.py); dry, typ_p,
# top_n_sigma and xtc take parameters edgesdk does not carry, whose llama.cpp defaults (dry_multiplier 0, typ_p 1,
# top_n_sigma -1, xtc_probability 0) leave the candidates as they are, so they are taken and pass everything through.
CARRIED_SAMPLERS = ("penalties", "top_k", "top_p", "min_p", "temperature", "infill")
PASS_THROUGH_SAMPLERS = ("dry", "typ_p", "top_n_sigma", "xtc")
# llama.cpp's default chain ("edskypmxt": penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature)
# less the pass-through ones.
DEFAULT_SAMPLERS = ("penalties", "top_k", "top_p", "min_p", "temperature")
# llama.cpp's one-letter codes (``common_sampler_type_to_chr``), read by ``--sampling-seq`` and a ``samplers`` string.
SAMPLER_LETTERS = {"e": "penalties", "d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma",
                   "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill"}
# llama.cpp's other names for samplers (common/sampling.cpp, common_sampler_types_from_names)
_SAMPLER_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical": "typ_p",
                    "typical-p": "typ_p"}


def sampler_chain(names, skipped: list | None = None) -> tuple[str, ...]:
    """llama.cpp's sampler list as canonical names: a list of names (any case; ``top-k`` and ``topk`` for
    ``top_k``, ``nucleus``, ``temp``, ``typ`` and ``typical`` as llama.cpp reads them) or a string of one-letter codes
    (``"kpmt"``). A name llama.cpp has but edgesdk cannot run (``adaptive_p``) is refused by name.

    A name or letter llama.cpp does not know is refused by name too, unless ``skipped`` is a list: then it is left
    out of the chain and appended there, for the caller to say, as llama.cpp's ``common_sampler_types_from_names``
    and ``common_sampler_types_from_chars`` (common/sampling.cpp) skip it with a warning (``unable to match sampler by
    name``); llama-server reads a request's ``samplers`` so (edgesdk/serve/api.py, ``_samplers``)."""
    if isinstance(names, str):
        unknown = [letter for letter in names if letter not in SAMPLER_LETTERS]
        if unknown and (skipped is None or "a" in unknown):
            bad = "a" if "a" in unknown else unknown[0]
            what = "is llama.cpp's adaptive_p, not carried by edgesdk" if bad == "a" else "is no sampler letter"
            raise ValueError(f"samplers {names!r} holds {bad!r}, which {what}; the letters are "
                             f"{''.join(SAMPLER_LETTERS)} ({', '.join(f'{k}={v}' for k, v in SAMPLER_LETTERS.items())})")
        if skipped is not None:
            skipped.extend(unknown)
        return tuple(SAMPLER_LETTERS[letter] for letter in names if letter in SAMPLER_LETTERS)
    if isinstance(names, (bytes, Mapping)) or not hasattr(names, "__iter__"):
        raise ValueError(f"samplers must be a list of sampler names or a string of sampler letters, got {names!r}")
    known = {name: name for name in CARRIED_SAMPLERS + PASS_THROUGH_SAMPLERS}
    for name in CARRIED_SAMPLERS + PASS_THROUGH_SAMPLERS:
        known[name.replace("_", "-")] = known[name.replace("_", "")] = name
    known.update(_SAMPLER_ALIASES)
    chain = []
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"samplers must be sampler names (strings), got {name!r}")
        canonical = known.get(name.lower())
        adaptive = name.lower() in ("adaptive_p", "adaptive-p", "adaptivep")
        if canonical is None and skipped is not None and not adaptive:
            skipped.append(name)
        elif canonical is None:
            what = "is llama.cpp's but not carried by edgesdk" if adaptive else "is no sampler"
            raise ValueError(f"samplers holds {name!r}, which {what}; the names are "
                             f"{', '.join(CARRIED_SAMPLERS + PASS_THROUGH_SAMPLERS)}")
        else:
            chain.append(canonical)
    return tuple(chain)


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is picked."""

    max_new_tokens: int = 128  # generation stops after this many tokens
    temperature: float = 0.0  # 0 = greedy (the default: reproducible output)
    top_p: float = 1.0  # nucleus sampling mass; 1.0 keeps every token
    # llama.cpp's top-k and min-p samplers: keep the ``top_k`` most likely tokens (0: all), and the tokens whose
    # probability is at least ``min_p`` times the most likely one's (0: all). See :class:`Sampler` for the order.
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None  # seeds the sampler for reproducible sampling
    # Penalties on tokens already in the last ``repeat_last_n`` tokens of the context (prompt and answer),
    # as llama.cpp's penalties sampler applies them: a repeated token's logit is divided by
    # ``repeat_penalty`` (multiplied when negative), then lowered by ``frequency_penalty`` per occurrence
    # and ``presence_penalty`` once (OpenAI's two terms). The defaults change nothing.
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # -1: the context's size (llama.cpp's n_ctx), over prompt and answer
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs added to the logits before the penalties and sampling (OpenAI's and llama-server's
    # logit_bias; llama.cpp applies its logit-bias sampler first in the chain). A bias is in [-100, 100], or -inf
    # for a token never to be taken; pairs naming one token add up. Greedy decoding follows them too.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # The sampler chain, llama.cpp's ``--samplers`` / ``samplers``: which of penalties, top_k, top_p, min_p,
    # temperature and infill run, in which order (names or letters: :func:`sampler_chain`). One left out does not run
    # (without "temperature" the draw is at temperature 1, as llama.cpp's). Temperature 0 decodes greedily
    # whatever the chain (with "infill", or penalties after another sampler: the most likely token the chain keeps).
    # The penalties run where they stand, as llama.cpp's (common/sampling.cpp ``common_sampler_init`` adds each
    # sampler in this order): after top-k they lower only the tokens top-k kept, after the temperature they work on
    # the tempered logits, and named twice they apply twice.
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS

    @property
    def penalizes(self) -> bool:
        return "penalties" in self.samplers and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)

    @property
    def penalizes_in_chain(self) -> bool:
        """The penalties run inside the chain (:meth:`Sampler._chain`), not on the logits before it (:func:`shaped`):
        a sampler that changes the candidates or the logits (top-k, top-p, min-p, the temperature, infill) comes
        before them, or they are named more than once."""
        if not self.penalizes:
            return False
        first = self.samplers.index("penalties")
        return self.samplers.count("penalties") > 1 or any(name in CARRIED_SAMPLERS
                                                           for name in self.samplers[:first])

    def __post_init__(self):
        # A fraction (1.5 gave 2 tokens) or NaN (never reached: the answer ran to the context) is no count,
        # and a value that is not a number ended in Python's own TypeError naming no field.
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, Integral) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a whole number >= 1, got {self.max_new_tokens!r}")
        for name in ("temperature", "top_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        # 0 keeps the likeliest token alone, as llama.cpp's top-p (min_keep 1) and OpenAI's range [0, 1] allow
        if not 0 <= self.top_p <= 1:  # NaN fails this too
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, Integral) or self.top_k < 0:
            raise ValueError(f"top_k must be a whole number >= 0 (0: off), got {self.top_k!r}")
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, Real) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be a number in [0, 1] (0: off), got {self.min_p!r}")
        # numpy's own refusal came only once generate() built the sampler, and named no field
        # ("expected non-negative integer"); True would have seeded as 1.
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, Integral) or self.seed < 0):
            raise ValueError(f"seed must be None or a whole number >= 0, got {self.seed!r}")
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0):
            raise ValueError(f"repeat_penalty must be a finite number > 0, got {self.repeat_penalty}")
        if isinstance(self.repeat_last_n, bool) or not isinstance(self.repeat_last_n, Integral) \
                or self.repeat_last_n < -1:
            raise ValueError(f"repeat_last_n must be a whole number >= -1, got {self.repeat_last_n!r}")
        # any finite number, as llama.cpp's penalties sampler and Ollama take; OpenAI's routes keep its [-2, 2]
        # (edgesdk.serve.api)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        object.__setattr__(self, "logit_bias", _checked_logit_bias(self.logit_bias))
        object.__setattr__(self, "samplers", sampler_chain(self.samplers))


def _checked_logit_bias(pairs) -> tuple[tuple[int, float], ...]:
    """``pairs`` (a mapping of token id to bias, or (id, bias) pairs) as a tuple of pairs, or a ValueError naming
    the bad entry."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    try:
        items = [tuple(item) for item in items]
    except TypeError:
        raise ValueError(f"logit_bias must be (token id, bias) pairs, got {pairs!r}") from None
    checked = []
    for item in items:
        if len(item) != 2:
            raise ValueError(f"logit_bias entries must be (token id, bias) pairs, got {item!r}")
        token, bias = item
        if isinstance(token, bool) or not isinstance(token, Integral) or token < 0:
            raise ValueError(f"logit_bias token ids must be whole numbers >= 0, got {token!r}")
        if isinstance(bias, bool) or not isinstance(bias, Real) or \
                not (-100 <= bias <= 100 or bias == -math.inf):  # NaN fails both
            raise ValueError(f"logit_bias for token {token} must be a number in [-100, 100] or -inf (never), "
                             f"got {bias!r}")
        checked.append((int(token), float(bias)))
    return tuple(checked)


def starts_with_added_bos(tokenizer, ids) -> bool:
    """Whether the prompt ``ids`` begins with the BOS the tokenizer adds (:meth:`ChatTokenizer.added_bos`), which
    a context shift keeps on top of ``--keep`` / ``n_keep`` as llama.cpp does (``n_keep += add_bos``, tools/main
    and llama-server's ``n_keep + add_bos_token``). A tokenizer that adds none keeps none on top, though its
    ``bos_token`` may begin every chat prompt (SmolLM2's ``<|im_start|>``): taken for a BOS, it kept one token
    more than asked."""
    added = tokenizer.added_bos()
    return added is not None and len(ids) > 0 and int(ids[0]) == added


@dataclass(frozen=True)
class ContextShift:
    """llama.cpp's context shift (``--context-shift`` with ``--keep``; llama-server's ``n_keep`` and ``n_discard``;
    Ollama's ``shift`` with ``num_keep``): when the next token would not fit in the KV cache, the first ``n_keep``
    tokens stay, the ``n_discard`` after them go, the rest move down, and the answer goes on.

    ``keep``: -1 keeps the whole prompt; N keeps the prompt's first N tokens, and with ``bos`` (the prompt starts with
    a BOS token the tokenizer adds) the BOS on top of them, as llama-cli resolves ``--keep`` (tools/main/main.cpp:
    ``n_keep < 0 || n_keep > prompt size`` keeps the prompt, else ``n_keep += add_bos``). ``discard``: 0 discards
    half of what follows the kept tokens, ``(n_past - n_keep) / 2`` as llama.cpp's default, at least one token as
    Ollama's ``ShiftDiscard`` (runner/ollamarunner/cache.go); N discards N (llama-server's ``n_discard``).
    ``window``: the context the answer shifts within, where it is smaller than the bundle's (Ollama's ``num_ctx``,
    the context its runner shifts at); None: the bundle's ``max_context``.
    """

    keep: int = 0
    discard: int = 0
    bos: bool = False
    window: int | None = None

    def __post_init__(self):
        if isinstance(self.keep, bool) or not isinstance(self.keep, Integral) or self.keep < -1:
            raise ValueError(f"context shift keep (n_keep) must be -1 (the whole prompt) or a whole number of the "
                             f"prompt's tokens >= 0, got {self.keep!r}")
        if isinstance(self.discard, bool) or not isinstance(self.discard, Integral) or self.discard < 0:
            raise ValueError(f"context shift discard (n_discard) must be a whole number >= 0 (0: half of what "
                             f"follows the kept tokens), got {self.discard!r}")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, Integral)
                                        or self.window < 2):
            raise ValueError(f"context shift window must be a whole number of tokens >= 2, or None for the bundle's "
                             f"max_context, got {self.window!r}")
        object.__setattr__(self, "keep", int(self.keep))
        object.__setattr__(self, "discard", int(self.discard))

    def context(self, max_context: int) -> int:
        """The context the answer shifts within, on a backend of ``max_context`` tokens."""
        return max_context if self.window is None else min(self.window, max_context)

    def kept(self, prompt_tokens: int) -> int:
        """The tokens kept at the start of the context, for a prompt of ``prompt_tokens`` tokens."""
        if self.keep < 0 or self.keep > prompt_tokens:
            return prompt_tokens
        return self.keep + int(self.bos)

    def spans(self, prompt_tokens: int, max_context: int, built: int | None = None,
              source: str = "-c") -> tuple[int, int]:
        """(tokens kept, tokens discarded) at a shift of a full context (:meth:`context` of a backend of
        ``max_context`` tokens), or an EdgeSDKError naming the setting where it leaves nothing to discard. ``built``:
        the bundle's context where the run holds less (``-c N``), named as this run's context rather than the
        bundle's, with raising -c among the fixes; ``source``: what held it (the backend's ``context_source``:
        LLAMA_ARG_CTX_SIZE, load()'s ``n_ctx``), named and raised in place of -c."""
        from edgesdk.bundle import capped_context, held_setting

        context = self.context(max_context)
        capped = capped_context(max_context, built, source) if context == max_context else None
        setting, whole = held_setting(source)
        where = (capped or f"the bundle's max_context of {context}" if context == max_context else
                 f"the context window of {context}")
        n_keep = self.kept(prompt_tokens)
        whole = self.keep < 0 or self.keep > prompt_tokens
        what = f"keep {self.keep}" + (f" (the whole prompt of {prompt_tokens} tokens)" if whole else "")
        if n_keep >= context:
            # the BOS is kept on top of ``keep``: a keep below the context less the BOS leaves a token to discard
            zero = "0 keeps only the BOS" if self.bos else "0 keeps none"
            raise EdgeSDKError(f"the context shift's {what} keeps {n_keep} tokens, which leaves nothing to discard "
                               f"in {where}",
                               f"keep fewer tokens (--keep / n_keep below {context - int(self.bos)}; {zero}), "
                               + (f"raise {setting} above {n_keep}, up to the bundle's {built} ({whole}), "
                                  if capped is not None and n_keep < built else "")
                               + "or turn the context shift off")
        left = context - n_keep
        n_discard = self.discard or max(left // 2, 1)
        if n_discard > left:
            raise EdgeSDKError(f"the context shift's discard {self.discard} is more than the {left} tokens that "
                               f"follow the {n_keep} kept of {where}",
                               f"discard at most {left} (n_discard), or 0 for half of them"
                               + (f", or raise {setting} up to the bundle's {built} ({whole})" if capped else ""))
        return n_keep, n_discard


class Sampler:
    """Picks the next token from logits already shaped by the logit bias and the penalties (:func:`shaped`).

    Sampling runs llama.cpp's chain (common/sampling.cpp ``common_sampler_init``) in the order of
    ``config.samplers``, by default top-k, top-p, min-p, then the temperature, then the draw; each sampler works
    on what the ones before it left:

    - top-k keeps the ``top_k`` largest logits (ties at the k-th: the lowest ids);
    - top-p keeps the smallest set of most likely tokens whose probability, softmax of the logits as they stand
      (before the temperature in the default chain), reaches ``top_p``;
    - min-p keeps the logits at most ``-log(min_p)`` below the largest (probability >= ``min_p`` times the top
      one's);
    - the temperature divides the logits;
    - infill, llama.cpp's infill sampler (:func:`edgesdk.runtime.infill_sampler.infill_apply`), keeps the
      end-of-generation tokens where they are likely enough against the text, else merges tokens whose text is a
      prefix of another's and keeps the likely ones; it reads ``vocabulary``
      (:class:`~edgesdk.runtime.infill_sampler.InfillVocabulary`).

    - penalties, where they come after one of these (``config.penalizes_in_chain``), lower the logits the samplers
      before them left, over ``context`` (llama.cpp's penalties sampler where it stands in the chain); where they
      come first, :func:`shaped` has applied them already.

    Greedy decoding (temperature 0) takes the top token whatever the chain; with infill in the chain, or penalties
    after another sampler, the top token of those the chain keeps (llama.cpp's temperature sampler at 0 keeps the
    top one of what it is given).
    """

    def __init__(self, config: SamplingConfig, vocabulary=None):
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self.vocabulary = vocabulary
        self._context: list[int] | None = None  # the penalties' tokens, where they run inside the chain
        if "infill" in config.samplers and vocabulary is None:
            raise EdgeSDKError("the sampler chain holds llama.cpp's infill sampler, which reads the tokens' texts, "
                               "and no vocabulary was given for it",
                               "pass the bundle's tokenizer (generate(vocabulary=runtime.tokenizer)), or leave "
                               "'infill' out of the samplers")

    def __call__(self, logits: np.ndarray, allowed: Callable[[int], bool] | None = None,
                 context: list[int] | None = None) -> int:
        """The next token. With ``allowed`` (a constraint such as JSON mode) only a token it accepts is
        taken: greedy decoding takes the most likely one; sampling draws from the chain's distribution and
        redraws without a refused token, which is exact sampling from that distribution restricted to the
        accepted tokens. Where the chain kept no accepted token, the chain runs again over the accepted tokens
        alone, as llama.cpp resamples a draw its grammar refuses (``common_sampler_sample``).

        ``context``: the tokens the penalties look back over, read where they run inside the chain
        (``config.penalizes_in_chain``; elsewhere :func:`shaped` applied them to ``logits``)."""
        self._context = context if context is not None and self.config.penalizes_in_chain else None
        best = int(np.argmax(logits))  # the first NaN when there is one
        _check_finite(float(logits[best]))
        if self.config.temperature == 0:
            if "infill" in self.config.samplers or self._context is not None:
                return self._greedy_kept(logits, best, allowed)
            return best if allowed is None or allowed(best) else _most_likely_allowed(logits, allowed)
        probs = self._distribution(logits, best)
        if allowed is None:
            return self._draw(probs)
        for _ in range(MAX_REDRAWS):
            token = self._draw(probs)
            if allowed(token):
                return token
            probs[token] = 0.0
            total = probs.sum()
            if total <= 0:
                break
            probs /= total
        # Many refusals in a row (the answer's first token, where only "{" or whitespace may come): draw
        # from the accepted tokens left in the kept set directly, which keeps the sampling exact.
        accepted = [int(token) for token in np.flatnonzero(probs) if allowed(int(token))]
        if accepted:
            weights = probs[accepted]
            return accepted[int(self.rng.choice(len(accepted), p=weights / weights.sum()))]
        return self._draw_accepted(logits, allowed)

    def _draw(self, probs: np.ndarray) -> int:
        return int(self.rng.choice(probs.shape[0], p=probs))

    def _draw_accepted(self, logits: np.ndarray, allowed: Callable[[int], bool]) -> int:
        """A draw from the chain run over the tokens ``allowed`` accepts only (every other logit -inf)."""
        best = _most_likely_allowed(logits, allowed)  # refuses, naming why, where no token is left
        return self._draw(self._distribution(_allowed_only(logits, allowed), best))

    def _greedy_kept(self, logits: np.ndarray, best: int, allowed: Callable[[int], bool] | None) -> int:
        """Greedy decoding through a chain with the infill sampler or penalties inside it: the most likely token the
        chain keeps (the
        lowest id among equal ones); with ``allowed``, where it refuses that one, the most likely token the chain
        keeps of the accepted tokens alone (llama.cpp's resampling of a refused token), else the most likely
        accepted token."""
        token = int(np.argmax(self._chain(logits, best)))
        if allowed is None or allowed(token):
            return token
        best = _most_likely_allowed(logits, allowed)  # refuses, naming why, where no token is left
        token = int(np.argmax(self._chain(_allowed_only(logits, allowed), best)))
        return token if allowed(token) else best

    def _distribution(self, logits: np.ndarray, best: int) -> np.ndarray:
        """The probabilities the draw takes (float64, summing to 1): the chain's, 0 at every token a sampler
        dropped. ``best`` is the index of the largest logit."""
        probs = np.exp(self._chain(logits, best))
        return probs / probs.sum()

    def _chain(self, logits: np.ndarray, best: int) -> np.ndarray:
        """The logits less ``logits[best]`` (the largest) after the chain's samplers, -inf at every token a sampler
        dropped. Every sampler but infill and penalties inside the chain keeps the top one."""
        config = self.config
        # Shifted so the top logit is 0: a tiny temperature then overflows the others only to -inf (probability 0),
        # where the raw logits scaled to inf and inf - inf was NaN. ``offset``: what the logits as llama.cpp's chain
        # holds them are less ``work`` (the penalties read their sign).
        offset = float(logits[best])
        work = logits.astype(np.float64) - offset
        # The infill sampler's candidates are llama.cpp's ``cur_p``: the tokens no sampler before it cut (top-k,
        # top-p and min-p shorten ``cur_p``; a logit bias or a grammar's -inf leaves a token in it).
        present = np.ones(work.shape[0], bool) if "infill" in config.samplers else None
        for name in config.samplers:
            if name == "top_k" and 0 < config.top_k < work.shape[0]:
                kept = _top_k_mask(work, config.top_k)
                work[~kept] = -np.inf
                if present is not None:
                    present &= kept
            elif name == "top_p" and config.top_p < 1.0:
                probs = np.exp(work)
                probs /= probs.sum()
                order = np.argsort(-probs)
                cumulative = np.cumsum(probs[order])
                dropped = order[int(np.searchsorted(cumulative, config.top_p)) + 1:]
                work[dropped] = -np.inf
                if present is not None:
                    present[dropped] = False
            elif name == "min_p" and config.min_p > 0:
                cut = work < math.log(config.min_p) + float(work.max())  # the top is kept
                work[cut] = -np.inf
                if present is not None:
                    present &= ~cut
            elif name == "penalties" and self._context is not None:
                work, offset = _penalized_shifted(work, offset, self._context, config)
            elif name == "temperature":
                if config.temperature > 0:
                    with np.errstate(over="ignore"):
                        work = work / config.temperature
                        offset = offset / config.temperature
                else:  # llama.cpp's temperature sampler at 0 keeps the top token only (greedy through infill)
                    top = int(np.argmax(work))
                    work[np.arange(work.shape[0]) != top] = -np.inf
            elif name == "infill":
                work, present, top = self._infill(work, present)
                offset += top
        return work

    def _infill(self, work: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """llama.cpp's infill sampler over the ``present`` candidates: -inf at every token it dropped, and the
        logits of the ones it kept as it leaves them (the EOT token it may fall back to at logit 1), less the
        largest of them (which changes no sampler after it but penalties, told it as the third value)."""
        from edgesdk.runtime.infill_sampler import infill_apply

        vocabulary = self.vocabulary
        candidates = np.flatnonzero(present)
        ids, kept_logits, _ = infill_apply(candidates, work[candidates], vocabulary.texts, vocabulary.eog,
                                           vocabulary.eot)
        if ids.size and int(ids.max()) >= work.shape[0]:
            raise EdgeSDKError(f"the infill sampler fell back to token id {int(ids.max())}, past this model's "
                               f"{work.shape[0]} logits", "leave 'infill' out of the samplers for this bundle")
        out = np.full(work.shape, -np.inf)
        out[ids] = kept_logits
        top = float(out.max())
        if not math.isfinite(top):
            top = 0.0
        out -= top
        kept = np.zeros(work.shape[0], bool)
        kept[ids] = True
        return out, kept, top


def _top_k_mask(logits: np.ndarray, k: int) -> np.ndarray:
    """True at the ``k`` largest logits; among ties at the k-th largest, the lowest ids (as a stable sort would).
    A partition, not a sort: 0.4 ms against 4.8 ms for a stable sort of 49,152 logits on the 2-core host."""
    kth = logits[np.argpartition(logits, logits.shape[0] - k)[logits.shape[0] - k]]
    keep = logits > kth
    ties = np.flatnonzero(logits == kth)[: k - int(keep.sum())]
    keep[ties] = True
    return keep


class LogitBiasError(EdgeSDKError):
    """The logit bias leaves no token to take: it bans the whole vocabulary, or every token a constraint allows at
    a step, or it names an id past the model's logits. A fault of the request (serve answers 400), not the model."""


MAX_REDRAWS = 64  # draws refused by a constraint before the accepted tokens of the nucleus are drawn from directly
CANDIDATES = 64  # the most likely tokens checked first; the rest of the vocabulary only when none passes
FLOAT32_MAX = float(np.finfo(np.float32).max)  # where a penalised logit is held (float32 logits)


def _most_likely_allowed(logits: np.ndarray, allowed: Callable[[int], bool]) -> int:
    """The most likely token ``allowed`` accepts; never one whose logit is -inf (a logit bias of -inf bans it)."""
    top = np.argpartition(-logits, min(CANDIDATES, logits.shape[0] - 1))[:CANDIDATES]
    ranked = top[np.argsort(-logits[top], kind="stable")]
    for token in ranked:
        if logits[token] > -math.inf and allowed(int(token)):
            return int(token)
    checked = set(ranked.tolist())
    for token in np.argsort(-logits, kind="stable"):
        if logits[token] == -math.inf:
            break  # sorted: every token left is banned
        if int(token) not in checked and allowed(int(token)):
            return int(token)
    banned = [int(token) for token in np.flatnonzero(logits == -math.inf) if allowed(int(token))]
    if banned:
        shown = ", ".join(map(str, banned[:8])) + (f" and {len(banned) - 8} more" if len(banned) > 8 else "")
        raise LogitBiasError(f"the logit_bias bans every token the constraint allows next (ids {shown}: -inf)",
                             "leave those tokens' bias above -inf, or leave out the constraint (JSON mode, a JSON "
                             "schema, tools, a grammar)")
    raise EdgeSDKError("no token of the vocabulary continues the constrained answer",
                       "leave the constraint (JSON mode, a JSON schema, tools, a grammar) out for this bundle")


def _check_finite(top_logit: float) -> None:
    """Refuse logits with NaN or an infinite top: a backend whose arithmetic overflowed (greedy
    decoding picked the NaN's token, often end-of-text, and sampling failed in numpy)."""
    if not math.isfinite(top_logit):
        raise RuntimeBackendError(f"the backend returned logits that are not finite (the top one is {top_logit})",
                                  "run the bundle with --backend ort-cpu; if it fails there too, "
                                  "'edgesdk verify' it and rebuild it")


class TokenConstraint(Protocol):
    """Which tokens an answer may take next (JSON mode), and whether it is complete."""

    def allows(self, token_id: int) -> bool: ...

    def advance(self, token_id: int) -> None: ...

    @property
    def complete(self) -> bool: ...


class StepHook(Protocol):
    """Called around each step of :func:`generate`; every method may be a no-op.

    ``kind`` is ``"prefill"`` (the prompt, whose last step also yields the first token) or ``"decode"``
    (one token; with prompt lookup a pass that also checked drafted tokens, reported once its draft is
    settled with every token it yielded). Blocking in :meth:`before_step` delays the step without losing
    anything.

    A hook may also have ``prefill_chunk(prompt_left: int) -> int | None``, asked before each prefill step with the
    prompt tokens still to prefill: the tokens the coming step takes (None: all of them, one step). With it the
    prompt is prefilled in steps of that many (llama.cpp's micro-batches, ``n_ubatch``), each held back by
    :meth:`before_step` and each but the last told to :meth:`after_step` with 0 tokens (:func:`_prefill`). A hook
    without it gets the whole prompt as one step, as before.
    """

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """A request starts (before its prefill)."""

    def before_step(self, kind: str) -> float | None:
        """May wait (pace, pause); returns the seconds waited (None: none)."""

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        """A step produced ``tokens`` tokens in ``compute_s`` seconds of backend time."""

    def end(self, stats: GenerationStats) -> None:
        """The request finished."""


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # the prompt's leading tokens taken from the previous answer's KV cache
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    token_latencies_s: list[float] = field(default_factory=list)  # each decoded token's gap (:func:`_share_pass`)
    stop_reason: str = ""
    # the end-of-text token the answer stopped at (stop_reason "eos"), or the one a complete constraint left, where
    # it was picked for its log-probabilities (stop_reason "complete": :func:`generate`)
    stop_token: int | None = None
    waited_s: float = 0.0  # time a StepHook held generation back (pacing, thermal pauses)
    draft_tokens: int = 0  # prompt lookup: tokens drafted and checked
    draft_accepted: int = 0  # of those, the ones the model's own choice equalled (each saved a decode step)
    context_shifts: int = 0  # times a full context was shifted (:class:`ContextShift`)
    # tokens the shifts dropped from the context (llama-server's n_discard at each shift, summed): what the KV cache
    # holds at the end is the prompt and the answer's tokens fed back, less these (its slot.prompt.n_tokens())
    context_discarded: int = 0

    @property
    def time_to_first_token_s(self) -> float:
        return self.prefill_s

    @property
    def prefill_tok_s(self) -> float:
        """Prompt tokens prefilled (those not taken from the cache) per second."""
        return (self.prompt_tokens - self.cached_tokens) / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens decoded (those after the prefill's) per second of decode time; None when no step ran (the answer
        was the prefill's token or nothing)."""
        decoded = len(self.token_latencies_s)
        return decoded / self.decode_s if decoded and self.decode_s else None

    @property
    def p95_latency_ms(self) -> float | None:
        """95th percentile of the decoded tokens' gaps (a drafted pass's compute shared by the tokens it yielded);
        None when no step ran."""
        return float(np.percentile(self.token_latencies_s, 95) * 1e3) if self.token_latencies_s else None

    def to_json(self) -> dict:
        """Rounded figures; ``decode_tok_s`` and ``p95_inter_token_ms`` are None (null) without a decode step."""
        return {
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens, "new_tokens": self.new_tokens,
            "time_to_first_token_ms": round(self.time_to_first_token_s * 1e3, 2),
            "prefill_tok_s": round(self.prefill_tok_s, 2), "decode_tok_s": _rounded(self.decode_tok_s),
            "p95_inter_token_ms": _rounded(self.p95_latency_ms), "stop_reason": self.stop_reason,
            "waited_ms": round(self.waited_s * 1e3, 2), "draft_tokens": self.draft_tokens,
            "draft_accepted": self.draft_accepted, "context_shifts": self.context_shifts,
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def generate(backend: DecoderBackend, prompt_ids: list[int], sampling: SamplingConfig,
             stop_ids: set[int], on_token: Callable[[int], None] | None = None,
             hook: StepHook | None = None, cache: PromptCache | None = None,
             reuse_cache: bool = True, constraint: TokenConstraint | None = None,
             logprobs: LogprobRecorder | None = None,
             lookup: LookupConfig | DraftModel | None = None, vocabulary=None,
             shift: ContextShift | None = None, stats: GenerationStats | None = None,
             ) -> tuple[list[int], GenerationStats]:
    """Prefill ``prompt_ids`` then decode until a stop id, ``max_new_tokens`` or the context is full.

    The first new token comes from the prefill logits (time to first token = prefill time);
    each later token costs one decode step. A prompt of ``max_context`` tokens still yields the
    token its prefill predicts; the answer then stops with ``stop_reason = "max_context"``, keeping
    every token produced, as llama.cpp's ``n_ctx`` limit does without ``--context-shift``.

    With ``shift`` (:class:`ContextShift`) a full context is shifted instead, and the answer goes on: where the
    next token would not fit, the context keeps its first ``n_keep`` tokens and the ones after the ``n_discard``
    that follow them, and the token is fed after those (llama.cpp's ``--context-shift``, tools/server
    ``update_slots``; Ollama's ``ShiftCacheSlot``). llama.cpp and Ollama remove the discarded entries from the KV
    cache and rotate the positions of the moved keys; here the backend is rewound to the kept tokens (reset where it
    cannot rewind, or steers its power gates) and the moved tokens are prefilled again after them with the token,
    one pass that costs a prefill of up to ``max_context - n_discard`` tokens at each shift (the ONNX Runtime,
    TensorRT, triton and gated backends keep their caches in different places, and none rotates them). The kept
    text's cache is then exactly what a prompt of those tokens gives: the discarded tokens no longer influence it,
    where llama.cpp's rotated entries still carry what they saw of them. The answer's tokens are all counted
    (``new_tokens``, ``max_new_tokens``), and the penalties' history, a constraint, the log-probabilities and what
    ``on_token`` sees go on across a shift as llama.cpp's do; only the context loses tokens. The shift's pass is
    told to the hook as the decode step it stands for (one token, its measured compute). A prompt cache holds the
    shifted tokens afterwards, and a drafter drafts from them. A ``keep`` that leaves nothing to discard is refused
    before anything runs, where the answer could reach the full context (:meth:`ContextShift.spans`), and so is a
    prompt longer than the shift's ``window``.

    ``hook`` (optional) is called
    around every step; the time it waits is in ``stats.waited_s`` (on the simulated clock for a
    simulated board), and the wall time spent in it is left out of the decode speed. A hook with ``prefill_chunk``
    (the thermal guard's) gets the prompt in steps of the tokens it names, as llama.cpp's micro-batches
    (:func:`_prefill`); without one the prompt is one pass.

    With a ``cache`` (:class:`~edgesdk.runtime.prompt_cache.PromptCache` over ``backend``) the
    prompt's prefix that the cache already holds is not prefilled again (``reuse_cache`` False:
    prefill it whole); ``stats.cached_tokens`` counts it, and the hook sees only the tokens prefilled.

    A ``constraint`` (JSON mode, a JSON schema, a GBNF grammar: :class:`~edgesdk.runtime.grammar.GrammarConstraint`)
    limits which tokens the sampler may take (a grammar's also which stop ids); once it is complete the answer
    stops there (``stop_reason = "complete"``).
    ``logprobs`` records each answer token's log-probability (before ``on_token`` sees the token), and
    with ``logprobs.prompt`` the prompt's too, which needs the whole prompt prefilled (no cache reuse). An answer
    that ends at a stop id keeps that token's entry in ``logprobs.end``; so does one whose constraint is complete
    below ``max_new_tokens`` with room left in the context: one more step picks the end-of-text token it leaves
    from the stop ids alone, as llama-server samples it (the grammar sampler allows only end-of-generation tokens
    there) and lists it with its probabilities, and its id is ``stats.stop_token``.

    With ``lookup`` (:mod:`edgesdk.runtime.lookup`) a step that finds the last tokens earlier in the
    text feeds the token and a draft of what followed them in one pass, and the tokens picked from its
    logits that equal the draft cost no further step; the answer is the one without drafts. A draft model
    (:class:`~edgesdk.runtime.speculative.DraftModel`) drafts the same way from its own greedy tokens. A backend
    that cannot rewind its cache, or a power-gated one (whose controller steps with every decode and
    starts over on a rewind), decodes token by token. A draft model on ``backend`` itself is refused by name: its
    decodes would go into the KV cache the answer is decoded from.

    ``vocabulary``: the bundle's tokenizer (:class:`~edgesdk.runtime.text.ChatTokenizer`) or an
    :class:`~edgesdk.runtime.infill_sampler.InfillVocabulary`, which a chain with llama.cpp's infill sampler reads
    (a chain holding it without one is refused by name).

    ``stats``: a fresh :class:`GenerationStats` to fill in as the answer goes (returned too), so that a caller whose
    ``on_token`` raises to end the answer (a stop string) still reads what happened, e.g. its context shifts.
    """
    _check_prompt(prompt_ids, backend)
    if lookup is not None and not callable(getattr(lookup, "drafter", None)):
        # a count of draft tokens (serve's ``lookup`` setting, ``--lookup N``) is no drafter: refused by name, also
        # where the backend decodes token by token and would not use it
        raise EdgeSDKError(f"lookup must be a LookupConfig (prompt lookup) or a DraftModel (a draft bundle), got "
                           f"{lookup!r}", "pass LookupConfig(max_draft=N) for up to N drafted tokens, or None")
    _check_draft_backend(lookup, backend)
    spans, context_size = None, backend.max_context  # the context the answer stops or shifts at
    if shift is not None:
        context_size = shift.context(backend.max_context)
        _check_prompt_in_window(len(prompt_ids), context_size)
        if len(prompt_ids) + sampling.max_new_tokens - 1 > context_size:
            spans = shift.spans(len(prompt_ids), backend.max_context, getattr(backend, "built_context", None),
                                getattr(backend, "context_source", "-c"))  # refused here where it cannot shift
    if stats is None:
        stats = GenerationStats()
    stats.prompt_tokens = len(prompt_ids)
    sampler = Sampler(sampling, _infill_vocabulary(sampling, vocabulary))
    scores_prompt = logprobs is not None and logprobs.prompt
    if cache is None:
        backend.reset()
    else:
        stats.cached_tokens = cache.start(prompt_ids, reuse=reuse_cache and not scores_prompt)
    fresh = prompt_ids[stats.cached_tokens:]
    keep = len(fresh) if scores_prompt else 1
    if hook is not None:
        hook.begin(len(fresh), sampling.max_new_tokens)
    rows, last_s = _prefill(backend, fresh, keep, hook, cache, stats)  # (keep, vocab)
    if scores_prompt:  # also a one-token prompt, whose one entry has no log-probability
        logprobs.record_prompt(rows, list(prompt_ids))
    logits = rows[-1]
    generated: list[int] = []
    # What the KV cache holds before ``token`` (read at a shift): the prompt, then each token the backend takes.
    held_ids = list(prompt_ids) if spans is not None else None
    # What the penalties look back over: the last repeat_last_n tokens of prompt and answer, -1 the context's size
    # as llama.cpp resolves it (penalty_last_n = n_ctx), a ring that also holds the tokens a context shift dropped.
    looked_back = context_size if sampling.repeat_last_n == -1 else sampling.repeat_last_n
    context = list(prompt_ids[max(len(prompt_ids) - looked_back, 0):]) if sampling.penalizes else None
    token = _pick_first(sampler, logits, constraint, context, logprobs, hook, last_s)
    drafter = lookup.drafter(prompt_ids) if lookup is not None and can_draft(backend) else None
    # Drafted tokens in the KV cache from ``token``'s position on, each with the logits that follow it.
    pending: list[tuple[int, np.ndarray]] = []
    # The last step's [compute seconds, tokens picked from its logits], told to the hook's after_step once no drafted
    # token of it is left to check: a pass whose drafts were taken yielded a token for each (the serve metrics'
    # token count, the thermal guard's rate and pacing credit read them).
    unreported: list | None = None
    pass_start, pass_compute = 0, 0.0  # where the current pass's tokens' gaps begin, and the pass's compute seconds
    decode_start = time.perf_counter()
    hook_wall_s = 0.0  # wall time spent in the hook, before and after each step (a simulated board waits on its own clock)

    def report() -> None:
        nonlocal unreported, hook_wall_s
        (compute_s, tokens), unreported = unreported, None
        entered = time.perf_counter()
        hook.after_step("decode", tokens, compute_s)
        hook_wall_s += time.perf_counter() - entered

    ending = False  # the constraint is complete: the token picked last is the end-of-text token it leaves

    try:
        while True:
            # drafted and checked (its logits are here already): accepted, also where the answer ends at it (a stop
            # id, a stop string, a complete constraint), as llama-server counts every draft token the model took
            drafted = bool(pending) and pending[0][0] == token
            if drafted:
                stats.draft_accepted += 1
            if token in stop_ids:
                stats.stop_reason, stats.stop_token = "complete" if ending else "eos", int(token)
                if logprobs is not None:
                    logprobs.end = logprobs.answer.pop()  # the end-of-text token is not part of the answer
                break
            generated.append(token)
            if drafter is not None:
                drafter.push(token)
            if on_token is not None:
                on_token(token)
            if constraint is not None and constraint.complete:
                stats.stop_reason = "complete"
                ending = logprobs is not None and len(generated) < sampling.max_new_tokens and \
                    _can_end(stop_ids, sampling, logits.shape[0])
                if not ending:
                    break
                constraint = _EndOfText(stop_ids)
            if len(generated) >= sampling.max_new_tokens:
                stats.stop_reason = "max_new_tokens"
                break
            held = backend.position - len(pending)  # cache entries before ``token``
            full = held >= context_size  # no room in the context for ``token`` (no draft is pending then)
            if full and (spans is None or ending):  # a complete answer is not shifted for its end-of-text token
                stats.stop_reason = "complete" if ending else "max_context"
                break
            stepped = not drafted
            if drafted:
                logits = pending.pop(0)[1]
                compute = 0.0
            else:
                if pending:  # the model chose otherwise: the rest of the draft leaves the cache
                    backend.rewind(held)
                    pending = []
                if unreported is not None:
                    report()
                if hook is not None:
                    entered = time.perf_counter()
                    stats.waited_s += _held_back(hook, "decode")
                    hook_wall_s += time.perf_counter() - entered
                step = time.perf_counter()
                # Drafting is part of the step: a draft model's decodes are compute the hook paces and is told of
                # (the thermal guard's rate, a simulated board's heat), and wait while the guard holds a step back.
                draft = [] if drafter is None or full or ending else \
                    drafter.draft(min(context_size - held - 1, sampling.max_new_tokens - len(generated) - 1))
                if full:
                    logits, held_ids = _shift(backend, held_ids, token, spans, cache)
                    stats.context_shifts += 1
                    stats.context_discarded += spans[1]
                    if drafter is not None:  # drafts read the text the context holds, as llama-server's do
                        drafter = lookup.drafter([*held_ids, token])
                elif draft:
                    rows = backend.prefill(np.asarray([token, *draft], np.int64), keep_logits=len(draft) + 1)
                    logits, pending = rows[0], list(zip(draft, rows[1:], strict=True))  # rows: (1 + draft, vocab)
                    stats.draft_tokens += len(draft)
                else:
                    logits = backend.decode(token)
                compute = time.perf_counter() - step
            if cache is not None:
                cache.took((token,))
            if held_ids is not None:
                held_ids.append(token)
            if context is not None:
                context.append(token)
                if len(context) > looked_back:  # no token past the penalties' window is kept
                    del context[: len(context) - looked_back]
            token = _pick(sampler, logits, constraint, context, logprobs)
            if stepped:  # a pass's tokens share its compute: their gaps start here
                pass_start, pass_compute = len(stats.token_latencies_s), compute
            _share_pass(stats.token_latencies_s, pass_start, pass_compute)
            if hook is not None:
                if stepped:
                    unreported = [compute, 1]
                else:
                    unreported[1] += 1
                if not pending:
                    report()
    finally:
        if pending:  # drafted tokens the answer did not take (or did not reach) leave the cache
            backend.rewind(backend.position - len(pending))
        if unreported is not None:  # the last pass's tokens, also of an answer cut short (a client gone)
            report()
        # also where ``on_token`` ended the answer (a stop string): the caller reads ``stats`` then too
        stats.decode_s = time.perf_counter() - decode_start - hook_wall_s
        stats.new_tokens = len(generated)
    if hook is not None:
        hook.end(stats)
    return generated, stats


def _held_back(hook: StepHook, kind: str) -> float:
    """The seconds ``hook.before_step(kind)`` held the step back; 0 where it returns nothing, as a no-op one does
    (the protocol's own, a ``pass``), which the stats' ``+=`` refused with a TypeError naming no hook."""
    return hook.before_step(kind) or 0.0


def _share_pass(gaps: list[float], start: int, compute_s: float) -> None:
    """Add the gap of a token picked from the pass whose tokens' gaps begin at ``start``: the pass's ``compute_s``
    shared evenly by all of its tokens so far (a drafted pass yields several at once), as llama.cpp's ``ms per
    token`` divides its decode time by the tokens and the thermal telemetry shares a step's time among its tokens."""
    count = len(gaps) - start + 1
    gaps[start:] = [compute_s / count] * count


def _prefill(backend: DecoderBackend, fresh: list[int], keep: int, hook: StepHook | None, cache: PromptCache | None,
             stats: GenerationStats) -> tuple[np.ndarray, float]:
    """Prefill the prompt tokens ``fresh`` after what the KV cache holds: the logits of the last ``keep`` of them, and
    the compute seconds of the last step, whose ``after_step`` (the step that yields the first token) the caller
    tells once it has picked that token.

    Without a hook, or one that has no ``prefill_chunk`` or answers None, the prompt is one step, one backend pass.
    A hook whose ``prefill_chunk(prompt_left)`` names fewer tokens (the thermal guard's: a few seconds of heat each,
    :meth:`edgesdk.thermal.guard.Guard.prefill_chunk`) gets the prompt in steps of that many, as llama.cpp decodes a
    prompt in micro-batches of ``n_ubatch`` (512 by default; ``llama_decode`` splits a batch into ubatches): each
    step is held back by ``before_step`` (the guard paces or pauses between steps), and each but the last is told to
    ``after_step`` as a prefill step that yielded no token. A step runs on top of the steps before it (the KV cache,
    and the prompt cache's ``took``, keep each as it ends, so a pause or an answer abandoned between steps loses
    none); ``stats.prefill_s`` adds up the steps' compute, ``stats.waited_s`` their waits; the logits kept are the
    last step's, or every step's rows where all of the prompt's are asked (``keep == len(fresh)``)."""
    ask = getattr(hook, "prefill_chunk", None) if hook is not None else None
    total, done, kept = len(fresh), 0, []
    stats.prefill_s = 0.0
    while True:
        left = total - done
        size = ask(left) if ask is not None else None
        size = left if size is None else min(max(int(size), 1), left)
        if hook is not None:
            stats.waited_s += _held_back(hook, "prefill")
        start = time.perf_counter()
        # the rows of this step among the last ``keep`` of the prompt (all of them, or the last step's last row)
        wanted = max(min(size, done + size - (total - keep)), 0)
        rows = backend.prefill(np.asarray(fresh[done:done + size], np.int64), keep_logits=max(wanted, 1))
        compute_s = time.perf_counter() - start
        stats.prefill_s += compute_s
        if cache is not None:
            cache.took(fresh[done:done + size])
        if wanted:
            kept.append(rows[-wanted:])
        done += size
        if done >= total:
            return (kept[0] if len(kept) == 1 else np.concatenate(kept, axis=0)), compute_s
        if hook is not None:
            hook.after_step("prefill", 0, compute_s)


def _shift(backend: DecoderBackend, held_ids: list[int], token: int, spans: tuple[int, int],
           cache: PromptCache | None) -> tuple[np.ndarray, list[int]]:
    """Shift the full context ``held_ids`` and feed ``token`` after what it keeps: the logits that follow ``token``,
    and the ids the KV cache holds before it (:func:`generate`). The kept start stays in the cache where the backend
    can rewind to it; the moved tokens and ``token`` are prefilled after it in one pass."""
    n_keep, n_discard = spans
    kept = held_ids[:n_keep] + held_ids[n_keep + n_discard:]
    start = n_keep if n_keep > 0 and callable(getattr(backend, "rewind", None)) and not steers_gates(backend) else 0
    controller = getattr(backend, "controller", None)  # a power-gated backend's: its --stats go on over the shift
    statistics = controller.statistics() if controller is not None else None
    if start:
        backend.rewind(start)
    else:
        backend.reset()
    if statistics is not None:
        controller.restore_statistics(statistics)
    if cache is not None:  # what the cache holds from here on: the kept start, then each token the backend takes
        cache.tokens = list(kept[:start])
    feed = [*kept[start:], token]
    rows = backend.prefill(np.asarray(feed, np.int64), keep_logits=1)  # (1, vocab)
    if cache is not None:
        cache.took(feed[:-1])  # ``token`` is added where every step adds it
    return rows[-1], kept


def _check_prompt_in_window(prompt_tokens: int, window: int) -> None:
    """Refuse a prompt longer than the context shift's window (:meth:`ContextShift.context`, below the bundle's
    ``max_context``, which :func:`_check_prompt` holds the prompt to): the cache held more than the window from the
    start, and each shift, sized for a full window, left it past the window again, so the answer shifted at every
    step. Ollama cuts such a prompt to ``num_ctx`` before it runs."""
    if prompt_tokens > window:
        raise EdgeSDKError(f"the prompt has {prompt_tokens} tokens; the context shift's window is {window} tokens",
                           f"shorten the prompt to at most {window} tokens, or widen ContextShift.window (Ollama's "
                           f"options.num_ctx) to at least {prompt_tokens}")


def _allowed_only(logits: np.ndarray, allowed: Callable[[int], bool]) -> np.ndarray:
    """``logits`` (float32) with every token ``allowed`` refuses, and every one already at -inf, at -inf."""
    finite = np.flatnonzero(logits > -math.inf)
    keep = np.fromiter((allowed(int(token)) for token in finite), bool, finite.shape[0])
    masked = np.full(logits.shape, -np.inf, np.float32)
    masked[finite[keep]] = logits[finite[keep]]
    return masked


def _infill_vocabulary(sampling: SamplingConfig, vocabulary):
    """What the infill sampler reads, where the chain holds it and ``vocabulary`` is given (None otherwise:
    :class:`Sampler` refuses a chain holding it without one, naming the fix)."""
    if "infill" not in sampling.samplers or vocabulary is None:
        return None
    from edgesdk.runtime import infill_sampler

    return infill_sampler.vocabulary_of(vocabulary)


def biased(logits: np.ndarray, config: SamplingConfig) -> np.ndarray:
    """``logits`` with ``config.logit_bias`` added (llama.cpp's ``llama_sampler_logit_bias``); the input
    itself when there is none. A token id past the logits is refused by name."""
    if not config.logit_bias:
        return logits
    highest = max(token for token, _ in config.logit_bias)  # before numpy, which cannot hold an id past 2**63
    if highest >= logits.shape[0]:
        raise LogitBiasError(f"logit_bias names token id {highest}; this model's vocabulary has ids 0 to "
                             f"{logits.shape[0] - 1}", "bias token ids of this model's tokenizer")
    tokens = np.fromiter((token for token, _ in config.logit_bias), np.int64, len(config.logit_bias))
    out = logits.astype(np.float32, copy=True)
    np.add.at(out, tokens, np.fromiter((bias for _, bias in config.logit_bias), np.float32, len(tokens)))
    if np.all(out == -np.inf):
        raise LogitBiasError("logit_bias bans every token of the vocabulary (-inf on each)",
                             "leave some token without a bias of -inf (false)")
    return out


def shaped(logits: np.ndarray, context: list[int] | None, config: SamplingConfig) -> np.ndarray:
    """The logits the sampler picks from: the logit bias, then the repetition penalties over ``context``, in
    llama.cpp's chain order (its logit-bias sampler comes before the penalties). Penalties that come after another
    sampler (``config.penalizes_in_chain``) are left to the sampler, which applies them where they stand."""
    out = biased(logits, config)
    return out if context is None or config.penalizes_in_chain else penalized(out, context, config)


def penalized(logits: np.ndarray, context: list[int], config: SamplingConfig) -> np.ndarray:
    """``logits`` with the repetition penalties of ``config`` applied over the end of ``context``
    (llama.cpp's ``llama_sampler_penalties``: repeat, then frequency and presence)."""
    if not config.penalizes:
        return logits
    seen = _seen(context, config, logits.shape[0])
    if seen is None:
        return logits
    tokens, counts = seen
    out = logits.astype(np.float32, copy=True)
    out[tokens] = _penalty(out[tokens], counts, config)
    return out


def _seen(context: list[int], config: SamplingConfig, vocab: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The distinct tokens of the penalties' window (the last ``repeat_last_n`` of ``context``, -1 all of it) that
    have a logit, and how often each is there; None where the window is empty."""
    window = context if config.repeat_last_n == -1 else context[max(len(context) - config.repeat_last_n, 0):]
    if not window:
        return None
    tokens, counts = np.unique(np.asarray(window, np.int64), return_counts=True)
    inside = tokens < vocab
    return tokens[inside], counts[inside]


def _penalty(seen: np.ndarray, counts: np.ndarray, config: SamplingConfig) -> np.ndarray:
    """llama.cpp's ``llama_sampler_penalties_apply`` on the logits ``seen`` of tokens seen ``counts`` times: a
    positive logit divided by ``repeat_penalty``, another multiplied, then ``count * frequency_penalty +
    presence_penalty`` taken off (OpenAI's formula). A result past float32's range is held at its largest (a
    penalty of -1e39 makes the token all but certain, one of 1e39 all but never drawn) rather than made infinite,
    which read as a backend's overflow; a token banned already (-inf, a logit bias) stays banned."""
    wide = seen.astype(np.float64)  # a repeat_penalty past float32's range stays finite (0 times it is 0)
    with np.errstate(over="ignore", invalid="ignore"):  # inf - inf only at a banned token, kept as it was
        scaled = np.where(wide > 0, wide / config.repeat_penalty, wide * config.repeat_penalty)
        out = np.clip(scaled, -FLOAT32_MAX, FLOAT32_MAX) - (counts * config.frequency_penalty
                                                             + config.presence_penalty)
    return np.where(seen == -np.inf, seen, np.clip(out, -FLOAT32_MAX, FLOAT32_MAX))


def _penalized_shifted(work: np.ndarray, offset: float, context: list[int],
                       config: SamplingConfig) -> tuple[np.ndarray, float]:
    """The penalties inside the chain, on ``work``, the logits as the samplers before them left them less
    ``offset``; a token a sampler dropped (-inf) stays dropped, as llama.cpp's penalties see only the candidates
    left. Returned shifted again so that the largest is 0 (the draw's softmax cannot underflow to all zeros), with
    the new offset."""
    seen = _seen(context, config, work.shape[0])
    if seen is None:
        return work, offset
    tokens, counts = seen
    live = work[tokens] > -np.inf
    tokens, counts = tokens[live], counts[live]
    out = work.copy()
    out[tokens] = _penalty(work[tokens] + offset, counts, config) - offset
    top = float(out.max())
    return out - top, offset + top


def _pick(sampler: Sampler, logits: np.ndarray, constraint: TokenConstraint | None, context: list[int] | None,
          logprobs: LogprobRecorder | None) -> int:
    picked_from = shaped(logits, context, sampler.config)
    if constraint is None:
        token = sampler(picked_from, context=context)
    else:
        token = sampler(picked_from, constraint.allows, context=context)
        constraint.advance(token)
    if logprobs is not None:
        logprobs.record(logits, token)  # the model's own distribution, as OpenAI reports it
    return token


def _pick_first(sampler: Sampler, logits: np.ndarray, constraint: TokenConstraint | None, context: list[int] | None,
                logprobs: LogprobRecorder | None, hook: StepHook | None, compute_s: float) -> int:
    """The answer's first token, from the prefill's last step, which ``hook`` is told of once it is picked, as each
    decode step is: with that token, or with none where the pick fails (a logit bias that leaves no token, a request's
    fault), so the step's compute still counts and no token the answer never had is counted (serve's metrics)."""
    try:
        token = _pick(sampler, logits, constraint, context, logprobs)
    except BaseException:
        if hook is not None:
            hook.after_step("prefill", 0, compute_s)
        raise
    if hook is not None:
        hook.after_step("prefill", 1, compute_s)
    return token


class _EndOfText:
    """The constraint of the pick after a complete answer: only the stop ids, as llama.cpp's grammar sampler at a
    grammar's end allows only end-of-generation tokens (src/llama-grammar.cpp ``llama_grammar_apply_impl``)."""

    def __init__(self, stop_ids: set[int]):
        self.stop_ids = stop_ids

    def allows(self, token_id: int) -> bool:
        return token_id in self.stop_ids

    def advance(self, token_id: int) -> None:
        pass

    @property
    def complete(self) -> bool:
        return True


def _can_end(stop_ids: set[int], sampling: SamplingConfig, vocab: int) -> bool:
    """Some stop id has a logit among the ``vocab`` the model gives and no logit bias of -inf bans it (the request's
    ``ignore_eos`` bans them all): the end-of-text token a complete answer leaves can be picked."""
    banned = {token for token, bias in sampling.logit_bias if bias == -math.inf}
    return any(token < vocab and token not in banned for token in stop_ids)


def can_draft(backend: DecoderBackend) -> bool:
    """Drafts need a cache that rewinds past refused tokens, and no per-decode controller (power gates)."""
    return callable(getattr(backend, "rewind", None)) and getattr(backend, "controller", None) is None


def _check_draft_backend(lookup, backend: DecoderBackend) -> None:
    """Refuse a draft model whose backend is the one it drafts for: its decodes went into the target's own KV cache
    between the target's passes, and the answer was silently another than the one without drafts."""
    if getattr(lookup, "backend", None) is backend:
        raise EdgeSDKError(f"the draft model runs on the target's own {backend.name} backend, whose KV cache the "
                           "drafts would overwrite between the target's passes",
                           "open the draft bundle on a backend of its own (edgesdk.runtime.speculative."
                           "open_draft_model, or open_runtime a second time) and pass DraftModel(that.backend)")


def _check_prompt(prompt_ids, backend: DecoderBackend) -> None:
    """Refuse, before anything is prefilled, an empty prompt, one past the context, and an id the model has
    no embedding row for: ONNX Runtime's Gather failed on an id past the rows with its own RuntimeError (the
    KV cache left as it was), and took a negative one as counted from the end, a silently wrong answer. A prompt
    past the context is told the --max-context that holds it where the backend knows its model's positions (its
    ``model_positions``, the manifest's: edgesdk.bundle.model_positions), or that no rebuild does; in a run held
    below the bundle's context by -c (the backend's ``built_context``: Runtime.cap_context), that the context is the
    run's, and raising -c first (or what held it: the backend's ``context_source``)."""
    tokens, max_context = len(prompt_ids), backend.max_context
    if tokens == 0:
        raise EdgeSDKError("the prompt encodes to 0 tokens", "pass non-empty text (with --raw nothing is added to it)")
    if tokens > max_context:
        from edgesdk.bundle import capped_context, context_fix

        built, source = getattr(backend, "built_context", None), getattr(backend, "context_source", "-c")
        capped = capped_context(max_context, built, source)
        problem = (f"the prompt has {tokens} tokens, past {capped}" if capped else
                   f"the prompt has {tokens} tokens; the bundle's max_context is {max_context}")
        raise EdgeSDKError(problem, context_fix("shorten the prompt", max_context,
                                                getattr(backend, "model_positions", None), tokens, built=built,
                                                source=source))
    rows = getattr(backend, "vocab_size", None)  # embedding rows (the ONNX Runtime and TensorRT backends)
    ids = np.asarray(prompt_ids)
    bad = np.flatnonzero((ids < 0) | (ids >= rows)) if rows is not None else np.flatnonzero(ids < 0)
    if bad.size:
        at = int(bad[0])
        reads = f"ids 0 to {rows - 1}" if rows is not None else "ids >= 0"
        raise EdgeSDKError(f"the prompt holds token id {int(ids[at])} at position {at}; the bundle's model "
                           f"reads {reads}", "pass token ids of the bundle's tokenizer that the model has "
                           "embedding rows for (text holding an added token past them cannot be fed to it)")
