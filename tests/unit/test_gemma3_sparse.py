"""Gemma 3 on the block-sparse path (export/sparse_export.py, edgesdk/runtime/sparse_decoder.py, the ``triton``
backend): the decode attention kernel's sliding window against its PyTorch twin under Triton's interpreter, and the
tiny Gemma 3 of test_gemma3.py (window 4 on layers 0 and 2, full attention on layer 1, query_pre_attn_scalar 24,
every norm weight away from 0) exported block-sparse and decoded far past its window against transformers'
Gemma3ForCausalLM. Every comparison prints its max abs diff (``-s``) and records it as ``max_abs_diff``.

The build refuses Gemma 3 for export.sparse before any stage (build/pipeline.py ``check_gemma_stages``), so the
export and the backend are called directly here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.ops import gqa_decode_attention  # noqa: E402
from edgesdk.kernels.reference import gqa_decode_attention_reference  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402
from tests._utils.parity import report_max_abs_diff  # noqa: E402
from tests._utils.tiny import on_sparse_grid, tiny_llama  # noqa: E402
from tests.unit.test_gemma3 import GEMMA3  # noqa: E402
from tests.unit.test_kernels import attention_inputs  # noqa: E402

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the interpreted kernel needs triton (pip install edgesdk[kernels])")
TILE_16 = dataclasses.replace(tuning_for(87), attn_block_t=16)  # several online-softmax tiles on short caches


# ---------------------------------------------------------------------------------------------- the kernel
WINDOW_CASES = [  # (Hq, Hkv, D, T_max, lengths, window)
    (4, 2, 32, 37, [1, 37, 20], 4),  # Gemma's tiny window, far shorter than two of the rows
    (6, 2, 24, 41, [41, 7, 0], 1),  # a query that sees itself only; D not a power of two; an empty row
    (3, 3, 17, 9, [9, 3], 50),  # a window longer than every row: full attention
    (8, 1, 64, 37, [37], 16),  # a window of exactly one tile, starting mid-tile (position 21)
    (12, 4, 80, 45, [45, 44], 37),  # 37 of 45: the first tile starts at 8, unaligned; BLOCK_D 128 for D 80
    (2, 1, 16, 33, [33], 33),  # a window equal to the length
]


@needs_triton
@pytest.mark.parametrize(("hq", "hkv", "d", "t_max", "lengths", "window"), WINDOW_CASES)
def test_the_windowed_decode_kernel_matches_its_twin_under_the_interpreter(hq, hkv, d, t_max, lengths, window,
                                                                          record_property):
    q, k, v, lens = attention_inputs(len(lengths), hq, hkv, d, t_max, lengths, seed=hq * d + window)
    out = gqa_decode_attention(q, k, v, lens, 0.2, mode="emulated", tuning=TILE_16, window=window)
    ref = gqa_decode_attention(q, k, v, lens, 0.2, mode="reference", window=window)
    assert out.shape == (len(lengths), hq, d)
    report_max_abs_diff(f"gqa window {window} Hq={hq} Hkv={hkv} D={d} lengths={lengths}", float((out - ref).abs().max()),
                        1e-5, record_property)
    if any(length > window for length in lengths):  # the window changed the answer: it was applied, not ignored
        full = gqa_decode_attention_reference(q, k, v, lens, 0.2)
        assert float((full - ref).abs().max()) > 1e-2


def test_the_twin_reads_the_last_window_positions_only():
    """The twin against its definition: softmax over keys length - window .. length - 1 of each row."""
    q, k, v, lens = attention_inputs(2, 6, 2, 16, 12, [12, 3])
    out = gqa_decode_attention_reference(q, k, v, lens, 0.25, window=5)
    kk, vv = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)  # (B, Hq, T, D)
    for b, length in enumerate(lens.tolist()):
        first = max(0, length - 5)
        probs = torch.softmax(torch.einsum("hd,htd->ht", q[b], kk[b, :, first:length]) * 0.25, dim=-1)
        assert torch.allclose(out[b], torch.einsum("ht,htd->hd", probs, vv[b, :, first:length]), atol=1e-5)


@pytest.mark.parametrize("mode", ["reference", pytest.param("emulated", marks=needs_triton)])
def test_positions_before_the_window_are_never_part_of_the_output(mode, record_property):
    """Entries before the window may hold anything (NaN, inf): they are outside the query's view as the ones
    past its length are."""
    q, k, v, lens = attention_inputs(1, 4, 2, 16, 20, [20])
    clean = gqa_decode_attention_reference(q, k, v, lens, 0.25, window=6)
    k[:, :, :14], v[:, :, :14] = float("nan"), float("inf")  # positions 0..13; the window is 14..19
    out = gqa_decode_attention(q, k, v, lens, 0.25, mode=mode, tuning=TILE_16, window=6)
    assert torch.isfinite(out).all()
    report_max_abs_diff(f"gqa {mode} window 6 with NaN/inf before it", float((out - clean).abs().max()), 1e-5, record_property)


@pytest.mark.parametrize("mode", ["reference", pytest.param("emulated", marks=needs_triton)])
@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_a_window_that_is_not_a_positive_count_is_refused(mode, window):
    q, k, v, lens = attention_inputs(1, 4, 2, 16, 8, [8])
    with pytest.raises(ValueError, match=r"window must be None \(full attention\) or the number of positions a "
                                         r"query sees, itself included: an integer in \[1, 2147483647\]"):
        gqa_decode_attention(q, k, v, lens, 0.25, mode=mode, tuning=TILE_16, window=window)


@needs_triton
def test_the_kernel_decorated_under_triton_interpret_matches_the_twin(tmp_path):
    """The kernel body as ``@triton.jit`` gives it with TRITON_INTERPRET=1 set (what the emulated mode builds
    without the variable), launched on windows shorter and longer than the rows, in a fresh interpreter."""
    script = tmp_path / "interpret.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import torch, triton
        from edgesdk.kernels.reference import gqa_decode_attention_reference
        from edgesdk.kernels.triton_kernels import KERNEL_BODIES

        kernel = triton.jit(KERNEL_BODIES["gqa_decode"])
        assert type(kernel).__name__ == "InterpretedFunction", type(kernel)
        diffs = []
        for hq, hkv, d, t_max, lengths, window in json.loads(sys.argv[1]):
            gen = torch.Generator().manual_seed(d)
            q = torch.randn(len(lengths), hq, d, generator=gen)
            k = torch.randn(len(lengths), hkv, t_max, d, generator=gen)
            v = torch.randn(len(lengths), hkv, t_max, d, generator=gen)
            lens = torch.tensor(lengths, dtype=torch.int32)
            out = torch.empty_like(q)
            kernel[(len(lengths), hkv)](q, k, v, lens, out, 0.2, hq // hkv, d, *q.stride(), *k.stride(),
                                        *v.stride(), *out.stride(), BLOCK_G=triton.next_power_of_2(hq // hkv),
                                        BLOCK_D=triton.next_power_of_2(d), BLOCK_T=16, WINDOW=window)
            ref = gqa_decode_attention_reference(q, k, v, lens, 0.2, window=window)
            diffs.append(float((out - ref).abs().max()))
        print(json.dumps(diffs))
    """))
    cases = [[hq, hkv, d, t_max, lengths, window] for hq, hkv, d, t_max, lengths, window in WINDOW_CASES[:4]]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script), json.dumps(cases)], capture_output=True, text=True, env=env,
                          cwd=os.getcwd(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    diffs = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n[max abs diff] TRITON_INTERPRET=1 kernel vs twin, windows 4, 1, 50, 16: {max(diffs):.3e}")
    assert max(diffs) <= 1e-5


# ---------------------------------------------------------------------------------------------- compiled kernels
def test_the_compiled_kernels_are_picked_by_window_and_a_missing_one_is_named():
    """AOT variants carry their window as a constexpr: a sliding layer launches the variant of its window, a full
    layer the one without (as bundles compiled before windows have it), and a model whose window was not
    compiled is told so when the bundle opens, not at its first token."""
    from tests.unit.test_kernel_loader import fake_kernels

    kernels, driver = fake_kernels(head_dims=(32,), group_blocks=(2,), layouts=("plain",), windows=(None, 4))
    assert sorted(name for name in kernels if name.startswith("gqa")) == ["gqa_decode_d32_g2_fp16",
                                                                          "gqa_decode_d32_g2_w4_fp16"]
    q, cache = torch.randn(1, 4, 32), torch.randn(1, 2, 16, 32)
    kernels.gqa_decode_attention(q, cache, cache, torch.tensor([9]), 0.2, window=4)
    kernels.gqa_decode_attention(q, cache, cache, torch.tensor([9]), 0.2)
    assert [launch[0] for launch in driver.launches] == ["gqa_decode_d32_g2_w4_fp16", "gqa_decode_d32_g2_fp16"]
    assert kernels.missing((32, 32), "plain", 32, [2, 2, 2], [4, None, 4]) == []
    older, _ = fake_kernels(head_dims=(32,), group_blocks=(2,), layouts=("plain",))
    for kernel in older.values():  # metadata written before windows: no WINDOW constexpr at all
        kernel.meta["constexprs"].pop("WINDOW", None)
    assert older.missing((32, 32), "plain", 32, [2, 2, 2]) == []
    assert older.missing((32, 32), "plain", 32, [2, 2, 2], [4, None, 4]) == [
        "gqa_decode for head_dim 32, 2 query heads per KV head, sliding window 4"]
    from edgesdk.kernels.loader import KernelLoadError

    with pytest.raises(KernelLoadError, match="no compiled gqa_decode variant for D=32, group=2, window=4"):
        older.gqa_decode_attention(q, cache, cache, torch.tensor([9]), 0.2, window=4)


@needs_triton
def test_a_windowed_variant_compiles_ahead_of_time(tmp_path):
    """Triton's whole pipeline (to a cubin for sm_87, no GPU) takes the kernel with a window as with none."""
    from edgesdk.kernels.aot import compile_for_target, default_variants

    tuning = tuning_for(87)
    variants = [v for v in default_variants(tuning, head_dims=(32,), group_blocks=(2,), layouts=("plain",),
                                            windows=(None, 512)) if v.kernel == "gqa_decode"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))
        results = compile_for_target(87, tmp_path / "kernels", tuning, variants=variants)
    assert [(r.name, r.ok, r.error) for r in results] == [("gqa_decode_d32_g2_fp16", True, None),
                                                          ("gqa_decode_d32_g2_w512_fp16", True, None)]
    meta = json.loads((tmp_path / "kernels" / "sm_87" / "gqa_decode_d32_g2_w512_fp16.json").read_text())
    assert meta["constexprs"]["WINDOW"] == 512
    assert [name for name, _ in meta["params"]][5:8] == ["scale", "GROUP", "D"]  # runtime parameters as before


