"""Review 58, quantization-aware training and its measurements: the per-stage perplexity of a build with a
float32 export is that of the float graph, and the mixed-precision budget takes a unit whose share of the
weights is exactly the fraction asked for."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant  # noqa: E402
from edgesdk.compress.measure import heldout_perplexity, measured_as_exported, stage_metrics  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _w8a8_model(ids: torch.Tensor):
    """A tiny model as the qat stage of the QDQ recipes leaves it (steps 0): weights baked per channel, observed
    per-tensor input scales recorded (made coarse, so that quantizing the activations clearly shows)."""
    model = tiny_llama(seed=3)
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="tensor",
                                                    embedding_bits=None))
    fake_quant.set_observing(model, True)
    with torch.no_grad():
        model(ids[None, :256])
    fake_quant.set_observing(model, False)
    recorded = fake_quant.detach(model, bake=True)
    coarse = {name: 8 * scale for name, scale in recorded.activation_scales.items()}
    setattr(model.config, fake_quant.CONFIG_KEY, {**recorded.to_json(), "activation_scales": coarse})
    return model


def test_stage_perplexity_for_a_float32_export_is_the_float_graphs():
    ids = torch.randint(0, 320, (512,), generator=torch.Generator().manual_seed(0))
    model = _w8a8_model(ids)
    float_graph = heldout_perplexity(model, ids)  # the fp32 graph: the baked weights, float activations
    reference = tiny_llama(seed=3)
    reference.load_state_dict(model.state_dict())
    setattr(reference.config, fake_quant.CONFIG_KEY, getattr(model.config, fake_quant.CONFIG_KEY))
    fake_quant.reattach(reference)
    qdq_graph = heldout_perplexity(reference, ids)  # the int8 QDQ graph: the activations on the static scales
    assert qdq_graph != pytest.approx(float_graph, rel=1e-5)

    with measured_as_exported(ExportConfig(weights="fp32")):
        assert stage_metrics(model, ids)["heldout_perplexity"] == pytest.approx(float_graph, rel=1e-6, abs=1e-4)
    with measured_as_exported(ExportConfig(weights="int8")):  # the QDQ graph's figure is unchanged
        assert stage_metrics(model, ids)["heldout_perplexity"] == pytest.approx(qdq_graph, rel=1e-6, abs=1e-4)


def test_a_fraction_exactly_a_units_share_keeps_that_unit_at_8_bits():
    from edgesdk.compress.mixed_precision import choose_units, unit_sizes

    model = tiny_llama(hidden=32, heads=4, kv_heads=1, intermediate=390, layers=1)
    sizes = unit_sizes(model)
    assert sizes["layers.0.attn.qkv"] == 1536  # QKV is 0.0384 of the weights
    assert sum(sizes.values()) == 40_000
    gains = {unit: 10.0 if unit == "layers.0.attn.qkv" else 1.0 for unit in sizes}  # QKV the most per weight
    # 0.0384 x 40000 is 1535.9999999999998 in floats: QKV was left out and the O projection taken instead
    assert choose_units(model, gains, 0.0384) == ["layers.0.attn.qkv"]


def test_the_recorded_rounding_gains_keep_their_significant_digits(tmp_path):
    import copy

    from edgesdk.build.registry import BuildContext
    from edgesdk.compress.data import TokenData
    from edgesdk.compress.mixed_precision import eight_bit_linears
    from edgesdk.compress.qat import QATConfig, qat_stage

    model = tiny_llama(seed=1)
    original = copy.deepcopy(model)
    data = TokenData(torch.randint(0, 320, (2000,), generator=torch.Generator().manual_seed(0)), 0)
    ctx = BuildContext(profile=None, work_dir=tmp_path, teacher=copy.deepcopy(model), progress=False)
    ctx._data = data
    config = QATConfig(weight_bits=4, steps=0, eight_bit_fraction=0.3, fisher_batches=1, batch_size=1,
                       sequence_length=16)
    qat_stage(model, config, ctx)
    calibration = data.batches(config.fisher_batches, config.batch_size, config.sequence_length, config.seed + 2,
                               "qat")  # the batches the stage ranked the units on
    _, units, gains = eight_bit_linears(original, calibration, config.eight_bit_fraction, config.block_size)
    assert ctx.metrics["eight_bit_units"] == units
    assert max(gains.values()) < 1e-3  # a tiny model's gains, as a real model's (1e-7 to 1e-3 nats)
    # rounded to six decimal places they were 0.0 to 4e-06 (the echoing tiny model's): the report showed no
    # ranking. The smallest here (~2.5e-6) still lose their significant digits that way:
    assert {name: round(gain, 6) for name, gain in gains.items()} != pytest.approx(gains, rel=1e-5)
    assert ctx.metrics["int4_rounding_gain"] == pytest.approx(gains, rel=1e-5)


@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_the_power_stage_measures_its_row_as_the_qat_row_for_the_export(weights):
    """The power stage measures its rows inside fake_quantization_on, as stage_metrics measures the qat row before
    it. For a float32 export the qat row is the float graph's; the power row switched the recorded W8A8 fake
    quantization on whatever the export, so its gating-off row (the QAT model itself) read the QDQ graph's figure."""
    from edgesdk.power.stage import fake_quantization_on

    ids = torch.randint(0, 320, (512,), generator=torch.Generator().manual_seed(0))
    model = _w8a8_model(ids)
    recorded = getattr(model.config, fake_quant.CONFIG_KEY)
    with measured_as_exported(ExportConfig(weights=weights)):
        qat_row = stage_metrics(model, ids)["heldout_perplexity"]
        with fake_quantization_on(model):
            power_row = heldout_perplexity(model, ids)
    assert power_row == pytest.approx(qat_row, rel=1e-6, abs=1e-4)
    assert not any(isinstance(module, fake_quant.QuantLinear) for module in model.modules())
    assert getattr(model.config, fake_quant.CONFIG_KEY) == recorded
