"""Linear rope scaling through GGUF export: a bundle whose rotary tables divide every frequency by one factor F
(transformers' rope_type linear) is written with llama.cpp's ``{arch}.rope.scaling.type`` linear and
``{arch}.rope.scaling.factor`` F, and the tables llama.cpp rebuilds from those keys (position p turned by
p * (1 / F) * theta^(-2j / hd); Gemma 3's sliding layers at base 10,000 and scale 1) are the bundle's own.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ExportError
from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

pytest.importorskip("torch")
pytest.importorskip("gguf")

RECIPE = "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
LINEAR = {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 4.0}
GEMMA3_LAYERS = 7
GEMMA3 = {"model_type": "gemma3_text", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32,
          "layers": GEMMA3_LAYERS, "intermediate": 128, "vocab_size": 384, "tokenizer": "gemma"}


def _gemma3(rope_parameters: dict) -> dict:
    layer_types = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(GEMMA3_LAYERS)]
    return {**GEMMA3, "config_overrides": {"sliding_window": 4, "query_pre_attn_scalar": 32,
                                           "layer_types": layer_types, "rope_parameters": rope_parameters}}


def _bundle_tables(bundle_path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's (cos, sin) rotary tables (P, hd/2) as the bundle's graph stores them."""
    import onnx

    from edgesdk.bundle import verify_bundle
    from edgesdk.export.bundle_weights import _Initializers

    record = verify_bundle(bundle_path).manifest["graph"]
    graph = onnx.load(str(bundle_path / record["file"]), load_external_data=False).graph
    store = _Initializers(graph, bundle_path, record.get("weights"))
    attention = [node for node in graph.node if node.op_type == "GroupQueryAttention"]
    return [(store.array(node.input[7]), store.array(node.input[8])) for node in attention]


def _llama_cpp_tables(positions: int, head_dim: int, base: float, freq_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """ggml_rope's angles without YaRN (ext_factor 0, linear scaling): p * freq_scale * base^(-2j / hd)."""
    angles = np.arange(positions)[:, None] * freq_scale * base ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    return np.cos(angles), np.sin(angles)  # (P, hd/2) each


def _field(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _synthetic_tables(inv_freq: np.ndarray, positions: int = 256) -> tuple[np.ndarray, np.ndarray]:
    angles = (np.arange(positions, dtype=np.float32)[:, None] * inv_freq.astype(np.float32)[None, :])
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)  # (P, hd/2) each


def test_a_linear_rope_bundle_exports_its_factor_and_llama_cpp_rebuilds_its_tables(tmp_path):
    from gguf import GGUFReader

    from edgesdk.export.gguf_export import export_gguf

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=2, kv_heads=1, intermediate=128,
                                    config_overrides={"rope_parameters": LINEAR})
    bundle = build_tiny_bundle(tmp_path, RECIPE, "host", model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    reader = GGUFReader(str(report.path))
    assert _field(reader, "llama.rope.scaling.type") == "linear"
    assert _field(reader, "llama.rope.scaling.factor") == pytest.approx(4.0, rel=1e-6)
    base = _field(reader, "llama.rope.freq_base")
    assert base == pytest.approx(10_000.0, rel=1e-6)
    head_dim = _field(reader, "llama.rope.dimension_count")
    for cos, sin in _bundle_tables(bundle.path):
        want_cos, want_sin = _llama_cpp_tables(cos.shape[0], head_dim, base, 1.0 / 4.0)
        assert np.abs(cos - want_cos).max() < 1e-4
        assert np.abs(sin - want_sin).max() < 1e-4
    plain_cos, _ = _llama_cpp_tables(cos.shape[0], head_dim, base, 1.0)
    assert np.abs(cos - plain_cos).max() > 0.5  # without the factor llama.cpp would rotate otherwise


def test_gemma3_s_linear_factor_on_its_global_layers_is_written_as_llama_cpp_applies_it(tmp_path):
    """Gemma 3 4B and larger scale their global layers only (factor 8); llama.cpp's gemma3 keeps its sliding
    layers at scale 1 (rope_freq_scale_train_swa) and base 10,000, and scales layer il where il % 6 == 5."""
    from gguf import GGUFReader

    from edgesdk.export.gguf_export import export_gguf

    ropes = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
             "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0}}
    model_dir = save_tiny_model_dir(tmp_path / "model", **_gemma3(ropes))
    bundle = build_tiny_bundle(tmp_path, RECIPE, "host", model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    reader = GGUFReader(str(report.path))
    assert _field(reader, "gemma3.rope.scaling.type") == "linear"
    factor = _field(reader, "gemma3.rope.scaling.factor")
    assert factor == pytest.approx(8.0, rel=1e-6)
    base = _field(reader, "gemma3.rope.freq_base")
    assert base == pytest.approx(1_000_000.0, rel=1e-6)
    tables = _bundle_tables(bundle.path)
    assert len(tables) == GEMMA3_LAYERS
    for il, (cos, sin) in enumerate(tables):
        swa = il % 6 != 5
        want_cos, want_sin = _llama_cpp_tables(cos.shape[0], 32, 10_000.0 if swa else base, 1.0 if swa else 1 / factor)
        assert np.abs(cos - want_cos).max() < 1e-4, il
        assert np.abs(sin - want_sin).max() < 1e-4, il


def test_a_gemma3_bundle_with_scaled_sliding_layers_is_refused(tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    ropes = {"sliding_attention": {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 2.0},
             "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}
    model_dir = save_tiny_model_dir(tmp_path / "model", **_gemma3(ropes))
    bundle = build_tiny_bundle(tmp_path, RECIPE, "host", model_dir=model_dir)
    with pytest.raises(ExportError, match=r"sliding layers .* linear scaling factor of \[2\.0\].*"
                                          r"rope_freq_scale_train_swa"):
        export_gguf(bundle.path, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_fit_rope_reads_a_linear_factor_and_refuses_one_below_1_or_one_on_top_of_llama3_scaling():
    from edgesdk.export.bundle_weights import fit_rope
    from edgesdk.models.loader import llama3_divisors

    head_dim = 32
    plain = 10_000.0 ** (-np.arange(0, head_dim, 2) / head_dim)  # (hd/2,)
    fit = fit_rope(*_synthetic_tables(plain / 2.5), head_dim, "b")
    assert (fit.theta, fit.linear, fit.factors) == (10_000.0, 2.5, None)
    assert fit_rope(*_synthetic_tables(plain), head_dim, "b").linear == 1.0
    with pytest.raises(ExportError, match=r"faster than plain RoPE \(a linear scaling factor of 0\.5, where .* "
                                          r"above 1\)"):
        fit_rope(*_synthetic_tables(plain * 2.0), head_dim, "b")
    llama3 = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
    divisors = llama3_divisors(llama3, 2 * np.pi / plain)
    assert fit_rope(*_synthetic_tables(plain / divisors), head_dim, "b").factors is not None
    with pytest.raises(ExportError, match=r"linear factor of 4 on top of Llama 3's scaling"):
        fit_rope(*_synthetic_tables(plain / divisors / 4.0), head_dim, "b")
