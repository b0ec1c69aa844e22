"""The INT8 QDQ export of the standard form (export/qdq_graph.py): the graph equals PyTorch fake
quantization over prefill and decode, its Q/DQ nodes are what TensorRT expects, pruned models
export, and the decoder linears take a quarter of the bytes."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant  # noqa: E402
from edgesdk.compress.structure import keep_ffn_channels, keep_kv_groups  # noqa: E402
from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.llama_graph import OPSET  # noqa: E402
from edgesdk.export.onnx_export import DATA_FILE, MODEL_FILE, ExportConfig, export_model  # noqa: E402
from edgesdk.export.qdq_graph import DTYPE, count_quantized, quantize_channels  # noqa: E402
from edgesdk.export.validate import (  # noqa: E402
    ExportMismatchError,
    ValidationConfig,
    _standard_session,
    empty_past,
    validate_export,
)
from tests._utils.tiny import tiny_llama  # noqa: E402

PROMPT, STEPS = 12, 4
QAT = fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="tensor", embedding_bits=None)
PTQ = fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="none", embedding_bits=None)
# seed -> tiny_llama shape; every seed exports with observed per-tensor activation scales
SHAPES = {
    0: {}, 1: {"kv_heads": 1}, 2: {"kv_heads": 4}, 3: {"tie": False}, 4: {"model_type": "qwen2"},
    5: {"layers": 3}, 6: {"hidden": 96, "heads": 6, "kv_heads": 3}, 7: {},
    8: {"tie": False, "kv_heads": 1}, 9: {"model_type": "qwen2", "tie": False},
    10: {"model_type": "qwen3", "head_dim": 32},
    11: {"model_type": "gemma3_text", "head_dim": 32, "layers": 3},
}


def _quantization_trained(model, seed: int, bake: bool = True, distinct_qkv: bool = False):
    """What the qat stage leaves (steps=0): per-channel weights, observed per-tensor input scales in
    the config, weights baked onto the grid (``bake``). ``distinct_qkv`` nudges k/v's scales apart
    from q's (they observe the same input, so they are equal otherwise)."""
    fake_quant.attach(model, QAT)
    fake_quant.set_observing(model, True)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(2):
            model(torch.randint(0, model.config.vocab_size, (2, 16), generator=generator))
    fake_quant.set_observing(model, False)
    scheme = fake_quant.detach(model, bake=bake)
    if distinct_qkv:
        scales = {name: value * (1.1 if "k_proj" in name else 0.95 if "v_proj" in name else 1.0)
                  for name, value in scheme.activation_scales.items()}
        setattr(model.config, fake_quant.CONFIG_KEY, replace(scheme, activation_scales=scales).to_json())
    return model


def _reference(model, embedding_bits: int | None = None):
    """The fake-quantized PyTorch model the QDQ graph must equal (built here, not by validate.py)."""
    reference = copy.deepcopy(model)
    scheme = fake_quant.QuantScheme.of(model) or PTQ
    fake_quant.attach(reference, replace(scheme, embedding_bits=None))
    if embedding_bits:  # the graph's LM head (tied: embedding too) is INT8 per row of (V, D)
        with torch.no_grad():
            reference.lm_head.weight.copy_(fake_quant.quantize_weight(reference.lm_head.weight, 8, "channel", 32))
    return reference.eval()


def _graph_logits(path, spec, ids: np.ndarray, optimize: bool) -> np.ndarray:
    """Prefill ids[:PROMPT], then decode the rest one token at a time through the KV cache: (T, V)."""
    session = _standard_session(path, optimize=optimize)
    names = [o.name for o in session.get_outputs()]
    feeds = {"input_ids": ids[None, :PROMPT], "num_logits_to_keep": np.array([PROMPT]), **empty_past(spec)}
    outputs = dict(zip(names, session.run(None, feeds), strict=True))
    logits = [outputs["logits"][0]]  # (PROMPT, V)
    for token in ids[PROMPT:]:
        feeds = {n.replace("present", "past_key_values"): v for n, v in outputs.items() if n.startswith("present")}
        feeds.update(input_ids=np.array([[token]]), num_logits_to_keep=np.array([1]))
        outputs = dict(zip(names, session.run(None, feeds), strict=True))
        logits.append(outputs["logits"][0])  # (1, V)
    return np.concatenate(logits)


