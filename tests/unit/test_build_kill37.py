"""A killed build resumes: real ``python -m edgesdk build`` processes are killed with SIGKILL at moments found
from the files each phase writes in the work directory, and the same command is run again with ``--resume``.

Most of those writes last a millisecond or two, too short to catch from outside by polling. There the build
process pauses itself (SIGSTOP) when it is about to write a given file, as seen by a PEP 578 audit hook on
``open`` / ``os.rename``; the test checks in the work directory that the process stands where it should, then
kills it. Nothing in the build is replaced: the hook only pauses the real command. Training lasts long enough
to be caught from outside: the test watches the state file and kills the build once the stage before training
is recorded.

The builds are deterministic (fixed data seeds, no generated teacher text, one thread), so a resumed build's
bundle must equal an uninterrupted one's file for file (the manifest's sha256 of every file, and so its id).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._utils.self_pause import kill_child as kill
from tests._utils.self_pause import wait_paused as paused
from tests._utils.signals import default_signals

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX signals (SIGSTOP, SIGKILL)")]

# smooth -> qat, exported as an INT8 QDQ graph; enough QAT steps that training is seen from outside.
RECIPE = """name: tiny-kill
stages:
  - stage: smooth
    config: {calibration_batches: 2, batch_size: 2, sequence_length: 24}
  - stage: qat
    config: {granularity: channel, activations: tensor, embedding_bits: null, steps: 200, batch_size: 2,
             sequence_length: 24, observer_batches: 2}
export: {form: standard, weights: int8}
"""

# The build command, run under an audit hook that pauses the process (SIGSTOP) at the COUNT-th open, rename or
# mkdir whose "event path" (e.g. "open /tmp/b.build/state.json.tmp") matches the regular expression in
# EDGESDK_TEST_STOP_AT; the event fires before the call does its work.
DRIVER = r"""
import os, sys
from tests._utils.self_pause import pause_at
if os.environ.get("EDGESDK_TEST_STOP_AT"):
    pause_at(os.environ["EDGESDK_TEST_STOP_AT"], int(os.environ.get("EDGESDK_TEST_STOP_COUNT", "1")))
from edgesdk.cli import entry
sys.argv = ["edgesdk", *sys.argv[1:]]
entry()
"""


class Setup:
    """A recipe's build for a target on a tiny random model, and the bundle of one run straight through."""

    def __init__(self, root: Path, recipe: str = RECIPE, target: str = "host", model: Path | None = None):
        from tests._utils.tiny import CORPUS, save_tiny_model_dir

        self.root, self.target = root, target
        self.model = model or save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
        self.recipe = root / "recipe.yaml"
        self.recipe.write_text(recipe)
        self.text = root / "train.txt"
        self.text.write_text("\n".join(CORPUS * 3))
        self.driver = root / "driver.py"
        self.driver.write_text(DRIVER)
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "EDGESDK_CACHE": str(root / "cache"),
                    "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        self.straight = self.finish(root / "straight", resume=False)[1]

    def args(self, out: Path, resume: bool) -> list[str]:
        return [sys.executable, str(self.driver), "build", "-t", self.target, "-m", str(self.model), "-o", str(out),
                "--recipe", str(self.recipe), "--data", str(self.text), "--data-skip-chars", "2000",
                "--generated-sequences", "0", "--max-context", "64", "--no-progress", *(["--resume"] if resume else [])]

    def start(self, out: Path, stop_at: str | None = None, count: int = 1, resume: bool = False):
        env = {**self.env, "EDGESDK_TEST_STOP_AT": stop_at or "", "EDGESDK_TEST_STOP_COUNT": str(count)}
        log = open(out.with_name(out.name + f".{time.monotonic_ns()}.log"), "w+")
        process = subprocess.Popen(self.args(out, resume), env=env, stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=default_signals)  # a Ctrl-C test's SIGINT must not arrive ignored
        process.log = log
        return process

    def finish(self, out: Path, resume: bool = True, check: bool = True) -> tuple[subprocess.CompletedProcess, dict]:
        """Run the build to its end; (the process, the bundle's manifest or {})."""
        done = subprocess.run(self.args(out, resume), env=self.env, capture_output=True, text=True, timeout=600)
        if check:
            assert done.returncode == 0, done.stderr
        manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").is_file() else {}
        return done, manifest


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pytest.importorskip("torch")
    return Setup(tmp_path_factory.mktemp("kill"))


