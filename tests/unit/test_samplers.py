"""llama.cpp's top-k and min-p samplers and the logit bias: which tokens each keeps, how often a seeded sampler
draws each kept token against the renormalised distribution, the chain's order, the constrained path, and
their way through generate, run and serve."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import (
    MAX_REDRAWS,
    Sampler,
    SamplingConfig,
    biased,
    generate,
    shaped,
)

DRAWS = 20_000


def _softmax(logits, temperature=1.0) -> np.ndarray:
    scaled = np.asarray(logits, np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    return probs / probs.sum()


def _frequencies(sampler: Sampler, logits: np.ndarray, allowed=None, draws: int = DRAWS) -> np.ndarray:
    counts = np.zeros(logits.shape[0])
    for _ in range(draws):
        counts[sampler(logits, allowed)] += 1
    return counts / draws


def _expected(logits, temperature: float, kept) -> np.ndarray:
    """The temperature's distribution over ``kept``, renormalised, 0 elsewhere."""
    probs = _softmax(logits, temperature)
    out = np.zeros_like(probs)
    out[list(kept)] = probs[list(kept)]
    return out / out.sum()


def _assert_matches(freq: np.ndarray, expected: np.ndarray) -> None:
    """Only tokens of nonzero probability were drawn, each within 4.5 standard errors of its probability."""
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(expected)), \
        f"drew tokens outside the kept set: {sorted(set(np.flatnonzero(freq)) - set(np.flatnonzero(expected)))}"
    error = np.sqrt(expected * (1 - expected) / DRAWS) * 4.5 + 1e-3
    assert np.all(np.abs(freq - expected) <= error), f"frequencies {freq.round(4)} against {expected.round(4)}"


LOGITS = np.array([2.0, 1.6, 1.5, 1.2, 0.4, 0.3, -0.5, -1.0], np.float32)


def test_top_k_draws_only_the_k_most_likely_at_their_renormalised_odds():
    sampler = Sampler(SamplingConfig(temperature=0.8, top_k=3, seed=1))
    freq = _frequencies(sampler, LOGITS)
    assert set(np.flatnonzero(freq)) == {0, 1, 2}
    _assert_matches(freq, _expected(LOGITS, 0.8, [0, 1, 2]))


def test_top_k_ties_at_the_k_th_keep_the_lowest_ids():
    logits = np.array([1.0, 3.0, 1.0, 1.0, 0.0], np.float32)
    freq = _frequencies(Sampler(SamplingConfig(temperature=1.0, top_k=3, seed=2)), logits, draws=2_000)
    assert set(np.flatnonzero(freq)) == {0, 1, 2}


def test_min_p_keeps_tokens_within_min_p_of_the_top_before_the_temperature():
    """llama.cpp's min-p compares logits before the temperature: with min_p 0.5, token 3 (logit 1.2, 0.45 of
    the top's probability) is out even at temperature 2, where its scaled probability is 0.67 of the top's."""
    kept = [i for i, p in enumerate(_softmax(LOGITS)) if p >= 0.5 * _softmax(LOGITS).max()]
    assert kept == [0, 1, 2]
    assert _softmax(LOGITS, 2.0)[3] >= 0.5 * _softmax(LOGITS, 2.0).max()  # what min-p after the temperature keeps
    sampler = Sampler(SamplingConfig(temperature=2.0, min_p=0.5, seed=3))
    _assert_matches(_frequencies(sampler, LOGITS), _expected(LOGITS, 2.0, kept))


def test_min_p_of_one_keeps_the_top_token_only():
    sampler = Sampler(SamplingConfig(temperature=1.0, min_p=1.0, seed=4))
    assert {sampler(LOGITS) for _ in range(200)} == {0}


def test_the_chain_is_top_k_then_top_p_then_min_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    # top-p counts its mass over what top-k kept: top-k 2 renormalises tokens 0 and 1 to 0.57 / 0.43, so top-p
    # 0.55 keeps token 0 alone; over all four tokens it keeps 0 and 1.
    after_k = Sampler(SamplingConfig(temperature=1.0, top_k=2, top_p=0.55, seed=5))
    assert {after_k(logits) for _ in range(300)} == {0}
    alone = Sampler(SamplingConfig(temperature=1.0, top_p=0.55, seed=5))
    assert {alone(logits) for _ in range(300)} == {0, 1}
    # min-p comes after top-p: top-p 0.5 keeps 0 and 1, and min-p 0.6 keeps both (0.3 >= 0.24). Before top-p,
    # min-p would have renormalised them to 0.57 / 0.43 and top-p 0.5 kept token 0 alone.
    both = Sampler(SamplingConfig(temperature=1.0, top_p=0.5, min_p=0.6, seed=6))
    _assert_matches(_frequencies(both, logits), _expected(logits, 1.0, [0, 1]))


