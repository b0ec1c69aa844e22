"""Compression stages: fake quantization equals the exported integer graph, pruning keeps
outputs at ratio 0 and shrinks GQA shapes correctly, distillation losses vanish on identical
models, and the recipes' stage configs validate."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant  # noqa: E402
from edgesdk.compress.losses import (  # noqa: E402
    attention_weights,
    global_attention_cosine,
    layer_attention_kl,
    logits_kl,
    token_attention_kl,
)
from edgesdk.compress.prune import (  # noqa: E402
    PruneConfig,
    apply_plans,
    fisher_diagonal,
    plan_ffn,
    plan_groups,
    saliencies,
)
from edgesdk.compress.structure import LAYERS_KEY, keep_ffn_channels, keep_kv_groups, load_pruned  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.export.validate import _exact_compute_copy  # noqa: E402
from edgesdk.runtime.ort_fused_backend import OrtFusedBackend  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _fused_logits(path, spec, ids: np.ndarray) -> np.ndarray:
    backend = OrtFusedBackend(path, spec.to_json(), threads=1)
    return backend.prefill(ids, keep_logits=len(ids))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("seed", range(6))
def test_fake_quant_equals_exported_block_graph(bits, seed, tmp_path):
    """The fake-quantized PyTorch model and the exported MatMulNBits graph (float compute) agree
    to float32 summation order, for int8 and int4 layers with an int8 tied embedding / head (an
    int4 one on odd seeds, the int4-small recipe's)."""
    _check_fake_quant_equals_export(bits, seed, 64, 32, tmp_path)


@pytest.mark.parametrize(("hidden", "heads", "block"), [(64, 4, 64), (48, 3, 32), (80, 5, 64)])
@pytest.mark.parametrize("seed", range(2))
def test_fake_quant_equals_export_at_other_block_sizes(hidden, heads, block, seed, tmp_path):
    """The same at block 64 (the default recipe's) and where a block does not divide the hidden or
    FFN width, so the last block of every row, the embedding's included, is zero-padded."""
    _check_fake_quant_equals_export(4, seed, hidden, block, tmp_path, heads=heads, kv_heads=1)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("seed", range(2))
def test_untied_fake_quant_equals_exported_block_graph(bits, seed, tmp_path):
    """An untied model: QAT quantizes the LM head and the embedding at embedding_bits (not the layers'
    bits), and the fused export stores both on that grid, so the graph computes what QAT trained."""
    _check_fake_quant_equals_export(bits, seed, 64, 32, tmp_path, tie=False)


@pytest.mark.parametrize(("bits", "head_bits", "tie"), [(4, 8, True), (8, 4, False)])
def test_baked_weights_are_the_exported_block_weights_bit_for_bit(bits, head_bits, tie, tmp_path):
    """After detach(bake=True) every decoder linear, the LM head and the embedding hold exactly what the
    exported MatMulNBits / GatherBlockQuantized initializers dequantize to: a zero-padded last block (hidden 48
    in blocks of 32), an all-zero row and a block below float16's smallest scale included."""
    import onnx
    from onnx import numpy_helper

    from edgesdk.export.blockwise import BlockQuantized
    from edgesdk.export.fused_graph import UNIT_LINEARS

    model = tiny_llama(seed=1, hidden=48, heads=3, kv_heads=1, tie=tie)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[2].zero_()
        model.model.layers[0].mlp.down_proj.weight[3, :32] = 1e-7
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=bits, activations="none", embedding_bits=head_bits))
    fake_quant.detach(model, bake=True)
    export_model(model, tmp_path, ExportConfig(form="ort-fused", weights=f"int{bits}", block_size=32,
                                               embedding_bits=head_bits, max_context=64))
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    stored = {t.name: numpy_helper.to_array(t) for t in graph.initializer}

    def dequantized(name: str, bits: int, k: int, n: int) -> np.ndarray:  # (K, N)
        scales = stored[f"{name}.scales"].astype(np.float32)
        return BlockQuantized(stored[f"{name}.qweight"], scales, bits, 32, k, n).dequantize()

    def baked(*linears) -> np.ndarray:  # (K, N), as the graph multiplies
        return np.concatenate([linear.weight.detach().numpy().T for linear in linears], axis=1)

    checked = 0
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            name, attributes = node.input[1].removesuffix(".qweight"), {a.name: a.i for a in node.attribute}
            if name in ("lm_head", "embed_tokens"):  # the tied head reads the embedding's initializers
                expected = baked(model.lm_head)
            else:
                _, index, unit = name.split(".", 2)
                layer = model.model.layers[int(index)]
                expected = baked(*(layer.get_submodule(module) for module in UNIT_LINEARS[unit]))
            actual = dequantized(name, attributes["bits"], attributes["K"], attributes["N"])
            np.testing.assert_array_equal(actual, expected, err_msg=name)
            checked += 1
    assert checked == 9  # 4 units per layer and the head
    table = model.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(dequantized("embed_tokens", head_bits, *table.T.shape), table.T)


