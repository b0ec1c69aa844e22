"""A build that starts over names the training in flight it discards; QAT says what it does before its first batch.

Real ``edgesdk build`` processes on a tiny model are stopped (SIGINT) while QAT trains, or while it loads its training
text (paused, SIGSTOP, as it opens the teacher text cached by an earlier build, and sent the SIGINT there), and the
same command is run again without --resume.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.train import TrainingProgress  # noqa: E402
from tests._utils.self_pause import wait_paused  # noqa: E402
from tests.unit.test_build_kill37 import Setup  # noqa: E402
from tests.unit.test_stage_resume61 import _batches, _start_until_kept, _student_and_teacher, _train  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX signals (SIGSTOP, SIGINT)")

RECIPE = """name: tiny-start-over
stages:
  - stage: qat
    config: {granularity: channel, activations: tensor, embedding_bits: null, steps: 400, batch_size: 2,
             sequence_length: 24, observer_batches: 2, checkpoint_interval_s: 0}
export: {form: standard, weights: int8}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return Setup(tmp_path_factory.mktemp("start_over"), RECIPE)


def _stopped(build) -> str:
    os.kill(build.pid, signal.SIGINT)
    assert build.wait(timeout=120) == 130
    build.log.seek(0)
    log = build.log.read()
    build.log.close()
    assert "Traceback" not in log, log
    return log


@pytest.mark.slow
def test_a_build_without_resume_names_the_training_in_flight_it_discards(setup, tmp_path):
    out = tmp_path / "b"
    build, kept = _start_until_kept(setup, out, 8)
    _stopped(build)
    batch = torch.load(kept, weights_only=True)["batch"]
    assert 8 <= batch < 400

    again, _ = setup.finish(out, resume=False)
    work = out.with_name("b.build")
    assert (f"starting over: the finished steps (baseline) and qat's training at batch {batch} of 400 an earlier "
            f"build left in {work} are discarded (a build without --resume starts from the beginning; with it, it "
            "goes on from them)") in again.stderr, again.stderr
    assert "qat: training 400 batches in 100 updates; the training in flight is kept after every update and when " \
           "the build is stopped, from the first update (batch 4) on" in again.stderr


@pytest.mark.slow
def test_ctrl_c_while_qat_loads_its_training_text_says_so_and_what_is_lost(setup, tmp_path):
    out = tmp_path / "b"
    args = setup.args(tmp_path / "first", False)
    args[args.index("--generated-sequences") + 1] = "2"
    env = {**setup.env, "EDGESDK_CACHE": str(tmp_path / "cache")}
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)  # samples the teacher text
    assert first.returncode == 0, first.stderr
    assert "qat: loading the training text (the --data files tokenized, and 2 sequences of 256 tokens the teacher " \
           "samples once for this model, or takes from the cache where an earlier build kept them)" in first.stderr

    from tests._utils.signals import default_signals

    args[args.index("-o") + 1] = str(out)
    log = open(tmp_path / "b.log", "w+")
    build = subprocess.Popen(args, env={**env, "EDGESDK_TEST_STOP_AT": r"^open .*/teacher-text/[0-9a-f]+\.pt$"},
                             stdout=log, stderr=subprocess.STDOUT, preexec_fn=default_signals)
    build.log = log
    wait_paused(build)  # the cached teacher text, opened inside the stage's set-up
    os.kill(build.pid, signal.SIGINT)  # delivered as it goes on, before the training
    os.kill(build.pid, signal.SIGCONT)
    assert build.wait(timeout=120) == 130
    log.seek(0)
    said = log.read()
    log.close()
    assert "Traceback" not in said, said
    assert ("edgesdk build: qat stopped while loading the training text (the --data files tokenized, and 2 sequences "
            "of 256 tokens the teacher samples once for this model, or takes from the cache where an earlier build "
            "kept them), before its training (teacher text not sampled whole is not kept in the cache: the next "
            "build samples it again); --resume starts the stage over\n") in said, said


def test_a_stop_in_the_first_update_says_where_the_first_batch_is_kept(tmp_path):
    said: list[str] = []
    progress = TrainingProgress(tmp_path / "00-qat.training.pt", "qat", "build", said.append)
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), progress, stop_at=2)
    assert progress.stopped_words() == ("qat stopped before any of its 42 batches of training was kept (the first is "
                                        "kept at batch 4); --resume starts the stage over")
    assert said == ["qat: training 42 batches in 11 updates; the training in flight is kept after every update and "
                    "when the build is stopped, from the first update (batch 4) on"]


def test_a_kept_training_records_where_it_stopped_of_how_many(tmp_path):
    from edgesdk.build.checkpoint import _training_reached

    kept = tmp_path / "00-qat.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _train(*_student_and_teacher(), _batches(0), TrainingProgress(kept, "qat", "build", print), stop_at=21)
    assert _training_reached(kept) == " at batch 20 of 42"
    kept.write_bytes(b"damaged")
    assert _training_reached(kept) == ""
    assert _training_reached(Path(tmp_path / "none.training.pt")) == ""
