"""The compression stages against the references they follow, run side by side:

* fake quantization (compress/fake_quant.py) against PyTorch's ``torch.fake_quantize_per_tensor_affine`` /
  ``torch.fake_quantize_per_channel_affine`` (values and straight-through gradients) and against ONNX Runtime
  running the QuantizeLinear / DequantizeLinear nodes the QDQ export writes;
* SmoothQuant (compress/smooth.py) against s_j = max|X_j|^a / max|W_j|^(1-a) (Xiao et al. 2023, eq. 4);
* the logits distillation loss (compress/losses.py) against ``torch.nn.functional.kl_div``;
* structured pruning (compress/structure.py, prune.py) against the unpruned model with the same heads and
  channels cut out.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import torch.nn.functional as F  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgesdk.compress import fake_quant, smooth  # noqa: E402
from edgesdk.compress.losses import layer_attention_kl, logits_kl, token_attention_kl  # noqa: E402
from edgesdk.compress.prune import (  # noqa: E402
    PruneConfig,
    apply_plans,
    fisher_diagonal,
    plan_ffn,
    plan_groups,
    saliencies,
)
from edgesdk.compress.structure import keep_ffn_channels, keep_kv_groups, layer_records  # noqa: E402
from edgesdk.export.qdq_graph import quantize_channels  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402

# --- fake quantization vs PyTorch -----------------------------------------------------------------------


def _halfway_values(scale: float, low: int, high: int) -> torch.Tensor:
    """Every (k + 1/2) * scale from two codes below ``low`` to two above ``high``: with a power-of-two scale
    these are exact float32 values, so x / scale and x * (1 / scale) both land exactly between two levels."""
    k = torch.arange(low - 2, high + 3, dtype=torch.float32)
    return torch.cat([(k + 0.5) * scale, k * scale])


def test_per_tensor_activations_round_half_to_even_and_saturate_as_pytorch_does():
    scale = 2.0 ** -6
    x = _halfway_values(scale, -128, 127)
    ours = fake_quant.quantize_activation_tensor(x, scale)
    reference = torch.fake_quantize_per_tensor_affine(x, scale, 0, -128, 127)
    assert torch.equal(ours, reference)
    codes = (ours / scale).tolist()
    assert codes[:3] == [-128.0, -128.0, -128.0]  # -129.5 saturates, -128.5 and -127.5 round to the even -128
    assert codes[3:5] == [-126.0, -126.0]  # -126.5 and -125.5 both to the even -126
    assert max(codes) == 127.0


@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 5, 31)])
def test_per_tensor_activations_equal_pytorch_fake_quant_on_odd_shapes(shape):
    generator = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=generator) * 3
    scale = 0.0123
    torch.testing.assert_close(fake_quant.quantize_activation_tensor(x, scale),
                               torch.fake_quantize_per_tensor_affine(x, scale, 0, -128, 127), rtol=0, atol=0)


def _gradients(function, x: torch.Tensor, upstream: torch.Tensor | None = None) -> torch.Tensor:
    """d/dx of sum(upstream * function(x)); upstream defaults to distinct values spread over [-1, 2]."""
    x = x.detach().clone().requires_grad_(True)
    upstream = torch.linspace(-1, 2, x.numel()).reshape(x.shape) if upstream is None else upstream
    (function(x) * upstream).sum().backward()
    return x.grad


def test_per_tensor_activation_gradient_is_pytorchs_clipped_straight_through():
    """Inputs past the end codes come out as the end codes whatever they are: PyTorch gives them no
    gradient, the others the identity. A QuantLinear with a static scale passes that gradient on."""
    scale = 2.0 ** -6
    x = torch.cat([_halfway_values(scale, -128, 127), torch.tensor([-5.0, -2.01, 1.99, 2.5, 9.0])])
    reference = _gradients(lambda v: torch.fake_quantize_per_tensor_affine(v, scale, 0, -128, 127), x)
    assert (reference == 0).any()
    assert (reference != 0).any()

    linear = torch.nn.Linear(x.numel(), 1, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.linspace(-1, 2, x.numel()))
    model_like = torch.nn.Module()
    model_like.linear = linear
    scheme = fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="tensor", embedding_bits=None,
                                    activation_scales={"linear": scale})
    fake_quant._make_quant_linear(linear, scheme, 8, "linear")
    inputs = x.detach().clone().requires_grad_(True)
    linear(inputs).sum().backward()
    # d out / d x_j = (quantized weight)_j where the code is inside [-128, 127], 0 where it saturated
    expected = torch.where(reference != 0, linear.quantized_weight()[0], torch.zeros(()))
    torch.testing.assert_close(inputs.grad, expected, rtol=0, atol=0)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", [(5, 37), (1, 16), (11, 3)])
def test_per_channel_symmetric_weights_equal_pytorch_fake_quant(bits, shape):
    generator = torch.Generator().manual_seed(bits + shape[0])
    weight = torch.randn(shape, generator=generator)
    weight[0, -1] = 0.0
    qmax = 2 ** (bits - 1) - 1
    scales = fake_quant.grouped_scales(weight, bits, "channel", 32).reshape(-1)
    zero = torch.zeros(shape[0], dtype=torch.int32)
    reference = torch.fake_quantize_per_channel_affine(weight, scales, zero, 0, -qmax, qmax)
    assert torch.equal(fake_quant.quantize_weight(weight, bits, "channel", 32), reference)
    gradient = _gradients(lambda w: torch.fake_quantize_per_channel_affine(w, scales, zero, 0, -qmax, qmax), weight)
    ours = _gradients(lambda w: fake_quant.straight_through(
        w, *fake_quant.quantize_weight_and_range(w, bits, "channel", 32, scales.reshape(-1, 1, 1))), weight)
    assert torch.equal(ours, gradient)


def test_per_channel_weights_at_halfway_codes_round_to_even_as_pytorch_does():
    scale = 2.0 ** -4
    codes = torch.arange(-127, 128, dtype=torch.float32)
    weight = torch.stack([torch.cat([codes * scale, (codes[:-1] + 0.5) * scale]),
                          torch.cat([-codes * scale, (-codes[:-1] - 0.5) * scale])])  # row absmax = 127 * scale
    scales = fake_quant.grouped_scales(weight, 8, "channel", 32).reshape(-1)
    assert scales.tolist() == [scale, scale]
    reference = torch.fake_quantize_per_channel_affine(weight, scales, torch.zeros(2, dtype=torch.int32), 0, -127, 127)
    assert torch.equal(fake_quant.quantize_weight(weight, 8, "channel", 32), reference)


@pytest.mark.parametrize("bits", [8, 4])
def test_block_weights_are_pytorch_asymmetric_fake_quant_per_block(bits):
    """The block layout (MatMulNBits) stores unsigned codes with zero point 2^(bits-1): per block of 32, that
    is ``fake_quantize_per_channel_affine`` over [0, 2^bits - 1] with that zero point, the scale (negative ones
    included, from the 4-bit search) that of the block. The weight's last block is zero-padded."""
    generator = torch.Generator().manual_seed(bits)
    weight = torch.randn(6, 70, generator=generator)
    weight[2, 5] = 9.0  # an outlier that the 4-bit scale search clips
    grouped, _ = fake_quant._blocks(weight, 32)
    scales = fake_quant.weight_scales(grouped, bits, half=True).reshape(-1)
    flat = grouped.reshape(-1, 32)
    zero = torch.full((flat.shape[0],), 2 ** (bits - 1), dtype=torch.int32)

    def reference(values):
        return torch.fake_quantize_per_channel_affine(values, scales, zero, 0, 0, 2 ** bits - 1)

    ours, inside = fake_quant.quantize_weight_and_range(weight, bits, "block", 32)
    assert torch.equal(ours, reference(flat).reshape(6, -1)[:, :70])
    upstream = torch.linspace(-1, 2, weight.numel()).reshape(weight.shape)
    expected_gradient = _gradients(lambda w: reference(w.reshape(-1, 32)).reshape(6, -1), F.pad(weight, (0, 26)),
                                   F.pad(upstream, (0, 26)))[:, :70]
    ours_gradient = _gradients(lambda w: fake_quant.straight_through(
        w, *fake_quant.quantize_weight_and_range(w, bits, "block", 32)), weight, upstream)
    assert torch.equal(ours_gradient, expected_gradient)
    if bits == 4:
        assert not bool(inside.all())  # the search clipped something: the comparison covered a zero gradient