def state(out: Path) -> dict:
    return json.loads((out.with_name(out.name + ".build") / "state.json").read_text())


def assert_same_bundle(setup: Setup, out: Path, manifest: dict) -> None:
    """The bundle verifies, and holds the uninterrupted build's files (weights, graph, tokenizer, report)."""
    from edgesdk.bundle import verify_bundle

    verify_bundle(out)
    assert manifest["files"] == setup.straight["files"]
    assert manifest["bundle_id"] == setup.straight["bundle_id"]
    assert not out.with_name(out.name + ".build").exists()
    assert not out.with_name(f".{out.name}.partial").exists()


def ran(stderr: str, stages: tuple[str, ...] = ("smooth", "qat")) -> list[str]:
    """The stages a build ran, from its log."""
    return [name for name in stages if f"] {name}: " in stderr]


def test_killed_while_a_stage_trains_resumes_at_that_stage(setup, tmp_path):
    """The state file records 'smooth' before QAT starts training: killed then, the resumed build takes smooth's
    checkpoint and trains QAT from it."""
    out = tmp_path / "b"
    build = setup.start(out)
    state_file = tmp_path / "b.build" / "state.json"
    while build.poll() is None:  # watch the state file until it records the stage before training
        if state_file.is_file() and "stage:smooth" in json.loads(state_file.read_text())["done"]:
            break
        time.sleep(0.002)
    kill(build)
    done = state(out)["done"]
    assert "stage:smooth" in done
    assert "stage:qat" not in done, "the kill did not land while QAT trained"
    assert not (tmp_path / "b.build" / "stages" / "01-qat").exists()

    resumed, manifest = setup.finish(out)
    assert "resuming after stage 'smooth' from its checkpoint (1 of 2 stages done)" in resumed.stderr
    assert ran(resumed.stderr) == ["qat"]
    assert_same_bundle(setup, out, manifest)


def test_ctrl_c_while_a_stage_trains_says_what_is_kept_and_exits_130(setup, tmp_path):
    """Ctrl-C (SIGINT) while QAT trains: the build says which finished steps it kept and how to go on, exits 130 as
    a shell reports an interrupted command (it ended with click's bare 'Aborted!' and exit 1), and --resume
    finishes the same bundle."""
    out = tmp_path / "b"
    build = setup.start(out)
    state_file = tmp_path / "b.build" / "state.json"
    while build.poll() is None:
        if state_file.is_file() and "stage:smooth" in json.loads(state_file.read_text())["done"]:
            break
        time.sleep(0.002)
    os.kill(build.pid, signal.SIGINT)
    assert build.wait(timeout=120) == 130
    build.log.seek(0)
    log = build.log.read()
    build.log.close()
    assert "the finished steps (baseline, stage:smooth) are kept in" in log, log
    assert "run the same command with --resume" in log
    assert log.rstrip().endswith("edgesdk build: stopped (Ctrl-C)"), log
    assert "Aborted!" not in log
    assert "Traceback" not in log

    resumed, manifest = setup.finish(out)
    assert ran(resumed.stderr) == ["qat"]
    assert_same_bundle(setup, out, manifest)


