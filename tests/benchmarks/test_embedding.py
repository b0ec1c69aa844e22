"""Embeddings on the real SmolLM2 model: the same vectors as llama.cpp's, and what the graph's hidden-state output
costs a decode step.

    EDGESDK_BENCH_BUNDLE=DIR EDGESDK_BENCH_FP32_BUNDLE=DIR python -m pytest tests/benchmarks/test_embedding.py \
        -m benchmark -s

- ``test_embeddings_match_llama_cpp``: the uncompressed bundle (recipe ``fp32-fused``) is exported to GGUF
  (``edgesdk export``, float32) and llama.cpp embeds the same texts from it (``Llama(embedding=True,
  pooling_type=...)``, ``embed(normalize=True)``) in a subprocess, one pooling at a time; the bundle's vectors
  must point the same way (cosine >= 0.9999) from the same token ids.
- ``test_retrieval_by_pooling``: how well the chat model's vectors find a related passage: for each WikiText-2
  validation article with two paragraphs of 300+ characters, the first paragraph (its first 128 tokens) is
  the query and every article's second paragraph a candidate; reported is the share of queries whose own
  article's paragraph is the most similar, per pooling, beside a TF-IDF baseline over the same tokens.
- ``test_hidden_state_output_costs_no_decode_time``: the default bundle's graph with and without the
  ``hidden_states`` output (one added onnx edit), both over the same weights, decode the same greedy tokens,
  alternating; reported as the median ratio of their step times.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.benchmark

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"

TEXTS = ["The capital of France is Paris.", "Photosynthesis turns light into chemical energy in plants.",
         "def add(a, b):\n    return a + b", "Ein kleiner Hund läuft über die Straße."]
LLAMA_EMBED = """
import json, sys
from llama_cpp import Llama
from tests.benchmarks.llamacpp import plain_cpu_buffers
pooling = {"last": 3, "mean": 1, "cls": 2}[sys.argv[2]]
with plain_cpu_buffers():
    llm = Llama(model_path=sys.argv[1], embedding=True, pooling_type=pooling, n_ctx=512, n_batch=512, n_ubatch=512,
                verbose=False, n_threads=2)
texts = json.loads(sys.argv[3])
print(json.dumps([{"tokens": llm.tokenize(t.encode(), add_bos=True, special=True), "vector": llm.embed(t, normalize=True)}
                  for t in texts]))