def _reference_logits(reference, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return reference(torch.from_numpy(ids)[None], use_cache=False).logits[0].numpy()  # (T, V)


@pytest.mark.parametrize("seed", sorted(SHAPES))
def test_qdq_graph_equals_fake_quantized_pytorch(seed, tmp_path):
    """(a) unfused ONNX Runtime == fake quantization to ~1e-4 of the logit range, prefill + decode;
    (b) ONNX Runtime's fused integer kernels (INT8 activations kept, EXACT_INT8_QDQ) to 1e-3 of it on any
    CPU; with ONNX Runtime's default UINT8 rewrite an AVX2 CPU without VNNI saturated them to 1.8 %."""
    model = _quantization_trained(tiny_llama(seed=seed, **SHAPES[seed]), seed, bake=seed % 2 == 0,
                                  distinct_qkv=seed % 4 == 1)
    embedding_bits = 8 if seed % 3 == 2 else None
    spec = export_model(model, tmp_path, ExportConfig(max_context=64, weights="int8", embedding_bits=embedding_bits))
    assert (spec.dtype, spec.form) == (DTYPE, "standard")
    ids = np.random.default_rng(seed).integers(0, spec.vocab_size, PROMPT + STEPS)
    expected = _reference_logits(_reference(model, embedding_bits), ids)
    span = float(np.abs(expected).max())
    exact = np.abs(_graph_logits(tmp_path / MODEL_FILE, spec, ids, optimize=False) - expected).max()
    fused = np.abs(_graph_logits(tmp_path / MODEL_FILE, spec, ids, optimize=True) - expected).max()
    float_model = np.abs(_reference_logits(model, ids) - expected).max()  # the quantization error itself
    print(f"seed {seed}: unfused {exact:.2e}, ORT-optimized {fused:.2e}, float model {float_model:.2e}, "
          f"logit range {span:.1f}")
    assert exact <= 1e-4 * span
    assert fused <= 1e-3 * span


def test_qdq_nodes_int8_weights_and_per_channel_scales(tmp_path):
    """(c) every decoder linear: INT8 weight -> DequantizeLinear(axis=1) with one scale per output
    channel, INT8 zero points of 0; its input through QuantizeLinear -> DequantizeLinear with the
    recorded per-tensor scale; opset 17; float head when embedding_bits is None."""
    model = _quantization_trained(tiny_llama(seed=11, layers=2), 11, distinct_qkv=True)
    scheme = fake_quant.QuantScheme.of(model)
    export_model(model, tmp_path, ExportConfig(max_context=64, weights="int8"))
    proto = onnx.load(str(tmp_path / MODEL_FILE))
    assert proto.opset_import[0].version == OPSET
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    nodes = list(proto.graph.node)
    weight_dq = [n for n in nodes if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    activation_q = [n for n in nodes if n.op_type == "QuantizeLinear"]
    # q, k, v with distinct scales: 3 MatMuls; o; gate|up share an input scale: 1; down -> 6 per layer
    assert len(weight_dq) == 6 * 2
    assert len(activation_q) == 6 * 2
    assert count_quantized(proto)["DequantizeLinear"] == len(weight_dq) + len(activation_q)
    for node in weight_dq:
        codes, scales, zero = (inits[name] for name in node.input)
        assert (codes.dtype, codes.ndim) == (np.int8, 2)
        assert np.abs(codes).max() <= 127
        assert (scales.dtype, scales.shape) == (np.float32, (codes.shape[1],))  # per output channel
        assert (zero.dtype, zero.shape) == (np.int8, scales.shape)
        assert not zero.any()
        assert {a.name: a.i for a in node.attribute} == {"axis": 1}
    for node in activation_q:
        scale, zero = inits[node.input[1]], inits[node.input[2]]
        assert (scale.shape, zero.shape, zero.dtype) == ((), (), np.int8)  # per tensor: rank-0 scale
        assert zero == 0
    recorded = {float(np.float32(v)) for v in scheme.activation_scales.values()}
    assert {float(inits[n.input[1]]) for n in activation_q} <= recorded
    embed = inits["embed_tokens.weight"]
    assert embed.dtype == np.float32  # embedding_bits None: the tied embedding / head stays float
    onnx.checker.check_model(proto)


def test_quantized_head_is_int8_per_row(tmp_path):
    model = tiny_llama(seed=12)
    export_model(model, tmp_path, ExportConfig(max_context=64, weights="int8", embedding_bits=8))
    proto = onnx.load(str(tmp_path / MODEL_FILE))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    assert "embed_tokens.weight" not in inits
    codes, scales = inits["embed_tokens.weight_quantized"], inits["embed_tokens.weight_scale"]
    assert codes.dtype == np.int8
    assert scales.shape == (model.config.vocab_size,)
    head_dq = [n for n in proto.graph.node if n.input[:1] == ["embed_tokens.weight_quantized"]]
    assert [(n.op_type, {a.name: a.i for a in n.attribute}) for n in head_dq] == [("DequantizeLinear", {"axis": 0})]
    # The departure from the QAT scheme's blocks of 32 along D: per-row rounding error is larger.
    table = model.model.embed_tokens.weight.detach()
    per_row = (fake_quant.quantize_weight(table, 8, "channel", 32) - table).abs().max()
    per_block = (fake_quant.quantize_weight(table, 8, "block", 32) - table).abs().max()
    print(f"embedding rounding error: per row {per_row:.2e}, per block of 32 {per_block:.2e}")
    assert per_block <= per_row


def test_ptq_model_gets_weight_only_qdq(tmp_path):
    """A model without a recorded scheme: per-channel weights from absmax / 127, float inputs."""
    model = tiny_llama(seed=13, kv_heads=1)
    spec = export_model(model, tmp_path, ExportConfig(max_context=64, weights="int8"))
    counts = count_quantized(onnx.load(str(tmp_path / MODEL_FILE), load_external_data=False))
    assert counts["QuantizeLinear"] == 0
    assert counts["DequantizeLinear"] == 4 * 2  # qkv, o, gate|up, down: one MatMul each (no input scales)
    ids = np.random.default_rng(13).integers(0, spec.vocab_size, PROMPT + STEPS)
    expected = _reference_logits(_reference(model), ids)
    got = _graph_logits(tmp_path / MODEL_FILE, spec, ids, optimize=False)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


def test_channel_codes_match_fake_quant_bit_for_bit():
    weight = torch.randn(48, 40, generator=torch.Generator().manual_seed(0))  # torch (out, in)
    weight[3] = 0  # an all-zero channel gets scale 1 and zero codes
    weight[5] = 1e-44  # denormals whose absmax / 127 underflows to 0: scale 1 too, not 0 / 0 = NaN codes
    codes, scales = quantize_channels(weight.numpy().T, axis=1)  # (K, N) as the graph stores it
    assert scales[3] == scales[5] == 1.0
    dequantized = codes.astype(np.float32) * scales[None, :]
    np.testing.assert_array_equal(dequantized.T, fake_quant.quantize_weight(weight, 8, "channel", 32).numpy())
    baked = torch.from_numpy(dequantized.T.copy())  # a baked weight gives back its own codes and scales
    rederived, rescales = quantize_channels(baked.numpy().T, axis=1)
    np.testing.assert_array_equal(rederived, codes)
    np.testing.assert_array_equal(rederived.astype(np.float32) * rescales[None, :], baked.numpy().T)


def test_pruned_model_exports_and_matches(tmp_path):
    """(d) one layer with a KV group and half its FFN removed: per-layer shapes differ."""
    model = tiny_llama(seed=14, layers=2, heads=6, kv_heads=3, hidden=96)
    layer = model.model.layers[0]
    keep_kv_groups(layer, [0, 2], q_per_kv=2, dim=16)
    keep_ffn_channels(layer, list(range(0, layer.mlp.gate_proj.out_features, 2)))
    model = _quantization_trained(model, 14)
    spec = export_model(model, tmp_path, ExportConfig(max_context=64, weights="int8"))
    assert spec.kv_heads == (2, 3)
    ids = np.random.default_rng(14).integers(0, spec.vocab_size, PROMPT + STEPS)
    expected = _reference_logits(_reference(model), ids)
    got = _graph_logits(tmp_path / MODEL_FILE, spec, ids, optimize=False)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
    report = validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=2, decode_steps=3))
    assert report.max_abs_diff["logits/decode"] <= 1e-4 * np.abs(expected).max()