def test_killed_while_a_checkpoint_is_written_redoes_that_stage_only(setup, tmp_path):
    """QAT's checkpoint half written (weights there, tokenizer files not yet, still under its .partial name)."""
    out = tmp_path / "b"
    build = setup.start(out, r"open .*/stages/01-qat\.partial/tokenizer_config\.json$")
    paused(build)
    stages = tmp_path / "b.build" / "stages"
    assert (stages / "01-qat.partial" / "model.safetensors").is_file()
    assert not (stages / "01-qat").exists()
    kill(build)

    resumed, manifest = setup.finish(out)
    assert "resuming after stage 'smooth' from its checkpoint (1 of 2 stages done)" in resumed.stderr
    assert ran(resumed.stderr) == ["qat"]
    assert_same_bundle(setup, out, manifest)


@pytest.mark.parametrize("stage", ["smooth", "qat"])
def test_killed_while_the_state_is_written_takes_no_unrecorded_checkpoint(setup, tmp_path, stage):
    """The stage's checkpoint is in place and the new state file written beside the old one, but not yet renamed
    over it (the third state write records smooth, the fourth qat). The checkpoint is not recorded, so the stage
    runs again; the half-written new state file (cut at a random byte here) is never read."""
    out = tmp_path / "b"
    index = {"smooth": 0, "qat": 1}[stage]
    build = setup.start(out, r"os.rename .*/b\.build/state\.json\.tmp$", count=3 + index)
    paused(build)
    work = tmp_path / "b.build"
    assert (work / "stages" / f"{index:02d}-{stage}" / "model.safetensors").is_file()
    assert f"stage:{stage}" not in state(out)["done"]
    assert f"stage:{stage}" in json.loads((work / "state.json.tmp").read_text())["done"]
    kill(build)
    tmp = work / "state.json.tmp"
    tmp.write_bytes(tmp.read_bytes()[: random.Random(index).randrange(1, tmp.stat().st_size)])

    resumed, manifest = setup.finish(out)
    assert ran(resumed.stderr) == ["smooth", "qat"][index:]
    reused = "the loaded model's figures (baseline)" + ", stage 'smooth'" * index
    assert f"--resume: reusing {reused} from {work}\n" in resumed.stderr  # said, also where no stage is reused
    if index:
        assert "resuming after stage 'smooth' from its checkpoint (1 of 2 stages done)" in resumed.stderr
    assert_same_bundle(setup, out, manifest)


def test_killed_while_exporting_keeps_both_stages(setup, tmp_path):
    out = tmp_path / "b"
    build = setup.start(out, r"open .*/b\.build/export/model\.onnx$")
    paused(build)
    assert set(state(out)["done"]) == {"baseline", "stage:smooth", "stage:qat"}
    kill(build)

    resumed, manifest = setup.finish(out)
    assert (f"--resume: reusing the loaded model's figures (baseline), stage 'smooth', stage 'qat' from {out}.build"
            in resumed.stderr)
    assert "resuming after stage 'qat' from its checkpoint (2 of 2 stages done)" in resumed.stderr
    assert ran(resumed.stderr) == []
    assert "exporting ONNX" in resumed.stderr
    assert_same_bundle(setup, out, manifest)


def test_killed_while_the_bundle_is_packaged_reuses_the_export(setup, tmp_path):
    out = tmp_path / "b"
    build = setup.start(out, r"open .*/\.b\.partial/report\.md$")
    paused(build)
    assert "export" in state(out)["done"]
    assert (tmp_path / ".b.partial" / "model.onnx.data").is_file()
    assert not out.exists()
    kill(build)

    resumed, manifest = setup.finish(out)
    assert "export: done in an earlier run" in resumed.stderr
    assert ran(resumed.stderr) == []
    assert "exporting ONNX" not in resumed.stderr
    assert_same_bundle(setup, out, manifest)