def test_untied_head_and_embedding_are_counted_at_embedding_bits():
    from edgesdk.compress.measure import weight_bytes

    tied, untied = tiny_llama(seed=0), tiny_llama(seed=0, tie=False)
    scheme = fake_quant.QuantScheme(weight_bits=4, embedding_bits=8)
    table = untied.model.embed_tokens.weight.numel()
    # the second (V, D) table of the untied model costs what the first does: 8-bit codes + float16 scales
    assert weight_bytes(untied, scheme) - weight_bytes(tied, scheme) == table + 2 * (table // 32)
    fake_quant.attach(untied, scheme)
    assert isinstance(untied.model.embed_tokens, fake_quant.QuantEmbedding)
    assert untied.lm_head.bits == untied.model.embed_tokens.bits == 8


def test_weight_bytes_count_the_padded_last_block_of_each_row_as_the_export_stores_it(tmp_path):
    """An FFN of 112 channels is 3.5 blocks of 32 per down-projection row: the export pads it to 4 blocks (codes
    and scales), so widening the FFN to 128 adds only the gate and up rows, as the report's bytes must say."""
    import onnx

    from edgesdk.compress.measure import weight_bytes

    def exported_linear_bytes(model, path) -> int:
        export_model(model, path, ExportConfig(form="ort-fused", weights="int4", block_size=32, max_context=64))
        graph = onnx.load(path / "model.onnx").graph
        return sum(onnx.numpy_helper.to_array(t).nbytes for t in graph.initializer
                   if t.name.startswith("layers.") and t.name.endswith((".qweight", ".scales")))

    scheme = fake_quant.QuantScheme(weight_bits=4, block_size=32)
    narrow = tiny_llama(seed=0)  # intermediate 112
    wide = copy.deepcopy(narrow)
    for layer in wide.model.layers:  # 16 zero channels more: same structure otherwise
        for linear, dim in ((layer.mlp.gate_proj, 0), (layer.mlp.up_proj, 0), (layer.mlp.down_proj, 1)):
            pad = (0, 16) if dim == 1 else (0, 0, 0, 16)
            linear.weight = torch.nn.Parameter(torch.nn.functional.pad(linear.weight.detach(), pad))
    assert wide.model.layers[0].mlp.down_proj.weight.shape == (64, 128)
    (tmp_path / "narrow").mkdir()
    (tmp_path / "wide").mkdir()
    exported = exported_linear_bytes(wide, tmp_path / "wide") - exported_linear_bytes(narrow, tmp_path / "narrow")
    assert weight_bytes(wide, scheme) - weight_bytes(narrow, scheme) == exported


def _check_fake_quant_equals_export(bits: int, seed: int, hidden: int, block: int, tmp_path, heads: int = 4,
                                    kv_heads: int = 2, tie: bool = True) -> None:
    head_bits = 4 if seed % 2 else 8
    model = tiny_llama(seed=seed, hidden=hidden, heads=heads, kv_heads=kv_heads, tie=tie)
    scheme = fake_quant.QuantScheme(weight_bits=bits, activations="none", embedding_bits=head_bits,
                                    block_size=block)
    fake_quant.attach(model, scheme)
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, 24)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)[None]).logits[0].numpy()
    fake_quant.detach(model, bake=True)
    with torch.no_grad():  # baking changes nothing: the weights now sit on the grid
        baked = model(torch.from_numpy(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(baked, expected, atol=1e-5)
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights=f"int{bits}", block_size=block,
                                                      embedding_bits=head_bits, max_context=64))
    exact = _fused_logits(_exact_compute_copy(tmp_path / "model.onnx"), spec, ids)
    scale = float(np.abs(expected).max())
    assert float(np.abs(exact - expected).max()) <= 1e-5 * max(scale, 1.0)


