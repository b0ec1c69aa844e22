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


def _title_request(messages: list[dict]) -> list[dict]:
    """A title request as Open WebUI sends one after an answer: the chat so far, quoted in a task prompt."""
    history = "\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages)
    return [{"role": "user", "content": "### Task:\nGenerate a concise, 3-5 word title summarizing the chat "
                                        f"history.\n### Chat History:\n<chat_history>\n{history}\n</chat_history>"}]


def test_turns_interleaved_with_title_requests_get_their_cache_back(smollm2_rpi5_bundle):
    """The same six-turn chat, a title request after every answer. One runtime keeps other
    conversations' caches in host memory (serve's --cache-ram, 256 MiB), the other keeps only the
    live cache (--cache-ram 0), whose chat turns then share only the chat template's start with it."""
    from edgesdk.runtime.cache_store import CacheStore

    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 validation text not found beside the checkout ({WIKITEXT.name})")
    runtimes = {way: open_runtime(smollm2_rpi5_bundle.path) for way in ("store", "live only")}
    caches = {"store": PromptCache(runtimes["store"].backend, CacheStore(256 * 2**20)),
              "live only": PromptCache(runtimes["live only"].backend)}
    tokenizer = runtimes["store"].tokenizer
    sampling, title_sampling = SamplingConfig(max_new_tokens=NEW_TOKENS), SamplingConfig(max_new_tokens=12)
    for runtime in runtimes.values():  # untimed: first-run allocations
        generate(runtime.backend, tokenizer.prompt_ids("Hello", raw=False), SamplingConfig(max_new_tokens=4),
                 tokenizer.eos_token_ids)

    def encode(messages):
        return tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False)

    messages: list[dict] = []
    rows = []
    for turn, paragraph in enumerate(_paragraphs(TURNS)):
        messages.append({"role": "user", "content": f"{paragraph}\n\nIn one sentence, what is this passage about?"})
        ids = encode(messages)
        results = {}
        for way in ("store", "live only") if turn % 2 == 0 else ("live only", "store"):
            results[way] = generate(runtimes[way].backend, ids, sampling, tokenizer.eos_token_ids, cache=caches[way])
            time.sleep(0.5)
        answer = tokenizer.decode(results["store"][0])
        messages.append({"role": "assistant", "content": answer})
        title = encode(_title_request(messages))
        for way in ("store", "live only"):  # untimed, as a client's background task
            generate(runtimes[way].backend, title, title_sampling, tokenizer.eos_token_ids, cache=caches[way])
        rows.append((turn + 1, len(ids), *(results[way][1].cached_tokens for way in ("store", "live only")),
                     *(results[way][1].time_to_first_token_s * 1e3 for way in ("store", "live only"))))

    print(f"\n{smollm2_rpi5_bundle.path.name}, a title request after every answer")
    print("turn | prompt tok | from cache: store / live only | TTFT store / live only (ms) | live only / store")
    for turn, prompt, stored, live, store_ms, live_ms in rows:
        print(f"{turn} | {prompt} | {stored} / {live} | {store_ms:.1f} / {live_ms:.1f} | {live_ms / store_ms:.2f}x")
    ratios = [live_ms / store_ms for *_, store_ms, live_ms in rows[1:]]
    print(f"turns 2-{TURNS}: median ratio {statistics.median(ratios):.2f}x; store holds "
          f"{caches['store'].store.nbytes / 2**20:.1f} MiB in {len(caches['store'].store.entries)} caches")
    assert all(row[2] > row[3] for row in rows[1:])