# ---------------------------------------------------------------------------------------------- the decoder
@pytest.fixture(scope="module")
def gemma_sparse(tmp_path_factory):
    """(model, export dir, record): the tiny Gemma 3 with its linears on the per-row INT8 grid and its embedding
    rounded to float16 (what the sparse weights store), exported block-sparse."""
    from edgesdk.export.sparse_export import SparseExportConfig, export_sparse

    model = on_sparse_grid(tiny_llama(**GEMMA3), embedding_in_half=True)
    out = tmp_path_factory.mktemp("gemma_sparse")
    record = export_sparse(model, out, SparseExportConfig(), max_context=64)
    return model, out, record


def _tensors(out, record):
    from safetensors.torch import load_file

    return load_file(str(out / record["weights"]))


def test_the_sparse_export_records_what_gemma_computes_otherwise(gemma_sparse):
    model, out, record = gemma_sparse
    assert [layer.get("window") for layer in record["layers"]] == [4, None, 4]
    assert [layer.get("rope", 0) for layer in record["layers"]] == [0, 1, 0]  # sliding: local base; full: global
    assert record["attention_scale"] == pytest.approx(24 ** -0.5)
    assert record["embed_scale"] == pytest.approx(64 ** 0.5)
    assert record["activation"] == "gelu_tanh"
    assert record["other_rope_scalings"] == [1.0]
    tensors = _tensors(out, record)
    layer = model.model.layers[1]
    for name, module in (("input_norm", layer.input_layernorm), ("post_attention_norm", layer.pre_feedforward_layernorm),
                         ("attn_out_norm", layer.post_attention_layernorm),
                         ("ffn_out_norm", layer.post_feedforward_layernorm), ("q_norm", layer.self_attn.q_norm)):
        assert torch.equal(tensors[f"layers.1.{name}"], module.weight.detach() + 1.0), name  # Gemma's 1 + w
    rotary = model.model.rotary_emb
    assert torch.equal(tensors["inv_freq"], rotary.sliding_attention_original_inv_freq)
    assert torch.equal(tensors["inv_freq.1"], rotary.full_attention_original_inv_freq)
    assert not torch.equal(tensors["inv_freq"], tensors["inv_freq.1"])