@pytest.mark.parametrize("seed", range(3))
def test_mixed_precision_fake_quant_equals_exported_graph(seed, tmp_path):
    """Int4 layers with some units at 8 bits: the fake-quantized model, the exported graph (float
    compute) and the graph's MatMulNBits bits all agree with the scheme's choice."""
    import onnx

    model = tiny_llama(seed=seed, hidden=64, heads=4, kv_heads=2)
    eight = ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.q_proj",
             "model.layers.1.self_attn.v_proj")
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=4, activations="none", embedding_bits=8,
                                                    eight_bit_linears=eight))
    assert model.model.layers[0].mlp.down_proj.bits == 8
    assert model.model.layers[0].mlp.up_proj.bits == 4
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, 24)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)[None]).logits[0].numpy()
    fake_quant.detach(model, bake=True)
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="int4", embedding_bits=8,
                                                      max_context=64))
    bits = {node.input[1].rsplit(".", 1)[0]: next(a.i for a in node.attribute if a.name == "bits")
            for node in onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph.node
            if node.op_type == "MatMulNBits" and node.input[1].startswith("layers.")}
    assert {name for name, b in bits.items() if b == 8} == {"layers.0.mlp.down", "layers.1.attn.qkv"}
    exact = _fused_logits(_exact_compute_copy(tmp_path / "model.onnx"), spec, ids)
    assert float(np.abs(exact - expected).max()) <= 1e-5 * max(float(np.abs(expected).max()), 1.0)


def test_a_fused_unit_takes_all_or_none_of_its_linears_at_8_bits():
    from edgesdk.export.fused_graph import FusedConfig

    config = FusedConfig(weights="int4", eight_bit_linears=("model.layers.2.self_attn.q_proj",))
    with pytest.raises(ValueError, match="all or none"):
        config.unit_bits("layers.2.attn.qkv")
    assert config.unit_bits("layers.2.attn.o") == 4


