"""The prompt cache leaves a power-gated backend's answers as they are: with the gates steered by the controller
(``--gating``), a conversation's next turn is the answer a fresh sequence gets, on a real ONNX Runtime session of a
tiny gated model. The controller starts over on a rewind and would otherwise see only the tokens prefilled after
the cached prefix, which moves its threshold and changes which FFN blocks run."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime.cache_store import CacheStore
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.logprobs import LogprobRecorder
from edgesdk.runtime.prompt_cache import SAVE_AT_LEAST, PromptCache


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.unit.test_prompt_cache import _gated

    return _gated(tmp_path_factory.mktemp("gated39"))


def _ids(seed: int, count: int) -> list[int]:
    return [int(token) for token in np.random.default_rng(seed).integers(0, 320, count)]


def _answer(backend, prompt, cache=None, reuse_cache=True):
    recorder = LogprobRecorder(top=1)
    tokens, stats = generate(backend, prompt, SamplingConfig(max_new_tokens=40), set(), cache=cache,
                             reuse_cache=reuse_cache, logprobs=recorder)
    return tokens, [entry.logprob for entry in recorder.answer], stats


@pytest.mark.parametrize("seed", [0, 1])
def test_a_steered_backend_answers_each_turn_as_a_fresh_sequence(gated, seed):
    """A chat, then its next turn (the chat, its answer and a few tokens): the turn's tokens and log-probabilities
    equal a fresh sequence's, with a live cache and with one saved in the store and loaded back."""
    gated.gating, gated.fixed_tau = True, None
    try:
        for store in (None, CacheStore(2**26)):
            cache = PromptCache(gated, store)
            chat = _ids(seed, SAVE_AT_LEAST + 8)
            answer, _, _ = _answer(gated, chat, cache)
            if store is not None:  # another prompt between the turns: the chat would come back from the store
                _answer(gated, _ids(50 + seed, 10), cache)
            turn = chat + answer + _ids(100 + seed, 6)
            tokens, logprobs, stats = _answer(gated, turn, cache)
            expected, expected_logprobs, _ = _answer(gated, turn)
            assert tokens == expected
            assert logprobs == pytest.approx(expected_logprobs, abs=1e-6)
            assert stats.cached_tokens == 0
    finally:
        gated.gating = False


def test_a_gated_backend_with_gating_off_or_a_fixed_threshold_still_reuses_the_cache(gated):
    """Gates that do not follow the controller (gating off, or a fixed threshold) give the same answer whatever the
    controller saw: the cached prefix is reused and the answer is a fresh sequence's."""
    for gating, fixed in ((False, None), (True, 0.3)):
        gated.gating, gated.fixed_tau = gating, fixed
        try:
            cache = PromptCache(gated)
            chat = _ids(7, 30)
            answer, _, _ = _answer(gated, chat, cache)
            turn = chat + answer + _ids(8, 5)
            tokens, logprobs, stats = _answer(gated, turn, cache)
            expected, expected_logprobs, _ = _answer(gated, turn)
            assert stats.cached_tokens == len(chat) + len(answer) - 1
            assert tokens == expected
            assert logprobs == pytest.approx(expected_logprobs, abs=1e-4)
        finally:
            gated.gating, gated.fixed_tau = False, None
