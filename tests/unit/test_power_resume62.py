"""The power stage keeps its training in flight as QAT and distillation do, at round boundaries; a training that has
finished is kept until its stage's checkpoint is recorded; which stages keep theirs is read from their settings.

In process, the rounds are stopped (Ctrl-C) as a round starts or after its rollout, and a resumed training ends on
the adapters of one run straight through, bit for bit. Real ``edgesdk build`` processes pause themselves at a given
write (tests/_utils/self_pause.py) and are killed there (SIGKILL), then resumed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import STAGES, register_stage  # noqa: E402
from edgesdk.compress.train import TrainingProgress, keeping_progress, keeps_training  # noqa: E402
from edgesdk.power import adapter, train  # noqa: E402
from edgesdk.power.profiler import CostStats  # noqa: E402
from tests._utils.self_pause import kill_child, wait_paused  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit.test_stage_resume61 import _assert_bitwise_equal, _batches, _student_and_teacher, _weights  # noqa: E402
from tests.unit.test_stage_resume61b import _train  # noqa: E402

ROUNDS = 6
CONFIG = train.PowerTrainConfig(rounds=ROUNDS, rollout=4, micro_batch=2, prompt_tokens=8, new_tokens=8,
                                checkpoint_interval_s=1e9)  # nothing kept but when stopped and once finished
POOL = torch.randint(0, 320, (300,), generator=torch.Generator().manual_seed(0))


class Stopped(Exception):
    pass


def _power():
    """A tiny model with fresh adapters and the c_t profile and scales its rounds train on."""
    torch.manual_seed(0)
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4, gate_init=0.5)
    peak, ffn = train.calibrate_scales(model, state, POOL[:64].reshape(2, 32))
    info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(16, [0.0, 0.2, 0.4], {}, 0.0125, 0.0))
    return model, state, info


def _adapters(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters() if ".power_adapter." in name}


def _rounds(log) -> list:
    return [{k: v for k, v in record.items() if k != "seconds"} for record in log.rounds]


def _run(monkeypatch, progress: TrainingProgress | None, stop_at: int | None = None, after_rollout: bool = False):
    """The rounds on a fresh model (kept in ``progress`` when given, resumed from what it holds); Ctrl-C as round
    ``stop_at`` starts, or once its rollout was sampled (``after_rollout``: the prompts' generator and the sampling's
    RNG moved on)."""
    calls = [0]
    sample, roll = train.sample_prompts, train.rollout

    def sample_prompts(*args, **kwargs):
        calls[0] += 1
        if calls[0] - 1 + resumed == stop_at and not after_rollout:
            raise KeyboardInterrupt()
        return sample(*args, **kwargs)

    def rollout(*args, **kwargs):
        out = roll(*args, **kwargs)
        if calls[0] - 1 + resumed == stop_at and after_rollout:
            raise KeyboardInterrupt()
        return out

    monkeypatch.setattr(train, "sample_prompts", sample_prompts)
    monkeypatch.setattr(train, "rollout", rollout)
    model, state, info = _power()
    if progress is None:
        resumed = 0
        return model, train.train_adapters(model, state, info, POOL, CONFIG, eos_ids=[], pad_id=0)
    identity, kept = train.read_kept(progress, CONFIG, POOL, [], 0)
    resumed = kept["batch"] if kept is not None else 0
    with keeping_progress(progress):
        return model, train.train_adapters(model, state, info, POOL, CONFIG, [], 0, False, kept, identity)


@pytest.fixture(scope="module")
def straight():
    with pytest.MonkeyPatch.context() as monkeypatch:
        model, log = _run(monkeypatch, None)
    return _adapters(model), _rounds(log)


@pytest.mark.parametrize(("stop_at", "after_rollout"), [(2, False), (3, True)])
def test_power_rounds_stopped_resume_from_the_kept_round_to_the_same_adapters(tmp_path, monkeypatch, straight,
                                                                              stop_at, after_rollout):
    expected, rounds = straight
    said: list[str] = []
    kept = tmp_path / "00-power.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _run(monkeypatch, TrainingProgress(kept, "power", "build", said.append), stop_at, after_rollout)
    assert torch.load(kept, weights_only=True)["batch"] == stop_at

    progress = TrainingProgress(kept, "power", "build", said.append)
    model, log = _run(monkeypatch, progress)
    assert f"power: going on from round {stop_at} of {ROUNDS}, the training a stopped build kept in {kept}" in said
    assert progress.resumed_from == stop_at
    _assert_bitwise_equal(_adapters(model), expected)
    assert _rounds(log) == rounds
    assert torch.load(kept, weights_only=True)["batch"] == ROUNDS  # the finished rounds, until the checkpoint


def test_power_rounds_kept_under_other_settings_are_removed_and_trained_again(tmp_path, monkeypatch, straight):
    said: list[str] = []
    kept = tmp_path / "00-power.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _run(monkeypatch, TrainingProgress(kept, "power", "other build settings", said.append), 2)
    model, _ = _run(monkeypatch, TrainingProgress(kept, "power", "build", said.append))
    assert any("is not taken (it was kept under other settings" in line and line.endswith("trains from its first round")
               for line in said), said
    _assert_bitwise_equal(_adapters(model), straight[0])


def test_finished_power_rounds_are_kept_and_a_resumed_stage_trains_none_again(tmp_path, monkeypatch, straight):
    kept = tmp_path / "00-power.training.pt"
    _run(monkeypatch, TrainingProgress(kept, "power", "build", [].append))
    said: list[str] = []
    model, log = _run(monkeypatch, TrainingProgress(kept, "power", "build", said.append), stop_at=0)  # none runs
    assert f"power: going on from round {ROUNDS} of {ROUNDS}, the training a stopped build kept in {kept}" in said
    _assert_bitwise_equal(_adapters(model), straight[0])
    assert _rounds(log) == straight[1]


def test_a_finished_training_is_kept_until_the_stage_checkpoint_and_a_resumed_stage_trains_nothing_again(tmp_path):
    """Stopped after the training, before the stage's checkpoint (its measurements, the checkpoint's write): the
    kept training is the finished one, not the last periodic keep (none here: the interval far away)."""
    student, teacher = _student_and_teacher()
    whole = _train(student, teacher, _batches(0), None)
    expected = _weights(student)
    kept = tmp_path / "00-qat.training.pt"
    _train(*_student_and_teacher(), _batches(0), TrainingProgress(kept, "qat", "build", [].append))
    assert torch.load(kept, weights_only=True)["batch"] == 42

    said: list[str] = []
    student, teacher = _student_and_teacher()
    assert _train(student, teacher, _batches(0), TrainingProgress(kept, "qat", "build", said.append),
                  stop_at=0) == whole  # a batch trained again would stop it
    assert said == [f"qat: going on from batch 42 of 42, the training a stopped build kept in {kept}"]
    _assert_bitwise_equal(_weights(student), expected)


def test_the_stages_that_keep_their_training_are_those_whose_settings_say_how_often(tmp_path):
    from dataclasses import dataclass

    assert [name for name in ("qat", "distill", "power", "smooth", "prune") if keeps_training(name)] == \
        ["qat", "distill", "power"]

    @dataclass(frozen=True)
    class NewConfig:
        checkpoint_interval_s: float = 300.0

    register_stage("new62", NewConfig)(lambda model, config, ctx: model)
    try:
        assert keeps_training("new62")
        progress = TrainingProgress(tmp_path / "01-new62.training.pt", "new62", "x", print)
        assert progress.stopped_words() == "new62 stopped before its training; --resume starts the stage over"
    finally:
        del STAGES["new62"]
    progress = TrainingProgress(tmp_path / "02-power.training.pt", "power", "x", print, unit="round", total=40,
                                kept=3)
    assert progress.stopped_words() == (f"power stopped after 3 of 40 rounds (its training so far is kept in "
                                        f"{progress.path}); --resume goes on from round 3")
    # while it profiled c_t, with no kept rounds: read_kept set the rounds before the stage measured the cost
    progress = TrainingProgress(tmp_path / "03-power.training.pt", "power", "x", print)
    assert train.read_kept(progress, CONFIG, POOL, [], 0)[1] is None
    assert progress.stopped_words() == (f"power stopped before any of its {ROUNDS} rounds of training was kept; "
                                        f"--resume starts the stage over")
    progress = TrainingProgress(tmp_path / "00-smooth.training.pt", "smooth", "x", print)
    assert progress.stopped_words() == "smooth keeps no training in flight; --resume starts the stage over"


# -- real builds, killed --------------------------------------------------------------------------------------------

POWER_RECIPE = """name: tiny-power-resume
stages:
  - stage: power
    config: {rounds: 6, rollout: 2, prompt_tokens: 8, new_tokens: 8, sweep_tokens: 8, profile_up_to: 128,
             profile_buckets: 2, checkpoint_interval_s: 0}
