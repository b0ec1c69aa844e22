"""SmoothQuant (stage ``smooth``) on Gemma 3: its RMSNorms scale by 1 + weight (transformers' Gemma3RMSNorm) and
its layers normalise the attention's and the FFN's outputs too, so the scales go into 1 + weight of the two
norms that feed the smoothed linears (input_layernorm -> q|k|v, pre_feedforward_layernorm -> gate|up) and
nowhere else. The smoothed model computes the same logits, per-tensor INT8 loses less to it, Llama and Qwen3
are folded as before, and a Gemma 3 model builds for a Jetson target with the int8-qdq recipe's stages."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import edgesdk.recipes  # noqa: E402
from edgesdk.compress import fake_quant, smooth  # noqa: E402
from tests._utils.builds import QDQ_RECIPE, build_tiny_bundle  # noqa: E402
from tests._utils.tiny import CORPUS, save_tiny_model_dir, tiny_llama, tiny_tokenizer  # noqa: E402

# test_gemma3.py's tiny Gemma 3: windows of 4 on layers 0 and 2, head size 32 over a width of 64, every norm
# weight in [-0.5, 0.5] so that 1 + weight counts
GEMMA3 = {"model_type": "gemma3_text", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32, "layers": 3,
          "intermediate": 128}
SEQUENCE = 48


def gemma(outliers: bool, seed: int = 0):
    """The tiny Gemma 3, or with the kind of outliers SmoothQuant is for: two channels of the norms in front of
    q|k|v and gate|up scaling by 30 (Gemma 3's norm weights run large on a few channels), and two rows of up 30
    times the rest, so down's input has them too."""
    model = tiny_llama(seed=seed, **GEMMA3)
    if outliers:
        with torch.no_grad():
            for layer in model.model.layers:
                for norm in (layer.input_layernorm, layer.pre_feedforward_layernorm):
                    norm.weight[[5, 40]] = 29.0
                layer.mlp.up_proj.weight[[3, 17]] *= 30.0
    return model


def corpus_batches() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tiny corpus as tokens: 4 calibration batches (2 x 48 tokens), then the evaluation batches after them."""
    ids = torch.tensor(tiny_tokenizer(320)("\n".join(CORPUS))["input_ids"])
    sequences = ids[: len(ids) // SEQUENCE * SEQUENCE].reshape(-1, SEQUENCE)
    calibration = [sequences[i:i + 2] for i in range(0, 8, 2)]
    evaluation = [sequences[i:i + 4] for i in range(8, len(sequences) - 3, 4)]
    return calibration, evaluation


def smoothed(model, calibration, sites=smooth.SITES):
    model = copy.deepcopy(model)
    with torch.no_grad():
        smooth.smooth_model(model, smooth.input_peaks(model, calibration), smooth.SmoothConfig(alpha=0.85,
                                                                                               sites=tuple(sites)))
    return model


def folds(layer, new, ffn_norm: str):
    """(the norm before and after smoothing, the linears it feeds, their reader in the peaks) for q|k|v and
    gate|up; ``ffn_norm`` names the layer's FFN input norm."""
    attn, mlp = layer.self_attn, layer.mlp
    return [(layer.input_layernorm, new.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj), "self_attn.q_proj"),
            (getattr(layer, ffn_norm), getattr(new, ffn_norm), (mlp.gate_proj, mlp.up_proj), "mlp.gate_proj")]


def scales_of(peaks, index: int, reader: str, linears) -> torch.Tensor:
    return smooth.migration_scales(peaks[f"model.layers.{index}.{reader}"], smooth.column_peak(*linears), 0.85)