def _decode_in_chunks(decoder, ids):
    """6 tokens of prefill, 5 more as a second prefill past the window, then one token a step."""
    parts = [decoder.step(ids[:6], keep=6), decoder.step(ids[6:11], keep=5)]
    parts += [decoder.step(ids[i:i + 1], keep=1) for i in range(11, len(ids))]
    return torch.cat(parts)


@pytest.mark.parametrize(("mode", "graphs"), [("reference", False), ("reference", True),
                                               pytest.param("emulated", False, marks=needs_triton)])
def test_the_sparse_decoder_gives_transformers_logits_far_past_the_window(mode, graphs, gemma_sparse,
                                                                         record_property):
    """Prefill, a second prefill chunk and 22 single-token steps (33 positions, 8 windows): every position's
    logits are Gemma3ForCausalLM's. ``graphs``: the static decode step the CUDA graph captures (length in a device
    tensor, window a constant of the launch), run eagerly on this CPU."""
    from edgesdk.runtime.sparse_decoder import SparseDecoder

    model, out, record = gemma_sparse
    ids = torch.randint(0, model.config.vocab_size, (33,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids[None]).logits[0]
    decoder = SparseDecoder(_tensors(out, record), record, mode=mode, graphs=graphs)
    got = _decode_in_chunks(decoder, ids)
    assert decoder.position == 33
    scale = float(expected.abs().max())
    report_max_abs_diff(f"sparse decoder ({mode}, static steps {graphs}) vs transformers, logit scale {scale:.1f}",
                        float((got - expected).abs().max()), 1e-4 * max(scale, 1.0), record_property)
    if mode == "reference" and not graphs:  # the comparison sees the window: without it the logits differ
        unwindowed = {**record, "layers": [{k: v for k, v in layer.items() if k != "window"}
                                           for layer in record["layers"]]}
        wrong = _decode_in_chunks(SparseDecoder(_tensors(out, record), unwindowed, mode=mode), ids)
        assert float((wrong[4:] - expected[4:]).abs().max()) > 1e-2 * scale


def test_the_build_s_own_check_of_the_sparse_weights_passes_for_gemma(gemma_sparse):
    """validate_sparse, which the build runs after the export: the twins' decoder against the PyTorch model on
    random prompts (12 tokens, three windows, then decode steps)."""
    from edgesdk.export.sparse_export import validate_sparse
    from edgesdk.export.validate import ValidationConfig

    model, out, record = gemma_sparse
    report = validate_sparse(model, out, record, ValidationConfig(prompts=2))
    print(f"\n[max abs diff] validate_sparse: {report['max_abs_diff']}")
    assert report["top1_agree"] == 1.0


@pytest.mark.parametrize("penalty", [1.0, 3.0])
def test_greedy_tokens_through_the_triton_backend_are_transformers_generate(penalty, gemma_sparse, monkeypatch):
    """The backend opened from the exported files (kernels' twins: EDGESDK_KERNELS=reference) and the runtime's
    generate: 40 greedy tokens after a 6-token prompt, ten windows, are transformers' generate tokens. The tiny
    model's greedy tokens depend on the context (its KV cache); with a repetition penalty over the whole context
    (llama.cpp's, as transformers' repetition_penalty computes it) each step picks a new one, so every step's
    logits count."""
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.triton_backend import open_triton_backend

    model, out, record = gemma_sparse
    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    backend = open_triton_backend(SimpleNamespace(manifest={"sparse": record}, file=lambda name: out / name),
                                  threads=1)
    prompt = [5, 17, 120, 33, 250, 9]
    sampling = SamplingConfig(max_new_tokens=40, repeat_penalty=penalty, repeat_last_n=-1)
    tokens, _ = generate(backend, prompt, sampling, stop_ids=set())
    with torch.no_grad():  # no stop id on either side: min_new_tokens would mask id 2 (the eos) instead
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                                  pad_token_id=0, repetition_penalty=penalty)[0, len(prompt):].tolist()
    assert len(expected) == 40
    assert tokens == expected
    if penalty > 1:
        assert len(set(tokens)) > 30


def test_a_record_with_an_activation_this_decoder_lacks_is_a_backend_error(gemma_sparse):
    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.sparse_decoder import SparseDecoder

    _, out, record = gemma_sparse
    with pytest.raises(RuntimeBackendError, match="sets activation 'relu2', which this block-sparse decoder does "
                                                  "not compute \\(it computes silu, gelu_tanh\\)"):
        SparseDecoder(_tensors(out, record), {**record, "activation": "relu2"}, mode="reference")
