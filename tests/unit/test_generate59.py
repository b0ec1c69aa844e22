"""Review of the sampler chain, stop conditions and drafted decoding (59th stop): on a backend whose logits depend only
on the text before them (the same from a prefill row, a drafted pass's row or a decode), an answer is the same token by
token, with prompt lookup and with a draft model, whatever the chain, the penalties' window, the context shift, the
prompt cache or a constraint; its log-probabilities, stop, KV cache and prompt cache too."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgesdk.runtime.generate import ContextShift, SamplingConfig, generate
from edgesdk.runtime.logprobs import LogprobRecorder
from edgesdk.runtime.lookup import LookupConfig
from edgesdk.runtime.prompt_cache import PromptCache
from edgesdk.runtime.speculative import DraftConfig, DraftModel


class _ExactBackend:
    """Logits drawn from the last three tokens before each position (and a pull towards the next id, so answers loop
    and drafts get taken): what a row holds never depends on how the tokens were batched."""

    name = "exact"

    def __init__(self, vocab: int, max_context: int, seed: int):
        self.vocab_size, self.max_context, self.seed = vocab, max_context, seed
        self.ids: list[int] = []

    @property
    def position(self) -> int:
        return len(self.ids)

    def reset(self) -> None:
        self.ids = []

    def rewind(self, length: int) -> None:
        assert 0 <= length <= len(self.ids)
        del self.ids[length:]

    def _row(self) -> np.ndarray:
        key = (self.seed * 1_000_003 + sum((t + 1) * 7919 ** i for i, t in enumerate(self.ids[-3:]))) % 2**32
        row = np.random.default_rng(key).normal(0.0, 2.0, self.vocab_size).astype(np.float32)
        row[(self.ids[-1] + 1) % self.vocab_size] += 3.0
        return row

    def prefill(self, token_ids, keep_logits: int = 1) -> np.ndarray:
        rows = []
        for token in np.asarray(token_ids).tolist():
            assert 0 <= token < self.vocab_size
            assert len(self.ids) < self.max_context
            self.ids.append(int(token))
            rows.append(self._row())
        return np.stack(rows[-keep_logits:])

    def decode(self, token_id: int) -> np.ndarray:
        return self.prefill([token_id])[0]


class _NoMultiplesOfThree:
    """A constraint: ``steps`` tokens none of whose ids is a multiple of 3 nor a stop id, then only a stop id."""

    def __init__(self, steps: int, stop_ids: set[int]):
        self.steps, self.stop_ids, self.taken = steps, stop_ids, 0

    def allows(self, token_id: int) -> bool:
        if self.complete:
            return token_id in self.stop_ids
        return token_id % 3 != 0 and token_id not in self.stop_ids

    def advance(self, token_id: int) -> None:
        self.taken += 1

    @property
    def complete(self) -> bool:
        return self.taken >= self.steps


class _Cut(Exception):
    """A stop string found in the text: the caller's ``on_token`` ends the answer."""


def _answer(mode: str, seed: int, settings: dict):
    backend = _ExactBackend(settings["vocab"], settings["max_context"], seed)
    lookup = {"plain": None, "lookup": LookupConfig(max_draft=settings["max_draft"]),
              "draft": DraftModel(_ExactBackend(settings["vocab"], settings["draft_context"], seed),
                                  DraftConfig(max_draft=3), vocab_size=settings["vocab"])}[mode]
    cache = PromptCache(backend) if settings["cached"] else None
    recorder = LogprobRecorder(top=2, prompt=settings["echo"])
    constraint = _NoMultiplesOfThree(settings["steps"], settings["stop"]) if settings["constrained"] else None
    shown: list[int] = []

    def on_token(token: int) -> None:
        shown.append(token)
        if settings["cut"] is not None and len(shown) >= settings["cut"]:
            raise _Cut

    try:
        tokens, stats = generate(backend, settings["prompt"], SamplingConfig(**settings["sampling"]), settings["stop"],
                                 on_token=on_token, cache=cache, constraint=constraint, logprobs=recorder,
                                 lookup=lookup, shift=settings["shift"])
        outcome = (tokens, stats.stop_reason, stats.stop_token, stats.context_shifts)
    except _Cut:
        outcome = ("cut", shown)
    if cache is not None:
        assert cache.tokens == backend.ids  # refused drafts left both caches
    scores = [(entry.token, round(entry.logprob, 5), entry.top) for entry in recorder.answer]
    end = recorder.end.token if recorder.end is not None else None
    return outcome, scores, end, len(recorder.prompt_entries), backend.ids


def _settings(seed: int) -> dict:
    case = random.Random(seed)
    vocab = case.choice([12, 16, 24])
    sampling = {"max_new_tokens": case.randrange(1, 50), "temperature": case.choice([0.0, 0.0, 0.7, 1.3]),
                "seed": case.randrange(1000), "top_k": case.choice([0, 3, 8]), "top_p": case.choice([1.0, 0.9, 0.5]),
                "min_p": case.choice([0.0, 0.05, 0.3]), "repeat_penalty": case.choice([1.0, 1.3, 0.8]),
                "repeat_last_n": case.choice([64, -1, 0, 3]), "presence_penalty": case.choice([0.0, 0.5]),
                "frequency_penalty": case.choice([0.0, 0.3]), "samplers": case.choice(["ekpmt", "kepmt", "tkpme"]),
                "logit_bias": case.choice([(), ((1, -float("inf")),), ((2, 4.0),)])}
    return {"vocab": vocab, "max_context": case.choice([24, 40, 64]), "draft_context": case.choice([8, 16, 64]),
            "max_draft": case.randrange(1, 8), "prompt": [case.randrange(vocab) for _ in range(case.randrange(1, 20))],
            "stop": {0, case.randrange(vocab)}, "sampling": sampling, "cached": case.random() < 0.5,
            "echo": case.random() < 0.3, "constrained": case.random() < 0.4, "steps": case.randrange(1, 30),
            "cut": case.choice([None, None, case.randrange(1, 30)]),
            "shift": case.choice([None, ContextShift(keep=case.randrange(0, 4))])}


@pytest.mark.parametrize("seed", range(60))
def test_lookup_and_a_draft_model_answer_as_token_by_token_decoding(seed):
    """Greedy and seeded sampling through every chain order (penalties first, after top-k, after the temperature),
    the penalties over the last 3, 64 or all (-1) tokens of prompt and answer or none (0), a logit bias, a context
    shift, a prompt cache, a constraint that completes, an echo's prompt scores and a stop string: the tokens, the
    stop, the raw log-probabilities and what the KV cache holds after are the same with drafts as without."""
    settings = _settings(seed)
    plain = _answer("plain", seed, settings)
    for mode in ("lookup", "draft"):
        assert _answer(mode, seed, settings) == plain, mode


def test_a_seed_gives_the_same_sampled_answer_on_every_run():
    """A fixed seed draws the same tokens run after run (a fresh sampler each answer), another seed other ones."""
    settings = _settings(7)
    settings.update(cut=None, constrained=False, shift=None, stop={0})
    settings["sampling"].update(max_new_tokens=40, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, logit_bias=(),
                                seed=11)
    first = _answer("plain", 7, settings)
    assert _answer("plain", 7, settings) == first
    settings["sampling"]["seed"] = 12
    assert _answer("plain", 7, settings)[0] != first[0]