def test_mixed_precision_keeps_the_units_with_most_fisher_weighted_rounding_loss():
    """A unit whose weights carry large Fisher mass is chosen first; the budget caps the count."""
    from edgesdk.compress.mixed_precision import choose_units, eight_bit_linears, rounding_gains

    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    fisher = {name: torch.full_like(linear.weight, 1e-6) for name, linear in fake_quant.decoder_linears(model).items()}
    fisher["model.layers.1.mlp.down_proj"].fill_(1.0)
    gains = rounding_gains(model, fisher, 32)
    assert all(gain > 0 for gain in gains.values())  # 4-bit rounding always loses more than 8-bit
    assert choose_units(model, gains, 0.2)[0] == "layers.1.mlp.down"
    assert choose_units(model, gains, 0.0) == []
    sizes = {"layers.1.mlp.down": model.model.layers[1].mlp.down_proj.weight.numel()}
    total = sum(linear.weight.numel() for linear in fake_quant.decoder_linears(model).values())
    assert "layers.1.mlp.down" not in choose_units(model, gains, 0.9 * sizes["layers.1.mlp.down"] / total)
    batches = [torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    linears, units, measured = eight_bit_linears(model, batches, 0.3, 32)
    assert units
    assert set(measured) == set(gains)
    assert all(any(name.startswith(f"model.{unit.rsplit('.', 2)[0]}.") for unit in units) for name in linears)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block", [32, 64])
def test_block_activation_fake_quant_matches_accuracy_level_4(seed, block, tmp_path):
    """activations=block approximates MatMulNBits accuracy_level 4 (int8 activations per weight
    block): on average closer to the shipped graph than the weight-only emulation, and, at block
    64, closer than activations quantized per 32 (the kernel quantizes them per weight block). Not
    bit-exact: the kernel's own rounding and summation order differ."""
    model = tiny_llama(seed=seed, hidden=128, heads=4, kv_heads=2)
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, 24)
    scheme = fake_quant.QuantScheme(weight_bits=8, activations="block", embedding_bits=8, block_size=block)
    per_32 = None
    if block != 32:
        coarse = copy.deepcopy(model)
        fake_quant.attach(coarse, scheme)
        with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
            finer = fake_quant.quantize_activation_blocks
            patch.setattr(fake_quant, "quantize_activation_blocks", lambda x, size: finer(x, 32))
            per_32 = coarse(torch.from_numpy(ids)[None]).logits[0].numpy()
    fake_quant.attach(model, scheme)
    with torch.no_grad():
        emulated = model(torch.from_numpy(ids)[None]).logits[0].numpy()
    fake_quant.detach(model, bake=True)
    with torch.no_grad():
        weight_only = model(torch.from_numpy(ids)[None]).logits[0].numpy()
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="int8", embedding_bits=8,
                                                      block_size=block, max_context=64))
    shipped = _fused_logits(tmp_path / "model.onnx", spec, ids)
    emulation_error = float(np.abs(shipped - emulated).mean())
    assert emulation_error < float(np.abs(shipped - weight_only).mean())
    # the LM head is a MatMulNBits too: with its input left in float the mean error was ~3e-4 of the range, at every
    # position; the median over positions leaves out the few where an input code a float step from a rounding tie
    # rounds the other way in the kernel (1e-4 to 1e-3 of the range there and, through attention, after)
    per_position = np.abs(shipped - emulated).mean(axis=1)  # [positions]
    assert float(np.median(per_position)) < 1e-5 * float(np.abs(shipped).max())
    assert float(np.abs(shipped - emulated).max()) < 2e-2 * float(np.abs(shipped).max())
    if per_32 is not None:
        assert emulation_error < float(np.abs(shipped - per_32).mean())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [32, 64])