"""
NEW_TOKENS = 128
ROUNDS = 6


def test_embeddings_match_llama_cpp(smollm2_fp32_bundle, tmp_path):
    pytest.importorskip("llama_cpp")
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens
    from edgesdk.runtime.session import open_runtime

    gguf = tmp_path / "smollm2-f32.gguf"
    export_gguf(smollm2_fp32_bundle.path, gguf)
    runtime = open_runtime(smollm2_fp32_bundle.path, threads=2)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for pooling in ("last", "mean", "cls"):
        # a subprocess: llama.cpp's thread pool and ONNX Runtime's never spin at the same time
        reference = json.loads(subprocess.run([sys.executable, "-c", LLAMA_EMBED, str(gguf), pooling, json.dumps(TEXTS)],
                                              capture_output=True, text=True, check=True, cwd=root).stdout)
        for text, theirs in zip(TEXTS, reference, strict=True):
            ids = runtime.tokenizer.encode(text)
            ours = embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling=pooling)).vectors
            vector = np.asarray(theirs["vector"], np.float32)
            cosine, gap = float(ours @ vector), float(np.abs(ours - vector).max())
            print(f"{pooling:>4} {text[:32]!r:36} tokens equal: {ids == theirs['tokens']}  cosine {cosine:.7f}  "
                  f"max |difference| {gap:.2e}")
            assert ids == theirs["tokens"]
            assert cosine >= 0.9999


def _article_paragraph_pairs(text: str) -> list[tuple[str, str]]:
    """(first, second) paragraph of 300+ characters of each WikiText article (its `` = Title = `` lines)."""
    pairs = []
    for article in re.split(r"\n = (?!=)[^\n]*? = \n", text):
        paragraphs = [line.strip() for line in article.split("\n")
                      if len(line.strip()) > 300 and not line.strip().startswith("=")]
        if len(paragraphs) >= 2:
            pairs.append((paragraphs[0], paragraphs[1]))
    return pairs


def _tf_idf(texts: list[str]) -> np.ndarray:
    """Unit rows of log-scaled term frequency times smoothed inverse document frequency (texts, terms)."""
    counts = [Counter(re.findall(r"\w+", text.lower())) for text in texts]
    frequency = Counter(word for count in counts for word in count)
    columns = {word: index for index, word in enumerate(frequency)}
    matrix = np.zeros((len(texts), len(columns)))
    for row, count in enumerate(counts):
        for word, n in count.items():
            matrix[row, columns[word]] = (1 + math.log(n)) * math.log((1 + len(texts)) / (1 + frequency[word]))
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def _top1(queries: np.ndarray, candidates: np.ndarray) -> float:
    return float((np.argmax(queries @ candidates.T, axis=1) == np.arange(len(queries))).mean())


def test_retrieval_by_pooling(smollm2_fp32_bundle):
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(smollm2_fp32_bundle.path, threads=2)
    pairs = _article_paragraph_pairs(WIKITEXT.read_text(encoding="utf-8"))
    ids = [[runtime.tokenizer.encode(text)[:128] for text in side] for side in zip(*pairs, strict=True)]
    texts = [runtime.tokenizer.decode(row) for side in ids for row in side]
    lexical = _tf_idf(texts)
    print(f"{len(pairs)} articles (chance {1 / len(pairs):.3f}); TF-IDF top-1 {_top1(lexical[:len(pairs)], lexical[len(pairs):]):.3f}")
    for pooling in ("last", "mean", "cls"):
        config = EmbeddingConfig(pooling=pooling)
        queries, candidates = (np.stack([embed_tokens(runtime.backend, row, config).vectors for row in side])
                               for side in ids)
        print(f"pooling {pooling}: top-1 {_top1(queries, candidates):.3f}")


def _graph_variants(bundle, root):
    """(with, without) the hidden_states output: two copies of the bundle's graph beside its weights file."""
    import onnx

    from edgesdk.runtime.backend import HIDDEN_STATES

    model = onnx.load(str(bundle.path / bundle.manifest["graph"]["file"]), load_external_data=False)
    outputs = [output.name for output in model.graph.output]
    paths = {}
    for variant in ("with", "without"):
        folder = root / variant
        folder.mkdir()
        weights = bundle.manifest["graph"].get("weights")
        if weights:
            (folder / weights["file"]).symlink_to(bundle.path / weights["file"])
        edited = onnx.ModelProto()
        edited.CopyFrom(model)
        if variant == "without" and HIDDEN_STATES in outputs:
            keep = [output for output in edited.graph.output if output.name != HIDDEN_STATES]
            del edited.graph.output[:]
            edited.graph.output.extend(keep)
            nodes = [node for node in edited.graph.node if HIDDEN_STATES not in node.output]
            del edited.graph.node[:]
            edited.graph.node.extend(nodes)
        if variant == "with" and HIDDEN_STATES not in outputs:  # a bundle built before the output existed
            final = next(node for node in edited.graph.node if node.op_type == "Slice" and
                         node.output[0] in {i for n in edited.graph.node for i in n.input})
            edited.graph.node.append(onnx.helper.make_node("Identity", [final.input[0]], [HIDDEN_STATES]))
            edited.graph.output.append(onnx.helper.make_tensor_value_info(HIDDEN_STATES, onnx.TensorProto.FLOAT,
                                                                          None))
        onnx.save(edited, str(folder / "model.onnx"))
        paths[variant] = folder / "model.onnx"
    return paths


def test_hidden_state_output_costs_no_decode_time(smollm2_rpi5_bundle, tmp_path):
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from edgesdk.runtime.session import open_runtime

    graph = smollm2_rpi5_bundle.manifest["graph"]
    assert graph["form"] == "ort-fused", "the default rpi5 bundle is the fused form"
    prompt = open_runtime(smollm2_rpi5_bundle.path, threads=1).tokenizer.encode("The board heats up while it writes")
    backends = {name: OrtFusedBackend(path, graph, threads=2)
                for name, path in _graph_variants(smollm2_rpi5_bundle, tmp_path).items()}

    def decode_s(backend) -> float:
        backend.reset()
        token = int(np.argmax(backend.prefill(np.asarray(prompt))[-1]))
        start = time.perf_counter()
        for _ in range(NEW_TOKENS):
            token = int(np.argmax(backend.decode(token)))
        return time.perf_counter() - start

    for backend in backends.values():
        decode_s(backend)  # warm-up, untimed
    ratios = []
    for _ in range(ROUNDS):
        with_s, without_s = decode_s(backends["with"]), decode_s(backends["without"])
        ratios.append(with_s / without_s)
        print(f"decode of {NEW_TOKENS} tokens: with the output {NEW_TOKENS / with_s:.1f} tok/s, without "
              f"{NEW_TOKENS / without_s:.1f} tok/s")
    print(f"step time with / without the hidden_states output: median {statistics.median(ratios):.3f}x over "
          f"{ROUNDS} alternated pairs")
