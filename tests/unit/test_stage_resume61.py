"""A stopped or killed build goes on from the training in flight, not from the start of the stage.

The training loop the QAT and distillation stages share keeps its state in the work directory at update boundaries
(every update here: ``checkpoint_interval_s`` 0); a resumed build loads it and trains the remaining batches to the same
weights as a build run straight through. Real ``edgesdk build`` processes are killed (SIGKILL) or stopped (SIGINT)
once the kept training is there; in-process runs of the loop check what is taken and what is refused.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant  # noqa: E402
from edgesdk.compress.losses import logits_kl  # noqa: E402
from edgesdk.compress.train import (  # noqa: E402
    LoopSettings,
    TrainingProgress,
    keeping_progress,
    run_training,
)
from tests._utils.self_pause import kill_child  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit.test_build_kill37 import Setup, assert_same_bundle, ran  # noqa: E402

RECIPE = """name: tiny-stage-resume
stages:
  - stage: qat
    config: {granularity: channel, activations: tensor, embedding_bits: null, steps: 120, batch_size: 2,
             sequence_length: 24, observer_batches: 2, checkpoint_interval_s: 0}
export: {form: standard, weights: int8}
"""


# -- in process: the loop itself -------------------------------------------------------------------------------------

def _student_and_teacher(bits: int = 4):
    teacher = tiny_llama(seed=0).eval()
    student = tiny_llama(seed=0).eval()
    fake_quant.attach(student, fake_quant.QuantScheme(weight_bits=bits, granularity="block", block_size=16,
                                                      activations="block", embedding_bits=None))
    for name, p in student.named_parameters():
        p.requires_grad_("embed_tokens" not in name)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return student, teacher


def _batches(seed: int, count: int = 42) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 320, (2, 12), generator=generator) for _ in range(count)]


class StopAt(Exception):
    pass


def _train(student, teacher, batches, progress: TrainingProgress | None, stop_at: int | None = None,
           interrupt=KeyboardInterrupt):
    """run_training with a KL loss to ``teacher``; ``interrupt`` raised as batch ``stop_at`` starts."""
    def loss_fn(batch, _):
        if stop_at is not None and index_of[id(batch)] == stop_at:
            raise interrupt()
        with torch.no_grad():
            target = teacher(batch).logits
        return logits_kl(student(batch).logits, target, 1.0), {}

    index_of = {id(batch): index for index, batch in enumerate(batches)}
    # 42 batches of 4 per update: 11 updates, past fake_quant.SCALE_REFRESH (the 4-bit scales searched again)
    settings = LoopSettings(lr=1e-2, grad_accumulation=4, checkpoint_interval_s=0)
    if progress is None:
        return run_training(student, loss_fn, batches, settings, desc="qat", progress=False)
    with keeping_progress(progress):
        return run_training(student, loss_fn, batches, settings, desc="qat", progress=False)


def _weights(model) -> dict:
    return {name: value.clone() for name, value in model.state_dict().items()}


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def _progress(path: Path, said: list, identity: str = "build") -> TrainingProgress:
    return TrainingProgress(path, "qat", identity, said.append)


@pytest.mark.parametrize("stop_at", [9, 24])  # mid-update (batch 9 of the update 8-11), and at a boundary
def test_a_stopped_training_resumed_ends_bitwise_where_an_uninterrupted_one_does(tmp_path, stop_at):
    student, teacher = _student_and_teacher()
    whole = _train(student, teacher, _batches(0), None)
    expected = _weights(student)

    said: list[str] = []
    student, teacher = _student_and_teacher()
    kept = tmp_path / "00-qat.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(student, teacher, _batches(0), _progress(kept, said), stop_at=stop_at)
    boundary = stop_at - stop_at % 4
    assert torch.load(kept, weights_only=True)["batch"] == boundary

    student, teacher = _student_and_teacher()  # a new process: the stage's set-up again, then the kept training
    progress = _progress(kept, said)
    resumed = _train(student, teacher, _batches(0), progress)
    assert f"qat: going on from batch {boundary} of 42, the training a stopped build kept in {kept}" in said
    assert progress.resumed_from == boundary
    _assert_bitwise_equal(_weights(student), expected)
    assert resumed == whole  # the loss history went on too


def test_kept_training_of_another_batch_list_or_settings_is_removed_not_loaded(tmp_path):
    said: list[str] = []
    kept = tmp_path / "00-qat.training.pt"
    student, teacher = _student_and_teacher()
    with pytest.raises(KeyboardInterrupt):
        _train(student, teacher, _batches(0), _progress(kept, said), stop_at=20)
    assert kept.is_file()

    for identity, batches in (("build", _batches(1)), ("other build settings", _batches(0))):
        student, teacher = _student_and_teacher()
        _train(student, teacher, batches, None)
        expected = _weights(student)
        student, teacher = _student_and_teacher()
        said.clear()
        progress = _progress(kept, said, identity)
        with pytest.raises(KeyboardInterrupt):  # what it keeps is its own: stopped again, for the next round
            _train(student, teacher, batches, progress, stop_at=41)
        assert any("is not taken (it was kept under other settings, another batch list or other trained "
                   "parameters); it is removed, and the stage trains from its first batch" in line for line in said)
        assert progress.kept == 40
        assert progress.resumed_from == 0
        student, teacher = _student_and_teacher()
        _train(student, teacher, batches, _progress(kept, [], identity))
        _assert_bitwise_equal(_weights(student), expected)
        with pytest.raises(KeyboardInterrupt):  # kept again under the first identity and batches, for the loop
            _train(*_student_and_teacher(), _batches(0), _progress(kept, [], "build"), stop_at=20)


def test_a_damaged_kept_training_is_removed_and_the_stage_trains_from_the_start(tmp_path):
    said: list[str] = []
    kept = tmp_path / "00-qat.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), _progress(kept, said), stop_at=20)
    kept.write_bytes(kept.read_bytes()[: kept.stat().st_size // 2])
    student, teacher = _student_and_teacher()
    _train(student, teacher, _batches(0), _progress(kept, said))
    # refused by its recorded sha256, before it is unpickled
    assert any(f"the training a stopped build kept in {kept} is not taken (it changed since it was written" in line
               for line in said), said
    expected_student, teacher = _student_and_teacher()
    _train(expected_student, teacher, _batches(0), None)
    _assert_bitwise_equal(_weights(student), _weights(expected_student))


def test_a_disk_without_room_for_the_kept_training_warns_once_and_the_training_goes_on(tmp_path):
    from tests._utils.small_disk import small_disk

    student, teacher = _student_and_teacher()
    _train(student, teacher, _batches(0), None)
    expected = _weights(student)
    with small_disk(tmp_path / "small", "64k") as disk:
        said: list[str] = []
        student, teacher = _student_and_teacher()
        progress = _progress(disk / "stages" / "00-qat.training.pt", said)
        _train(student, teacher, _batches(0), progress)
        warnings = [line for line in said if line.startswith("warning: qat: cannot keep the training in flight")]
        assert len(warnings) == 1, said  # eleven updates, each one refused
        assert "No space left on device" in warnings[0], warnings[0]
        assert "the training goes on" in warnings[0]
        assert progress.kept is None
        assert [p.name for p in (disk / "stages").iterdir()] == []  # no half file takes the space
    _assert_bitwise_equal(_weights(student), expected)


def test_stopped_words_say_where_the_stage_stopped_and_where_resume_goes_on(tmp_path):
    progress = TrainingProgress(tmp_path / "01-qat.training.pt", "qat", "x", print, "cli", total=448, kept=60)
    assert progress.stopped_words() == (f"qat stopped after 60 of 448 batches (its training so far is kept in "
                                        f"{progress.path}); --resume goes on from batch 60")
    progress = TrainingProgress(tmp_path / "01-qat.training.pt", "qat", "x", print, "python", total=448)
    assert progress.stopped_words() == ("qat stopped before any of its 448 batches of training was kept; "
                                        "resume=True starts the stage over")
    progress = TrainingProgress(tmp_path / "00-smooth.training.pt", "smooth", "x", print)
    assert progress.stopped_words() == "smooth keeps no training in flight; --resume starts the stage over"


# -- real builds, killed and stopped ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return Setup(tmp_path_factory.mktemp("stage_resume"), RECIPE)


def _start_until_kept(setup: Setup, out: Path, least: int):
    """Start the build and wait until its kept QAT training holds ``least`` batches or more."""
    build = setup.start(out)
    kept = out.with_name(out.name + ".build") / "stages" / "00-qat.training.pt"
    deadline = time.monotonic() + 300
    while build.poll() is None and time.monotonic() < deadline:
        if kept.is_file():
            try:
                if torch.load(kept, weights_only=True)["batch"] >= least:
                    break
            except Exception:  # replaced while read
                pass
        time.sleep(0.01)
    assert build.poll() is None, "the build ended before its training was kept"
    return build, kept


@pytest.mark.slow
def test_a_build_killed_while_qat_trains_resumes_from_the_kept_batch_to_the_same_bundle(setup, tmp_path):
    out = tmp_path / "b"
    build, kept = _start_until_kept(setup, out, 40)
    kill_child(build)
    batch = torch.load(kept, weights_only=True)["batch"]
    assert 40 <= batch < 120

    resumed, manifest = setup.finish(out)
    assert f"qat: going on from batch {batch} of 120, the training a stopped build kept in {kept}" in resumed.stderr
    assert ran(resumed.stderr, ("qat",)) == ["qat"]
    assert_same_bundle(setup, out, manifest)  # the weights' sha256 among the files: bitwise the same


@pytest.mark.slow
def test_ctrl_c_while_qat_trains_says_where_it_stopped_and_resume_goes_on_from_there(setup, tmp_path):
    out = tmp_path / "b"
    build, kept = _start_until_kept(setup, out, 20)
    os.kill(build.pid, signal.SIGINT)
    assert build.wait(timeout=120) == 130
    build.log.seek(0)
    log = build.log.read()
    build.log.close()
    batch = torch.load(kept, weights_only=True)["batch"]
    assert batch % 4 == 0
    assert 20 <= batch < 120
    assert (f"edgesdk build: qat stopped after {batch} of 120 batches (its training so far is kept in {kept}); "
            f"--resume goes on from batch {batch}\n") in log, log
    assert "Traceback" not in log

    resumed, manifest = setup.finish(out)
    assert f"qat: going on from batch {batch} of 120" in resumed.stderr
    assert_same_bundle(setup, out, manifest)
    assert not kept.exists()
