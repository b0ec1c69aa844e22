"""End-to-end batch-1 decode on a GPU with the ``triton`` backend, SmolLM2-135M's shapes.

    python -m pytest tests/benchmarks/test_triton_decode_gpu.py -m benchmark -s

The weights are random (speed does not depend on their values; no model file is needed on the GPU machine):
30 layers, hidden 576, 9 query / 3 KV heads of 64, FFN 1536, vocabulary 49152, tied head, stored as the
exporter stores them (block-sparse INT8 at block density 1.0 and 0.5). Each run prefills 8 tokens and decodes
256 greedily through :class:`TritonBackend` (logits copied to the host every step, as ``edgesdk run`` does),
with the decode step replayed from a CUDA graph and without. Baseline in the same process: transformers'
LlamaForCausalLM of the same shapes in float16, eager, with its KV cache. ``ort-cuda`` is measured where
onnxruntime has the CUDA execution provider; otherwise the run says so.

``EDGESDK_BENCH_OUT=DIR`` also writes the figures to ``DIR/decode.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests._utils.gpu import gpu_benchmark_marks  # noqa: E402

pytestmark = gpu_benchmark_marks(torch)

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 576, 30, 9, 3, 64, 1536, 49152
PROMPT, NEW_TOKENS = 8, 256


def smollm2_shaped_weights(density: float, seed: int = 0) -> tuple[dict, dict]:
    """(tensors, record) as export/sparse_export.py writes them, random INT8 codes, random block masks."""
    from edgesdk.kernels.block_sparse import BlockSparseWeight

    gen = torch.Generator().manual_seed(seed)
    qkv_rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    shapes = {"qkv": (qkv_rows, HIDDEN), "o": (HIDDEN, HEADS * HEAD_DIM), "gate_up": (2 * FFN, HIDDEN),
              "down": (HIDDEN, FFN)}
    tensors = {"embed": (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02).half(),
               "final_norm": torch.ones(HIDDEN),
               "inv_freq": 1.0 / (100000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))}
    stored = 0
    for index in range(LAYERS):
        tensors[f"layers.{index}.input_norm"] = torch.ones(HIDDEN)
        tensors[f"layers.{index}.post_attention_norm"] = torch.ones(HIDDEN)
        for kind, (n, k) in shapes.items():
            codes = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
            mask = torch.rand(-(-n // 32), -(-k // 32), generator=gen) < density
            weight = BlockSparseWeight.from_dense(codes, torch.full((n,), 0.02 / 127), mask=mask)
            tensors.update(weight.state_dict(f"layers.{index}.{kind}"))
            stored += weight.nbytes
    record = {"head_dim": HEAD_DIM, "rms_eps": 1e-5, "rope_scaling": 1.0, "max_context": 1024,
              "layers": [{"heads": HEADS, "kv_heads": KV_HEADS, "ffn": FFN}] * LAYERS, "bytes_sparse": stored}
    return tensors, record


def decode_rate(step, first: int) -> tuple[float, list[int]]:
    """Tokens per second of ``NEW_TOKENS`` greedy steps (``step(token) -> logits``) and the tokens chosen."""
    token, tokens = first, []
    for _ in range(4):  # warm-up: compiles, captures the graph
        step(token)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(NEW_TOKENS):
        token = int(np.argmax(step(token)))
        tokens.append(token)
    torch.cuda.synchronize()
    return NEW_TOKENS / (time.perf_counter() - start), tokens


def triton_rate(tensors, record, graphs: bool) -> tuple[float, list[int]]:
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend

    backend = TritonBackend(SparseDecoder(tensors, record, device="cuda", mode="triton", graphs=graphs), "triton")
    prompt = np.arange(3, 3 + PROMPT)
    backend.prefill(prompt)
    rate, tokens = decode_rate(backend.decode, 5)
    assert backend.decoder.graphs == graphs
    if graphs:
        assert backend.decoder._graph not in (None, False), backend.decoder.graph_error
    return rate, tokens


def transformers_fp16_rate() -> float:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                         tie_word_embeddings=True, max_position_embeddings=1024)
    model = LlamaForCausalLM(config).half().cuda().eval()
    state = {}

    @torch.no_grad()
    def step(token):
        out = model(input_ids=torch.tensor([[token]], device="cuda"), past_key_values=state.get("cache"),
                    use_cache=True)
        state["cache"] = out.past_key_values
        return out.logits[0, -1].float().cpu().numpy()

    with torch.no_grad():
        state["cache"] = model(input_ids=torch.arange(3, 3 + PROMPT, device="cuda")[None], use_cache=True
                               ).past_key_values
    return decode_rate(step, 5)[0]


def test_triton_decode_vs_transformers_fp16():
    import onnxruntime

    from edgesdk.kernels.ops import _device_tuning

    results = {"device": torch.cuda.get_device_name(), "new_tokens": NEW_TOKENS,
               "tuning": _device_tuning(torch.cuda.current_device()).to_dict(),
               "onnxruntime_providers": onnxruntime.get_available_providers()}
    baseline = transformers_fp16_rate()
    results["transformers fp16 eager"] = baseline
    lines = [f"{'transformers fp16 eager':>28} {baseline:>8.1f} tok/s  1.00x"]
    for density in (1.0, 0.5):
        tensors, record = smollm2_shaped_weights(density)
        chosen = {}
        for graphs in (False, True):
            rate, chosen[graphs] = triton_rate(tensors, record, graphs)
            label = f"triton d={density} {'graph' if graphs else 'eager'}"
            results[label] = rate
            results[f"{label} MB/token"] = record["bytes_sparse"] / 1e6
            lines.append(f"{label:>28} {rate:>8.1f} tok/s {rate / baseline:>5.2f}x  "
                         f"({record['bytes_sparse'] / 1e6:.1f} MB of layer weights a token)")
        results[f"d={density} graph tokens equal eager"] = chosen[True] == chosen[False]
    if "CUDAExecutionProvider" not in results["onnxruntime_providers"]:
        lines.append("ort-cuda: not measured, this onnxruntime has no CUDAExecutionProvider "
                     f"({results['onnxruntime_providers']})")
    print(f"\n{results['device']}, batch 1, {PROMPT}-token prompt, {NEW_TOKENS} new tokens, tuning {results['tuning']}\n"
          + "\n".join(lines))
    out = os.environ.get("EDGESDK_BENCH_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "decode.json").write_text(json.dumps(results, indent=1))
    assert all(value for key, value in results.items() if key.endswith("equal eager"))