export: {form: ort-fused, weights: fp32}
"""

QAT_RECIPE = """name: tiny-finished-resume
stages:
  - stage: qat
    config: {granularity: channel, activations: tensor, embedding_bits: null, steps: 40, batch_size: 2,
             sequence_length: 24, observer_batches: 2, checkpoint_interval_s: 100000}
export: {form: standard, weights: int8}
"""


def _killed_at(setup, out: Path, stop_at: str, count: int = 1) -> None:
    build = setup.start(out, stop_at, count)
    wait_paused(build)
    kill_child(build)


def _tables(value) -> list:
    """Every c_t table (``table_ms``) in a bundle's manifest."""
    if isinstance(value, dict):
        return ([value["table_ms"]] if "table_ms" in value else []) + [t for v in value.values() for t in _tables(v)]
    return [t for v in value for t in _tables(v)] if isinstance(value, list) else []


@pytest.mark.slow
def test_a_build_killed_while_the_power_stage_trains_goes_on_from_the_kept_round(tmp_path):
    from tests.unit.test_build_kill37 import Setup

    setup = Setup(tmp_path / "setup", POWER_RECIPE)
    out = tmp_path / "b"
    kept = out.with_name("b.build") / "stages" / "00-power.training.pt"
    # paused as it writes the third round's file: rounds 1 and 2 kept (after every round: checkpoint_interval_s 0)
    _killed_at(setup, out, r"^open .*/stages/00-power\.training\.pt\.tmp$", 3)
    taken = torch.load(kept, weights_only=True)
    assert taken["batch"] == 2

    resumed, manifest = setup.finish(out)
    assert f"power: going on from round 2 of 6, the training a stopped build kept in {kept}" in resumed.stderr
    # the rounds left trained on the c_t profile the kept ones did, not on one timed again
    assert CostStats(**taken["info"]["cost"]).to_json()["table_ms"] in _tables(manifest)
    assert not kept.exists()


@pytest.mark.slow
def test_a_build_killed_after_qat_trained_before_its_checkpoint_goes_on_from_the_finished_training(tmp_path):
    from tests.unit.test_build_kill37 import Setup, assert_same_bundle

    setup = Setup(tmp_path / "setup", QAT_RECIPE)
    out = tmp_path / "b"
    kept = out.with_name("b.build") / "stages" / "00-qat.training.pt"
    _killed_at(setup, out, r"^os\.mkdir .*/stages/00-qat\.partial$")  # as the stage's checkpoint is written
    assert torch.load(kept, weights_only=True)["batch"] == 40

    resumed, manifest = setup.finish(out)
    assert f"qat: going on from batch 40 of 40, the training a stopped build kept in {kept}" in resumed.stderr
    assert_same_bundle(setup, out, manifest)
