"""GGUF export: a fused bundle's own weights, re-encoded bit-exactly, loadable by an independent reader.

The independent reader is transformers' GGUF loader (``gguf_file=``), which dequantizes Q4_0 /
Q8_0 with the gguf package's decoder and undoes llama.cpp's query/key row order; llama.cpp itself
runs the exported default bundle in tests/benchmarks/test_gguf_export.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import BundleError, ExportError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import llama_cpp_logits
from tests._utils.tiny import save_tiny_model_dir

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

FUSED = "name: fused\nstages: []\nexport: {{form: ort-fused, weights: {weights}, block_size: {block}}}\n"
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
PROMPT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models."


def _bundle(tmp_path, weights: str, block: int = 32, **model):
    model_dir = save_tiny_model_dir(tmp_path / "model", **{"hidden": 64, "heads": 4, "kv_heads": 2,
                                                           "intermediate": 128, **model})
    return build_tiny_bundle(tmp_path, FUSED.format(weights=weights, block=block), "host", model_dir=model_dir)


def _export(bundle, tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    return export_gguf(bundle.path, tmp_path / "model.gguf")


def _load_gguf(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _source(tmp_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()


def _tensor_types(path) -> dict[str, str]:
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_float_bundle_loads_in_transformers_with_the_source_models_logits(arch, tmp_path):
    """F32 tensors hold the weights exactly, so the GGUF model must compute the source model's logits:
    this checks the query/key row order (llama), the biases (qwen2), RoPE theta, the norm epsilon and
    the tied head together."""
    bundle = _bundle(tmp_path, "fp32", model_type=arch)
    report = _export(bundle, tmp_path)
    assert report.file_type == "F32"
    assert report.verified_tensors > 0
    gguf_model, _ = _load_gguf(report.path)
    source = _source(tmp_path)
    ids = torch.tensor([[5, 17, 120, 33, 250, 9, 64, 199, 3, 77]])
    with torch.no_grad():
        diff = (gguf_model(ids).logits - source(ids).logits).abs().max().item()
    print(f"{arch} fp32: max abs logit difference {diff:.2e}")
    assert diff < 1e-4


def test_an_int4_bundle_becomes_q4_0_with_the_bundles_weights_exactly(tmp_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from edgesdk.export.bundle_weights import read_bundle_decoder

    bundle = _bundle(tmp_path, "int4", block=64)
    report = _export(bundle, tmp_path)
    types = _tensor_types(report.path)
    assert report.file_type == "Q4_0"
    assert {types[n] for n in types if n.endswith(".weight") and "norm" not in n} == {"Q4_0"}
    # Independently of the exporter's own read-back: the down projection (no row reordering) equals the
    # MatMulNBits codes times their float16 scales, as ONNX Runtime computes them.
    decoder = read_bundle_decoder(bundle.path, bundle.manifest)
    down = decoder.layers[1].units["mlp.down"]
    tensor = next(t for t in GGUFReader(str(report.path)).tensors if t.name == "blk.1.ffn_down.weight")
    stored = dequantize(tensor.data, tensor.tensor_type)
    codes = np.stack([down.packed & 15, down.packed >> 4], axis=-1).reshape(down.n, -1).astype(np.float32) - 8
    scales = np.repeat(down.scales.reshape(down.n, -1), down.block_size, axis=1)
    assert np.array_equal(stored, codes * scales)

    # transformers reads it back (undoing llama.cpp's query/key row order) as the source weights
    # within int4 rounding; a scrambled layout would be off by about the weights' own size.
    gguf_model, _ = _load_gguf(report.path)
    source = dict(_source(tmp_path).named_parameters())
    for name, value in gguf_model.named_parameters():
        if name.endswith("proj.weight"):
            relative = ((value - source[name]).norm() / source[name].norm()).item()
            assert relative < 0.15, f"{name}: relative error {relative:.3f}"


def test_an_int4_bundle_in_transformers_agrees_with_the_bundle_runtime(tmp_path):
    """The GGUF model's float compute over the Q4_0 weights against ONNX Runtime's int8-activation
    compute over the same codes: the same next token almost everywhere, logits close."""
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    bundle = _bundle(tmp_path, "int4", block=64)
    report = _export(bundle, tmp_path)
    gguf_model, _ = _load_gguf(report.path)
    runtime = open_runtime(bundle.path, threads=1)
    ids = np.array(runtime.tokenizer.encode(PROMPT, add_special_tokens=False))
    expected = bundle_scorer(runtime)(ids)
    with torch.no_grad():
        got = gguf_model(torch.tensor(ids[None])).logits[0].numpy()
    agree = float((got.argmax(-1) == expected.argmax(-1)).mean())
    spread = float(expected.std())
    print(f"int4: top-1 agreement {agree:.3f}, max abs diff {np.abs(got - expected).max():.3f} (logit std {spread:.2f})")
    assert agree >= 0.9
    assert np.abs(got - expected).max() < 0.1 * spread


def test_int8_blocks_become_q8_0_and_blocks_of_16_stay_exact_as_f32(tmp_path):
    from edgesdk.export.bundle_weights import read_bundle_decoder
    from edgesdk.export.gguf_tensors import decoded_values, encode_matrix

    bundle = _bundle(tmp_path / "q8", "int8", block=32)
    report = _export(bundle, tmp_path / "q8")
    assert report.file_type == "Q8_0"
    assert _tensor_types(report.path)["blk.0.ffn_up.weight"] == "Q8_0"

    small = _bundle(tmp_path / "b16", "int4", block=16)
    report = _export(small, tmp_path / "b16")
    assert report.file_type == "F32"  # 16 weights per scale fit no ggml block of 32
    down = read_bundle_decoder(small.path, small.manifest).layers[0].units["mlp.down"]
    encoded = encode_matrix(down)
    assert encoded.quant is None
    assert np.array_equal(encoded.data, decoded_values(down))


def test_the_tokenizer_and_chat_template_travel(tmp_path):
    from gguf import GGUFReader

    from edgesdk.runtime.session import open_runtime

    bundle = _bundle(tmp_path, "int8")
    report = _export(bundle, tmp_path)
    _, tokenizer = _load_gguf(report.path)
    runtime = open_runtime(bundle.path, threads=1)
    text = PROMPT + " Überall: café, 東京 🙂 <|im_end|>"
    assert tokenizer.encode(text, add_special_tokens=False) == runtime.tokenizer.encode(text, add_special_tokens=False)
    fields = GGUFReader(str(report.path)).fields
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    assert fields["tokenizer.ggml.eos_token_id"].contents() == runtime.tokenizer.encode("<|im_end|>", add_special_tokens=False)[0]
    assert fields["tokenizer.ggml.token_type"].contents()[:3] == [3, 3, 3]  # the special tokens are control tokens
    assert "<|im_start|>" in fields["tokenizer.chat_template"].contents()
    assert fields["general.name"].contents() == f"model (fused, edgesdk bundle {bundle.bundle_id})"  # no host path


def test_outputs_that_would_break_the_bundle_or_are_not_gguf_are_refused(tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    bundle = _bundle(tmp_path, "int8")
    with pytest.raises(ExportError, match="lies inside the bundle"):
        export_gguf(bundle.path, bundle.path / "model.gguf")
    with pytest.raises(ExportError, match="does not end in .gguf") as refused:
        export_gguf(bundle.path, tmp_path / "model.bin")
    assert "model.gguf" in refused.value.fix
    out = tmp_path / "out"
    out.mkdir()
    assert export_gguf(bundle.path, out).path == out / "b.gguf"  # a directory takes the bundle's name
    assert not list(out.glob("*.partial"))


def test_a_corrupt_bundle_is_refused_before_anything_is_written(tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    bundle = _bundle(tmp_path, "int8")
    weights = next(p for p in bundle.path.iterdir() if p.name.startswith("model.onnx."))
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="sha256 differs"):
        export_gguf(bundle.path, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_a_standard_form_bundle_is_refused_with_the_forms_that_export(tmp_path):
    from edgesdk.export.bundle_weights import read_bundle_decoder

    manifest = {"graph": {"form": "standard", "file": "model.onnx"}}
    with pytest.raises(ExportError, match="graph form 'standard'") as refused:
        read_bundle_decoder(tmp_path, manifest)
    assert "ort-fused" in refused.value.fix


PRUNED = ("name: pruned\nstages:\n  - stage: prune\n    config: {{ffn_ratio: 0.4, kv_group_ratio: 0.5, "
          "calibration_batches: 2, batch_size: 2, sequence_length: 24}}\n"
          "export: {{form: ort-fused, weights: {weights}, block_size: 32}}\n")


def _pruned_bundle(tmp_path, weights: str, model_type: str = "llama"):
    """Three layers whose FFN widths and GQA groups the prune stage cuts unevenly (Fisher ranks across layers)."""
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=128, heads=8, kv_heads=4, intermediate=256, layers=3,
                                    model_type=model_type)
    return build_tiny_bundle(tmp_path, PRUNED.format(weights=weights), "host", model_dir=model_dir)


def _gguf_fields(path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items()}, {
        t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}


def test_layers_pruned_to_different_widths_export_as_deci_with_per_layer_shapes(tmp_path):
    """llama.cpp's ``llama`` loader reads one FFN width and head count for every layer; its ``deci`` loader
    reads them per layer, and each layer's tensors must have exactly those shapes (ggml order: inputs first)."""
    from edgesdk.export.bundle_weights import matrix_rows, read_bundle_decoder

    bundle = _pruned_bundle(tmp_path, "int4")
    decoder = read_bundle_decoder(bundle.path, bundle.manifest)
    shapes = [(layer.heads, layer.kv_heads, matrix_rows(layer.units["mlp.gate_up"]) // 2) for layer in decoder.layers]
    assert len(set(shapes)) > 1, f"the prune stage left uniform layers {shapes}: the test needs uneven ones"
    report = _export(bundle, tmp_path)
    assert report.architecture == "deci"
    assert report.file_type == "Q4_0"
    assert report.verified_tensors > 0
    fields, tensors = _gguf_fields(report.path)
    assert fields["general.architecture"] == "deci"
    assert fields["deci.attention.head_count"] == [h for h, _, _ in shapes]
    assert fields["deci.attention.head_count_kv"] == [k for _, k, _ in shapes]
    assert fields["deci.feed_forward_length"] == [f for _, _, f in shapes]
    hd, width = decoder.head_dim, decoder.hidden_size
    assert fields["deci.attention.key_length"] == fields["deci.attention.value_length"] == hd
    for i, (heads, kv_heads, ffn) in enumerate(shapes):
        assert tensors[f"blk.{i}.attn_q.weight"] == (width, heads * hd)
        assert tensors[f"blk.{i}.attn_k.weight"] == tensors[f"blk.{i}.attn_v.weight"] == (width, kv_heads * hd)
        assert tensors[f"blk.{i}.attn_output.weight"] == (heads * hd, width)
        assert tensors[f"blk.{i}.ffn_gate.weight"] == tensors[f"blk.{i}.ffn_up.weight"] == (width, ffn)
        assert tensors[f"blk.{i}.ffn_down.weight"] == (ffn, width)


def test_uniform_layers_keep_their_own_architecture_and_single_numbers(tmp_path):
    report = _export(_bundle(tmp_path, "fp32"), tmp_path)
    fields, _ = _gguf_fields(report.path)
    assert report.architecture == fields["general.architecture"] == "llama"
    assert fields["llama.feed_forward_length"] == 128
    assert fields["llama.attention.head_count"] == 4
    # 64 / 4 heads, which llama.cpp derives too; written as the converter writes config.json's head_dim
    assert fields["llama.attention.key_length"] == fields["llama.attention.value_length"] == 16


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_pruned_export_runs_in_llama_cpp_with_the_bundles_logits(model_type, tmp_path):
    """The independent check of the per-layer export: llama.cpp itself loads the deci file and computes the
    bundle's logits from its float weights (qwen2: the Q/K/V biases and the RoPE reorder too)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install "
                                    "llama-cpp-python, which compiles llama.cpp for several minutes)")
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    bundle = _pruned_bundle(tmp_path, "fp32", model_type)
    report = _export(bundle, tmp_path)
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)
    expected = bundle_scorer(runtime)(np.array(ids))
    diff = float(np.abs(llama_cpp_logits(report.path, ids, context=64) - expected).max())
    print(f"{model_type} pruned fp32 in llama.cpp: max abs logit difference {diff:.2e}")
    assert diff < 1e-3


def test_rope_theta_is_fitted_llama3_factors_are_read_and_other_scaling_is_refused(tmp_path):
    from edgesdk.export.bundle_weights import fit_rope

    head_dim, positions = 64, 2048
    exponents = np.arange(0, head_dim, 2) / head_dim

    def tables(inv_freq):
        angles = np.arange(positions)[:, None] * inv_freq.astype(np.float32).astype(np.float64)[None, :]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    for theta in (10_000.0, 100_000.0, 500_000.0):
        fit = fit_rope(*tables(theta ** -exponents), head_dim, tmp_path)
        assert fit.theta == pytest.approx(theta, rel=1e-5)
        assert fit.factors is None
    llama3 = 500_000.0 ** -exponents
    llama3[exponents > 0.5] /= 8  # Llama 3's rope scaling slows the low frequencies
    fit = fit_rope(*tables(llama3), head_dim, tmp_path)
    assert fit.theta == pytest.approx(500_000.0, rel=1e-5)
    assert np.allclose(fit.factors, np.where(exponents > 0.5, 8.0, 1.0), rtol=1e-3)
    faster = 500_000.0 ** -exponents
    faster[exponents > 0.5] *= 2  # sped up: no llama.cpp rule gives it
    with pytest.raises(ExportError, match="neither plain RoPE"):
        fit_rope(*tables(faster), head_dim, tmp_path)
    cos, sin = tables(10_000.0 ** -exponents)
    with pytest.raises(ExportError, match="scaled by 1.2000"):
        fit_rope(cos * 1.2, sin * 1.2, head_dim, tmp_path)


@pytest.mark.parametrize(("pre_tokenizer", "name"), [
    ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, "gpt-2"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]},
     "smollm"),
    ({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}, "qwen2"),
    ({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_REGEX.replace("p{N}|", "p{N}{1,3}|")}, "behavior": "Isolated",
         "invert": False}, {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}, "llama-bpe"),
    ({"type": "Metaspace", "replacement": "▁"}, None),
    ({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x"}},
                                            {"type": "ByteLevel", "use_regex": False}]}, None),
])
def test_pre_tokenizers_map_to_llama_cpp_names_or_are_refused(pre_tokenizer, name, tmp_path):
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    spec = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
            "added_tokens": [{"id": 3, "content": "<s>", "special": True}], "decoder": {"type": "ByteLevel"},
            "pre_tokenizer": pre_tokenizer,
            "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                       {"Sequence": {"id": "A", "type_id": 0}}]}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    if name is None:
        with pytest.raises(ExportError, match="has no llama.cpp regex known to match"):
            vocab_from_tokenizer_json(path, "<s>", None, 5)
        return
    vocab = vocab_from_tokenizer_json(path, "<s>", None, 5)
    assert vocab.pre == name
    assert vocab.tokens == ["a", "b", "ab", "<s>", "[PAD4]"]
    assert vocab.token_types == [1, 1, 1, 3, 5]  # the padding row is UNUSED, never matched in text
    assert vocab.merges == ["a b"]
    assert vocab.bos_id == 3
    assert vocab.add_bos


def test_the_cli_exports_and_says_how_to_run_it(tmp_path):
    from click.testing import CliRunner

    from edgesdk.cli import main

    bundle = _bundle(tmp_path, "int4", block=64)
    result = CliRunner().invoke(main, ["export", str(bundle.path), str(tmp_path / "tiny.gguf")])
    assert result.exit_code == 0, result.output
    assert "llama Q4_0" in result.output
    assert "read back bit-exact" in result.output
    assert "llama-cli -m" in result.output
    assert "deci" not in result.output
    pruned = _pruned_bundle(tmp_path / "pruned", "int4")
    result = CliRunner().invoke(main, ["export", str(pruned.path), str(tmp_path / "pruned.gguf")])
    assert result.exit_code == 0, result.output
    assert "deci Q4_0" in result.output
    assert "llama.cpp's deci architecture" in result.output
    result = CliRunner().invoke(main, ["export", str(tmp_path / "missing"), str(tmp_path / "x.gguf")])
    assert result.exit_code != 0
    assert "does not exist" in result.output
