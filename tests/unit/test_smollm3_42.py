"""SmolLM3 (transformers' ``smollm3``): Llama's decoder whose NoPE layers apply no rotary embedding, built, run and
exported like the other decoders.

Tiny SmolLM3 models here have 4 layers, GQA (4 query heads, 2 KV heads) and SmolLM3's default pattern: every
fourth layer is NoPE (``no_rope_layers`` [1, 1, 1, 0], llama.cpp's smollm3 ``(il + 1) % 4 == 0``); one case moves
the NoPE layer to the front ([0, 1, 1, 1]) so that the layers after it read its unrotated output. A graph that
rotated every layer (or none) gives other tokens, so each comparison with transformers checks where rotary is
skipped. Every comparison prints its max abs logit diff (``-s``) and records it as ``max_abs_diff``.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from edgesdk.errors import ExportError, ModelSourceError
from tests._utils.builds import JETSON_RECIPE, QDQ_RECIPE, build_tiny_bundle
from tests._utils.parity import bundle_follows_transformers, penalised_greedy_tokens, report_max_abs_diff
from tests._utils.tiny import on_sparse_grid, save_tiny_model_dir, tiny_llama

torch = pytest.importorskip("torch")

SMOLLM3 = {"model_type": "smollm3", "hidden": 64, "heads": 4, "kv_heads": 2, "layers": 4, "intermediate": 128}
PROMPT = [5, 17, 120, 33, 250, 9]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the interpreted kernels need triton (pip install edgesdk[kernels])")


def _recipe(form: str, weights: str) -> str:
    return f"name: r\nstages: []\nexport: {{form: {form}, weights: {weights}}}\n"


def _model_dir(tmp_path, **overrides):
    return save_tiny_model_dir(tmp_path / "model", **{**SMOLLM3, **overrides})


def _source(tmp_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()


# ---------------------------------------------------------------------------------------------- loading
def test_the_loader_takes_smollm3_and_the_export_reads_its_nope_layers(tmp_path):
    from edgesdk.export.decoder_weights import decoder_weights_from_hf
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model(str(_model_dir(tmp_path))), progress=False)
    assert loaded.facts()["architecture"] == "smollm3"
    assert loaded.model.config.no_rope_layers == [1, 1, 1, 0]
    assert [layer.rope for layer in decoder_weights_from_hf(loaded.model).layers] == [0, 0, 0, None]


def test_a_sliding_window_shorter_than_the_context_is_refused_before_any_stage(tmp_path):
    """SmolLM3's use_sliding_window makes its NoPE layers attend over ``sliding_window`` tokens; the graphs
    attend over the whole context, so a shorter window is refused (as for Mistral and Qwen)."""
    from edgesdk.export.onnx_export import ExportConfig, check_exportable, sliding_window

    model = tiny_llama(**SMOLLM3, config_overrides={"use_sliding_window": True, "sliding_window": 32})
    assert model.config.layer_types == ["full_attention"] * 3 + ["sliding_attention"]
    assert sliding_window(model.config) == 32
    with pytest.raises(ExportError, match="sliding window of 32 tokens, shorter than the bundle's context of 64"):
        check_exportable(model.config, ExportConfig(max_context=64))
    check_exportable(model.config, ExportConfig(max_context=32))  # within the window the two are the same
    off = tiny_llama(**SMOLLM3, config_overrides={"use_sliding_window": False, "sliding_window": 32})
    assert sliding_window(off.config) is None


def test_a_smollm3_gguf_file_lacking_a_key_llama_cpp_requires_is_refused_by_name(tmp_path):
    """edgesdk reads a smollm3 GGUF file itself (transformers' GGUF reader has none); one without
    smollm3.feed_forward_length, which llama.cpp requires, is refused naming the key, the architecture and the fix
    (tests/unit/test_smollm3_gguf_in42.py builds from whole files)."""
    from gguf import GGUFWriter

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    path = tmp_path / "smollm3.gguf"
    writer = GGUFWriter(str(path), "smollm3")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelSourceError, match="holds a SmolLM3 model \\(general.architecture smollm3\\) without "
                       "smollm3.feed_forward_length, which llama.cpp requires") as info:
        load_model(resolve_model(str(path)), progress=False)
    assert "Hugging Face directory" in info.value.fix


# ---------------------------------------------------------------------------------------------- the ONNX graphs
@pytest.mark.parametrize(("form", "overrides"), [
    ("ort-fused", {}),
    ("standard", {}),
    ("ort-fused", {"tie": False, "config_overrides": {"no_rope_layers": [0, 1, 1, 1]}}),
    ("standard", {"tie": False, "config_overrides": {"no_rope_layers": [0, 1, 1, 1]}}),
], ids=["fused-tied", "standard-tied", "fused-untied-nope-first", "standard-untied-nope-first"])
def test_greedy_tokens_through_the_bundle_are_transformers_generate(form, overrides, tmp_path, record_property):
    """24 greedy tokens after a 6-token prompt through the bundle's runtime (the fused graph's GroupQueryAttention
    with do_rotary 0 on the NoPE layer, or the standard graph without its rotary) equal transformers' generate;
    a repetition penalty over the whole context makes each step pick a new token, so every step's logits count.
    The prompt's logits are compared too."""
    bundle = build_tiny_bundle(tmp_path, _recipe(form, "fp32"), "host", model_dir=_model_dir(tmp_path, **overrides))
    bundle_follows_transformers(bundle.path, _source(tmp_path), PROMPT,
                                f"{form} graph {overrides or 'tied'} vs transformers", record_property)