def test_greedy_ignores_top_k_and_min_p():
    logits = np.array([0.1, 3.0, 2.9], np.float32)
    assert Sampler(SamplingConfig(top_k=1, min_p=0.9))(logits) == 1
    allowed = lambda token: token != 1  # noqa: E731
    assert Sampler(SamplingConfig(top_k=1, min_p=1.0))(logits, allowed) == 2


def _old_sampler(config: SamplingConfig):
    """The sampler before top-k and min-p, for the defaults to be held to it draw for draw."""
    rng = np.random.default_rng(config.seed)

    def pick(logits):
        best = int(np.argmax(logits))
        if config.temperature == 0:
            return best
        with np.errstate(over="ignore"):
            scaled = (logits.astype(np.float64) - logits[best]) / config.temperature
        probs = np.exp(scaled)
        probs /= probs.sum()
        if config.top_p < 1.0:
            order = np.argsort(-probs)
            cumulative = np.cumsum(probs[order])
            keep = order[: int(np.searchsorted(cumulative, config.top_p)) + 1]
            mask = np.zeros_like(probs)
            mask[keep] = probs[keep]
            probs = mask / mask.sum()
        return int(rng.choice(probs.shape[0], p=probs))

    return pick


@pytest.mark.parametrize(("temperature", "top_p", "samplers"), [
    (0.0, 1.0, None), (0.7, 1.0, None), (1.0, 0.9, None),
    (1.3, 0.5, "ktp"),  # the temperature before top-p, as it ran before llama.cpp's order (top-p first)
])
def test_the_defaults_draw_what_the_sampler_drew_before(temperature, top_p, samplers):
    """Where the order of top-p and the temperature cannot matter (temperature 1, or no top-p) the default chain
    draws what the sampler drew before it followed llama.cpp's order; elsewhere the chain "ktp" does."""
    config = SamplingConfig(temperature=temperature, top_p=top_p, seed=11,
                            **({} if samplers is None else {"samplers": samplers}))
    new, old = Sampler(config), _old_sampler(config)
    rng = np.random.default_rng(0)
    for _ in range(300):
        logits = (rng.standard_normal(500) * 3).astype(np.float32)
        assert new(logits) == old(logits)


def test_constrained_sampling_is_exact_over_the_kept_accepted_tokens():
    """A constraint refusing some kept tokens: the draws follow the top-k distribution restricted to the accepted
    ones, and a token top-k dropped is never taken although the constraint would accept it."""
    allowed = lambda token: token in (1, 3, 5)  # noqa: E731  (5 is outside top-k 4)
    sampler = Sampler(SamplingConfig(temperature=0.9, top_k=4, seed=7))
    _assert_matches(_frequencies(sampler, LOGITS, allowed), _expected(LOGITS, 0.9, [1, 3]))


def test_constrained_sampling_past_the_redraws_draws_from_the_kept_accepted_tokens():
    """More refused tokens in the kept set than MAX_REDRAWS: the direct draw from the accepted ones stays exact,
    and min-p's cut still holds there."""
    refused = 3 * MAX_REDRAWS
    logits = np.concatenate([np.full(refused, 6.0), np.linspace(2.0, -6.0, 60)]).astype(np.float32)
    allowed = lambda token: token >= refused  # noqa: E731
    sampler = Sampler(SamplingConfig(temperature=1.0, min_p=math.exp(-6.0), seed=8))  # keeps logits >= 0
    kept = [i for i in range(refused, logits.shape[0]) if logits[i] >= 0.0]
    assert 0 < len(kept) < 60
    _assert_matches(_frequencies(sampler, logits, allowed, draws=DRAWS), _expected(logits, 1.0, kept))


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("top_k", -1, "-1"), ("top_k", 2.5, "2.5"), ("top_k", True, "True"),
    ("min_p", -0.1, "-0.1"), ("min_p", 1.5, "1.5"), ("min_p", float("nan"), "nan"),
    ("logit_bias", {5: 101}, "101"), ("logit_bias", {5: float("inf")}, "inf"), ("logit_bias", {-1: 1.0}, "-1"),
    ("logit_bias", {5: True}, "True"), ("logit_bias", [(1, 2, 3)], "(1, 2, 3)"),
])
def test_bad_values_are_refused_naming_field_value_and_range(field, value, shown):
    with pytest.raises(ValueError, match=field) as info:
        SamplingConfig(**{field: value})
    assert shown in str(info.value)
    assert any(word in str(info.value) for word in ("[0, 1]", ">= 0", "[-100, 100]", "pairs"))


