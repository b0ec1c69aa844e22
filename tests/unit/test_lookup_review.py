"""Prompt lookup decoding (edgesdk/runtime/lookup.py and generate()'s drafts) against decoding token by token:
the answers, the cache, and what the step hook (serve's metrics, the thermal guard) is told."""

from __future__ import annotations

import http.client
import json
import random
import re
import threading

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.lookup import LookupConfig
from edgesdk.runtime.prompt_cache import PromptCache

REPEATING = [5, 6, 7, 8, 9, 10] * 6


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


class CountingHook:
    """A StepHook that lists its calls."""

    def __init__(self):
        self.calls: list[tuple] = []

    def begin(self, prompt_tokens, max_new_tokens):
        self.calls.append(("begin",))

    def before_step(self, kind):
        self.calls.append(("before", kind))
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self.calls.append(("after", kind, tokens))

    def end(self, stats):
        self.calls.append(("end",))

    def tokens(self) -> int:
        return sum(call[2] for call in self.calls if call[0] == "after")


class Cut(Exception):
    pass


def _hooked(runtime, lookup, stop_after=None, **fields):
    hook, seen = CountingHook(), []

    def on_token(token):
        seen.append(token)
        if len(seen) == stop_after:
            raise Cut

    try:
        _, stats = generate(runtime.backend, REPEATING, SamplingConfig(**fields), runtime.tokenizer.eos_token_ids,
                            on_token=on_token, hook=hook, cache=PromptCache(runtime.backend), lookup=lookup)
    except Cut:
        stats = None
    return hook, seen, stats


@pytest.mark.parametrize(("fields", "stop_after"), [
    ({"max_new_tokens": 30}, None),
    # sampled from the two most likely tokens: a draw from all of the tiny model's flat logits repeats nothing to draft
    ({"max_new_tokens": 30, "temperature": 1.5, "seed": 4, "top_k": 2}, None),
    ({"max_new_tokens": 30}, 7),  # cut short mid-draft (a client gone, a stop string)
])
def test_the_hook_is_told_every_token_a_drafted_pass_yielded(runtime, fields, stop_after):
    """A pass whose drafts were taken was told to the hook as one token: serve's tokens_predicted_total and the
    thermal guard's rate and pacing credit missed every token a draft gave. Each pass is one step (a before_step
    and an after_step), told the tokens it yielded, so the hook counts what decoding token by token counts."""
    plain, plain_seen, _ = _hooked(runtime, None, stop_after, **fields)
    hook, seen, stats = _hooked(runtime, LookupConfig(max_draft=8), stop_after, **fields)
    assert seen == plain_seen
    if stats is not None:
        assert stats.draft_accepted > 0
    assert hook.tokens() == plain.tokens()
    steps = [call[1:] for call in hook.calls if call[0] in ("before", "after")]
    assert steps[:2] == [("prefill",), ("prefill", 1)]
    kinds = [call[0] for call in hook.calls if call[0] in ("before", "after")]
    assert kinds == ["before", "after"] * (len(kinds) // 2)  # each step told once, in order
    assert len(kinds) < len(plain.calls) - 2  # fewer steps than token by token
    assert any(call[0] == "after" and call[2] > 1 for call in hook.calls)


def test_serve_metrics_count_the_tokens_of_drafted_answers(runtime):
    """``edgesdk serve --lookup 8 --metrics``: edgesdk_tokens_predicted_total fell short of the completion tokens
    by the drafted tokens the model took."""
    from edgesdk.serve.completion import Completer, ServeDefaults
    from edgesdk.serve.http_server import ApiServer

    completer = Completer(runtime, ServeDefaults(max_tokens=24, lookup=8))
    server = ApiServer(("127.0.0.1", 0), completer, "tiny", log=False, metrics=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def ask(method, path, body=None):
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
        connection.request(method, path, body=None if body is None else json.dumps(body))
        text = connection.getresponse().read().decode()
        connection.close()
        return text

    try:
        usage = [json.loads(ask("POST", "/v1/completions", {"prompt": prompt}))["usage"]
                 for prompt in (REPEATING, [40, 41, 42, 43] * 5)]
        metrics = ask("GET", "/metrics")
    finally:
        server.shutdown()
        server.server_close()
    predicted = next(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("edgesdk_tokens_predicted_total "))
    assert predicted == sum(u["completion_tokens"] for u in usage) == 48


def test_thermal_telemetry_of_a_drafted_run_counts_every_token(tiny_bundle, tmp_path):
    """``run --lookup 8 --simulate-thermal --telemetry``: the step records summed to fewer tokens than the answer
    had (a pass whose drafts were taken was recorded as one token)."""
    from edgesdk.thermal.telemetry import load
    from tests.unit.test_cli import assert_ok, invoke

    path = tmp_path / "sim.jsonl"
    result = invoke("run", tiny_bundle.path, "--prompt", "one two three four " * 12, "--raw", "-n", 30,
                    "--threads", 1, "--lookup", 8, "--stats", "--simulate-thermal", "--thermal-target", "rpi5",
                    "--telemetry", path)
    assert_ok(result)
    taken = re.search(r"drafts (\d+)/\d+ taken", result.stderr)
    assert taken is not None, result.stderr
    assert int(taken.group(1)) > 0
    _, steps = load(path)
    assert sum(step["tokens"] for step in steps) == 30


@pytest.mark.parametrize("seed", range(16))
def test_drafts_refused_and_taken_give_the_answer_and_cache_of_decoding_token_by_token(runtime, seed):
    """Prompts over a few tokens (so that n-grams recur and drafts are both taken and refused), greedy and sampled,
    with penalties, a logit bias, a stop id, max_new_tokens and the context limit: the same tokens, stop reason and
    log-probabilities, and a cache that lists what the backend holds."""
    from edgesdk.runtime.logprobs import LogprobRecorder

    rng = random.Random(seed)
    alphabet = rng.sample(range(3, 300), rng.randint(3, 10))
    prompt = [rng.choice(alphabet) for _ in range(rng.randint(5, runtime.backend.max_context - 4))]
    fields = {"max_new_tokens": rng.randint(1, 80), "temperature": rng.choice([0.0, 0.8, 1.5, 3.0]), "seed": seed}
    if seed % 3 == 1:
        fields.update(repeat_penalty=1.3, repeat_last_n=rng.choice([-1, 8]), frequency_penalty=0.5,
                      presence_penalty=0.5)
    if seed % 4 == 2:
        fields.update(logit_bias=((rng.choice(alphabet), -100.0), (rng.choice(alphabet), 6.0)))
    stop = {rng.choice(alphabet)} if seed % 2 else set()
    lookup = LookupConfig(max_draft=rng.randint(1, 10), ngram_max=3, ngram_min=rng.randint(1, 3))
    answers = []
    for config in (None, lookup):
        cache, recorder = PromptCache(runtime.backend), LogprobRecorder(top=2)
        tokens, stats = generate(runtime.backend, prompt, SamplingConfig(**fields), stop, cache=cache,
                                 logprobs=recorder, lookup=config)
        assert runtime.backend.position == len(cache.tokens)
        assert cache.tokens == [*prompt, *tokens][: len(cache.tokens)]
        answers.append((tokens, stats, recorder))
    (plain, plain_stats, plain_logprobs), (drafted, stats, logprobs) = answers
    assert (drafted, stats.stop_reason) == (plain, plain_stats.stop_reason)
    assert [entry.logprob for entry in logprobs.answer] == pytest.approx(
        [entry.logprob for entry in plain_logprobs.answer], abs=1e-4)
    assert stats.draft_accepted <= stats.draft_tokens
