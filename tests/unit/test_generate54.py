"""Token generation (edgesdk/runtime/generate.py): per-token figures of drafted passes."""

from __future__ import annotations

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.lookup import LookupConfig


def test_a_drafted_pass_shares_its_compute_among_the_tokens_it_yields(runtime):
    """A prompt-lookup pass that checks a draft yields several tokens at once. Each accepted drafted token was timed
    0 s and the pass's first token the whole pass, so the p95 inter-token figure of ``--stats`` was the time of a
    9-token pass (lookup looked 9x slower per token than it is). The pass's compute is now shared by its tokens, as
    llama.cpp's ``ms per token`` and the thermal telemetry's inter-token gaps divide a step's time."""
    loop = 77
    sampling = SamplingConfig(max_new_tokens=40, logit_bias=((loop, 100.0),))
    prompt = [5, 17, 99, 3, loop, loop, loop]
    tokens, stats = generate(runtime.backend, prompt, sampling, set(), lookup=LookupConfig(max_draft=8))
    assert tokens == [loop] * 40
    assert stats.draft_accepted >= 30
    gaps = stats.token_latencies_s
    assert len(gaps) == len(tokens) - 1  # the first token comes from the prefill
    assert min(gaps) > 0  # no token of a pass is timed as free
    passes = len(gaps) - stats.draft_accepted
    assert len(set(gaps)) <= passes  # one share per pass, the same for each of its tokens
    assert stats.p95_latency_ms <= max(gaps) * 1e3
