"""Review 59 of resuming a killed build (edgesdk/build/pipeline.py, checkpoint.py, package.py).

Real builds of a tiny random model (smooth -> qat, an INT8 QDQ graph) run in child processes and pause themselves
(SIGSTOP, from a PEP 578 audit hook) when they are about to write a given file: half-way through QAT's checkpoint,
at the start of the export, and while the bundle is staged. Each is then killed with SIGKILL, and the same build,
resumed here with ``resume=True``, must finish with the bundle an uninterrupted build wrote (the same bundle id:
every file's sha256), leave no staged copy, no ``.partial`` checkpoint and no stale work directory behind, and keep
a work directory whose state file matches its files. A resume whose target, recipe or model changed is refused by
name, saying what changed; a recorded step's files are flushed to the disk before the state file records it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._utils.builds import QDQ_RECIPE
from tests._utils.child_script import REPO
from tests._utils.self_pause import kill_child, wait_paused

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not hasattr(signal, "SIGSTOP") or not Path("/proc/self/fd").is_dir(),
                                 reason="needs POSIX signals (SIGSTOP, SIGKILL) and /proc/self/fd")]

RECIPE = QDQ_RECIPE  # smooth -> qat, exported as an INT8 QDQ graph

# A build of tiny_config(root, out) that pauses itself (SIGSTOP) at the COUNT-th open / rename whose "event path"
# (e.g. "open /x/b.build/export/model.onnx") matches PATTERN: argv is root, out, PATTERN, COUNT.
CHILD = r"""
import sys
from pathlib import Path
from tests._utils.self_pause import pause_at
root, out = Path(sys.argv[1]), Path(sys.argv[2])
pause_at(sys.argv[3], int(sys.argv[4]), events=("open", "os.rename"))
from edgesdk.build.pipeline import build
from tests.unit.test_resume59 import tiny_config
build(tiny_config(root, out))
"""


def tiny_config(root: Path, out: Path, **changes):
    """The build every test here runs: RECIPE for host on root/model, trained on root/train.txt, into ``out``."""
    from dataclasses import replace

    from edgesdk.build.pipeline import BuildConfig
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    config = BuildConfig(target="host", model=str(root / "model"), out=out, recipe=str(root / "recipe.yaml"),
                         data=DataConfig(files=(str(root / "train.txt"),), skip_chars=2000, generated_sequences=0),
                         export=ExportConfig(max_context=64), progress=False)
    return replace(config, **changes)


def _inputs(root: Path) -> Path:
    from tests._utils.tiny import CORPUS, save_tiny_model_dir

    save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
    (root / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    (root / "train.txt").write_text("\n".join(CORPUS * 3), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def one_thread():
    """The children run with OMP_NUM_THREADS=1; the builds here take one thread too, so that every build computes
    alike (a float sum's order follows the threads)."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _durability_spy(events: list):
    """os.fsync and os.replace recording each call (the fsync by its descriptor's path; a replace of the state file
    with the steps it records done), both still done."""
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(handle):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{handle}")))
        return real_fsync(handle)

    def replace(source, destination, **kwargs):
        done = None
        if os.fspath(source).endswith("state.json.tmp"):
            done = set(json.loads(Path(source).read_text(encoding="utf-8"))["done"])
        events.append(("replace", os.fspath(source), os.fspath(destination), done))
        return real_replace(source, destination, **kwargs)

    return fsync, replace


@pytest.fixture(scope="module")
def straight(tmp_path_factory, one_thread):
    """The build run straight through (its work directory kept), with every fsync and replace it made."""
    from edgesdk.build.pipeline import build

    root = _inputs(tmp_path_factory.mktemp("resume"))
    events: list = []
    fsync, replace = _durability_spy(events)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", fsync)
        patch.setattr(os, "replace", replace)
        bundle = build(tiny_config(root, root / "straight" / "b", keep_work=True))
    return root, bundle, events


def _start(root: Path, out: Path, pattern: str, count: int = 1) -> subprocess.Popen:
    out.parent.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO)}
    log = open(out.parent / "child.log", "w+")  # noqa: SIM115 (closed by _kill)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(out), pattern, str(count)], cwd=REPO,
                             env=env, stdout=log, stderr=subprocess.STDOUT)
    child.log = log
    return child


def _kill(child: subprocess.Popen) -> None:
    kill_child(child)
    (Path(child.log.name)).unlink()


