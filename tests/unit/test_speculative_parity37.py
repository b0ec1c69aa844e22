"""Speculative decoding (a draft bundle) and prompt lookup decoding against decoding token by token, on real ONNX
Runtime sessions of tiny bundles: greedy answers equal (many prompts, lengths that end mid-draft or at the context's
end, stop ids, constraints, logit bias and penalties), sampled answers keep the model's own distribution (an exact
distribution from a fresh prefill against many seeds), the KV cache after refused drafts holds the accepted tokens
only (the next logits equal a fresh prefill's), and the draft counts add up."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from edgesdk.runtime.generate import Sampler, SamplingConfig, generate, shaped
from edgesdk.runtime.lookup import LookupConfig
from edgesdk.runtime.prompt_cache import PromptCache
from edgesdk.runtime.speculative import DraftConfig, DraftModel
from tests._utils.builds import build_lively_bundle

PROMPTS = [
    [5, 17, 120, 33, 250, 9, 64, 199],
    [40, 41, 42, 43] * 5,
    [5, 6, 7, 8, 9, 10] * 6,
    [3 + (7 * index * index + 11 * index) % 317 for index in range(30)],
    [100],
    [12, 12, 12, 12, 12, 12, 12],
]


@pytest.fixture(scope="module")
def lively(tmp_path_factory):
    return build_lively_bundle(tmp_path_factory.mktemp("lively37"), 11)


def _open(bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(bundle.path, threads=1)


@pytest.fixture(scope="module")
def target(lively):
    return _open(lively)


@pytest.fixture(scope="module")
def same_model(lively):
    """The target's bundle opened again as a draft model: it agrees with the target on nearly every token."""
    return _open(lively)


@pytest.fixture(scope="module")
def other_bundle(tmp_path_factory):
    return build_lively_bundle(tmp_path_factory.mktemp("other37"), 12)


@pytest.fixture(scope="module")
def other_model(other_bundle):
    """Another seed's model with the target's tokenizer as a draft model: most of its drafts are refused."""
    return _open(other_bundle)


@pytest.fixture(scope="module")
def probe(lively):
    """The target's bundle opened once more, for fresh prefills to compare with."""
    return _open(lively).backend


def _drafter(kind: str, request, target, max_draft: int):
    if kind == "lookup":
        return LookupConfig(max_draft=max_draft, ngram_min=1)
    model = request.getfixturevalue(kind)
    model.backend.reset()  # a draft model takes the backend's cache as its own (earlier tests' models used it too)
    return DraftModel(model.backend, DraftConfig(max_draft=max_draft, p_min=0.0), target.backend.vocab_size)


def _fresh_logits(probe, tokens) -> np.ndarray:
    probe.reset()
    return np.array(probe.prefill(np.asarray(tokens, np.int64))[-1], np.float64)


def _answer(target, prompt, sampling, stop_ids, lookup, **kwargs):
    """An answer with a prompt cache; the cache must list what the backend holds."""
    cache = PromptCache(target.backend)
    tokens, stats = generate(target.backend, prompt, sampling, stop_ids, cache=cache, lookup=lookup, **kwargs)
    assert target.backend.position == len(cache.tokens)
    assert cache.tokens == [*prompt, *tokens][: len(cache.tokens)]
    return tokens, stats


