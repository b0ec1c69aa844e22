"""The power stage's settings, its profiler and training log, and the build's checkpoint, report and recipe
files, on tiny models: values a recipe or --set accepts that broke later, and records that did not match."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.recipes import load_recipe  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402


def _refused(*overrides: str) -> BuildError:
    with pytest.raises(BuildError) as info:
        load_recipe("power").with_overrides(list(overrides)).validated()
    return info.value


@pytest.mark.parametrize("tokens", [0, -3, 7])
def test_a_sweep_shorter_than_one_entropy_window_is_refused_before_the_build(tokens):
    """sweep_tokens 0 (or below) decoded no token, so every point's executed fraction was None and choosing
    among them was a TypeError after the whole training; under 8 the controller never steered."""
    error = _refused(f"power.sweep_tokens={tokens}")
    assert f"sweep_tokens={tokens}" in str(error)
    assert "set power.sweep_tokens to 8 or more" in str(error)


@pytest.mark.parametrize(("override", "message"), [
    ("power.lr=-0.001", "lr must be a positive finite number (the adapters' learning rate), got -0.001"),
    ("power.lr=0", "lr must be a positive finite number"),
    ("power.weight_budget=-10", "weight_budget=-10.0: loss weights must be >= 0"),
    ("power.weight_power_kl=-0.1", "weight_power_kl=-0.1: loss weights must be >= 0"),
    ("power.entropy_end=-0.08", "entropy_end=-0.08: loss weights must be >= 0"),
    ("power.low_power_scale=-0.3", "low_power_scale must be in [0, 1]"),
    ("power.low_power_scale=3", "low_power_scale must be in [0, 1]"),
])
def test_a_learning_rate_or_loss_weight_that_trains_backwards_is_refused_before_the_build(override, message):
    """A negative lr was AdamW's ValueError (a traceback) after the c_t profile; 0 trained nothing; a negative
    loss weight ascended its term: the gates trained away from the entropy target or over the budget."""
    assert message in str(_refused(override))


@pytest.mark.parametrize(("overrides", "message"), [
    (("power.profile_buckets=1",), "profile_buckets=1: the c_t profiler fits a line"),
    (("power.bucket_size=512", "power.profile_up_to=128"),
     "profile_up_to=128 with bucket_size=512: the c_t profiler times one cache length per bucket"),
    (("power.profile_up_to=100",), "raise power.profile_up_to to 128 or more, or lower power.bucket_size to 50"),
])
def test_a_c_t_profile_of_fewer_than_two_cache_lengths_is_refused_before_the_build(overrides, message):
    """One timed cache length gives the cost line no slope, so c_t was 0 at every position (as profile_buckets 0,
    which was refused, made it); a bucket wider than profile_up_to timed a cache longer than the profiling graph
    and failed in the stage with the runtime's fix (--max-context)."""
    assert message in str(_refused(*overrides))


def _power_context(tmp_path, teacher, generated: int = 0):
    from edgesdk.build.registry import BuildContext
    from edgesdk.compress.data import DataConfig
    from edgesdk.profile import get_profile
    from tests._utils.tiny import CORPUS, tiny_tokenizer

    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    return BuildContext(profile=get_profile("rpi5"), work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=teacher,
                        progress=False, data_config=DataConfig(files=(str(text),), generated_sequences=generated))


TINY = {"rounds": 0, "rollout": 2, "prompt_tokens": 8, "new_tokens": 8, "sweep_tokens": 8}


def test_a_model_context_too_short_for_two_c_t_buckets_is_a_named_build_error(tmp_path):
    """A model of 100 positions and buckets of 64 left one cache length to time: the stage trained on c_t 0."""
    import copy

    from edgesdk.build.registry import make_config, stage_spec
    from tests._utils.tiny import tiny_llama

    teacher = tiny_llama(max_positions=100)
    with pytest.raises(BuildError) as info:
        stage_spec("power").run(copy.deepcopy(teacher), make_config("power", TINY), _power_context(tmp_path, teacher))
    assert "the model's context of 100 positions holds fewer than two c_t buckets of power.bucket_size=64" \
        in str(info.value)
    assert info.value.fix == "lower power.bucket_size to 46 or less"


@pytest.mark.parametrize("layers", [(2,), (-3,), (-1, 5)])
def test_a_peak_layer_the_model_lacks_is_refused_not_wrapped_onto_another(layers):
    """Layer numbers were taken modulo the layer count: 2 of a 2-layer model made the first layer's attention
    peak a_t, with nothing said."""
    from edgesdk.power import adapter
    from tests._utils.tiny import tiny_llama

    with pytest.raises(BuildError) as info:
        adapter.install_adapters(tiny_llama(layers=2), 4, peak_layers=layers)
    assert "but the model has 2 decoder layers (0 to 1, or -1 to -2 counted from the last)" in str(info.value)
    assert "--set 'power.peak_layers=[-1]'" in info.value.fix
    assert adapter.install_adapters(tiny_llama(layers=2), 4, peak_layers=(-1, 0)).peak_layers == (0, 1)


def test_the_training_log_averages_entropy_over_the_windows_measured_not_over_micro_batches():
    """A micro-batch whose rollouts ended before a whole window counted an entropy of 0 into the round's figure
    (the manifest's train rounds), halving it here; a round without any window logged 0, not 'not measured'."""
    import math

    from edgesdk.power import adapter, train
    from edgesdk.power.profiler import CostStats
    from tests._utils.tiny import tiny_llama

    def run(eos: list[int], rollout: int = 2):
        model = tiny_llama(layers=2)
        state = adapter.install_adapters(model, 4)
        peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 16),
                                                                        generator=torch.Generator().manual_seed(1)))
        info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(16, [0.0, 0.2], {}, 0.0125, 0.0))
        config = train.PowerTrainConfig(rounds=1, rollout=rollout, micro_batch=1, prompt_tokens=8, new_tokens=8)
        pool = torch.randint(0, 320, (200,), generator=torch.Generator().manual_seed(32))
        torch.manual_seed(0)  # the rollout train_adapters samples (seeded by config.seed): see which rows end early
        prompts = train.sample_prompts(pool, rollout, 8, torch.Generator().manual_seed(0))
        _, loss_mask = train.rollout(model, state, prompts, config, eos, 0)
        log = train.train_adapters(model, state, info, pool, config, eos_ids=eos, pad_id=0)
        return loss_mask[:, 8:].sum(-1).tolist(), log.rounds[0]

    # 258 ends the first rollout after 4 tokens (it samples 257 267 105 258 ...); the second runs its 8 (116 195
    # 237 74 265 69 224 162, no 258).
    lengths, record = run([258])
    assert lengths == [4.0, 8.0]
    assert record["entropy"] > math.log(8) / 2  # one micro-batch's window; halved it could not exceed ln 8 / 2
    assert record["power_kl"] is not None  # 0 here: fresh adapters leave P_proxy = P_student
    # one rollout (257 162 ...), ended by 162 after 2 tokens, before a whole window: no window
    lengths, record = run([162], rollout=1)
    assert lengths[0] < 8
    assert record["entropy"] is None
    assert record["power_kl"] is None


def test_too_little_text_for_a_prompt_names_an_option_that_exists():
    """The fix named power.data_files, which the power stage does not have (the text is the build's --data)."""
    from edgesdk.power import train

    with pytest.raises(BuildError) as info:
        train.sample_prompts(torch.arange(10), 2, 32, torch.Generator().manual_seed(0))
    assert "has 10 tokens, fewer than one prompt of 32" in str(info.value)
    assert info.value.fix == "pass more --data text or lower power.prompt_tokens"