def test_the_fused_graph_rotates_in_every_layer_but_the_nope_one(tmp_path):
    import onnx

    from edgesdk.export.decoder_weights import decoder_weights_from_hf
    from edgesdk.export.fused_graph import emit_fused_decoder

    proto, _ = emit_fused_decoder(decoder_weights_from_hf(tiny_llama(**SMOLLM3)), 64)
    attentions = [node for node in proto.graph.node if node.op_type == "GroupQueryAttention"]
    rotary = [onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "do_rotary"))
              for node in attentions]
    assert rotary == [1, 1, 1, 0]
    assert [len([name for name in node.input[7:] if name]) for node in attentions] == [2, 2, 2, 0]


def test_an_int8_qdq_build_validates_against_pytorch(tmp_path):
    """smooth, QAT and the standard form's INT8 QDQ graph (TensorRT's): the build's own validation compares the
    graph with the PyTorch model carrying the same quantized weights."""
    bundle = build_tiny_bundle(tmp_path, QDQ_RECIPE, "host", model_dir=_model_dir(tmp_path), generated_sequences=0)
    assert bundle.manifest["graph"]["form"] == "standard"
    assert bundle.manifest["graph"]["dtype"] == "int8-qdq"
    assert bundle.manifest["model"]["after"]["architecture"] == "smollm3"


def test_gguf_export_of_a_smollm3_bundle_writes_llama_cpp_s_smollm3(tmp_path):
    """The 4-layer default (NoPE at 3) is llama.cpp's smollm3 layout; tests/unit/test_smollm3_gguf42.py runs it
    in llama.cpp and refuses other NoPE layers."""
    from edgesdk.export.gguf_export import export_gguf

    bundle = build_tiny_bundle(tmp_path, _recipe("ort-fused", "fp32"), "host", model_dir=_model_dir(tmp_path))
    assert export_gguf(bundle.path, tmp_path / "model.gguf").architecture == "smollm3"


def test_the_jetson_recipe_builds_and_its_sparse_weights_validate(tmp_path):
    """QAT, sparsify (with its reorder) and distill, exported as QDQ plus block-sparse weights: the build validates
    both the graph and the sparse decoder (its PyTorch twins) against the PyTorch model."""
    bundle = build_tiny_bundle(tmp_path, JETSON_RECIPE, "orin-nx", model_dir=_model_dir(tmp_path),
                               generated_sequences=0)
    assert [layer.get("rope", 0) for layer in bundle.manifest["sparse"]["layers"]] == [0, 0, 0, None]


# ---------------------------------------------------------------------------------------------- power gates
def test_the_power_recipe_builds_the_gated_graph(tmp_path):
    """The power stage's adapters scale each head's query before rotary, which SmolLM3 (no per-head query norm)
    keeps: the stage runs and the build validates the gated graph against the gated PyTorch model."""
    recipe = ("name: power\nstages:\n  - stage: power\n    config: {rounds: 2, rollout: 2, new_tokens: 8, "
              "prompt_tokens: 8, sweep_tokens: 40, bucket_size: 16, profile_up_to: 64, profile_buckets: 2}\n"
              "export: {form: ort-fused, weights: fp32}\n")
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=_model_dir(tmp_path))
    assert bundle.manifest["graph"]["form"] == "ort-fused-gated"