KINDS = ["same_model", "other_model", "lookup"]


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_answers_are_the_plain_ones_for_many_prompts_lengths_and_stops(target, kind, request):
    """Every length from 1 to 12 (ends mid-draft for each draft size) and 40, with and without a stop id met
    inside a drafted run: the same tokens and stop reason, and a cache holding exactly the fed tokens."""
    drafted = accepted = 0
    for prompt in PROMPTS:
        plain, _ = generate(target.backend, prompt, SamplingConfig(max_new_tokens=40), set())
        stops = [set(), {plain[len(plain) // 2]}, {plain[1]} if len(plain) > 1 else set()]
        for max_draft in (1, 3, 5):
            lookup = _drafter(kind, request, target, max_draft)
            for n in (*range(1, 13), 40):
                for stop in stops:
                    sampling = SamplingConfig(max_new_tokens=n)
                    expected, expected_stats = generate(target.backend, prompt, sampling, stop)
                    tokens, stats = _answer(target, prompt, sampling, stop, lookup)
                    assert (tokens, stats.stop_reason) == (expected, expected_stats.stop_reason), \
                        (prompt, max_draft, n, stop)
                    drafted, accepted = drafted + stats.draft_tokens, accepted + stats.draft_accepted
    assert 0 < accepted < drafted  # drafts both taken and refused


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_answers_are_the_plain_ones_to_the_context_s_end(target, kind, request):
    """Prompts that leave from 0 to 30 free positions: drafts are cut to what the cache holds and the answer stops
    at max_context (or max_new_tokens) where the plain one does, keeping the token the last position predicts."""
    max_context = target.backend.max_context
    for free in (0, 1, 2, 3, 5, 8, 13, 30):
        prompt = (PROMPTS[3] * 8)[: max_context - free]
        for n in (free, free + 1, free + 2, 60):
            sampling = SamplingConfig(max_new_tokens=max(n, 1))
            expected, expected_stats = generate(target.backend, prompt, sampling, set())
            for max_draft in (2, 7):
                tokens, stats = _answer(target, prompt, sampling, set(), _drafter(kind, request, target, max_draft))
                assert (tokens, stats.stop_reason) == (expected, expected_stats.stop_reason), (free, n, max_draft)
                assert target.backend.position <= max_context


def _random_sampling(rng: random.Random, greedy: bool, seed: int, vocab: int) -> SamplingConfig:
    fields = {"max_new_tokens": rng.randint(1, 50), "temperature": 0.0 if greedy else rng.choice([0.7, 1.0, 1.6]),
              "seed": seed}
    if rng.random() < 0.6:
        fields.update(repeat_penalty=rng.choice([1.1, 1.5, 2.0]), repeat_last_n=rng.choice([-1, 0, 3, 16, 64]),
                      frequency_penalty=rng.choice([0.0, 0.5, 1.5]), presence_penalty=rng.choice([0.0, -0.5, 1.0]))
    if rng.random() < 0.5:
        fields["logit_bias"] = tuple((rng.randrange(vocab), rng.choice([-math.inf, -100.0, -3.0, 2.5, 8.0]))
                                     for _ in range(rng.randint(1, 6)))
    if not greedy:
        fields.update(top_k=rng.choice([0, 1, 5, 40]), top_p=rng.choice([1.0, 0.9, 0.5]),
                      min_p=rng.choice([0.0, 0.05, 0.2]), samplers=rng.choice(["ekpmt", "tkpm", "mpkte", "et"]))
    return SamplingConfig(**fields)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_penalties_and_logit_bias_see_the_accepted_tokens_as_a_plain_decode_does(target, kind, greedy, request):
    """Random penalty windows (repeat_last_n 0, 3, 16, 64, the whole context), frequency and presence terms, logit
    biases (-inf bans too) and sampler chains, with a stop id: the same tokens, stop reason and log-probabilities
    as decoding token by token."""
    from edgesdk.runtime.logprobs import LogprobRecorder

    vocab = target.backend.vocab_size
    for seed in range(24):
        rng = random.Random(1000 * greedy + seed)
        prompt = rng.choice(PROMPTS) + [rng.randrange(3, vocab) for _ in range(rng.randint(0, 12))]
        sampling = _random_sampling(rng, greedy, seed, vocab)
        stop = {rng.randrange(3, vocab) for _ in range(rng.randint(0, 8))}
        plain_logprobs, logprobs = LogprobRecorder(top=2), LogprobRecorder(top=2)
        expected, expected_stats = generate(target.backend, prompt, sampling, stop, logprobs=plain_logprobs)
        tokens, stats = _answer(target, prompt, sampling, stop, _drafter(kind, request, target, rng.randint(1, 6)),
                                logprobs=logprobs)
        assert (tokens, stats.stop_reason) == (expected, expected_stats.stop_reason), (seed, sampling)
        assert [entry.logprob for entry in logprobs.answer] == pytest.approx(
            [entry.logprob for entry in plain_logprobs.answer], abs=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constrained_answers_are_the_plain_ones(target, kind, temperature, request):
    """JSON mode and a GBNF grammar: drafts the constraint would refuse are checked like any other, and the
    constraint advances over the accepted tokens only."""
    from edgesdk.runtime.gbnf import parse_grammar
    from edgesdk.runtime.grammar import GrammarConstraint
    from edgesdk.runtime.json_mode import JsonConstraint

    tokenizer = target.tokenizer
    makers = [lambda: JsonConstraint(tokenizer.token_bytes()),
              lambda: GrammarConstraint(tokenizer.token_bytes(), parse_grammar('root ::= ("ab" | "abc" | [0-9]+ " "){2,12} "."'),
                                        tokenizer.eos_token_ids)]
    for make in makers:
        for seed, prompt in enumerate(PROMPTS):
            sampling = SamplingConfig(max_new_tokens=48, temperature=temperature, seed=seed)
            expected, expected_stats = generate(target.backend, prompt, sampling, tokenizer.eos_token_ids,
                                                constraint=make())
            tokens, stats = _answer(target, prompt, sampling, tokenizer.eos_token_ids,
                                    _drafter(kind, request, target, 4), constraint=make())
            assert (tokens, stats.stop_reason) == (expected, expected_stats.stop_reason), (seed, prompt)


def _exact_distribution(probe, prompt, sampling: SamplingConfig, length: int, floor: float = 1e-7) -> dict:
    """The plain sampler's distribution of an answer's first ``length`` tokens (sequences -> probability), from
    fresh prefills: each step's distribution is the chain's (:class:`Sampler`) over the shaped logits (logit bias,
    penalties over the text so far). Sequences under ``floor`` are left out (their mass is small and reported by
    the sum falling short of 1)."""
    sampler = Sampler(sampling)
    found = {(): 1.0}
    for _ in range(length):
        grown = {}
        for sequence, mass in found.items():
            text = [*prompt, *sequence]
            logits = shaped(_fresh_logits(probe, text).astype(np.float32),
                            text if sampling.penalizes else None, sampling)
            probs = sampler._distribution(logits, int(np.argmax(logits)))
            for token in np.flatnonzero(probs * mass > floor):
                grown[(*sequence, int(token))] = mass * float(probs[token])
        found = grown
    return found


def _marginals(distribution: dict, length: int) -> list[dict]:
    out = [{} for _ in range(length)]
    for sequence, mass in distribution.items():
        for position, token in enumerate(sequence):
            out[position][token] = out[position].get(token, 0.0) + mass
    return out


SAMPLED = [
    SamplingConfig(max_new_tokens=3, temperature=0.5),
    SamplingConfig(max_new_tokens=3, temperature=0.8, top_k=12, top_p=0.9, min_p=0.05),
    # the penalties over the last 12 tokens: over the whole 52-token prompt they push every token the prompt holds
    # out of reach, and prompt lookup (which drafts what followed a token earlier in the text) has nothing to draft
    SamplingConfig(max_new_tokens=3, temperature=1.3, top_k=8, top_p=0.8, min_p=0.02, samplers="tpmke",
                   repeat_penalty=1.3, frequency_penalty=0.4, repeat_last_n=12, logit_bias=((20, 2.0), (212, -1.0))),
]


EXACT: dict = {}  # (config index, prompt) -> exact distribution, shared by the drafters' cases


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sampling", SAMPLED, ids=["temperature", "top-k-p-min-p", "tail-first-penalized"])
def test_sampled_answers_keep_the_model_s_distribution(target, probe, kind, sampling, request):
    """Over many seeds, each of an answer's first three tokens (the second and third checked against a drafted
    pass's rows) is distributed as the plain sampler's exact distribution, within a total-variation bound: three
    times the expected deviation of an empirical distribution of that many draws plus the mass left out of the
    exact one. Each seed also gives the answer it gives without drafts."""
    runs = 1500
    # the model's own greedy answer once, then the prompt again: lookup finds what follows the first token there
    prompt = [*PROMPTS[1], *generate(target.backend, PROMPTS[1], SamplingConfig(max_new_tokens=12), set())[0],
              *PROMPTS[1]]
    key = (SAMPLED.index(sampling), tuple(prompt))
    if key not in EXACT:
        EXACT[key] = _exact_distribution(probe, prompt, sampling, 3, floor=1e-6)
    exact = EXACT[key]
    left_out = 1.0 - sum(exact.values())
    assert left_out < 0.03
    lookup = _drafter(kind, request, target, 2)
    counts = [{} for _ in range(3)]
    drafted = accepted = 0
    for seed in range(runs):
        seeded = SamplingConfig(**{**sampling.__dict__, "seed": seed})
        tokens, stats = generate(target.backend, prompt, seeded, set(), lookup=lookup)
        assert tokens == generate(target.backend, prompt, seeded, set())[0], seed
        drafted, accepted = drafted + stats.draft_tokens, accepted + stats.draft_accepted
        for position, token in enumerate(tokens):
            counts[position][token] = counts[position].get(token, 0) + 1
    assert drafted > 0
    if kind != "other_model":
        assert accepted > 0
    for position, marginal in enumerate(_marginals(exact, 3)):
        tokens = set(marginal) | set(counts[position])
        distance = 0.5 * sum(abs(counts[position].get(t, 0) / runs - marginal.get(t, 0.0)) for t in tokens)
        expected = 0.5 * sum(math.sqrt(p * (1 - p) / runs) for p in marginal.values())
        assert distance <= 3 * expected + left_out, (position, distance, expected)


@pytest.mark.parametrize("kind", KINDS)
def test_after_refused_drafts_the_cache_holds_the_accepted_tokens_only(target, probe, other_bundle, kind, request):
    """After answers whose drafts were refused at every point (lengths 1 to 24, greedy and sampled), the next
    token's logits from the cache equal a fresh prefill's of the prompt and answer; so do the draft model's from
    its own cache."""
    max_context = target.backend.max_context
    lookup = _drafter(kind, request, target, 4)
    draft_probe = _open(other_bundle).backend if kind == "other_model" else probe
    refused = 0
    for prompt in PROMPTS[:4]:
        for n in range(1, 25):
            for temperature in (0.0, 1.0):
                sampling = SamplingConfig(max_new_tokens=n, temperature=temperature, seed=n)
                tokens, stats = _answer(target, prompt, sampling, set(), lookup)
                refused += stats.draft_tokens - stats.draft_accepted
                text = [*prompt, *tokens]
                assert target.backend.position == len(text) - 1 < max_context
                after = np.array(target.backend.decode(tokens[-1]), np.float64)
                np.testing.assert_allclose(after, _fresh_logits(probe, text), atol=1e-4, err_msg=str((prompt, n)))
                if isinstance(lookup, DraftModel):
                    assert len(lookup.cached) == lookup.backend.position
                    np.testing.assert_allclose(lookup.logits_after(text), _fresh_logits(draft_probe, text),
                                               atol=1e-4)
    assert refused > 0


class StepCounter:
    """A StepHook that counts the decode passes and the tokens each was told to have yielded."""

    def __init__(self):
        self.passes = self.tokens = 0

    def begin(self, prompt_tokens, max_new_tokens):
        pass

    def before_step(self, kind):
        self.passes += kind == "decode"
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self.tokens += tokens if kind == "decode" else 0

    def end(self, stats):
        pass


@pytest.mark.parametrize("kind", KINDS)
def test_the_draft_counts_add_up(target, kind, request):
    """Every token after the first is picked from a pass's own row or from a drafted token's row it accepted: the
    passes and the accepted drafts add up to the tokens picked; the drafted tokens are the draft model's own count,
    and the accepted ones never exceed them. With the target's own weights as the draft, greedy answers that stop at
    max_new_tokens take every drafted token."""
    for seed, prompt in enumerate(PROMPTS):
        for temperature in (0.0, 1.0):
            lookup = _drafter(kind, request, target, 1 + seed % 5)
            before = lookup.drafted if isinstance(lookup, DraftModel) else 0
            hook = StepCounter()
            sampling = SamplingConfig(max_new_tokens=40, temperature=temperature, seed=seed)
            tokens, stats = generate(target.backend, prompt, sampling, set(), hook=hook, lookup=lookup)
            picked = len(tokens) - 1
            assert len(stats.token_latencies_s) == picked == hook.tokens
            assert hook.passes + stats.draft_accepted == picked
            assert 0 <= stats.draft_accepted <= stats.draft_tokens
            if isinstance(lookup, DraftModel):
                assert lookup.drafted - before == stats.draft_tokens
            if kind == "same_model" and temperature == 0:
                assert stats.draft_accepted == stats.draft_tokens > 0


@pytest.mark.parametrize("kind", KINDS)
def test_serve_stop_strings_inside_a_drafted_run_answer_as_without(target, kind, request):
    """A stop string met at each point of the plain answer (while drafted tokens wait in the cache): the same text
    and finish reason, greedy and sampled, and the request after it (which reuses the prompt cache) is answered as
    without drafts too."""
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    prompt = "one two three four one two three four one two"
    bodies = [{"prompt": prompt, "max_tokens": 30}, {"prompt": prompt, "max_tokens": 30, "temperature": 0.9,
                                                      "seed": 4, "top_k": 20}]
    plain = Served(target, ServeDefaults(max_tokens=30))
    try:
        full = [plain.post("/v1/completions", body)[1]["choices"][0]["text"] for body in bodies]
        cases = []
        for body, text in zip(bodies, full, strict=True):
            for cut in range(2, len(text) - 2, max(1, len(text) // 8)):
                stopped = {**body, "stop": [text[cut:cut + 2]]}
                after = {**body, "prompt": prompt + text[:cut], "max_tokens": 12}
                cases.append((stopped, after, plain.post("/v1/completions", stopped)[1]["choices"][0],
                              plain.post("/v1/completions", after)[1]["choices"][0]))
    finally:
        plain.close()
    assert len(cases) >= 8
    served = Served(target, ServeDefaults(max_tokens=30))
    served.server.completer.lookup = _drafter(kind, request, target, 4)
    try:
        for stopped, after, expected, expected_after in cases:
            answer = served.post("/v1/completions", stopped)[1]["choices"][0]
            assert (answer["text"], answer["finish_reason"]) == (expected["text"], expected["finish_reason"]), stopped
            assert served.post("/v1/completions", after)[1]["choices"][0]["text"] == expected_after["text"], after
    finally:
        served.close()


def test_numpy_whole_numbers_are_taken_as_draft_settings(target, same_model):
    """LookupConfig and DraftConfig refused numpy's whole numbers (``max_draft must be a whole number >= 1, got
    np.int64(4)``), which SamplingConfig takes; they are taken now and kept as Python numbers."""
    lookup = LookupConfig(max_draft=np.int64(4), ngram_max=np.int32(3), ngram_min=np.int64(1))
    assert (lookup.max_draft, lookup.ngram_max, lookup.ngram_min) == (4, 3, 1)
    assert all(type(value) is int for value in (lookup.max_draft, lookup.ngram_max, lookup.ngram_min))
    config = DraftConfig(max_draft=np.int64(3), p_min=np.float32(0.25))
    assert (type(config.max_draft), type(config.p_min)) == (int, float)
    sampling = SamplingConfig(max_new_tokens=30)
    plain, _ = generate(target.backend, PROMPTS[2], sampling, set())
    same_model.backend.reset()
    for drafts in (lookup, DraftModel(same_model.backend, config, target.backend.vocab_size)):
        tokens, stats = generate(target.backend, PROMPTS[2], sampling, set(), lookup=drafts)
        assert tokens == plain
        assert stats.draft_tokens > 0
    with pytest.raises(ValueError, match="max_draft must be a whole number >= 1, got np.int64.0."):
        LookupConfig(max_draft=np.int64(0))
    with pytest.raises(ValueError, match="max_draft must be a whole number from 1 to 64, got 2.0"):
        DraftConfig(max_draft=2.0)


def test_a_lookup_that_is_no_drafter_is_refused_by_name(target):
    """``generate(lookup=8)`` (serve's ``lookup`` setting is such a count) failed with ``'int' object has no attribute
    'drafter'`` on a backend that drafts, and was passed over silently on one that cannot rewind."""
    from edgesdk.errors import EdgeSDKError
    from tests._utils.backends import NoRewind

    for backend in (target.backend, NoRewind(target.backend)):
        with pytest.raises(EdgeSDKError) as caught:
            generate(backend, PROMPTS[0], SamplingConfig(max_new_tokens=4), set(), lookup=8)
        assert "lookup must be a LookupConfig (prompt lookup) or a DraftModel (a draft bundle), got 8" in str(caught.value)
        assert "LookupConfig(max_draft=N)" in caught.value.fix
