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


def test_layers_of_different_shapes_are_refused_by_name(tmp_path):
    from edgesdk.export.bundle_weights import BundleDecoder, BundleLayer
    from edgesdk.export.gguf_export import _uniform_shape

    def layer(heads, ffn):
        units = {"mlp.gate_up": np.zeros((2 * ffn, 8), np.float32)}
        return BundleLayer(np.ones(8), np.ones(8), heads, 1, units)

    decoder = BundleDecoder(head_dim=4, rms_eps=1e-5, rope_base=1e4, max_context=8, embed=np.zeros((4, 8)),
                            final_norm=np.ones(8), lm_head=None, layers=[layer(2, 16), layer(2, 12)])
    with pytest.raises(ExportError, match=r"different shapes \[\(2, 1, 12\), \(2, 1, 16\)\]"):
        _uniform_shape(decoder, tmp_path)


def test_rope_theta_is_fitted_and_scaled_rope_is_refused(tmp_path):
    from edgesdk.export.bundle_weights import fit_rope_base

    head_dim, positions = 64, 2048
    exponents = np.arange(0, head_dim, 2) / head_dim

    def tables(inv_freq):
        angles = np.arange(positions)[:, None] * inv_freq.astype(np.float32).astype(np.float64)[None, :]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    for theta in (10_000.0, 100_000.0, 500_000.0):
        assert fit_rope_base(*tables(theta ** -exponents), head_dim, tmp_path) == pytest.approx(theta, rel=1e-5)
    llama3 = 500_000.0 ** -exponents
    llama3[exponents > 0.5] /= 8  # Llama 3's rope scaling slows the low frequencies
    with pytest.raises(ExportError, match="not plain RoPE"):
        fit_rope_base(*tables(llama3), head_dim, tmp_path)
    cos, sin = tables(10_000.0 ** -exponents)
    with pytest.raises(ExportError, match="scaled by 1.2000"):
        fit_rope_base(cos * 1.2, sin * 1.2, head_dim, tmp_path)


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
    result = CliRunner().invoke(main, ["export", str(tmp_path / "missing"), str(tmp_path / "x.gguf")])
    assert result.exit_code != 0
    assert "does not exist" in result.output