def test_matmul_nbits_accuracy_level_4_is_the_block_activation_emulation(bits, block):
    """One MatMulNBits node at accuracy level 4 on this CPU computes what QAT emulates: INT8
    activations per weight block times the stored codes. Outlier channels (30x) are in the input:
    they are what a saturating integer kernel (16-bit pair sums without VNNI) gets wrong. The
    whole-model test above cannot be this tight, since summation order differs across layers."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.export.blockwise import quantize_blockwise

    rng = np.random.default_rng(bits + block)
    k, n = 576, 384  # SmolLM2's hidden size; K spans 9 or 18 blocks
    quantized = quantize_blockwise(rng.standard_normal((k, n)).astype(np.float32) * 0.05, bits, block)
    x = rng.standard_normal((3, k)).astype(np.float32)
    x[:, :8] *= 30.0
    node = helper.make_node("MatMulNBits", ["x", "codes", "scales"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=block, accuracy_level=4)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])],
                              [numpy_helper.from_array(quantized.packed, "codes"),
                               numpy_helper.from_array(quantized.scales, "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shipped = session.run(None, {"x": x})[0]
    emulated = fake_quant.quantize_activation_blocks(torch.from_numpy(x), block).numpy() @ quantized.dequantize()
    float_only = x @ quantized.dequantize()
    scale = float(np.abs(float_only).max())
    print(f"bits {bits} block {block}: emulation {np.abs(shipped - emulated).max() / scale:.1e}, "
          f"float activations {np.abs(shipped - float_only).max() / scale:.1e} of the output range")
    assert np.abs(shipped - emulated).max() < 1e-5 * scale
    assert np.abs(shipped - float_only).max() > 1e-3 * scale  # the activations really were quantized


def test_channel_scales_are_per_output_row_so_q_k_v_each_have_their_own():
    weight = torch.randn(8, 64)
    weight[3] *= 100.0  # one loud channel must not coarsen the others
    quantized = fake_quant.quantize_weight(weight, 8, "channel", 32)
    error = (quantized - weight).abs().amax(dim=1)
    steps = weight.abs().amax(dim=1) / 127
    assert torch.all(error <= steps / 2 + 1e-6)
    assert float(error[0]) < float(steps[3]) / 10


def test_four_bit_channel_scales_are_chosen_for_the_symmetric_codes_they_quantize_to():
    """Per-channel codes are symmetric ([-7, 7] at 4 bits): the scale search must measure its candidates
    on that range, so no row ends up with more rounding error than the plain absmax / 7 scale gives it
    (a search on [-8, 7] took scales whose -8 code is then clamped to -7)."""
    weight = torch.randn(256, 64, generator=torch.Generator().manual_seed(0))
    error = (fake_quant.quantize_weight(weight, 4, "channel", 32) - weight).pow(2).sum(dim=1)
    scale = weight.abs().amax(dim=1, keepdim=True) / 7
    plain = (torch.clamp(torch.round(weight / scale), -7, 7) * scale - weight).pow(2).sum(dim=1)
    assert torch.all(error <= plain * (1 + 1e-6))


@pytest.mark.parametrize("granularity", ["channel", "block"])
@pytest.mark.parametrize("bits", [8, 4])
def test_a_row_too_small_for_a_float32_step_bakes_finite(granularity, bits):
    """absmax / 127 of a row of denormal weights underflows to a zero scale: its zeros became 0 / 0 = NaN."""
    weight = torch.zeros(3, 40)
    weight[0] = 0.5
    weight[1, 0] = 1e-44
    quantized = fake_quant.quantize_weight(weight, bits, granularity, 32)
    assert torch.isfinite(quantized).all()
    assert float((quantized[1] - weight[1]).abs().max()) <= 1e-44


def test_straight_through_gradient_is_the_identity():
    model = tiny_llama(seed=0)
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=4, activations="block"))
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    model(ids).logits.float().pow(2).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads
    assert all(torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)


def test_tensor_observers_record_activation_scales_into_the_config():
    model = tiny_llama(seed=1)
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="tensor"))
    fake_quant.set_observing(model, True)
    with torch.no_grad():
        model(torch.randint(0, model.config.vocab_size, (2, 16)))
    fake_quant.set_observing(model, False)
    scheme = fake_quant.detach(model)
    names = set(fake_quant.decoder_linears(model))
    assert names <= set(scheme.activation_scales)
    assert all(value > 0 for value in scheme.activation_scales.values())
    assert fake_quant.QuantScheme.of(model).activation_scales == scheme.activation_scales


def test_an_observer_that_sees_nan_names_the_linear_instead_of_recording_a_nan_scale():
    """A NaN input would stay in the running absmax for good and reach the export as a NaN scale."""
    from edgesdk.errors import BuildError

    model = tiny_llama(seed=1)
    with torch.no_grad():
        model.model.embed_tokens.weight[7, 3] = float("nan")
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="tensor"))
    fake_quant.set_observing(model, True)
    with torch.no_grad(), pytest.raises(BuildError, match=r"model\.layers\.0\.self_attn\.q_proj .* nan"):
        model(torch.tensor([[5, 7, 9]]))


# --- pruning ---------------------------------------------------------------------------------------


def _calibration(model, count=2):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, model.config.vocab_size, (2, 16), generator=generator) for _ in range(count)]


def test_pruning_at_ratio_zero_keeps_every_output():
    model = tiny_llama(seed=2, layers=3, heads=6, kv_heads=3, hidden=96)
    ids = torch.randint(0, model.config.vocab_size, (1, 20))
    with torch.no_grad():
        before = model(ids).logits
    ffn_scores, group_scores = saliencies(model, fisher_diagonal(model, _calibration(model)))
    config = PruneConfig(ffn_ratio=0.0, kv_group_ratio=0.0)
    ffn_plan, group_plan = plan_ffn(ffn_scores, config), plan_groups(group_scores, config)
    for layer, channels, groups in zip(model.model.layers, ffn_plan, group_plan, strict=True):
        keep_ffn_channels(layer, channels)
        keep_kv_groups(layer, groups, q_per_kv=2, dim=96 // 6)
    with torch.no_grad():
        after = model(ids).logits
    torch.testing.assert_close(after, before)


def test_gqa_group_pruning_removes_whole_groups_and_matches_the_sliced_computation(tmp_path):
    """Removing KV group g removes its KV head and its query heads; the pruned model equals the
    original with those heads' contributions cut (o_proj columns gone), and its export matches."""
    model = tiny_llama(seed=3, layers=2, heads=6, kv_heads=3, hidden=96)
    dim = 96 // 6
    layer = model.model.layers[0]
    reference = copy.deepcopy(model)
    keep_kv_groups(layer, [0, 2], q_per_kv=2, dim=dim)
    keep_ffn_channels(layer, list(range(0, layer.mlp.gate_proj.out_features, 2)))
    assert layer.self_attn.q_proj.weight.shape == (4 * dim, 96)
    assert layer.self_attn.k_proj.weight.shape == (2 * dim, 96)
    assert layer.self_attn.o_proj.weight.shape == (96, 4 * dim)
    # The same computation on the unpruned model: zero the removed heads' o_proj columns and FFN channels.
    with torch.no_grad():
        ref_layer = reference.model.layers[0]
        ref_layer.self_attn.o_proj.weight[:, 2 * dim * 1: 2 * dim * 2] = 0  # group 1 = query heads 2, 3
        ref_layer.mlp.down_proj.weight[:, 1::2] = 0
        ids = torch.randint(0, model.config.vocab_size, (1, 14))
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=1e-4, rtol=1e-4)
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=64))
    assert spec.kv_heads == (2, 3)
    onnx_logits = _fused_logits(tmp_path / "model.onnx", spec, ids[0].numpy())
    np.testing.assert_allclose(onnx_logits, model(ids).logits[0].detach().numpy(), atol=1e-4)


