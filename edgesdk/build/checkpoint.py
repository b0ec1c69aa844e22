"""Build work directory: a state file of completed steps and a checkpoint after each stage.

A killed build resumes (``--resume``) at the first step not recorded as done, provided the
build key (model source and data files with their sizes and times, target, recipe, export
settings, edgesdk version) is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from edgesdk.errors import BuildError

STATE = "state.json"
# fn(model, checkpoint_dir) -> model, run after every load: stages that add modules of their own
# (the power stage's adapters) register one to put them back after ``from_pretrained``.
LOAD_HOOKS: list = []


def file_fingerprint(path: str | Path) -> dict:
    """What a build read from ``path``: its absolute location, and size and modification time of
    each file (of a model directory: its config and weight files), so a resumed build notices an
    input that changed under the same name."""
    path = Path(path).resolve()
    files = [path] if path.is_file() else sorted(
        f for f in path.iterdir() if f.suffix in (".json", ".safetensors", ".bin", ".gguf", ".model")) \
        if path.is_dir() else []
    return {"path": str(path), "files": {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files}}


def check_work_dir(path: Path) -> None:
    """``path`` may serve as a build's work directory: nothing is there, or a work directory (one holding
    the state file, or an empty one a kill left before its first state). Anything else is the user's, and
    a build would delete it when it starts over."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink():
        names = {entry.name for entry in path.iterdir()}
        if not names or STATE in names or names == {STATE + ".tmp"}:
            return
    kind = "directory" if path.is_dir() else "file"
    raise BuildError(f"the build's work directory {path} is taken: a {kind} that is not an edgesdk work directory "
                     "is there, and the build would delete it",
                     f"move {path} away, or pass --out another path (the work directory is <out>.build)")


class WorkDir:
    def __init__(self, path: Path, build_key: dict, resume: bool):
        self.path = Path(path)
        self.key = hashlib.sha256(json.dumps(build_key, sort_keys=True, default=str).encode()).hexdigest()[:16]
        state_file = self.path / STATE
        if resume and state_file.is_file():
            self.state = json.loads(state_file.read_text())
            if self.state.get("build_key") != self.key:
                raise BuildError(
                    f"--resume: the work directory {self.path} belongs to a different build "
                    "(model, data, target, recipe, export settings or edgesdk version changed)",
                    "drop --resume to start over, or pass the same arguments as the killed build",
                )
        else:
            check_work_dir(self.path)
            if self.path.exists():
                shutil.rmtree(self.path)
            self.path.mkdir(parents=True)
            self.state = {"build_key": self.key, "done": {}}
            self._save()

    def done(self, step: str) -> dict | None:
        return self.state["done"].get(step)

    def mark_done(self, step: str, record: dict) -> dict:
        """Record ``step`` as done; returns the record as a resumed build reads it back (keys sorted, tuples
        as lists), so a build that runs straight through writes the same bundle as one that resumes."""
        record = json.loads(json.dumps(record, sort_keys=True, default=str))
        self.state["done"][step] = record
        self._save()
        return record

    def stage_checkpoint(self, index: int, name: str) -> Path:
        return self.path / "stages" / f"{index:02d}-{name}"

    def _save(self) -> None:
        tmp = self.path / (STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=2, sort_keys=True, default=str))
        os.replace(tmp, self.path / STATE)  # atomic: a kill never leaves a half-written state


def save_checkpoint(model, tokenizer, path: Path) -> None:
    """safetensors weights + config, written beside the final name and renamed (never half-written)."""
    partial = path.with_name(path.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    if path.exists():
        shutil.rmtree(path)
    os.replace(partial, path)


def load_checkpoint(path: Path):
    """The model a stage saved, pruned layer shapes included (edgesdk/compress/structure.py)."""
    from edgesdk.compress.structure import load_pruned

    model = load_pruned(path)
    for hook in LOAD_HOOKS:
        model = hook(model, path)
    return model