@pytest.mark.parametrize("sites", [smooth.SITES, *[(site,) for site in smooth.SITES]], ids=lambda s: "+".join(s))
@pytest.mark.parametrize("outliers", [False, True], ids=["plain", "outliers"])
@torch.no_grad()
def test_smoothed_gemma3_gives_the_same_float32_logits(outliers, sites):
    model = gemma(outliers)
    calibration, evaluation = corpus_batches()
    after = smoothed(model, calibration, sites)
    for batch in [*calibration, *evaluation[:3]]:
        torch.testing.assert_close(after(batch).logits, model(batch).logits, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_the_scales_go_into_one_plus_weight_of_the_norms_that_feed_q_k_v_and_gate_up_only():
    model = gemma(outliers=True)
    calibration, _ = corpus_batches()
    peaks = smooth.input_peaks(model, calibration)
    after = smoothed(model, calibration, ("qkv", "gate_up"))
    for index, (layer, new) in enumerate(zip(model.model.layers, after.model.layers, strict=True)):
        for norm, new_norm, linears, reader in folds(layer, new, "pre_feedforward_layernorm"):
            scales = scales_of(peaks, index, reader, linears)
            assert float(scales.max()) > 10.0  # the planted channels moved
            torch.testing.assert_close(1.0 + new_norm.weight, (1.0 + norm.weight) / scales, rtol=1e-6, atol=1e-7)
        # the norms on the attention's and the FFN's outputs, and the per-head query / key norms, read outputs
        # smoothing leaves as they were
        for name in ("post_attention_layernorm", "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
            assert torch.equal(new.get_submodule(name).weight, layer.get_submodule(name).weight), name
    assert torch.equal(after.model.norm.weight, model.model.norm.weight)


def qdq_divergence(reference, model, calibration, evaluation) -> float:
    """Mean KL(reference || model under per-channel INT8 weights and static per-tensor INT8 activations, the QDQ
    graph's scheme) per token over ``evaluation``, the activation scales observed on ``calibration``."""
    quantized = copy.deepcopy(model)
    fake_quant.attach(quantized, fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="tensor",
                                                        embedding_bits=None))
    with torch.no_grad():
        fake_quant.set_observing(quantized, True)
        for batch in calibration:
            quantized(batch)
        fake_quant.set_observing(quantized, False)
        total, tokens = 0.0, 0
        for batch in evaluation:
            expected = reference(batch).logits.log_softmax(-1)
            got = quantized(batch).logits.log_softmax(-1)
            total += float((expected.exp() * (expected - got)).sum())
            tokens += batch.numel()
    return total / tokens


@pytest.mark.parametrize("outliers", [False, True], ids=["plain", "outliers"])
def test_per_tensor_int8_on_the_tiny_corpus_loses_no_more_after_smoothing(outliers):
    """KL per token to the float model, here (seed 0): 0.00137 -> 0.00112 smoothed, with outliers 0.0858 ->
    0.0173; the mean over seeds 0 to 3: 0.00131 -> 0.00109, with outliers 0.163 -> 0.040."""
    model = gemma(outliers)
    calibration, evaluation = corpus_batches()
    plain = qdq_divergence(model, model, calibration, evaluation)
    smoothed_divergence = qdq_divergence(model, smoothed(model, calibration), calibration, evaluation)
    print(f"KL per token, per-tensor INT8: {plain:.5f} -> {smoothed_divergence:.5f} smoothed")
    assert smoothed_divergence <= (plain / 2 if outliers else plain)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@torch.no_grad()
def test_llama_and_qwen3_norms_are_still_divided_by_the_scales(model_type):
    """The Llama family's norms scale by their weight: w / s exactly, into the post-attention norm in front of
    gate|up (Qwen3's q_norm / k_norm untouched), as before Gemma 3's folds."""
    model = tiny_llama(seed=3, heads=4, kv_heads=2, hidden=64, model_type=model_type)
    calibration, _ = corpus_batches()
    peaks = smooth.input_peaks(model, calibration)
    after = smoothed(model, calibration)
    for index, (layer, new) in enumerate(zip(model.model.layers, after.model.layers, strict=True)):
        for norm, new_norm, linears, reader in folds(layer, new, "post_attention_layernorm"):
            assert torch.equal(new_norm.weight, norm.weight / scales_of(peaks, index, reader, linears))
        if model_type == "qwen3":
            for name in ("q_norm", "k_norm"):
                assert torch.equal(getattr(new.self_attn, name).weight, getattr(layer.self_attn, name).weight)
    for batch in calibration:
        torch.testing.assert_close(after(batch).logits, model(batch).logits, rtol=1e-4, atol=1e-4)


def test_the_jetson_recipe_builds_a_gemma3_bundle_with_windowed_kernels(tmp_path):
    """A Gemma 3 model on a Jetson target with its default recipe (smooth, qat INT8, the QDQ graph and the
    block-sparse weights with kernels compiled for sm_87): the build validates, and the sliding layers' window
    has its own decode-attention kernels (named _w4)."""
    jetson = (Path(edgesdk.recipes.__file__).parent / "jetson.yaml").read_text()
    model_dir = save_tiny_model_dir(tmp_path / "model", **GEMMA3)
    bundle = build_tiny_bundle(tmp_path, jetson, "orin-nx", model_dir=model_dir, generated_sequences=0)
    assert [stage["stage"] for stage in bundle.manifest["stages"]] == ["smooth", "qat"]
    kernels = [path.name for path in (bundle.path / "kernels" / "sm_87").iterdir()]
    assert any("_w4" in name for name in kernels), kernels
    assert any("gqa" in name and "_w" not in name for name in kernels), kernels  # the global layer's


def test_a_gemma3_smooth_qat_int8_build_for_a_jetson_validates(tmp_path):
    """int8-qdq's stages (smooth, qat per-channel INT8 weights with per-tensor activations) and its standard
    INT8 export, in tiny, for orin-nx: the build's export validation compares the QDQ graph with the smoothed,
    fake-quantized model."""
    import onnx

    from edgesdk.build.recipes import load_recipe
    from edgesdk.export.onnx_export import MODEL_FILE
    from edgesdk.export.qdq_graph import count_quantized

    shipped = load_recipe("int8-qdq")  # what the refusal names: the same stages and export as the tiny recipe
    assert [entry.stage for entry in shipped.stages] == ["smooth", "qat"]
    assert not shipped.export.sparse
    bundle = build_tiny_bundle(tmp_path, QDQ_RECIPE, "orin-nx", model_dir=save_tiny_model_dir(tmp_path / "model",
                                                                                               **GEMMA3))
    assert bundle.manifest["model"]["after"]["architecture"] == "gemma3_text"
    assert [stage["stage"] for stage in bundle.manifest["stages"]] == ["smooth", "qat"]
    diffs = bundle.manifest["export_validation"]["max_abs_diff"]
    print(f"build validation: {diffs}")
    assert diffs["logits/decode"] < 1e-3
    assert "qdq/decode" in diffs
    assert count_quantized(onnx.load(str(bundle.path / MODEL_FILE), load_external_data=False))["QuantizeLinear"] > 0