def test_a_four_bit_quant_linear_gives_clamped_weights_no_gradient():
    model = tiny_llama(seed=4)
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=4, activations="none", embedding_bits=None))
    linear = model.model.layers[0].mlp.down_proj
    with torch.no_grad():
        linear.weight[3, 7] = 5.0 * float(linear.weight.abs().max())
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    model(ids).logits.float().pow(2).mean().backward()
    _, inside = fake_quant.quantize_weight_and_range(linear.weight, 4, "block", 32)
    assert not bool(inside.all())
    assert bool((linear.weight.grad[~inside] == 0).all())
    assert bool((linear.weight.grad[inside] != 0).any())


# --- fake quantization vs ONNX Runtime --------------------------------------------------------------------


def _run_graph(nodes, inputs: dict[str, np.ndarray], initializers, outputs: dict[str, tuple]) -> list[np.ndarray]:
    """Run ``nodes`` in an ONNX Runtime CPU session; ``outputs``: float outputs by name, with their shapes."""
    graph = helper.make_graph(
        nodes, "reference",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape)) for name, value in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name, shape in outputs.items()],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the nodes as written
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(list(outputs), inputs)


@pytest.mark.parametrize("scale", [2.0 ** -6, 0.0123, 0.1, 1 / 3, 0.00731])
def test_per_tensor_fake_quant_equals_onnx_runtime_quantize_dequantize(scale):
    """The training's activation fake quantization and the exported QuantizeLinear -> DequantizeLinear pair
    (scalar scale, int8 zero point 0) give the same float32 numbers, halfway and saturated values included.
    The scale is recorded as a Python float and stored in the graph as float32."""
    generator = torch.Generator().manual_seed(7)
    x = torch.cat([torch.randn(20000, generator=generator) * 140 * scale,
                   _halfway_values(float(np.float32(scale)), -128, 127)]).reshape(4, -1)
    (got,) = _run_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])],
        {"x": x.numpy()}, {"scale": np.asarray(np.float32(scale)), "zero": np.asarray(np.int8(0))}, {"y": x.shape})
    np.testing.assert_array_equal(got, fake_quant.quantize_activation_tensor(x, scale).numpy())