def test_logit_bias_is_added_before_the_penalties_and_banned_tokens_are_never_taken():
    logits = np.array([2.0, 1.0, 0.5, 3.0], np.float32)
    config = SamplingConfig(logit_bias={0: 2.0, 3: -math.inf}, repeat_penalty=2.0)
    np.testing.assert_array_equal(biased(logits, config), [4.0, 1.0, 0.5, -np.inf])
    # llama.cpp's chain: bias, then the penalty divides the biased logit: (2 + 2) / 2, not 2 / 2 + 2.
    np.testing.assert_array_equal(shaped(logits, [0], config), [2.0, 1.0, 0.5, -np.inf])
    assert shaped(logits, None, SamplingConfig()) is logits
    greedy = Sampler(config)
    assert greedy(shaped(logits, None, config)) == 0
    sampler = Sampler(SamplingConfig(temperature=5.0, seed=9, logit_bias=((3, -math.inf),)))
    assert 3 not in {sampler(biased(logits, sampler.config)) for _ in range(500)}
    with pytest.raises(EdgeSDKError, match="token id 4"):
        biased(logits, SamplingConfig(logit_bias={4: 1.0}))
    with pytest.raises(EdgeSDKError, match="bans every token"):
        biased(logits, SamplingConfig(logit_bias={i: -math.inf for i in range(4)}))


def test_a_constraint_never_takes_a_banned_token():
    logits = np.array([0.0, 5.0, 4.0], np.float32)
    config = SamplingConfig(logit_bias={1: -math.inf})
    assert Sampler(config)(biased(logits, config), lambda token: token != 2) == 0
    with pytest.raises(EdgeSDKError, match="logit_bias"):
        Sampler(config)(biased(logits, config), lambda token: token == 1)


# ------------------------------------------------------------------------------------ generate, run, serve


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def test_generate_follows_the_logit_bias_and_records_the_model_s_own_logprobs(runtime):
    from edgesdk.runtime.logprobs import LogprobRecorder

    prompt = runtime.tokenizer.encode("The quick brown fox")
    plain, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=12), set())
    banned = plain[0]
    bias = SamplingConfig(max_new_tokens=12, logit_bias={banned: -math.inf})
    recorder = LogprobRecorder(top=0)
    answer, _ = generate(runtime.backend, prompt, bias, set(), logprobs=recorder)
    assert banned not in answer
    runtime.backend.reset()
    logits = runtime.backend.prefill(np.asarray(prompt, np.int64), keep_logits=1)[-1].astype(np.float64)
    own = logits[answer[0]] - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    assert recorder.answer[0].logprob == pytest.approx(own, abs=1e-4)  # not -inf-shifted by the bias


def test_generate_samples_within_top_k(runtime):
    prompt = runtime.tokenizer.encode("The quick brown fox")
    runtime.backend.reset()
    rows = runtime.backend.prefill(np.asarray(prompt, np.int64), keep_logits=1)
    top = set(np.argsort(-rows[-1])[:2].tolist())
    firsts = {generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=1, temperature=3.0, top_k=2,
                                                               seed=seed), set())[0][0] for seed in range(30)}
    assert firsts <= top
    assert len(firsts) == 2  # temperature 3 over two kept tokens draws both in 30 tries


def _cases(runtime) -> list[tuple[dict, SamplingConfig]]:
    """(run options, the SamplingConfig they stand for) for the prompt "hello": top-k and min-p sampling, and a
    logit bias that bans the greedy answer's token and lifts a low one between the top two, so that leaving out
    either entry changes the first token. Each must change the answer, or a run or serve that drops it passes."""
    tokenizer = runtime.tokenizer
    prompt = tokenizer.prompt_ids("hello", raw=True)
    runtime.backend.reset()
    logits = runtime.backend.prefill(np.asarray(prompt, np.int64), keep_logits=1)[-1].astype(np.float64)
    order = np.argsort(-logits)
    top, second, low = (int(t) for t in order[[0, 1, 10]])
    lift = round(float((logits[top] + logits[second]) / 2 - logits[low]), 2)
    cases = [({"temperature": 2.0, "seed": 3, "top_k": 4}, SamplingConfig(temperature=2.0, seed=3, top_k=4)),
             ({"temperature": 2.0, "seed": 3, "min_p": 0.01}, SamplingConfig(temperature=2.0, seed=3, min_p=0.01)),
             ({"logit_bias": {top: -math.inf, low: lift}}, SamplingConfig(logit_bias={top: -math.inf, low: lift}))]
    variants = [[SamplingConfig(temperature=2.0, seed=3)], [SamplingConfig(temperature=2.0, seed=3)],
                [SamplingConfig(), SamplingConfig(logit_bias={top: -math.inf}), SamplingConfig(logit_bias={low: lift})]]
    for (_, config), without in zip(cases, variants, strict=True):
        answer = _answer(runtime, config)
        for other in without:
            assert _answer(runtime, other) != answer, f"{config} must change the answer"
    return cases


