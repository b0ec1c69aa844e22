"""What ``edgesdk serve`` costs per token against the generation loop it wraps, on the real SmolLM2 bundle.

    EDGESDK_BENCH_BUNDLE=DIR python -m pytest tests/benchmarks/test_serve_overhead.py -m benchmark -s

The same greedy answer (no stop id, so every run decodes the same number of tokens) is produced,
alternating, by :func:`generate` called directly and by a streamed ``POST /v1/completions`` to a
server on 127.0.0.1 in this process: HTTP parsing, the stop-string matcher, the stream decoder and
one server-sent event per token included. Reported: the median of the paired ratios of whole-request
wall time, and the decode tok/s of each.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer

pytestmark = pytest.mark.benchmark

PROMPT = "The board heats up while it writes"
NEW_TOKENS = 128
ROUNDS = 8


def _streamed_wall_s(port: int, body: dict) -> tuple[float, int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    connection.request("POST", "/v1/completions", body=json.dumps(body))
    payload = connection.getresponse().read().decode()
    wall = time.perf_counter() - start
    connection.close()
    events = [line[6:] for line in payload.split("\n\n") if line.startswith("data: ")]
    usage = json.loads(events[-2])["usage"]
    return wall, usage["completion_tokens"]


def test_streaming_through_serve_against_generate(smollm2_rpi5_bundle):
    runtime = open_runtime(smollm2_rpi5_bundle.path)
    prompt = runtime.tokenizer.encode(PROMPT)
    runtime.tokenizer.eos_token_ids.clear()  # every run decodes NEW_TOKENS tokens, through both paths
    server = ApiServer(("127.0.0.1", 0), Completer(runtime, ServeDefaults()), "bench", log=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    body = {"prompt": PROMPT, "max_tokens": NEW_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
    try:
        generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=8), set())  # warm-up, untimed
        _streamed_wall_s(server.server_address[1], {**body, "max_tokens": 8})
        ratios, direct_rates, served_rates = [], [], []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            tokens, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW_TOKENS), set())
            direct = time.perf_counter() - start
            time.sleep(0.5)
            served, served_tokens = _streamed_wall_s(server.server_address[1], body)
            time.sleep(0.5)
            assert served_tokens == len(tokens) == NEW_TOKENS
            ratios.append(served / direct)
            direct_rates.append(NEW_TOKENS / direct)
            served_rates.append(NEW_TOKENS / served)
    finally:
        server.shutdown()
        server.server_close()
    print(f"\nserve (streamed, HTTP on 127.0.0.1) vs generate, {NEW_TOKENS} tokens, {ROUNDS} alternated pairs: "
          f"wall time ratio median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
          f"tok/s incl. prefill: generate {statistics.median(direct_rates):.1f}, serve "
          f"{statistics.median(served_rates):.1f}")


def test_python_api_against_generate(smollm2_rpi5_bundle):
    """The same answer through :class:`edgesdk.api.Model` (a streamed ``create_completion`` read chunk by chunk,
    its worker thread and queue included) and through :func:`generate`, alternating, in one process."""
    from edgesdk.api import Model

    with Model(smollm2_rpi5_bundle.path) as model:
        runtime = model.runtime
        prompt = runtime.tokenizer.encode(PROMPT)
        runtime.tokenizer.eos_token_ids.clear()  # every run decodes NEW_TOKENS tokens, through both paths
        generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=8), set())  # warm-up, untimed
        list(model.create_completion(PROMPT, max_tokens=8, stream=True))
        ratios, direct_rates, api_rates = [], [], []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            tokens, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW_TOKENS), set())
            direct = time.perf_counter() - start
            time.sleep(0.5)
            start = time.perf_counter()
            chunks = list(model.create_completion(PROMPT, max_tokens=NEW_TOKENS, stream=True, cache_prompt=False,
                                                  stream_options={"include_usage": True}))
            through_api = time.perf_counter() - start
            time.sleep(0.5)
            assert chunks[-1]["usage"]["completion_tokens"] == len(tokens) == NEW_TOKENS
            ratios.append(through_api / direct)
            direct_rates.append(NEW_TOKENS / direct)
            api_rates.append(NEW_TOKENS / through_api)
    print(f"\nedgesdk.load(...).create_completion(stream=True) vs generate, {NEW_TOKENS} tokens, {ROUNDS} alternated "
          f"pairs: wall time ratio median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
          f"tok/s incl. prefill: generate {statistics.median(direct_rates):.1f}, API {statistics.median(api_rates):.1f}")