def test_killed_after_the_bundle_is_in_place_resumes_to_the_same_bundle(setup, tmp_path):
    """Killed as it removes the work directory: the bundle is whole; the resumed build writes it again."""
    out = tmp_path / "b"
    build = setup.start(out, r"os.rename .*/b\.build$")
    paused(build)
    from edgesdk.bundle import verify_bundle

    verify_bundle(out)
    kill(build)

    # Resumed again and killed between the two renames that put the new bundle in the old one's place: the old
    # one waits aside as .b.old, and the next resumed build puts the bundle back and removes it.
    build = setup.start(out, r"os.rename .*/\.b\.partial$", resume=True)
    paused(build)
    assert not out.exists()
    verify_bundle(tmp_path / ".b.old")
    kill(build)

    resumed, manifest = setup.finish(out)
    assert "export: done in an earlier run" in resumed.stderr
    assert ran(resumed.stderr) == []
    assert_same_bundle(setup, out, manifest)
    assert not (tmp_path / ".b.old").exists()


@pytest.fixture(scope="module")
def jetson(setup):
    """qat -> sparsify -> distill for orin-nx: block-sparse weights and Triton kernels compiled for sm_87."""
    pytest.importorskip("triton")
    from tests._utils.builds import JETSON_RECIPE

    root = setup.root / "jetson"
    root.mkdir()
    return Setup(root, JETSON_RECIPE, "orin-nx", setup.model)


@pytest.mark.parametrize("moment", ["distill-checkpoint", "kernels"])
def test_a_killed_block_sparse_build_resumes_to_the_same_bundle(jetson, tmp_path, moment):
    """Killed while distillation's checkpoint is written (after sparsify recorded its masks), or while the export
    compiles the GPU kernels (two of the sm_87 kernel files written)."""
    stages = ("qat", "sparsify", "distill")
    out = tmp_path / "b"
    if moment == "kernels":
        build = jetson.start(out, r"open .*/b\.build/export/kernels/sm_87/[^/]+\.cubin$", count=2)
    else:
        build = jetson.start(out, r"open .*/stages/02-distill\.partial/tokenizer_config\.json$")
    paused(build)
    kill(build)

    resumed, manifest = jetson.finish(out)
    if moment == "kernels":
        assert "resuming after stage 'distill' from its checkpoint (3 of 3 stages done)" in resumed.stderr
        assert ran(resumed.stderr, stages) == []
    else:
        assert "resuming after stage 'sparsify' from its checkpoint (2 of 3 stages done)" in resumed.stderr
        assert ran(resumed.stderr, stages) == ["distill"]
    assert_same_bundle(jetson, out, manifest)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_truncated_checkpoint_is_made_again_never_loaded(setup, tmp_path, seed):
    """Killed while exporting, then one file of QAT's checkpoint cut at a random byte (as a disk that lost the
    end of a write leaves it): the resumed build names it and trains QAT again from smooth's checkpoint."""
    out = tmp_path / "b"
    build = setup.start(out, r"open .*/b\.build/export/model\.onnx$")
    paused(build)
    kill(build)
    pick = random.Random(seed)
    checkpoint = tmp_path / "b.build" / "stages" / "01-qat"
    files = sorted(f for f in checkpoint.iterdir() if f.stat().st_size > 1)
    damaged = checkpoint / "model.safetensors" if seed == 0 else pick.choice(files)  # seed 0: the weights
    size = damaged.stat().st_size
    cut = pick.randrange(1, size)
    damaged.write_bytes(damaged.read_bytes()[:cut])

    resumed, manifest = setup.finish(out)
    assert (f"--resume: the checkpoint of stage 'qat' is damaged ({damaged.name} has {cut} bytes, {size} when it "
            "was written); the stage runs again") in resumed.stderr
    assert ran(resumed.stderr) == ["qat"]
    assert_same_bundle(setup, out, manifest)


