"""The positions each stage puts through the model, refused before any stage runs where they reach past the model's
max_position_embeddings (build/pipeline.py check_stage_sizes), and the distill stage's hooks and fake quantization
taken off a model whose training failed. Each test named for a defect fails on the code before its fix."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.pipeline import check_stage_sizes  # noqa: E402
from edgesdk.build.registry import BuildContext, make_config, stage_spec  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.compress.fake_quant import QuantEmbedding, QuantLinear  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.profile import get_profile  # noqa: E402
from tests._utils.tiny import CORPUS, save_tiny_model_dir, tiny_llama, tiny_tokenizer  # noqa: E402

POWER = {"prompt_tokens": 8, "new_tokens": 8, "sweep_tokens": 8, "bucket_size": 4, "profile_up_to": 16,
         "profile_buckets": 2}

# stage, its settings, what the refusal says, the fix in --set terms, the same in build_bundle()'s
PAST = [
    ("smooth", {"sequence_length": 48}, "smooth.sequence_length is 48",
     "--set smooth.sequence_length=16 or less", "overrides=['smooth.sequence_length=16'] or less"),
    ("sparsify", {"sequence_length": 48}, "sparsify.sequence_length is 48",
     "--set sparsify.sequence_length=16 or less", "overrides=['sparsify.sequence_length=16'] or less"),
    ("qat", {"sequence_length": 48}, "qat.sequence_length is 48",
     "--set qat.sequence_length=16 or less", "overrides=['qat.sequence_length=16'] or less"),
    ("prune", {"sequence_length": 48}, "prune.sequence_length is 48",
     "--set prune.sequence_length=16 or less", "overrides=['prune.sequence_length=16'] or less"),
    ("power", {**POWER, "new_tokens": 40}, "power.prompt_tokens 8 + power.new_tokens 40 make 48 positions",
     "--set power.new_tokens=8 or less", "overrides=['power.new_tokens=8'] or less"),
    ("power", {**POWER, "prompt_tokens": 40}, "power.prompt_tokens 40 + power.new_tokens 8 make 48 positions",
     "--set power.prompt_tokens=8 or less", "overrides=['power.prompt_tokens=8'] or less"),
    ("power", {**POWER, "prompt_tokens": 12, "new_tokens": 36},
     "power.prompt_tokens 12 + power.new_tokens 36 make 48 positions",  # new_tokens alone cannot go below a window
     "--set power.prompt_tokens=8 --set power.new_tokens=8 or less",
     "overrides=['power.prompt_tokens=8', 'power.new_tokens=8'] or less"),
    ("power", {**POWER, "sweep_tokens": 48}, "power.sweep_tokens is 48",
     "--set power.sweep_tokens=16 or less", "overrides=['power.sweep_tokens=16'] or less"),
]


@pytest.mark.parametrize(("stage", "values", "said", "cli_fix", "python_fix"), PAST,
                         ids=[f"{stage}-{said.split()[0]}" for stage, _, said, _, _ in PAST])
def test_a_stage_reading_past_the_models_positions_is_refused_before_any_stage(stage, values, said, cli_fix,
                                                                               python_fix):
    """Each stage's blocks of 48 tokens on a model of 16 positions were taken: a Llama's rotary table extends
    without a word, so smooth calibrated, sparsify and prune scored, qat trained and the power stage generated
    where the model was never trained, on positions the bundle never runs."""
    model, profile = tiny_llama(max_positions=16), get_profile("host")
    with pytest.raises(BuildError) as refused:
        check_stage_sizes([(stage, make_config(stage, values))], model, profile)
    assert said in refused.value.problem
    assert "more than the model's max_position_embeddings 16" in refused.value.problem
    assert cli_fix in refused.value.fix
    with pytest.raises(BuildError) as refused:
        check_stage_sizes([(stage, make_config(stage, values, "python"))], model, profile, "python")
    assert python_fix in refused.value.fix
    assert "--set" not in refused.value.fix


@pytest.mark.parametrize(("stage", "values"), [
    ("smooth", {"sequence_length": 16}), ("sparsify", {"sequence_length": 16}), ("qat", {"sequence_length": 16}),
    ("prune", {"sequence_length": 16}), ("power", POWER),
    # reads no text: no steps, no observers, no 8-bit choice; prunes nothing; trains no round
    ("qat", {"sequence_length": 48, "steps": 0, "activations": "block"}),
    ("prune", {"sequence_length": 48, "ffn_ratio": 0.0}),
    ("power", {**POWER, "rounds": 0, "new_tokens": 40}),
])
def test_what_reaches_the_models_positions_or_nothing_is_taken(stage, values):
    check_stage_sizes([(stage, make_config(stage, values))], tiny_llama(max_positions=16), get_profile("host"))


def test_a_model_too_short_for_the_power_stage_is_told_to_build_without_it():
    with pytest.raises(BuildError) as refused:
        check_stage_sizes([("power", make_config("power", {**POWER, "prompt_tokens": 2}))], tiny_llama(max_positions=8),
                          get_profile("host"))
    assert "power.prompt_tokens 2 + power.new_tokens 8 make 10 positions" in refused.value.problem
    assert "max_position_embeddings 8" in refused.value.problem
    assert "a recipe without the power stage" in refused.value.fix


@pytest.mark.parametrize(("stage", "config", "setting"), [
    ("smooth", "{calibration_batches: 1, batch_size: 1}", "smooth.sequence_length=48"),
    ("power", "{rounds: 1, rollout: 2, prompt_tokens: 8, new_tokens: 8, sweep_tokens: 8, bucket_size: 4, "
              "profile_up_to: 16, profile_buckets: 2}", "power.new_tokens=40"),
], ids=["smooth", "power"])
def test_the_cli_refuses_a_stage_set_past_the_positions_before_it_runs(tmp_path, stage, config, setting):
    """``edgesdk build --set STAGE.FIELD=48`` on a model of 16 positions built the bundle."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    model = save_tiny_model_dir(tmp_path / "model", max_positions=16)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: tiny-{stage}\nstages:\n  - stage: {stage}\n    config: {config}\n"
                      "export: {form: ort-fused, weights: fp32}\n")
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    out = tmp_path / "b"
    result = CliRunner().invoke(main, ["build", "-t", "host", "-m", str(model), "-o", str(out), "--recipe", str(recipe),
                                       "--data", str(text), "--generated-sequences", "0", "--no-progress",
                                       "--max-context", "16", "--set", setting])
    assert result.exit_code != 0, result.output
    assert "max_position_embeddings 16" in result.stderr
    assert f"[2/4] {stage}" not in result.stderr  # refused before the stage started
    assert not out.exists()
    assert not (tmp_path / "b.build").exists()


