"""The training in flight kept between two save points, its checksum, the words of a stage that keeps none, the RNG
states of more GPUs than a resumed build sees, and the stop signals held over an optimizer step.

The loop keeps its state every ``checkpoint_interval_s`` seconds and when stopped; stopped between two save points
(the interval far away, as the default's 300 s usually is), what it keeps is the last update boundary's, all of it:
the fake-quantization state too, which the forward passes since moved on.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import train  # noqa: E402
from edgesdk.compress.losses import logits_kl  # noqa: E402
from edgesdk.compress.train import LoopSettings, TrainingProgress, keeping_progress, run_training  # noqa: E402
from tests.unit.test_stage_resume61 import (  # noqa: E402
    _assert_bitwise_equal,
    _batches,
    _progress,
    _student_and_teacher,
    _weights,
)


def _train(student, teacher, batches, progress: TrainingProgress | None, stop_at: int | None = None,
           after_forward: bool = False, interval: float = 1e9):
    """run_training with a KL loss to ``teacher``; Ctrl-C as batch ``stop_at`` starts, or once the student's forward
    pass of it ran (``after_forward``: where a Ctrl-C usually lands). By default nothing is kept but when stopped."""
    def loss_fn(batch, _):
        stop = stop_at is not None and index_of[id(batch)] == stop_at
        if stop and not after_forward:
            raise KeyboardInterrupt()
        with torch.no_grad():
            target = teacher(batch).logits
        out = student(batch).logits
        if stop:
            raise KeyboardInterrupt()
        return logits_kl(out, target, 1.0), {}

    index_of = {id(batch): index for index, batch in enumerate(batches)}
    settings = LoopSettings(lr=1e-2, grad_accumulation=4, checkpoint_interval_s=interval)
    if progress is None:
        return run_training(student, loss_fn, batches, settings, desc="qat", progress=False)
    with keeping_progress(progress):
        return run_training(student, loss_fn, batches, settings, desc="qat", progress=False)


@pytest.fixture(scope="module")
def uninterrupted():
    student, teacher = _student_and_teacher()
    whole = _train(student, teacher, _batches(0), None)
    return whole, _weights(student)


# 9: one forward pass past the boundary 8; 29: past 28, the update at which the 4-bit scales are searched again
# (fake_quant.SCALE_REFRESH 8), one update early when the scales' age was taken from the stop, not the boundary
@pytest.mark.parametrize(("stop_at", "after_forward"), [(9, False), (9, True), (29, True), (30, False)])
def test_a_training_stopped_between_save_points_resumes_bitwise_to_the_same_weights(tmp_path, uninterrupted, stop_at,
                                                                                    after_forward):
    whole, expected = uninterrupted
    said: list[str] = []
    kept = tmp_path / "00-qat.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), _progress(kept, said), stop_at=stop_at,
               after_forward=after_forward)
    boundary = stop_at - stop_at % 4
    assert torch.load(kept, weights_only=True)["batch"] == boundary

    student, teacher = _student_and_teacher()
    resumed = _train(student, teacher, _batches(0), _progress(kept, said))
    assert f"qat: going on from batch {boundary} of 42, the training a stopped build kept in {kept}" in said
    _assert_bitwise_equal(_weights(student), expected)
    assert resumed == whole


def _flip_a_byte_of_a_weight(kept) -> None:
    data = bytearray(kept.read_bytes())
    weight = next(value for name, value in torch.load(kept, weights_only=True)["params"].items()
                  if name.endswith("q_proj.weight"))
    at = data.find(weight.numpy().tobytes())
    assert at > 0
    data[at + 10] ^= 0x40
    kept.write_bytes(bytes(data))


def test_a_kept_training_changed_since_it_was_written_is_removed_and_the_stage_trains_from_the_start(
        tmp_path, uninterrupted):
    whole, expected = uninterrupted
    said: list[str] = []
    kept = tmp_path / "00-qat.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), _progress(kept, said), stop_at=21)
    _flip_a_byte_of_a_weight(kept)
    assert torch.load(kept, weights_only=True)["batch"] == 20  # torch loads it as if nothing happened

    student, teacher = _student_and_teacher()
    progress = _progress(kept, said)
    assert _train(student, teacher, _batches(0), progress) == whole
    [line] = [line for line in said if "is not taken" in line]
    assert line.startswith(f"qat: the training a stopped build kept in {kept} is not taken (it changed since it was "
                           "written: its sha256 is "), line
    assert line.endswith(f"was recorded in {kept.name}.sha256); it is removed, and the stage trains from its first "
                         "batch"), line
    assert progress.resumed_from == 0
    _assert_bitwise_equal(_weights(student), expected)
    # the damaged file is gone: what is kept now is the finished training, until the stage checkpoint is recorded
    assert torch.load(kept, weights_only=True)["batch"] == 42
    assert kept.with_name(kept.name + ".sha256").is_file()


def test_a_kept_training_without_its_recorded_sha256_is_not_taken(tmp_path):
    said: list[str] = []
    kept = tmp_path / "00-qat.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), _progress(kept, said), stop_at=21)
    kept.with_name(kept.name + ".sha256").unlink()
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), _progress(kept, said), stop_at=0)
    assert (f"qat: the training a stopped build kept in {kept} is not taken (no sha256 of it was recorded in "
            f"{kept.name}.sha256); it is removed, and the stage trains from its first batch") in said
    assert not kept.exists()


def test_a_kill_between_recording_the_sha256_and_the_rename_leaves_the_last_kept_training_taken(tmp_path):
    said: list[str] = []
    kept = tmp_path / "00-qat.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), _progress(kept, said), stop_at=17, interval=0)
    earlier = tmp_path / "batch-16.pt"
    shutil.copyfile(kept, earlier)
    with pytest.raises(KeyboardInterrupt):  # resumed, and kept again at 20 (after every update: interval 0)
        _train(*_student_and_teacher(), _batches(0), _progress(kept, said), stop_at=21, interval=0)
    assert torch.load(kept, weights_only=True)["batch"] == 20
    # a kill after the sha256 of batch 20's file was recorded, before that file was renamed over batch 16's
    os.replace(earlier, kept)
    said.clear()
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), _progress(kept, said), stop_at=16)
    assert said == [f"qat: going on from batch 16 of 42, the training a stopped build kept in {kept}"]


def test_a_stage_that_keeps_no_training_says_so_when_stopped(tmp_path):
    progress = TrainingProgress(tmp_path / "02-prune.training.pt", "prune", "x", print)
    assert progress.stopped_words() == "prune keeps no training in flight; --resume starts the stage over"
    progress = TrainingProgress(tmp_path / "02-prune.training.pt", "prune", "x", print, "python")
    assert progress.stopped_words() == "prune keeps no training in flight; resume=True starts the stage over"
    progress = TrainingProgress(tmp_path / "01-qat.training.pt", "qat", "x", print)  # stopped while it calibrated
    assert progress.stopped_words() == "qat stopped before its training; --resume starts the stage over"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="restores CUDA RNG states: needs a GPU")
def test_rng_states_kept_on_a_machine_with_more_gpus_restore_those_of_the_gpus_visible():
    torch.cuda.init()
    states = train._rng_states()
    expected = torch.cuda.get_rng_state_all()
    states["cuda"] = list(states["cuda"]) + [states["cuda"][0]] * 2  # kept where two more GPUs were visible
    torch.rand(8, device="cuda")
    train._set_rng_states(states)
    assert all(torch.equal(now, then) for now, then in zip(torch.cuda.get_rng_state_all(), expected, strict=True))


class Terminated(Exception):
    pass


@pytest.fixture
def own_stop_handlers():
    """SIGINT at Python's default (KeyboardInterrupt), SIGTERM raising Terminated with the frame it was given; put
    back afterwards."""
    frames = []

    def terminated(number, frame):
        frames.append(frame)
        raise Terminated(number)

    before = {signum: signal.getsignal(signum) for signum in train.STOP_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, terminated)
    yield terminated, frames
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_signals_held_over_a_step_are_passed_on_in_order_with_a_frame(own_stop_handlers):
    terminated, frames = own_stop_handlers
    stopped = None
    try:  # a KeyboardInterrupt that escaped would stop the test session
        with train._stops_held():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))  # the handlers run between bytecodes
    except BaseException as exc:  # noqa: BLE001
        stopped = exc
    assert isinstance(stopped, Terminated), repr(stopped)  # the SIGTERM after the Ctrl-C is not lost
    assert isinstance(stopped.__context__, KeyboardInterrupt)  # the Ctrl-C was passed on too, first
    assert len(frames) == 1
    assert frames[0] is not None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is terminated


def test_a_handler_that_cannot_be_swapped_puts_back_those_already_swapped(own_stop_handlers, monkeypatch):
    terminated, _ = own_stop_handlers
    real = signal.signal
    last = train.STOP_SIGNALS[-1]

    def refusing(signum, handler):
        if signum == last and handler is not before_last:
            raise ValueError(f"signal {signum} refused")
        return real(signum, handler)

    before_last = signal.getsignal(last)
    if not callable(before_last):
        before_last = terminated
        real(last, terminated)
    monkeypatch.setattr(signal, "signal", refusing)
    with pytest.raises(ValueError, match="refused"):
        with train._stops_held():
            pass
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(last) is before_last
    if last != signal.SIGTERM:
        assert signal.getsignal(signal.SIGTERM) is terminated