def test_group_pruning_of_a_gated_model_keeps_the_power_adapters_head_scales_in_step():
    """The power adapter of layer i scales each query head of layer i+1: pruning a group of layer i+1 drops
    those heads' scales too, so the gated model runs and equals the original with the heads' o columns cut."""
    from edgesdk.power import adapter

    model = tiny_llama(seed=3, layers=3, heads=6, kv_heads=3, hidden=96)
    dim = 96 // 6
    adapter.install_adapters(model, 4, 0.5)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("power_adapter.proj2.weight"):
                parameter.normal_(0, 0.5)  # head scales that differ between heads
    reference = copy.deepcopy(model)
    ffn = [list(range(layer.mlp.gate_proj.out_features)) for layer in model.model.layers]
    apply_plans(model, ffn, [[0, 1, 2], [0, 2], [1]])
    assert [layer.mlp.power_adapter.next_heads for layer in model.model.layers] == [4, 2, 0]
    with torch.no_grad():
        o1, o2 = reference.model.layers[1].self_attn.o_proj.weight, reference.model.layers[2].self_attn.o_proj.weight
        o1[:, 2 * dim: 4 * dim] = 0  # layer 1 loses group 1 (query heads 2, 3)
        o2[:, : 2 * dim] = 0  # layer 2 loses groups 0 and 2
        o2[:, 4 * dim:] = 0
        ids = torch.randint(0, model.config.vocab_size, (1, 14))
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=1e-4, rtol=1e-4)


