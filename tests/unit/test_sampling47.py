"""The penalties where they stand in the sampler chain, as llama.cpp's (common/sampling.cpp ``common_sampler_init``
adds each sampler of ``--samplers`` in its order; src/llama-sampling.cpp ``llama_sampler_penalties_apply`` lowers
the candidates the samplers before it left): after top-k, after the temperature, named twice."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime.generate import Sampler, SamplingConfig, _pick, generate, shaped


def _picks(config: SamplingConfig, logits, context, draws: int) -> np.ndarray:
    """How often each token is picked in ``draws`` picks, as generate() picks (logit bias, penalties, chain)."""
    sampler = Sampler(config)
    logits = np.asarray(logits, np.float32)
    counts = np.zeros(logits.shape[0], int)
    for _ in range(draws):
        counts[_pick(sampler, logits, None, list(context), None)] += 1
    return counts


def test_penalties_after_top_k_lower_only_what_top_k_kept_greedy():
    """llama.cpp, ``--samplers "top_k;penalties;temperature" --top-k 2 --temp 0``: top-k keeps tokens 0 and 1
    (3.0, 2.9), the penalties halve both (1.5, 1.45), the temperature at 0 takes token 0. Penalising first made
    token 2 (2.0) the top, a token top-k had dropped."""
    config = SamplingConfig(temperature=0.0, top_k=2, repeat_penalty=2.0,
                            samplers=("top_k", "penalties", "temperature"))
    assert _picks(config, [3.0, 2.9, 2.0, 1.0], [0, 1], 3).tolist() == [3, 0, 0, 0]


def test_penalties_after_top_k_lower_only_what_top_k_kept_sampled():
    config = SamplingConfig(temperature=1.0, top_k=2, repeat_penalty=2.0, seed=7,
                            samplers=("top_k", "penalties", "temperature"))
    counts = _picks(config, [3.0, 2.9, 2.0, 1.0], [0, 1], 2000)
    assert counts[2:].tolist() == [0, 0]  # top-k dropped them before the penalties ran
    # what is left: softmax(1.5, 1.45) = 0.5125, 0.4875
    assert counts[0] / counts.sum() == pytest.approx(0.5125, abs=0.04)


def test_penalties_after_the_temperature_work_on_the_tempered_logits():
    """``--samplers "temperature;penalties" --temp 0.5 --frequency-penalty 1``: logits (1, 0) become (2, 0), then
    token 0, seen once, 1: p(0) = 1 / (1 + e^-1) = 0.731. Penalising first gave (0, 0) / 0.5, p(0) = 0.5."""
    config = SamplingConfig(temperature=0.5, frequency_penalty=1.0, seed=3, samplers=("temperature", "penalties"))
    counts = _picks(config, [1.0, 0.0], [0], 4000)
    assert counts[0] / counts.sum() == pytest.approx(1 / (1 + np.exp(-1.0)), abs=0.03)


def test_penalties_named_twice_apply_twice():
    """llama.cpp adds a penalties sampler for each time the chain names it: 2.0 / 1.2 / 1.2 = 1.39 < 1.5."""
    twice = SamplingConfig(temperature=0.0, repeat_penalty=1.2, samplers=("penalties", "penalties", "temperature"))
    once = SamplingConfig(temperature=0.0, repeat_penalty=1.2, samplers=("penalties", "temperature"))
    assert _picks(twice, [2.0, 1.5], [0], 1).tolist() == [0, 1]
    assert _picks(once, [2.0, 1.5], [0], 1).tolist() == [1, 0]


def test_penalties_first_are_applied_before_the_chain_as_before():
    """The default chain (and a pass-through sampler before the penalties) still penalises the logits the chain
    reads: shaped() carries them."""
    logits = np.array([3.0, 2.0, 1.0], np.float32)
    for samplers in (("penalties", "top_k", "temperature"), ("dry", "penalties", "top_k", "temperature")):
        config = SamplingConfig(temperature=1.0, repeat_penalty=2.0, presence_penalty=1.0, samplers=samplers)
        assert not config.penalizes_in_chain
        assert shaped(logits, [0], config)[0] == pytest.approx(0.5)  # 3 / 2 - 1
    late = SamplingConfig(temperature=1.0, repeat_penalty=2.0, samplers=("top_k", "penalties"))
    assert late.penalizes_in_chain
    assert shaped(logits, [0], late)[0] == 3.0  # left to the chain


def test_a_penalised_chain_keeps_a_finite_distribution_where_every_kept_token_is_penalised_hard():
    """Penalties after top-k that push every kept logit far below 0 leave the draw a distribution, not NaN."""
    config = SamplingConfig(temperature=1.0, top_k=2, repeat_penalty=1e6, seed=1,
                            samplers=("top_k", "penalties", "temperature"))
    counts = _picks(config, [-50.0, -60.0, -70.0], [0, 1], 50)
    assert counts[2] == 0
    assert counts.sum() == 50


def test_generate_applies_penalties_after_top_k_over_the_answer(runtime):
    """Through generate() on a real model: each greedy token of ``top_k;penalties;temperature`` with top-k 2 is one
    of the two most likely tokens of the model's own logits at that step, however hard the penalties push them."""
    tokenizer = runtime.tokenizer
    prompt = tokenizer.prompt_ids("The quick brown fox jumps over the lazy dog.", raw=True)
    config = SamplingConfig(max_new_tokens=16, temperature=0.0, top_k=2, repeat_penalty=50.0, repeat_last_n=-1,
                            samplers=("top_k", "penalties", "temperature"))
    answer, _ = generate(runtime.backend, prompt, config, set())
    assert len(answer) == 16
    runtime.backend.reset()
    rows = runtime.backend.prefill(np.asarray(prompt + answer[:-1], np.int64), keep_logits=len(answer))
    for step, (row, token) in enumerate(zip(rows, answer, strict=True)):
        top_two = set(np.argsort(-row, kind="stable")[:2].tolist())
        assert token in top_two, f"step {step}: token {token} is not one of the model's two most likely {top_two}"