def test_the_gated_graph_matches_the_pytorch_gated_smollm3(tmp_path, record_property):
    """The power stage's gated graph (export/gated_graph.py) over the fused one: the adapters' query scales go in
    before GroupQueryAttention, whose NoPE layer rotates nothing; prefill and decode equal the gated model."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.power import adapter, train
    from edgesdk.power.profiler import CostStats
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend

    model = tiny_llama(**SMOLLM3)
    state = adapter.install_adapters(model, 4, peak_layers=(2, 3))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".power_adapter." in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)
    cost = CostStats(16, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], {}, 0.0125, 0.0)
    peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 32)))
    model.config.edgesdk_power = {**model.config.edgesdk_power, "weights": [0.3, 0.5, 0.2], "peak_scale": peak,
                                  "ffn_scales": ffn, "cost_scale": 0.5, "cost": cost.to_json(), "tau_init": 0.5}
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=64))
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    ids = torch.randint(0, 320, (20,), generator=torch.Generator().manual_seed(5))
    state.clear()
    state.record, state.enabled, state.tau = False, True, 0.5
    with torch.no_grad():
        expected = model(ids[None], use_cache=False).logits[0].numpy()
    backend.reset()
    backend.gating, backend.fixed_tau = True, 0.5
    got = [backend.prefill(ids[:8].numpy(), keep_logits=8)]
    got += [backend.decode(int(ids[t]))[None] for t in range(8, len(ids))]
    report_max_abs_diff("gated graph vs the gated PyTorch model", float(np.abs(np.concatenate(got) - expected).max()), 2e-4,
                        record_property)


# ---------------------------------------------------------------------------------------------- block-sparse path
@pytest.fixture(scope="module")
def smollm3_sparse(tmp_path_factory):
    """(model, export dir, record): the tiny SmolLM3 with its linears on the per-row INT8 grid and its embedding
    rounded to float16 (what the sparse weights store), exported block-sparse."""
    from edgesdk.export.sparse_export import SparseExportConfig, export_sparse

    model = on_sparse_grid(tiny_llama(**SMOLLM3), embedding_in_half=True)
    out = tmp_path_factory.mktemp("smollm3_sparse")
    record = export_sparse(model, out, SparseExportConfig(), max_context=64)
    return model, out, record


def _tensors(out, record):
    from safetensors.torch import load_file

    return load_file(str(out / record["weights"]))


def _decode_in_chunks(decoder, ids):
    parts = [decoder.step(ids[:6], keep=6), decoder.step(ids[6:11], keep=5)]
    parts += [decoder.step(ids[i:i + 1], keep=1) for i in range(11, len(ids))]
    return torch.cat(parts)


def test_the_sparse_record_marks_the_nope_layer(smollm3_sparse):
    _, _, record = smollm3_sparse
    assert [layer.get("rope", 0) for layer in record["layers"]] == [0, 0, 0, None]


@pytest.mark.parametrize(("mode", "graphs"), [("reference", False), ("reference", True),
                                               pytest.param("emulated", False, marks=needs_triton)])
def test_the_sparse_decoder_gives_transformers_logits(mode, graphs, smollm3_sparse, record_property):
    """Prefill, a second prefill chunk and single-token steps through the kernels' reference twins, or the Triton
    kernels interpreted (``emulated``); the decode attention kernel reads the cache as stored, rotary (or none) is
    applied before it. ``graphs``: the static decode step the CUDA graph captures, run eagerly on this CPU.
    Without the NoPE layer's record the logits differ."""
    from edgesdk.runtime.sparse_decoder import SparseDecoder

    model, out, record = smollm3_sparse
    ids = torch.randint(0, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids[None]).logits[0]
    got = _decode_in_chunks(SparseDecoder(_tensors(out, record), record, mode=mode, graphs=graphs), ids)
    scale = float(expected.abs().max())
    report_max_abs_diff(f"sparse decoder ({mode}, static steps {graphs}) vs transformers, logit scale {scale:.1f}",
                        float((got - expected).abs().max()), 1e-4 * max(scale, 1.0), record_property)
    if mode == "reference" and not graphs:
        rotated = {**record, "layers": [{k: v for k, v in layer.items() if k != "rope"} for layer in record["layers"]]}
        wrong = _decode_in_chunks(SparseDecoder(_tensors(out, record), rotated, mode="reference"), ids)
        assert float((wrong[1:] - expected[1:]).abs().max()) > 1e-3 * scale  # 10x the bound above


def test_the_build_s_own_check_of_the_sparse_weights_passes(smollm3_sparse):
    from edgesdk.export.sparse_export import validate_sparse
    from edgesdk.export.validate import ValidationConfig

    model, out, record = smollm3_sparse
    report = validate_sparse(model, out, record, ValidationConfig(prompts=2))
    print(f"\n[max abs diff] validate_sparse: {report['max_abs_diff']}")
    assert report["top1_agree"] == 1.0


def test_greedy_tokens_through_the_triton_backend_are_transformers_generate(smollm3_sparse, monkeypatch):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.triton_backend import open_triton_backend

    model, out, record = smollm3_sparse
    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    backend = open_triton_backend(SimpleNamespace(manifest={"sparse": record}, file=lambda name: out / name),
                                  threads=1)
    sampling = SamplingConfig(max_new_tokens=24, repeat_penalty=10.0, repeat_last_n=-1)
    tokens, _ = generate(backend, PROMPT, sampling, stop_ids=set())
    assert tokens == penalised_greedy_tokens(model, PROMPT)