def _state_matches_files(work: Path) -> dict:
    """The work directory's state file, checked against its files: every file recorded for a finished step is there
    with its size and sha256, and no other file is in that step's folder."""
    from edgesdk.hashing import sha256_file

    state = json.loads((work / "state.json").read_text(encoding="utf-8"))
    folders = {step: work / "stages" / path.name for step in state["done"] if step.startswith("stage:")
               for path in (work / "stages").glob(f"*-{step.partition(':')[2]}") if not path.name.endswith(".partial")}
    folders.update({"export": work / "export"} if "export" in state["done"] else {})
    assert set(state.get("files", {})) == set(folders), (state.get("files"), folders)
    for step, folder in folders.items():
        recorded = {name: [size, digest] for name, (size, digest) in state["files"][step].items()}
        found = {p.relative_to(folder).as_posix(): [p.stat().st_size, sha256_file(p)]
                 for p in folder.rglob("*") if p.is_file()}
        assert found == recorded, step
    return state


# moment -> (what the child pauses at, the steps its state records then, the stages the resumed build runs)
MOMENTS = {
    "qat-checkpoint": (r"open .*/stages/01-qat\.partial/tokenizer_config\.json$", {"baseline", "stage:smooth"},
                       ["qat"]),
    "export": (r"open .*/b\.build/export/model\.onnx$", {"baseline", "stage:smooth", "stage:qat"}, []),
    "bundle": (r"open .*/\.b\.partial/report\.md$", {"baseline", "stage:smooth", "stage:qat", "export"}, []),
}


def test_a_build_killed_in_a_stage_in_the_export_or_in_packaging_resumes_to_the_same_bundle(straight, capfd):
    """SIGKILL half-way through QAT's checkpoint (its weights written under the .partial name), as the export
    starts, and while the bundle is staged (a copy of the weights under .b.partial): the resumed build takes the
    recorded steps, makes the others, and writes the uninterrupted build's bundle; nothing staged or stale is left.
    The last one keeps its work directory, whose state file then records every step with its files as they are."""
    from edgesdk.build.pipeline import build
    from edgesdk.bundle import verify_bundle

    root, expected, _ = straight
    children = {moment: _start(root, root / moment / "b", stop) for moment, (stop, _, _) in MOMENTS.items()}
    try:
        for child in children.values():
            wait_paused(child)
    finally:
        for child in children.values():
            if child.returncode is None:
                _kill(child)
    capfd.readouterr()
    for moment, (_, recorded, rerun) in MOMENTS.items():
        out = root / moment / "b"
        work = out.with_name("b.build")
        assert set(_state_matches_files(work)["done"]) == recorded, moment
        keep = moment == "bundle"
        bundle = build(tiny_config(root, out, resume=True, keep_work=keep))
        said = capfd.readouterr().err
        assert [name for name in ("smooth", "qat") if f"] {name}: " in said] == rerun, (moment, said)
        assert ("exporting ONNX" in said) == (moment != "bundle"), moment
        verify_bundle(out)
        assert bundle.bundle_id == expected.bundle_id, moment
        assert bundle.manifest["files"] == expected.manifest["files"], moment
        assert sorted(os.listdir(out.parent)) == (["b", "b.build"] if keep else ["b"]), moment
        if keep:  # every step recorded, each with its files; no half checkpoint, no state file being written
            assert set(_state_matches_files(work)["done"]) == recorded
            assert sorted(os.listdir(work)) == ["export", "stages", "state.json"]
            assert sorted(os.listdir(work / "stages")) == ["00-smooth", "01-qat"]


def _killed_in_qat(root: Path, monkeypatch) -> Path:
    """The build stopped by an error in QAT (as a kill leaves it: baseline and smooth recorded); its work
    directory."""
    from dataclasses import replace

    from edgesdk.build.pipeline import build
    from edgesdk.build.registry import STAGES, stage_spec

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt("killed in qat")

    with monkeypatch.context() as patch:
        patch.setitem(STAGES, "qat", replace(stage_spec("qat"), run=stopped))
        with pytest.raises(KeyboardInterrupt):
            build(tiny_config(root, root / "b"))
    return root / "b.build"


