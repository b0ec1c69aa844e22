"""Resume (review 64): what a --resume with other stage settings makes again (the settings that changed, the training
in flight it discards) is worked out by the work directory that reads the state file, not read a second time by the
pipeline through the work directory's private helpers; and a stage's training in flight is one set of files for every
reader: the whole file a training kept is what a build reports as reached, while the temporaries of a save a kill cut
short are never reported and go with the training they belong to."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build import checkpoint  # noqa: E402
from edgesdk.build.checkpoint import WorkDir  # noqa: E402
from edgesdk.compress.train import TrainingProgress  # noqa: E402


def _key(seed: int, context: int = 32) -> dict:
    """A build key as the pipeline makes it (edgesdk/build/pipeline.py build), of a recipe whose one stage is qat."""
    return {"model": {"path": "/m", "files": {"model.safetensors": [10, 1]}}, "target": {"name": "host"},
            "recipe": ["qat"], "stage:qat": [["qat", {"seed": seed, "steps": 48}]], "export": {"form": "standard"},
            "sparse_export": None, "context": context, "data": {"files": []}, "edgesdk": "0"}


def _keep_training(work: WorkDir, batch: int, total: int = 48) -> Path:
    """Keep a training in flight of qat as a running stage does (a real TrainingProgress write: temporary file,
    sha256 beside it, rename)."""
    progress = TrainingProgress(work.training_file(0, "qat"), "qat", work.stage_identity("qat"), lambda line: None,
                                total=total)
    progress.write({"batch": batch})
    assert progress.kept == batch
    return progress.path


def _killed_save(kept: Path, batch: int) -> Path:
    """What a build killed while it saved its training at ``batch`` leaves: the temporary file the save writes
    (renamed over the kept one only once whole), cut short part-way."""
    kept.parent.mkdir(parents=True, exist_ok=True)  # as the save makes it, before any checkpoint made the folder
    whole = kept.with_name("whole")
    torch.save({"batch": batch, "total": 48, "unit": "batch"}, whole)
    tmp = kept.with_name(kept.name + ".tmp")
    tmp.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    whole.unlink()
    return tmp


def _training_files(work_path: Path) -> list[str]:
    stages = work_path / "stages"
    return sorted(f.name for f in stages.iterdir() if ".training.pt" in f.name) if stages.is_dir() else []


def test_the_pipeline_takes_no_private_helper_of_the_work_directory():
    """pipeline.py's resume note imported five private helpers of checkpoint.py and read the state file again, a
    second copy of what the state file holds: it imports no underscore name from checkpoint.py."""
    import edgesdk.build.pipeline as pipeline

    tree = ast.parse(Path(pipeline.__file__).read_text(encoding="utf-8"))
    private = [alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "edgesdk.build.checkpoint" for alias in node.names if alias.name.startswith("_")]
    assert private == []


def test_a_resume_with_other_stage_settings_says_what_changed_and_the_training_it_discards(tmp_path):
    """The work directory that decides what a resume makes again says what changed (the setting with its two values)
    and the training in flight it removes (where it had got), read before it removes it."""
    path = tmp_path / "b.build"
    first = WorkDir(path, _key(seed=0), resume=False)
    assert first.resume_changes == checkpoint.ResumeChanges()
    kept = _keep_training(first, batch=20)
    first.release()
    resumed = WorkDir(path, _key(seed=1), resume=True)
    resumed.release()
    assert resumed.redone == ["stage:qat"]
    assert resumed.resume_changes.changed_settings == ("qat.seed: 0 then, 1 now",)
    assert resumed.resume_changes.discarded_training == ("qat's training at batch 20 of 48",)
    assert not kept.exists()
    again = WorkDir(path, _key(seed=1), resume=True)  # the same build: nothing changed, nothing to say
    again.release()
    assert again.resume_changes == checkpoint.ResumeChanges()
    assert again.redone == []


def test_a_resume_with_another_context_only_names_the_context(tmp_path):
    """A changed context redoes the export alone: no stage's training is discarded."""
    path = tmp_path / "b.build"
    first = WorkDir(path, _key(seed=0, context=32), resume=False)
    kept = _keep_training(first, batch=20)
    first.release()
    resumed = WorkDir(path, _key(seed=0, context=64), resume=True)
    resumed.release()
    assert resumed.resume_changes == checkpoint.ResumeChanges(changed_settings=("context: 32 then, 64 now",))
    assert kept.is_file()  # the stage goes on from it


def test_a_save_killed_part_way_is_neither_reported_nor_kept_when_the_stage_is_made_again(tmp_path):
    """A build killed while it saved its training leaves the save's temporary file beside the last whole one: the
    whole one is the training reached (batch 20, not the 30 being saved), and both go when the stage's settings
    changed."""
    path = tmp_path / "b.build"
    first = WorkDir(path, _key(seed=0), resume=False)
    kept = _keep_training(first, batch=20)
    tmp = _killed_save(kept, batch=30)
    first.release()
    assert _training_files(path) == ["00-qat.training.pt", "00-qat.training.pt.sha256", "00-qat.training.pt.tmp"]
    resumed = WorkDir(path, _key(seed=1), resume=True)
    resumed.release()
    assert resumed.resume_changes.discarded_training == ("qat's training at batch 20 of 48",)
    assert not tmp.exists()
    assert _training_files(path) == []


def test_a_first_save_killed_part_way_is_no_training_reached(tmp_path):
    """A build killed in the first save of its training kept none: its temporary file is reported by neither a resume
    nor a build that starts over, and neither leaves it there."""
    for resume, key in ((True, _key(seed=1)), (False, _key(seed=0))):
        path = tmp_path / f"b{resume}.build"
        first = WorkDir(path, _key(seed=0), resume=False)
        tmp = _killed_save(first.training_file(0, "qat"), batch=10)
        first.release()
        again = WorkDir(path, key, resume=resume)
        again.release()
        assert again.resume_changes.discarded_training == ()
        assert again.discarded_training == []
        assert not tmp.exists()
        assert _training_files(path) == []


def test_a_build_that_starts_over_names_the_whole_training_only(tmp_path):
    """Starting over names the training a stopped build kept (batch 20) once, not the save a kill cut short."""
    path = tmp_path / "b.build"
    first = WorkDir(path, _key(seed=0), resume=False)
    _killed_save(_keep_training(first, batch=20), batch=30)
    first.release()
    again = WorkDir(path, _key(seed=0), resume=False)
    again.release()
    assert again.discarded_training == ["qat's training at batch 20 of 48"]
    assert _training_files(path) == []


def test_a_finished_stages_training_left_by_a_kill_goes_when_the_build_resumes(tmp_path):
    """A kill between the state file recording a stage as done and the stage removing its training in flight left
    that training (and its sha256) in the work directory for good: a resumed build skips the stage, and a kept work
    directory (--keep-work) kept it after the bundle was written. The resume removes it, and reports it nowhere: the
    stage's checkpoint holds what it made."""
    path = tmp_path / "b.build"
    first = WorkDir(path, _key(seed=0), resume=False)
    kept = _keep_training(first, batch=48)
    first.mark_done("stage:qat", {"stage": "qat"})
    first.release()
    resumed = WorkDir(path, _key(seed=0), resume=True)
    resumed.release()
    assert resumed.done("stage:qat") == {"stage": "qat"}
    assert not kept.exists()
    assert _training_files(path) == []
    assert json.loads((path / "state.json").read_text(encoding="utf-8"))["done"] == {"stage:qat": {"stage": "qat"}}
