"""Speculative decoding's draft confidence (``--draft-p-min``) measured as llama.cpp measures it, on a real ONNX
Runtime session of the tiny bundle: the draft model's top token's probability among its 10 most likely tokens."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.speculative import DRAFT_TOP_K, DraftConfig, DraftModel, top_probability

PROMPT = [5, 17, 120, 33, 250, 9, 64, 199]


def _full_softmax_top(logits: np.ndarray) -> float:
    shifted = logits.astype(np.float64) - logits.max()
    return 1.0 / float(np.exp(shifted).sum())


def test_the_top_probability_is_a_softmax_over_the_ten_most_likely_tokens():
    """llama.cpp's draft sampler is top-k 10 then dist: one token 5 nats above 300 others is 0.33 of the whole
    vocabulary's mass but 0.94 of the ten candidates', and it is the latter that p_min is compared with."""
    logits = np.zeros(301, np.float32)
    logits[42] = 5.0
    assert _full_softmax_top(logits) == pytest.approx(np.exp(5) / (np.exp(5) + 300))
    assert top_probability(logits) == pytest.approx(np.exp(5) / (np.exp(5) + DRAFT_TOP_K - 1))
    assert top_probability(np.array([1.0, 1.0], np.float32)) == pytest.approx(0.5)  # fewer than ten: all of them
    banned = np.full(50, -np.inf, np.float32)
    banned[3] = 0.0
    assert top_probability(banned) == 1.0


def test_p_min_between_the_vocabulary_s_and_the_candidates_probability_drafts(target, same_model, tiny_bundle):
    """The draft stopped at a first token whose probability over the whole vocabulary was under p_min although over
    llama.cpp's ten candidates it was above: with --draft-p-min a draft model drafted less than llama.cpp's does."""
    from edgesdk.runtime.session import open_runtime

    probe = open_runtime(tiny_bundle.path, threads=1).backend
    probe.reset()
    logits = probe.prefill(np.asarray(PROMPT, np.int64))[-1]
    whole, candidates = _full_softmax_top(logits), top_probability(logits)
    assert whole < candidates  # a random model's mass is spread over the vocabulary
    between = (whole + candidates) / 2
    model = DraftModel(same_model.backend, DraftConfig(max_draft=3, p_min=between), target.backend.vocab_size)
    drafted = model.drafter(PROMPT).draft()
    assert drafted
    assert drafted[0] == int(np.argmax(logits))
    above = DraftModel(same_model.backend, DraftConfig(max_draft=3, p_min=min(candidates * 1.01, 0.999)))
    assert above.drafter(PROMPT).draft() == []
    sampling = SamplingConfig(max_new_tokens=16)
    plain, _ = generate(target.backend, PROMPT, sampling, stop_ids=set())
    answer, stats = generate(target.backend, PROMPT, sampling, stop_ids=set(), lookup=model)
    assert answer == plain
    assert stats.draft_tokens > 0
