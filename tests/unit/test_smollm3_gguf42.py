"""GGUF export of SmolLM3 bundles as llama.cpp's ``smollm3`` architecture, checked against llama.cpp itself.

llama.cpp's smollm3 (src/models/smollm3.cpp) is Llama's tensors with the query / key rows in its pairwise rotary
order (the converter's ``SmolLM3Model(LlamaModel)``), and a layer ``il`` applies no rotary where
``(il + 1) % 4 == 0`` (``n_no_rope_layer_step`` fixed at 4, nothing read from the file). A bundle whose NoPE layers
are those exports; one whose NoPE layers are others is refused by name. llama.cpp runs in a child process with plain
CPU weight buffers and a float32 KV cache (its default F16 cache rounds keys and values), so that a crash there
fails the test instead of the run; the tests skip without llama-cpp-python. Each comparison prints its max abs
logit difference (``-s``) and records it as ``max_abs_diff``.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from edgesdk.errors import ExportError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import rewrite_gguf
from tests._utils.parity import report_max_abs_diff
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
SMOLLM3 = {"model_type": "smollm3", "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128}
IDS = [5, 17, 120, 33, 250, 9, 101, 3, 42, 7, 99, 12]
needs_llama_cpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (pip install llama-cpp-python)")

def llama_cpp_logits(path: Path, lora: Path | None = None, scale: float = 1.0) -> np.ndarray:
    """llama.cpp's logits (len(IDS), V) for IDS from the GGUF file ``path`` (with the LoRA adapter ``lora`` at
    ``scale``: llama.cpp's --lora-scaled), F32 KV cache, in a child process."""
    from tests._utils.gguf_files import llama_cpp_child

    return llama_cpp_child(path, IDS, lora=lora, lora_scale=scale, f32_cache=True)[0]


def _bundle(tmp_path, **model):
    model_dir = save_tiny_model_dir(tmp_path / "model", **{**SMOLLM3, **model})
    return build_tiny_bundle(tmp_path, FUSED_FP32, "host", model_dir=model_dir, generated_sequences=0)


def _export(bundle, tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    return export_gguf(bundle.path, tmp_path / "model.gguf")


def _bundle_logits(bundle) -> np.ndarray:
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    return bundle_scorer(open_runtime(bundle.path, threads=1))(np.array(IDS))


@pytest.fixture(scope="module")
def eight_layers(tmp_path_factory):
    """A float32 SmolLM3 bundle of 8 layers, NoPE at 3 and 7 (SmolLM3's default every fourth), untied, and its
    GGUF export. Weights drawn at 10x transformers' default spread (initializer_range 0.2) give attention that
    depends on position, so that a rotated NoPE layer moves the logits well past the comparison's bound."""
    root = tmp_path_factory.mktemp("smollm3-gguf")
    bundle = _bundle(root, layers=8, tie=False, config_overrides={"initializer_range": 0.2})
    return bundle, _export(bundle, root)


# ---------------------------------------------------------------------------------------------- the file
def test_an_eight_layer_bundle_exports_as_smollm3_with_pairwise_rows(eight_layers):
    from gguf import GGUFReader

    from edgesdk.export.bundle_weights import read_bundle_decoder

    bundle, report = eight_layers
    decoder = read_bundle_decoder(bundle.path, bundle.manifest)
    assert [i for i, layer in enumerate(decoder.layers) if layer.rope is None] == [3, 7]
    assert report.architecture == "smollm3"
    assert report.file_type == "F32"
    reader = GGUFReader(str(report.path))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "smollm3"
    assert fields["smollm3.block_count"] == 8
    assert fields["smollm3.rope.dimension_count"] == 16
    assert fields["smollm3.rope.freq_base"] == pytest.approx(decoder.rope_base)
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    q = tensors["blk.3.attn_q.weight"]  # the NoPE layer's rows are reordered like the others' (the converter's)
    bundle_q = decoder.layers[3].units["attn.qkv"][:64]
    assert not np.array_equal(q, bundle_q)
    assert np.array_equal(q[1], bundle_q[8])  # row 2j + 1 of a head is rotate-half row hd/2 + j


@needs_llama_cpp
def test_llama_cpp_computes_the_bundle_s_logits(eight_layers, record_property):
    """llama.cpp's smollm3 over the exported file against the bundle's own runtime (ONNX Runtime's fused graph)
    for 12 positions: both skip rotary in layers 3 and 7 only. The same file read as llama (every layer rotated)
    gives other logits, so the comparison sees where rotary is skipped."""
    bundle, report = eight_layers
    expected = _bundle_logits(bundle)
    got = llama_cpp_logits(report.path)
    scale = float(np.abs(expected).max())
    report_max_abs_diff(f"llama.cpp smollm3 vs the bundle runtime, logit scale {scale:.1f}",
                        float(np.abs(got - expected).max()), 1e-4 * max(scale, 1.0), record_property)
    as_llama = rewrite_gguf(report.path, report.path.with_name("as-llama.gguf"), architecture="llama")
    rotated = float(np.abs(llama_cpp_logits(as_llama) - expected).max())
    print(f"[max abs diff] the same file as llama (every layer rotated) vs the bundle runtime: {rotated:.3e}")
    assert rotated > 1e-2 * max(scale, 1.0)


def test_an_int4_bundle_with_smollm3_3b_s_rotary_base_exports_as_q4_0(tmp_path):
    """SmolLM3-3B rotates at a base of 5,000,000: the base fitted to the bundle's tables is written as
    rope.freq_base, and the INT4 weights as Q4_0 blocks read back bit-exactly."""
    from gguf import GGUFReader

    int4 = "name: q\nstages: []\nexport: {form: ort-fused, weights: int4, block_size: 32}\n"
    model_dir = save_tiny_model_dir(tmp_path / "model", **SMOLLM3, layers=4, config_overrides={"rope_theta": 5e6})
    bundle = build_tiny_bundle(tmp_path, int4, "host", model_dir=model_dir, generated_sequences=0)
    report = _export(bundle, tmp_path)
    assert (report.architecture, report.file_type) == ("smollm3", "Q4_0")
    assert report.verified_tensors == len(GGUFReader(str(report.path)).tensors)
    fields = {name: field.contents() for name, field in GGUFReader(str(report.path)).fields.items()}
    assert fields["smollm3.rope.freq_base"] == 5e6


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("layers", "no_rope", "found", "expected"), [
    (4, [0, 1, 1, 1], [0], [3]),  # another pattern
    (3, [1, 1, 0], [2], []),  # 4 layers after depth pruning removed layer 0 or 1: the NoPE layer moved up
    (8, [1, 1, 1, 1, 1, 0, 1, 1], [5], [3, 7]),
], ids=["nope-first", "depth-pruned", "interval-6"])
def test_nope_layers_llama_cpp_would_rotate_are_refused_by_name(tmp_path, layers, no_rope, found, expected):
    bundle = _bundle(tmp_path, layers=layers, config_overrides={"no_rope_layers": no_rope})
    told = f"layers without rotary (NoPE) are {found}, where llama.cpp's smollm3 skips rotary in exactly layers {expected}"
    with pytest.raises(ExportError, match=re.escape(told)) as refused:
        _export(bundle, tmp_path)
    assert "run this bundle with edgesdk" in refused.value.fix
    assert not (tmp_path / "model.gguf").exists()