def test_validate_export_checks_qdq_against_fake_quantization(tmp_path):
    model = _quantization_trained(tiny_llama(seed=15), 15)
    spec = export_model(model, tmp_path, ExportConfig(max_context=64, weights="int8"))
    report = validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=2, decode_steps=3))
    print(f"validation: {report.to_json()}")
    assert set(report.max_abs_diff) == {"logits/prefill", "logits/decode", "present/kv", "qdq/prefill", "qdq/decode",
                                        "shipped/prefill", "shipped/decode", "quantization/prefill",
                                        "quantization/decode"}
    assert report.max_abs_diff["logits/decode"] < 1e-3
    assert report.max_abs_diff["qdq/decode"] < 1e-3  # no rounding flip on a model this small
    assert report.max_abs_diff["quantization/decode"] > report.max_abs_diff["qdq/decode"]  # INT8 is not free
    assert not list(tmp_path.glob("validate-*"))  # the weights-only twin is removed
    # Scales in the config that the graph does not carry.
    scheme = fake_quant.QuantScheme.of(model)
    halved = {name: value / 2 for name, value in scheme.activation_scales.items()}
    setattr(model.config, fake_quant.CONFIG_KEY, replace(scheme, activation_scales=halved).to_json())
    with pytest.raises(ExportMismatchError, match="input scale of model.layers.0.self_attn.q_proj"):
        validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=1, decode_steps=2))
    # Weights the graph does not carry.
    setattr(model.config, fake_quant.CONFIG_KEY, scheme.to_json())
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(1.5)
    with pytest.raises(ExportMismatchError, match="QDQ weights, unfused, vs fake-quantized weights"):
        validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=1, decode_steps=2))