@pytest.mark.parametrize("shape", [(5, 37), (16, 16), (3, 70)])
def test_qdq_linear_in_onnx_runtime_equals_the_fake_quantized_linear(shape):
    """A QuantLinear (per-channel INT8 weight, per-tensor INT8 input) against the nodes the QDQ export writes
    for it: QuantizeLinear / DequantizeLinear on x, DequantizeLinear(axis=1) on the exporter's (K, N) codes,
    MatMul. The dequantized weight is equal bit for bit; the product up to float32 summation order."""
    out_features, in_features = shape
    generator = torch.Generator().manual_seed(out_features)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(shape, generator=generator) * 0.2)
    scale = 0.0217
    scheme = fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="tensor",
                                    embedding_bits=None, activation_scales={"linear": scale})
    fake_quant._make_quant_linear(linear, scheme, 8, "linear")
    x = torch.randn(2, 9, in_features, generator=generator) * 1.5
    with torch.no_grad():
        expected = linear(x)
    codes, scales = quantize_channels(linear.weight.detach().numpy().T, axis=1)  # (K, N), (N,)
    weight, y = _run_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["xq"]),
         helper.make_node("DequantizeLinear", ["codes", "w_scale", "w_zero"], ["w"], axis=1),
         helper.make_node("MatMul", ["xq", "w"], ["y"])],
        {"x": x.numpy()},
        {"scale": np.asarray(np.float32(scale)), "zero": np.asarray(np.int8(0)), "codes": codes, "w_scale": scales,
         "w_zero": np.zeros(scales.shape, np.int8)}, {"w": (in_features, out_features), "y": tuple(expected.shape)})
    np.testing.assert_array_equal(weight.T, linear.quantized_weight().numpy())
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-5, atol=1e-5)