def _context(tmp_path, teacher, profile: str = "host", eval_text: bool = True) -> BuildContext:
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    data = DataConfig(files=(str(text),), generated_sequences=0, skip_chars=2000 if eval_text else 0)
    return BuildContext(profile=get_profile(profile), work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=teacher,
                        progress=False, data_config=data)


def test_the_power_stage_puts_no_block_past_a_short_models_positions_through_it(tmp_path):
    """The component scales were calibrated on rows of 128 tokens whatever the model's positions."""
    teacher = tiny_llama(max_positions=16)
    model = copy.deepcopy(teacher)
    config = make_config("power", {**POWER, "rounds": 1, "rollout": 2})
    check_stage_sizes([("power", config)], model, get_profile("host"))
    longest = []

    def record(_, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        longest.append((ids if ids is not None else embeds).shape[1])

    model.register_forward_pre_hook(record, with_kwargs=True)
    stage_spec("power").run(model, config, _context(tmp_path, teacher, eval_text=False))
    assert longest
    assert max(longest) <= 16


def test_a_failed_distillation_leaves_no_hooks_or_fake_quantization_on_the_model(tmp_path):
    """A training step that raised left the stage's gradient hooks (the sparsity masks held at zero), its fake
    quantization and its trainable parameters on the model."""
    teacher = tiny_llama(seed=1)
    ctx = _context(tmp_path, teacher, "orin-nx")
    model = copy.deepcopy(teacher)
    model = stage_spec("qat").run(model, make_config("qat", {"weight_bits": 8, "steps": 0, "activations": "block"}),
                                  ctx)
    model = stage_spec("sparsify").run(model, make_config("sparsify", {"density": 0.5, "calibration_batches": 1,
                                                                       "batch_size": 1, "sequence_length": 16}), ctx)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    implementation = model.config._attn_implementation
    # a teacher of another vocabulary: the logits KL of the first training step raises
    ctx.teacher = tiny_llama(seed=1, vocab_size=384)
    config = make_config("distill", {"steps": 2, "batch_size": 1, "sequence_length": 16, "grad_accumulation": 1})
    with pytest.raises(RuntimeError):
        stage_spec("distill").run(model, config, ctx)
    assert not [name for name, module in model.named_modules() if isinstance(module, (QuantLinear, QuantEmbedding))]
    assert not [name for name, p in model.named_parameters() if p._backward_hooks]
    assert not [name for name, p in model.named_parameters() if p.requires_grad]
    assert not model._forward_hooks
    assert not model._forward_pre_hooks
    assert model.config._attn_implementation == implementation
    for name, p in model.named_parameters():  # nothing trained, and the weights not rounded again
        assert torch.equal(p, before[name]), name
    # the same model distils afterwards with its own teacher, its dropped blocks still zero
    ctx.teacher = teacher
    stage_spec("distill").run(model, config, ctx)
    assert ctx.metrics["training"]["tokens"] == 2 * 16