def _answer(runtime, config: SamplingConfig) -> list[int]:
    from dataclasses import replace

    tokenizer = runtime.tokenizer
    return generate(runtime.backend, tokenizer.prompt_ids("hello", raw=True), replace(config, max_new_tokens=10),
                    tokenizer.eos_token_ids)[0]


def test_run_takes_top_k_min_p_and_logit_bias(tiny_bundle, runtime):
    from tests.unit.test_cli import assert_ok, invoke

    for options, config in _cases(runtime):
        arguments = []
        for name, value in options.items():
            if name == "logit_bias":
                arguments += [part for token, bias in value.items() for part in ("--logit-bias", f"{token}={bias}")]
            else:
                arguments += [f"--{name.replace('_', '-')}", value]
        result = invoke("run", tiny_bundle.path, "--prompt", "hello", "--raw", "-n", 10, *arguments, "--threads", 1)
        assert_ok(result)
        assert result.stdout == runtime.tokenizer.decode(_answer(runtime, config)) + "\n", options
    greedy = invoke("run", tiny_bundle.path, "--prompt", "hello", "--raw", "-n", 2, "--top-k", 5, "--min-p", 0.1,
                    "--threads", 1)
    assert_ok(greedy)
    assert "--top-k is not used" in greedy.stderr
    assert "--min-p is not used" in greedy.stderr
    for option, value, shown in (("--top-k", "two", "two"), ("--min-p", "1.5", "1.5"), ("--logit-bias", "7", "'7'"),
                                 ("--logit-bias", "7=200", "200"), ("--logit-bias", "99999=1", "99999")):
        bad = invoke("run", tiny_bundle.path, "--prompt", "hello", option, value, "--threads", 1)
        assert bad.exit_code == 2, bad.output
        assert option in bad.output
        assert shown in bad.output


def test_serve_takes_top_k_min_p_and_logit_bias(runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    cases = _cases(runtime)
    server = Served(runtime, ServeDefaults(max_tokens=10))
    try:
        for options, config in cases:
            expected = runtime.tokenizer.decode(_answer(runtime, config))
            forms = [options]
            if "logit_bias" in options:  # OpenAI's object (false: never), llama-server's pairs
                forms = [{"logit_bias": {str(t): (False if b == -math.inf else b) for t, b in options["logit_bias"].items()}},
                         {"logit_bias": [[t, (False if b == -math.inf else b)] for t, b in options["logit_bias"].items()]}]
            for body in forms:
                status, answer = server.post("/v1/completions", {"prompt": "hello", **body})
                assert status == 200, answer
                assert answer["choices"][0]["text"] == expected, body
        # a negative top_k is the sampler off, as llama-server reads it (tests/unit/test_core48.py)
        for field, value in (("top_k", "many"), ("top_k", 1.5), ("min_p", 2), ("min_p", "x"), ("logit_bias", {"7": 101}),
                             ("logit_bias", {"99999": 1}), ("logit_bias", {"7": True}), ("logit_bias", [[7]]),
                             ("logit_bias", "7")):
            status, answer = server.post("/v1/completions", {"prompt": "hello", field: value})
            assert (status, answer["error"]["param"]) == (400, field), answer
            assert field in answer["error"]["message"]
        status, answer = server.post("/v1/completions", {"prompt": "hello", "top_k": None, "min_p": None,
                                                          "logit_bias": None})
        assert status == 200, answer
    finally:
        server.close()


def test_a_text_logit_bias_biases_each_of_its_tokens(runtime):
    from edgesdk.serve.api import parse_text_request
    from edgesdk.serve.completion import Completer

    ids = runtime.tokenizer.encode_plain(" fox fox")
    assert len(set(ids)) < len(ids), "the text must repeat a token, to check it is biased once per time it appears"
    sampling = Completer(runtime).sampling(parse_text_request({"prompt": "x", "logit_bias": {" fox fox": -5,
                                                                                              "12": 1}}))
    assert sampling.logit_bias == (*((token, -5.0) for token in ids), (12, 1.0))  # as llama-server adds each


def test_serve_defaults_take_top_k_and_min_p(runtime):
    from edgesdk.serve.api import parse_text_request
    from edgesdk.serve.completion import Completer, ServeDefaults

    completer = Completer(runtime, ServeDefaults(top_k=20, min_p=0.1))
    sampling = completer.sampling(parse_text_request({"prompt": "x"}))
    assert (sampling.top_k, sampling.min_p) == (20, 0.1)
    sampling = completer.sampling(parse_text_request({"prompt": "x", "top_k": 0, "min_p": 0}))
    assert (sampling.top_k, sampling.min_p) == (0, 0.0)
    with pytest.raises(ValueError, match="top_k"):
        ServeDefaults(top_k=-3)