# --- SmoothQuant vs the paper's formula -----------------------------------------------------------------


def _recorded_inputs(model, names, batches):
    """max |x_j| of each named module's input, recorded with forward hooks (independent of smooth.input_peaks)."""
    peaks = {}
    modules = dict(model.named_modules())

    def hook(name):
        def record(_module, args):
            peak = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0)
            peaks[name] = torch.maximum(peaks[name], peak) if name in peaks else peak
        return record

    handles = [modules[name].register_forward_pre_hook(hook(name)) for name in names]
    with torch.no_grad():
        for batch in batches:
            model(batch)
    for handle in handles:
        handle.remove()
    return peaks


def _smooth_batches():
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, 320, (2, 24), generator=generator) for _ in range(2)]


def _expected_scales(x_peak, w_peak, alpha):
    raw = x_peak.double().clamp_min(1e-5) ** alpha / w_peak.double().clamp_min(1e-5) ** (1 - alpha)
    return raw.clamp(*smooth.SCALE_RANGE)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.85, 1.0])
@torch.no_grad()
def test_smoothing_scales_follow_the_paper_and_keep_the_function(alpha):
    """Per site: the norm (or the producing rows) divided by s, the reading columns multiplied by s, with
    s_j = max|X_j|^a / max|W_:,j|^(1-a) from the inputs seen; GQA's o input takes one scale per V row, from the
    largest activation and weight peaks of the query heads sharing it. A channel whose activations are all
    zero (a norm weight of 0, an up row of 0, a V row of 0) stays zero."""
    model = tiny_llama(seed=3, heads=6, kv_heads=2, hidden=48)
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.input_layernorm.weight[4] = 0.0
        layer.post_attention_layernorm.weight[9] = 0.0
        layer.mlp.up_proj.weight[11] = 0.0
        layer.self_attn.v_proj.weight[3] = 0.0
    batches = _smooth_batches()
    before_logits = [model(batch).logits for batch in batches]
    original = copy.deepcopy(model)
    prefix = "model.layers.0."
    readers = [prefix + name for name in smooth.READERS]
    peaks = _recorded_inputs(model, readers, batches)
    found = smooth.input_peaks(model, batches)
    for name in readers:
        torch.testing.assert_close(found[name], peaks[name], rtol=0, atol=0)
    smooth.smooth_model(model, found, smooth.SmoothConfig(alpha=alpha))
    after, was = model.model.layers[0], original.model.layers[0]

    def column_scale(new, old):  # the factor each input column was multiplied by, from its largest entry
        index = old.weight.abs().argmax(0)
        return (new.weight.gather(0, index[None]) / old.weight.gather(0, index[None]))[0].double()

    qkv = _expected_scales(peaks[prefix + "self_attn.q_proj"],
                           torch.cat([was.self_attn.q_proj.weight, was.self_attn.k_proj.weight,
                                      was.self_attn.v_proj.weight]).abs().amax(0), alpha)
    torch.testing.assert_close(column_scale(after.self_attn.k_proj, was.self_attn.k_proj), qkv, rtol=1e-5, atol=0)
    torch.testing.assert_close(after.input_layernorm.weight.double(), was.input_layernorm.weight.double() / qkv,
                               rtol=1e-6, atol=0)
    assert float(peaks[prefix + "self_attn.q_proj"][4]) == 0.0
    assert float(after.input_layernorm.weight[4]) == 0.0

    gate_up = _expected_scales(peaks[prefix + "mlp.gate_proj"],
                               torch.cat([was.mlp.gate_proj.weight, was.mlp.up_proj.weight]).abs().amax(0), alpha)
    torch.testing.assert_close(column_scale(after.mlp.gate_proj, was.mlp.gate_proj), gate_up, rtol=1e-5, atol=0)

    down = _expected_scales(peaks[prefix + "mlp.down_proj"], was.mlp.down_proj.weight.abs().amax(0), alpha)
    torch.testing.assert_close(column_scale(after.mlp.down_proj, was.mlp.down_proj), down, rtol=1e-5, atol=0)
    torch.testing.assert_close(after.mlp.up_proj.weight.double(),  # columns: gate|up's scales; rows: down's
                               was.mlp.up_proj.weight.double() * gate_up[None, :] / down[:, None], rtol=1e-5, atol=0)
    assert float(peaks[prefix + "mlp.down_proj"][11]) == 0.0
    assert bool((after.mlp.up_proj.weight[11] == 0).all())

    head_dim, group = 8, 3
    x_o = peaks[prefix + "self_attn.o_proj"].reshape(2, group, head_dim).amax(1).reshape(-1)
    w_o = was.self_attn.o_proj.weight.abs().amax(0).reshape(2, group, head_dim).amax(1).reshape(-1)
    o = _expected_scales(x_o, w_o, alpha)  # (kv_heads * head_dim,)
    torch.testing.assert_close(after.self_attn.v_proj.weight.double(),  # columns: qkv's scales; rows: o's
                               was.self_attn.v_proj.weight.double() * qkv[None, :] / o[:, None], rtol=1e-5, atol=0)
    expanded = o.reshape(2, 1, head_dim).expand(-1, group, -1).reshape(-1)
    torch.testing.assert_close(column_scale(after.self_attn.o_proj, was.self_attn.o_proj), expanded, rtol=1e-5, atol=0)
    assert float(x_o[3]) == 0.0
    assert bool((after.self_attn.v_proj.weight[3] == 0).all())

    for batch, expected in zip(batches, before_logits, strict=True):
        torch.testing.assert_close(model(batch).logits, expected, rtol=1e-4, atol=1e-4)