def test_validate_export_of_a_ptq_graph(tmp_path):
    model = tiny_llama(seed=18, tie=False)
    spec = export_model(model, tmp_path, ExportConfig(max_context=64, weights="int8", embedding_bits=8))
    report = validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=2, decode_steps=3))
    assert "qdq/decode" not in report.max_abs_diff  # no activation Q/DQ: the weights check is the whole graph
    assert report.max_abs_diff["logits/decode"] < 1e-4


def test_int8_linears_take_a_quarter_of_the_bytes(tmp_path):
    model = tiny_llama(seed=16, hidden=256, heads=4, kv_heads=2)
    export_model(model, tmp_path / "fp32", ExportConfig(max_context=64))
    export_model(model, tmp_path / "int8", ExportConfig(max_context=64, weights="int8"))

    def linear_bytes(folder) -> int:
        proto = onnx.load(str(folder / MODEL_FILE), load_external_data=False)
        total = 0
        for tensor in proto.graph.initializer:
            if "layers." in tensor.name and "norm" not in tensor.name:  # decoder linears (+ their scales)
                entries = {e.key: e.value for e in tensor.external_data}
                total += int(entries["length"]) if entries else len(tensor.raw_data)
        return total

    fp32, int8 = linear_bytes(tmp_path / "fp32"), linear_bytes(tmp_path / "int8")
    params = sum(m.weight.numel() for m in fake_quant.decoder_linears(model).values())
    assert fp32 == 4 * params
    print(f"decoder linears: fp32 {fp32} B, int8 QDQ {int8} B ({fp32 / int8:.2f}x); data files "
          f"{(tmp_path / 'fp32' / DATA_FILE).stat().st_size} vs {(tmp_path / 'int8' / DATA_FILE).stat().st_size} B")
    assert 3.8 < fp32 / int8 <= 4.0


def test_refusals_are_typed_and_name_the_fix():
    with pytest.raises(ExportError, match="weights=int4") as caught:
        ExportConfig(form="standard", weights="int4")
    assert "ort-fused" in caught.value.fix
    with pytest.raises(ExportError, match="embedding_bits=4"):
        ExportConfig(form="standard", weights="int8", embedding_bits=4)
    model = tiny_llama(seed=17)
    setattr(model.config, fake_quant.CONFIG_KEY, fake_quant.QuantScheme(granularity="block").to_json())
    with pytest.raises(ExportError, match="8-bit weights per channel"):
        export_model(model, __import__("pathlib").Path("unused"), ExportConfig(max_context=64, weights="int8"))


def test_int8_qdq_recipe_validates():
    from edgesdk.build.recipes import load_recipe

    recipe = load_recipe("int8-qdq")
    (smooth_name, smooth), (name, qat) = recipe.validated()
    assert (smooth_name, smooth.alpha) == ("smooth", 0.85)  # SmoothQuant before per-tensor activations
    assert (name, qat.weight_bits, qat.granularity, qat.activations) == ("qat", 8, "channel", "tensor")
    assert qat.embedding_bits is None
    assert (recipe.export.form, recipe.export.weights, recipe.export.embedding_bits) == ("standard", "int8", None)
    ExportConfig(form=recipe.export.form, weights=recipe.export.weights, embedding_bits=recipe.export.embedding_bits)


def test_build_with_a_qdq_recipe_validates_against_fake_quantization(tiny_model_dir, tmp_path):
    """The pipeline path: qat (channel weights, observed per-tensor activations) -> QDQ export ->
    validate_export against the fake-quantized model -> bundle whose runtime loads the graph."""
    from tests._utils.builds import QDQ_RECIPE, build_tiny_bundle

    bundle = build_tiny_bundle(tmp_path, QDQ_RECIPE, "host", model_dir=tiny_model_dir)
    assert (bundle.manifest["graph"]["form"], bundle.manifest["graph"]["dtype"]) == ("standard", DTYPE)
    diffs = bundle.manifest["export_validation"]["max_abs_diff"]
    print(f"build validation: {diffs}")
    assert diffs["logits/decode"] < 1e-3
    assert "qdq/decode" in diffs
    counts = count_quantized(onnx.load(str(bundle.path / MODEL_FILE), load_external_data=False))
    assert counts["QuantizeLinear"] > 0
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(bundle.path, threads=1)  # the standard-form ONNX Runtime backend loads it
    assert runtime.backend.name == "ort-cpu"
    logits = runtime.backend.prefill(np.arange(3, 9, dtype=np.int64))
    assert np.isfinite(logits).all()