@pytest.mark.parametrize(("change", "part", "differs"), [
    ({"target": "rpi5"}, "the target profile (--target or its YAML: its sparsity_block or power)",
     "target.power.entropy_target: 1.2 then, 1.5 now"),
    ({"recipe": "default"}, "the recipe's stages (--recipe or its file)",
     'recipe: ["smooth", "qat"] then, ["qat"] now'),
    ({"overrides": ("export.weights=fp32",)}, "the export settings",
     'export.weights: "int8" then, "fp32" now'),
])
def test_a_resume_with_another_target_recipe_or_export_is_refused_saying_what_changed(tmp_path, monkeypatch,
                                                                                      one_thread, change, part,
                                                                                      differs):
    """The refusal named the part of the build key that changed, never the value: the user was to find by hand which
    of the arguments differed from the killed build's. The fix now names the setting, as it was and as it is."""
    from edgesdk.build.pipeline import build
    from edgesdk.errors import BuildError

    root = _inputs(tmp_path)
    work = _killed_in_qat(root, monkeypatch)
    before = (work / "state.json").read_bytes()
    with pytest.raises(BuildError, match="belongs to a different build") as refused:
        build(tiny_config(root, root / "b", resume=True, **change))
    assert f"{part}" in refused.value.problem
    assert refused.value.problem.endswith("changed since it was written")
    assert refused.value.fix.startswith("drop --resume to start over, or pass the same arguments as the killed build")
    assert f"put back what changed ({differs}" in refused.value.fix, refused.value.fix
    assert (work / "state.json").read_bytes() == before  # nothing of the killed build's was touched


def test_a_resume_after_the_model_file_changed_is_refused_naming_the_file_and_starts_over_without_resume(
        straight, tmp_path, monkeypatch, capfd):
    """The model's weights re-saved (another model of the same shape: the same size) after the kill: the checkpoints
    are not of this model. --resume refuses, naming model.safetensors (it named "the model" only); without it the
    build starts over, says what it discarded, and writes the new model's bundle."""
    from edgesdk.build.pipeline import build
    from edgesdk.bundle import verify_bundle
    from edgesdk.errors import BuildError
    from tests._utils.tiny import tiny_llama

    root, expected, _ = straight
    root = _inputs(tmp_path)
    work = _killed_in_qat(root, monkeypatch)
    weights = root / "model" / "model.safetensors"
    size = weights.stat().st_size
    tiny_llama(seed=7, hidden=64, heads=4, kv_heads=2).save_pretrained(tmp_path / "other", safe_serialization=True)
    shutil.copyfile(tmp_path / "other" / "model.safetensors", weights)
    assert weights.stat().st_size == size
    with pytest.raises(BuildError, match="belongs to a different build") as refused:
        build(tiny_config(root, root / "b", resume=True, terms="python"))
    assert refused.value.problem.endswith("the model (model or its files) changed since it was written")
    assert refused.value.fix.startswith("pass resume=False to start over")
    assert "model.safetensors: modified since the killed build read it" in refused.value.fix, refused.value.fix
    assert "config.json" not in refused.value.fix  # what did not change is not named
    assert "tokenizer.json" not in refused.value.fix
    assert set(json.loads((work / "state.json").read_text())["done"]) == {"baseline", "stage:smooth"}

    capfd.readouterr()
    bundle = build(tiny_config(root, root / "b"))
    said = capfd.readouterr().err
    assert "starting over: the finished steps (baseline, stage:smooth)" in said
    assert "] smooth: " in said
    assert "] qat: " in said
    verify_bundle(root / "b")
    assert bundle.manifest["files"]["model.onnx.data"] != expected.manifest["files"]["model.onnx.data"]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith((".b", "b"))) == ["b"]


def test_a_steps_files_reach_the_disk_before_the_state_file_records_the_step(straight):
    """A stage's checkpoint and the export were written and renamed with no fsync, then recorded as done in a state
    file that is flushed: after a power cut the state could record a step whose files were empty or missing (ext4
    writes a rename before the data renamed), and the resumed build made the step again, losing the stage's
    training. Each file is now flushed before the state file records its step, and the renamed checkpoint's
    folder too."""
    root, _, events = straight
    work = root / "straight" / "b.build"
    state = json.loads((work / "state.json").read_text(encoding="utf-8"))
    for step, files in state["files"].items():
        recorded_at = next(index for index, event in enumerate(events)
                           if event[0] == "replace" and event[3] is not None and step in event[3])
        synced = {event[1] for event in events[:recorded_at] if event[0] == "fsync"}
        if step == "export":
            folder, written_in = work / "export", work / "export"
        else:
            folder = next((work / "stages").glob(f"*-{step.partition(':')[2]}"))
            written_in = folder.with_name(folder.name + ".partial")
        unsynced = sorted(name for name in files if str(written_in / name) not in synced)
        assert unsynced == [], f"{step}: not flushed before the state recorded it: {unsynced}"
        assert str(folder.parent) in synced, step  # the rename (or the new export folder's entry) too