# --- distillation loss vs torch.nn.functional.kl_div ------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0, 0.5])
def test_logits_kl_is_hintons_teacher_to_student_kl_times_t_squared(temperature):
    """KL(p_teacher || p_student) at temperature T, times T^2 (Hinton et al. 2015 §2), averaged over positions:
    ``kl_div(log q_student, log p_teacher, log_target=True)`` summed over the vocabulary."""
    generator = torch.Generator().manual_seed(int(temperature * 4))
    student = torch.randn(3, 5, 41, generator=generator) * 3
    teacher = torch.randn(3, 5, 41, generator=generator) * 3
    expected = F.kl_div(F.log_softmax(student / temperature, -1), F.log_softmax(teacher / temperature, -1),
                        reduction="none", log_target=True).sum(-1).mean() * temperature ** 2
    torch.testing.assert_close(logits_kl(student, teacher, temperature), expected, rtol=1e-5, atol=1e-6)
    reverse = F.kl_div(F.log_softmax(teacher / temperature, -1), F.log_softmax(student / temperature, -1),
                       reduction="none", log_target=True).sum(-1).mean() * temperature ** 2
    assert abs(float(reverse - expected)) > 1e-3  # the direction is tested, not only the magnitude

    student = student.clone().requires_grad_(True)
    logits_kl(student, teacher, temperature).backward()
    # d/dz_s of T^2 KL(p_t || softmax(z_s / T)) = T (q_s - p_t) per position, divided by the positions averaged
    analytic = temperature * (F.softmax(student.detach() / temperature, -1) - F.softmax(teacher / temperature, -1))
    torch.testing.assert_close(student.grad, analytic / 15, rtol=1e-4, atol=1e-6)


