"""Build pipeline, checkpoints and the power stage (review 49): what a build computes after the power stage."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import STAGES, register_stage  # noqa: E402
from tests._utils.tiny import CORPUS  # noqa: E402

TINY_POWER = {"rounds": 1, "rollout": 2, "prompt_tokens": 8, "new_tokens": 8, "sweep_tokens": 8,
              "profile_up_to": 128, "profile_buckets": 2}


@pytest.fixture
def probe_stage():
    """A stage after the power stage that records the threshold the model computes at while it runs (what QAT's or
    distillation's forward passes see) and the model's logits then."""
    from dataclasses import dataclass

    from edgesdk.power.adapter import power_state

    @dataclass(frozen=True)
    class ProbeConfig:
        pass

    seen: dict = {}

    def probe(model, config, ctx):
        if seen.pop("fail", False):  # a build that stops inside this stage: its --resume takes the power checkpoint
            raise RuntimeError("stopped inside the probe stage")
        state = power_state(model)
        seen["tau"] = None if state is None else float(state.tau)
        ids = torch.tensor([ctx.tokenizer(CORPUS[0])["input_ids"]])
        with torch.no_grad():
            seen["logits"] = model(ids).logits
            seen["teacher"] = ctx.teacher(ids).logits
        return model

    register_stage("probe49", ProbeConfig)(probe)
    try:
        yield seen
    finally:
        STAGES.pop("probe49", None)


@pytest.mark.parametrize("resumed", [False, True])
def test_stages_after_the_power_stage_work_on_the_runtimes_default_function(tiny_model_dir, tmp_path, probe_stage,
                                                                              resumed):
    """The power stage left its adapters at tau 0, where their channel and head scales act, and the stages after it
    (qat, distill: trained toward the loaded model) ran so: the backbone learned to undo the scales, while the
    runtime's default (gating off, tau ADAPTERS_OFF_TAU) computes the backbone without them. They now run with
    gating off, the loaded model's function (the probe's logits equal the teacher's), in a build that runs straight
    through and in one resumed from the power stage's checkpoint; the export's check still passes (tau 0 again
    afterwards, as the gated graph's check runs)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.export.validate import ValidationConfig
    from edgesdk.power.controller import ADAPTERS_OFF_TAU

    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    recipe = tmp_path / "power-then-probe.yaml"
    recipe.write_text("name: power-then-probe\nstages:\n"
                      f"  - stage: power\n    config: {TINY_POWER}\n"
                      "  - stage: probe49\n"
                      "export: {form: ort-fused, weights: fp32}\n", encoding="utf-8")
    config = BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "b", recipe=str(recipe),
                         data=DataConfig(files=(str(text),), generated_sequences=0), export=ExportConfig(max_context=64),
                         validation=ValidationConfig(prompts=1, decode_steps=1), progress=False)
    if resumed:
        probe_stage["fail"] = True
        with pytest.raises(RuntimeError, match="stopped inside the probe stage"):
            build(config)
        assert "tau" not in probe_stage
        config = replace(config, resume=True)
    bundle = build(config)
    assert probe_stage["tau"] == ADAPTERS_OFF_TAU
    torch.testing.assert_close(probe_stage["logits"], probe_stage["teacher"], rtol=0, atol=1e-5)
    assert [stage["stage"] for stage in bundle.manifest["stages"]] == ["power", "probe49"]

def test_a_power_stage_after_qat_measures_its_row_with_the_recorded_fake_quantization_on(tmp_path):
    """The report states every row's held-out perplexity "with the fake quantization recorded by then on" (as the
    exported graph computes), and each stage but power measured so. A power stage after QAT measured in float
    activations: its gating-off row, the QAT model itself, read another perplexity than the qat row above it. Now
    the two agree (to the float rounding of the eager attention the adapters switch the model to)."""
    import copy

    from edgesdk.build.registry import BuildContext, make_config, stage_spec
    from edgesdk.compress.data import DataConfig
    from edgesdk.compress.fake_quant import CONFIG_KEY, QuantLinear
    from edgesdk.profile import get_profile
    from tests._utils.tiny import tiny_llama, tiny_tokenizer

    torch.manual_seed(0)
    teacher = tiny_llama()
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 30), encoding="utf-8")
    ctx = BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=teacher,
                       progress=False, data_config=DataConfig(files=(str(text),), skip_chars=3000,
                                                              generated_sequences=0))
    model = copy.deepcopy(teacher)
    model = stage_spec("qat").run(model, make_config("qat", {"weight_bits": 8, "steps": 4, "batch_size": 2,
                                                             "sequence_length": 16}), ctx)
    qat_row = ctx.metrics["heldout_perplexity"]
    recorded = getattr(model.config, CONFIG_KEY)
    ctx.metrics = {}
    model = stage_spec("power").run(model, make_config("power", TINY_POWER), ctx)
    power_row = ctx.metrics["heldout"]["gating_off"]["perplexity"]
    assert ctx.metrics["heldout_perplexity"] == power_row
    assert power_row == pytest.approx(qat_row, rel=1e-5)
    # the fake quantization is off again, the scheme as QAT recorded it: the export reads the model as QAT left it
    assert not any(isinstance(module, QuantLinear) for module in model.modules())
    assert getattr(model.config, CONFIG_KEY) == recorded
