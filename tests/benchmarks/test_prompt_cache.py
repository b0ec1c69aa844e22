"""Time to first token of a chat's later turns with the prompt cache against prefilling each prompt whole.

    EDGESDK_BENCH_BUNDLE=DIR python -m pytest tests/benchmarks/test_prompt_cache.py -m benchmark -s

A six-turn chat, each user turn a WikiText-2 paragraph and a question about it, answered greedily
(at most 64 tokens). Two runtimes of the same bundle in this process, one used at a time: one
keeps a :class:`PromptCache` across the turns (as ``edgesdk serve`` and ``run --history`` do), the
other prefills each turn's whole conversation. Which of the two goes first alternates from turn to
turn and repetition (3 of each). Reported per turn: prompt tokens, tokens from the cache, the
median time to first token of each and their ratio, and whether both gave the same answer (the history both continue is the cached one's).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.prompt_cache import PromptCache
from edgesdk.runtime.session import open_runtime

pytestmark = pytest.mark.benchmark

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"
TURNS = 6
NEW_TOKENS = 64
REPETITIONS = 3  # per turn and way; the medians are reported


def _paragraphs(count: int) -> list[str]:
    """The first ``count`` paragraphs of 60-120 words (headings and short lines skipped)."""
    found = []
    for line in WIKITEXT.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if 60 <= len(words) <= 120 and not line.strip().startswith("="):
            found.append(" ".join(words))
            if len(found) == count:
                break
    return found


def test_later_turns_reuse_the_cache(smollm2_rpi5_bundle):
    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 validation text not found beside the checkout ({WIKITEXT.name})")
    cached_runtime = open_runtime(smollm2_rpi5_bundle.path)
    whole_runtime = open_runtime(smollm2_rpi5_bundle.path)
    tokenizer = cached_runtime.tokenizer
    cache = PromptCache(cached_runtime.backend)
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    warm = tokenizer.prompt_ids("Hello", raw=False)
    for runtime in (cached_runtime, whole_runtime):  # untimed: first-run allocations
        generate(runtime.backend, warm, SamplingConfig(max_new_tokens=4), tokenizer.eos_token_ids)

    messages: list[dict] = []
    rows, ratios = [], []
    for turn, paragraph in enumerate(_paragraphs(TURNS)):
        messages.append({"role": "user", "content": f"{paragraph}\n\nIn one sentence, what is this passage about?"})
        ids = tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False)

        held = list(cache.tokens)  # what the cache holds after the previous turn
        runs = {"cache": [], "whole": []}
        for repetition in range(REPETITIONS):
            for way in ("cache", "whole") if (turn + repetition) % 2 == 0 else ("whole", "cache"):
                if way == "cache":  # each repetition starts from the previous turn's cache
                    cached_runtime.backend.rewind(len(held))
                    cache.tokens = list(held)
                    runs[way].append(generate(cached_runtime.backend, ids, sampling, tokenizer.eos_token_ids,
                                              cache=cache))
                else:
                    runs[way].append(generate(whole_runtime.backend, ids, sampling, tokenizer.eos_token_ids))
                time.sleep(0.5)  # let the other session's threads settle
        (cached_tokens, cached_stats), (whole_tokens, _) = runs["cache"][0], runs["whole"][0]
        whole_ms, cached_ms = (statistics.median(stats.time_to_first_token_s * 1e3 for _, stats in runs[name])
                               for name in ("whole", "cache"))
        ratio = whole_ms / cached_ms
        rows.append((turn + 1, len(ids), cached_stats.cached_tokens, whole_ms, cached_ms, ratio,
                     cached_tokens == whole_tokens))
        if turn:
            ratios.append(ratio)
        messages.append({"role": "assistant", "content": tokenizer.decode(cached_tokens)})

    print(f"\n{smollm2_rpi5_bundle.path.name}, {cached_runtime.backend.name}, {cached_runtime.threads} threads")
    print("turn | prompt tok | from cache | TTFT whole (ms) | TTFT cached (ms) | whole / cached | same answer")
    for turn, prompt, cached, whole_ms, cached_ms, ratio, same in rows:
        print(f"{turn} | {prompt} | {cached} | {whole_ms:.1f} | {cached_ms:.1f} | {ratio:.2f}x | {same}")
    print(f"turns 2-{TURNS}: median time-to-first-token ratio {statistics.median(ratios):.2f}x")
    assert all(row[2] > 0 for row in rows[1:]), "every later turn should reuse the earlier turns' tokens"