def test_attention_kl_terms_are_the_seeds_student_to_teacher_kl_over_causal_rows():
    """Seed 004 §4.1 L_token = KL(Attn_s || Attn_t) per kept head, L_layer the same on head-mean maps: against
    ``kl_div(log Attn_t, Attn_s)`` summed over keys and averaged over rows. Causal rows hold exact zeros above
    the diagonal (the masked keys), which add nothing."""
    generator = torch.Generator().manual_seed(3)
    causal = torch.full((6, 6), float("-inf")).triu(1)
    student = [torch.softmax(torch.randn(2, 2, 6, 6, generator=generator) + causal, -1) for _ in range(2)]
    teacher = [torch.softmax(torch.randn(2, 4, 6, 6, generator=generator) + causal, -1) for _ in range(2)]
    kept = [[1, 3], [0, 2]]

    def reference(s, t):  # 0 * log(0 / q) = 0 on the masked keys, where kl_div's pointwise form is 0 * inf
        pointwise = F.kl_div(t.log(), s, reduction="none")
        return torch.where(s > 0, pointwise, torch.zeros(())).sum(-1).mean()

    expected = torch.stack([reference(s, t[:, k]) for s, t, k in zip(student, teacher, kept, strict=True)]).mean()
    torch.testing.assert_close(token_attention_kl(student, teacher, kept), expected, rtol=1e-5, atol=1e-6)
    expected = torch.stack([reference(s.mean(1), t.mean(1)) for s, t in zip(student, teacher, strict=True)]).mean()
    torch.testing.assert_close(layer_attention_kl(student, teacher), expected, rtol=1e-5, atol=1e-6)


# --- structured pruning vs the unpruned model ------------------------------------------------------------


@torch.no_grad()
def test_gqa_pruning_removes_each_kv_head_with_the_query_heads_that_read_it():
    """3 query heads per KV head, biases on q/k/v/o and the FFN: keeping groups [0, 2] and a subset of FFN
    channels equals the unpruned model with group 1's query heads' o columns and the dropped channels' down
    columns zeroed (a removed head adds nothing; a kept head still reads its own K and V)."""
    model = tiny_llama(seed=8, layers=2, heads=9, kv_heads=3, hidden=72,
                       config_overrides={"attention_bias": True, "mlp_bias": True})
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):
            parameter.normal_(0, 0.5)
    reference = copy.deepcopy(model)
    dim, q_per_kv = 8, 3
    layer = model.model.layers[1]
    width = layer.mlp.gate_proj.out_features
    channels = [c for c in range(width) if c % 3 != 1]
    keep_kv_groups(layer, [0, 2], q_per_kv=q_per_kv, dim=dim)
    keep_ffn_channels(layer, channels)
    assert layer.self_attn.k_proj.bias.shape == (2 * dim,)
    assert layer.self_attn.q_proj.bias.shape == (6 * dim,)
    cut = reference.model.layers[1]
    cut.self_attn.o_proj.weight[:, q_per_kv * dim: 2 * q_per_kv * dim] = 0  # query heads 3, 4, 5
    dropped = [c for c in range(width) if c not in channels]
    cut.mlp.down_proj.weight[:, dropped] = 0
    ids = torch.randint(0, model.config.vocab_size, (2, 15), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)


def test_pruning_plans_at_ratio_zero_leave_the_model_and_its_record_as_they_were():
    model = tiny_llama(seed=9, layers=3, heads=6, kv_heads=2, hidden=48)
    ids = torch.randint(0, model.config.vocab_size, (1, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(ids).logits
    records = layer_records(model)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, model.config.vocab_size, (2, 12), generator=generator) for _ in range(2)]
    ffn, groups = saliencies(model, fisher_diagonal(model, batches))
    config = PruneConfig(ffn_ratio=0.0, kv_group_ratio=0.0)
    apply_plans(model, plan_ffn(ffn, config), plan_groups(groups, config))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    assert layer_records(model) == records