def test_a_truncated_state_file_is_refused_by_name_and_the_build_starts_over_without_resume(setup, tmp_path):
    """Without its state file the finished steps are not known: --resume refuses it by name (no traceback), and
    the build without --resume starts over in the same place."""
    out = tmp_path / "b"
    build = setup.start(out, r"open .*/b\.build/export/model\.onnx$")
    paused(build)
    kill(build)
    state_file = tmp_path / "b.build" / "state.json"
    state_file.write_bytes(state_file.read_bytes()[: random.Random(7).randrange(0, state_file.stat().st_size)])

    refused, _ = setup.finish(out, check=False)
    assert refused.returncode != 0
    assert f"state file {state_file} cannot be read" in refused.stderr
    assert "drop --resume to start over" in refused.stderr
    assert "Traceback" not in refused.stderr

    again, manifest = setup.finish(out, resume=False)
    assert ran(again.stderr) == ["smooth", "qat"]
    assert_same_bundle(setup, out, manifest)


def test_a_second_build_on_a_running_builds_work_directory_is_refused_and_a_killed_ones_lock_is_gone(setup,
                                                                                                    tmp_path):
    out = tmp_path / "b"
    first = setup.start(out, r"open .*/stages/01-qat\.partial/tokenizer_config\.json$")
    paused(first)  # holds its work directory's lock, half-way through a checkpoint
    work = tmp_path / "b.build"
    before = {p.relative_to(work): p.read_bytes() for p in work.rglob("*") if p.is_file()}
    for resume in (False, True):
        second, _ = setup.finish(out, resume=resume, check=False)
        assert second.returncode != 0
        assert f"another edgesdk build is using the work directory {work} (the same --out) right now" in second.stderr
        assert "Traceback" not in second.stderr
    assert {p.relative_to(work): p.read_bytes() for p in work.rglob("*") if p.is_file()} == before
    assert not out.exists()

    os.kill(first.pid, signal.SIGCONT)  # the first build goes on and finishes, undisturbed
    assert first.wait(timeout=600) == 0
    first.log.close()
    assert_same_bundle(setup, out, json.loads((out / "manifest.json").read_text()))

    # A build killed while holding the lock leaves no lock behind: the next one, resumed or not, runs.
    killed = setup.start(out, r"open .*/b\.build/export/model\.onnx$")
    paused(killed)
    kill(killed)
    resumed, manifest = setup.finish(out)
    assert "resuming after stage 'qat'" in resumed.stderr
    assert_same_bundle(setup, out, manifest)
    killed = setup.start(out, r"open .*/b\.build/export/model\.onnx$")
    paused(killed)
    kill(killed)
    again, manifest = setup.finish(out, resume=False)
    assert ran(again.stderr) == ["smooth", "qat"]
    assert_same_bundle(setup, out, manifest)


@pytest.mark.parametrize("window", ["before-mkdir", "before-lock"])
def test_a_second_build_in_the_first_ones_start_up_window_refuses_one_of_them_by_name(setup, tmp_path, window):
    """A build that starts over makes its work directory, then locks it. A second build on the same --out that came
    in before that lock took the directory; the first then failed at its mkdir with FileExistsError and a
    traceback (before-mkdir), where the lock refuses it by name (before-lock). Both windows now end the same way:
    one build goes on, the other is refused naming the work directory, and nothing of the one that goes on is
    touched."""
    out, work = tmp_path / "b", tmp_path / "b.build"
    stop = {"before-mkdir": r"os.mkdir .*/b\.build$", "before-lock": r"open .*/b\.build$"}[window]
    first = setup.start(out, stop)
    paused(first)
    assert work.is_dir() == (window == "before-lock")
    second = setup.start(out, r"open .*/stages/01-qat\.partial/tokenizer_config\.json$")
    paused(second)  # half-way through its last checkpoint, holding the work directory
    os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=600) != 0
    first.log.seek(0)
    said = first.log.read()
    first.log.close()
    assert f"another edgesdk build is using the work directory {work} (the same --out) right now" in said
    assert "Traceback" not in said
    os.kill(second.pid, signal.SIGCONT)
    assert second.wait(timeout=600) == 0
    second.log.close()
    assert_same_bundle(setup, out, json.loads((out / "manifest.json").read_text()))