def test_a_bundle_without_any_rotary_is_refused_not_failed_on(tmp_path):
    """Every layer NoPE: the bundle has no rotary table at all, whose base the reader then leaves unset."""
    from edgesdk.export.bundle_weights import read_bundle_decoder

    bundle = _bundle(tmp_path, layers=2, config_overrides={"no_rope_layers": [0, 0]})
    assert read_bundle_decoder(bundle.path, bundle.manifest).rope_base is None
    with pytest.raises(ExportError, match="are \\[0, 1\\], where llama.cpp's smollm3 skips rotary in exactly layers "
                                          "\\[\\]"):
        _export(bundle, tmp_path)


def test_a_depth_pruned_smollm3_whose_nope_layers_still_fit_exports(tmp_path):
    """Removing the last layer of four leaves three rotated layers, which llama.cpp's smollm3 rotates too."""
    bundle = _bundle(tmp_path, layers=3, config_overrides={"no_rope_layers": [1, 1, 1]})
    assert _export(bundle, tmp_path).architecture == "smollm3"


PRUNED = ("name: pruned\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.4, kv_group_ratio: 0.5, "
          "calibration_batches: 2, batch_size: 2, sequence_length: 24}\n"
          "export: {form: ort-fused, weights: fp32}\n")


def test_layers_pruned_to_different_shapes_are_refused_as_deci_rotates_every_layer(tmp_path):
    """Layers of different widths go to llama.cpp's per-layer deci architecture, which rotates every layer."""
    from edgesdk.export.bundle_weights import read_bundle_decoder
    from edgesdk.export.gguf_export import layer_shapes

    model_dir = save_tiny_model_dir(tmp_path / "model", **{**SMOLLM3, "hidden": 128, "heads": 8, "kv_heads": 4,
                                                           "intermediate": 256, "layers": 4})
    bundle = build_tiny_bundle(tmp_path, PRUNED, "host", model_dir=model_dir, generated_sequences=0)
    shape = layer_shapes(read_bundle_decoder(bundle.path, bundle.manifest))
    assert not shape.uniform, f"the prune stage left uniform layers {shape}: the test needs uneven ones"
    with pytest.raises(ExportError, match="its layers \\[3\\] apply no rotary \\(NoPE\\), where llama.cpp's deci "
                                          "architecture \\(its layers were pruned to different shapes"):
        _export(bundle, tmp_path)


@needs_llama_cpp
def test_llama_cpp_with_a_smollm3_lora_adapter_computes_the_merged_model(eight_layers, tmp_path, record_property):
    """A GGUF LoRA adapter in convert_lora_to_gguf.py's smollm3 layout (attn_q / attn_k lora_b rows in llama.cpp's
    pairwise order), applied by llama.cpp at run time over the exported base (--lora-scaled 0.5), against edgesdk's
    build-time merge of it into the Hugging Face model the bundle was built from."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.lora import LoraAdapter, gguf_architecture, merge_adapters
    from edgesdk.models.sources import resolve_model
    from tests.unit._lora_files41 import random_factors, write_gguf_adapter
    from tests.unit.test_lora_gguf41 import _gguf_pairs

    bundle, report = eight_layers
    source = resolve_model(str(report.path.parent / "model"))
    model = load_model(source, progress=False).model
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "smollm3",
                                 _gguf_pairs(model, random_factors(model, rank=4)), alpha=8)
    merge_adapters(model, [LoraAdapter(str(adapter), 0.5)], gguf_architecture(source, model))
    with torch.no_grad():
        merged = model(torch.tensor([IDS])).logits[0].numpy()
    adapted = llama_cpp_logits(report.path, adapter, 0.5)
    assert float(np.abs(adapted - _bundle_logits(bundle)).max()) > 1.0  # the adapter changes llama.cpp's answer
    scale = float(np.abs(merged).max())
    report_max_abs_diff(f"llama.cpp smollm3 with the adapter vs edgesdk's merge, logit scale {scale:.1f}",
                        float(np.abs(adapted - merged).max()), 1e-4 * max(scale, 1.0), record_property)