def test_cooperative_rule_removes_one_group_per_neighbour_pool():
    scores = [torch.tensor([0.1, 5.0, 5.0]), torch.tensor([0.2, 5.0, 5.0]), torch.tensor([0.3, 5.0, 5.0])]
    plan = plan_groups(scores, PruneConfig(kv_group_ratio=2 / 9, cooperative=True))
    removed = [(i, g) for i, keep in enumerate(plan) for g in range(3) if g not in keep]
    # Pass 1: (0,0) pools {(0,0),(1,0)}: (0,0) goes, layer 1's group 0 is closed; (2,0) pools with (1,0)
    # which is closed, so (2,0) goes: neighbours never both lose the same group in one pass.
    assert removed == [(0, 0), (2, 0)]
    independent = plan_groups(scores, PruneConfig(kv_group_ratio=2 / 9, cooperative=False))
    assert [(i, g) for i, keep in enumerate(independent) for g in range(3) if g not in keep] == [(0, 0), (1, 0)]


def test_ffn_plan_follows_importance_with_floor_and_block_multiple():
    scores = [torch.arange(128, dtype=torch.float32) * 0.001, torch.arange(128, dtype=torch.float32) + 100]
    plan = plan_ffn(scores, PruneConfig(ffn_ratio=0.4, min_ffn_keep=0.25, ffn_multiple=32))
    assert len(plan[1]) == 128  # every channel of the important layer survives
    assert len(plan[0]) % 32 == 0
    assert len(plan[0]) >= 32
    assert plan[0] == list(range(128 - len(plan[0]), 128))  # the most salient channels are kept


def test_ffn_plan_keeps_the_asked_count_when_saliencies_tie():
    """All-equal saliencies (as with no calibration batch) used to keep nothing above the threshold, so the
    min_ffn_keep floor decided: asked to remove 10 %, it removed 75 %. Ties are broken by rank."""
    scores = [torch.zeros(128), torch.zeros(128)]
    plan = plan_ffn(scores, PruneConfig(ffn_ratio=0.1, ffn_multiple=1))
    assert sum(len(p) for p in plan) == 256 - round(0.1 * 256)
    tied = [torch.cat([torch.zeros(64), torch.ones(64)])]  # half tied at the cut
    assert len(plan_ffn(tied, PruneConfig(ffn_ratio=0.25, ffn_multiple=1, min_ffn_keep=0.1))[0]) == 96


def test_ffn_floor_is_rounded_up_to_the_multiple():
    """min_ffn_keep 0.3 of 1536 is 460.8 channels: the floor rounds up to 480, never down to 448."""
    plan = plan_ffn([torch.arange(1536.0)], PruneConfig(ffn_ratio=0.9, min_ffn_keep=0.3, ffn_multiple=32))
    assert len(plan[0]) == 480
    assert len(plan[0]) >= 0.3 * 1536


def test_prune_needs_a_calibration_batch():
    from edgesdk.build.registry import make_config
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match="calibration_batches must be >= 1, got 0"):
        make_config("prune", {"calibration_batches": 0})


def test_pruned_checkpoint_round_trips(tmp_path):
    from edgesdk.compress.structure import layer_records

    model = tiny_llama(seed=4, layers=2, heads=6, kv_heads=3, hidden=96)
    records = layer_records(model)
    keep_kv_groups(model.model.layers[1], [1], q_per_kv=2, dim=16)
    keep_ffn_channels(model.model.layers[0], list(range(32)))
    records[1]["kv_heads"], records[1]["heads"] = [1], [2, 3]
    records[0]["ffn"] = list(range(32))
    setattr(model.config, LAYERS_KEY, records)
    model.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    loaded = load_pruned(tmp_path / "ckpt")
    ids = torch.randint(0, model.config.vocab_size, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


# --- distillation losses ---------------------------------------------------------------------------


def test_each_distillation_loss_is_zero_for_identical_teacher_and_student():
    model = tiny_llama(seed=5)
    model.set_attn_implementation("eager")
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    kept = [list(range(model.config.num_attention_heads))] * model.config.num_hidden_layers
    assert float(logits_kl(out.logits, out.logits, 2.0)) == pytest.approx(0.0, abs=1e-6)
    assert float(token_attention_kl(out.attentions, out.attentions, kept)) == pytest.approx(0.0, abs=1e-6)
    assert float(layer_attention_kl(out.attentions, out.attentions)) == pytest.approx(0.0, abs=1e-6)
    assert float(global_attention_cosine(out.attentions, out.attentions)) == pytest.approx(0.0, abs=1e-6)
    other = tiny_llama(seed=6)
    other.set_attn_implementation("eager")
    with torch.no_grad():
        different = other(ids, output_attentions=True)
    assert float(logits_kl(different.logits, out.logits)) > 0
    assert float(token_attention_kl(different.attentions, out.attentions, kept)) > 0
    assert float(layer_attention_kl(different.attentions, out.attentions)) > 0
    assert float(global_attention_cosine(different.attentions, out.attentions)) > 0


def test_token_attention_kl_compares_surviving_heads_with_themselves():
    teacher = [torch.softmax(torch.randn(1, 4, 5, 5), -1)]
    student = [teacher[0][:, [1, 3]]]
    assert float(token_attention_kl(student, teacher, [[1, 3]])) == pytest.approx(0.0, abs=1e-6)
    assert float(token_attention_kl(student, teacher, [[0, 2]])) > 0


def test_attention_weight_schedule_sums_to_one_and_shifts_emphasis():
    early, middle, late = attention_weights(0.1), attention_weights(0.5), attention_weights(0.9)
    for weights in (early, middle, late):
        assert sum(weights.values()) == pytest.approx(1.0)
    assert early["token"] == 0.6
    assert middle["layer"] == 0.5
    assert late["global"] == 0.4
    assert attention_weights(0.5, schedule=False) == {"token": 0.4, "layer": 0.35, "global": 0.25}


# --- training loop and stage settings ---------------------------------------------------------------


def test_a_last_partial_accumulation_group_is_a_real_update_on_the_mean_gradient():
    """5 batches, 2 per step: the third update (one batch) used to get lr 0 (the cosine schedule counted
    2 updates) and half its gradient (divided by 2 for one batch)."""
    from edgesdk.compress.train import LoopSettings, run_training

    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    seen, grads = [], []

    def loss_fn(batch, _):
        seen.append(model.weight.detach().clone())
        return (model(batch) * 0.01).sum(), {}

    def record_grad(optimizer, *args):
        grads.append(model.weight.grad.detach().clone())

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(record_grad)
    try:
        batches = [torch.ones(1, 4)] * 5
        result = run_training(model, loss_fn, batches, LoopSettings(lr=0.1, grad_accumulation=2),
                              desc="t", progress=False)
    finally:
        handle.remove()
    assert result["updates"] == 3
    assert not torch.equal(model.weight, seen[-1])  # the last update moved the weights
    for grad in grads:  # every update: the mean gradient of its batches, one batch or two
        torch.testing.assert_close(grad, torch.full((1, 4), 0.01))


@pytest.mark.parametrize(("stage", "options", "match"), [
    ("qat", {"activations": "tensor", "granularity": "channel", "observer_batches": 0}, "observer_batches >= 1"),
    ("qat", {"weight_bits": 4, "eight_bit_fraction": 0.2, "fisher_batches": 0}, "fisher_batches >= 1"),
    ("qat", {"grad_accumulation": 0}, "grad_accumulation must be >= 1"),
    ("distill", {"grad_accumulation": 0}, "grad_accumulation must be >= 1"),
])
def test_stage_settings_that_would_calibrate_or_train_on_nothing_are_refused(stage, options, match):
    from edgesdk.build.registry import make_config
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match=match):
        make_config(stage, options)
