"""Build work directory: a state file of completed steps and a checkpoint after each stage.

A killed build resumes (``--resume``) at the first step not recorded as done, provided the
build key (model source and data files with their sizes and times, target, recipe, export
settings, edgesdk version) is unchanged, or changed only in parts that some steps alone depend
on (the bundle's context, the block-sparse export settings, a stage's settings: :func:`_steps_of`),
whose steps are then made again. A step's files (a stage's checkpoint, the export) are recorded with their sizes and sha256
when the step is marked done, and checked before a resumed build takes them: damaged ones are
made again, never used.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from edgesdk.bundle import _sync_tree, sync_directory, sync_file
from edgesdk.errors import DISK_FULL, BuildError, disk_full  # noqa: F401  (DISK_FULL: importable from here)
from edgesdk.hashing import sha256_file

STATE = "state.json"
TRAINING = ".training.pt"  # a stage's training in flight, beside its checkpoint (WorkDir.training_file)

# Each build option as ``edgesdk build`` names it, and as its build_bundle() argument (edgesdk/api.py): a build's
# messages name the one its caller passed (BuildConfig.terms: "cli" or "python"), a Python caller has no flags.
BUILD_ARGUMENTS = {"--model": "model", "--target": "target", "--out": "out", "--recipe": "recipe", "--set": "overrides",
                   "--weight-bits": "weight_bits", "--max-context": "max_context", "--data": "data",
                   "--resume": "resume", "--data-skip-chars": "data_skip_chars",
                   "--generated-sequences": "generated_sequences"}
TERMS = ("cli", "python")


def said(option: str, terms: str, value: object = None) -> str:
    """``option`` (a key of :data:`BUILD_ARGUMENTS`), with ``value`` if given, in the caller's terms: for the CLI
    ``--max-context 16``, ``--set qat.steps=1``, ``--resume``; for build_bundle() ``max_context=16``,
    ``overrides=['qat.steps=1']``, ``resume=True`` (a flag without a value is its bare name: ``no recipe given``)."""
    if terms != "python":
        return option if value is None else f"{option} {value}"
    name = BUILD_ARGUMENTS[option]
    if option == "--resume":
        return f"{name}=True"
    if value is None:
        return name
    if option == "--set":
        return f"{name}=[{str(value)!r}]"
    return f"{name}={value!r}" if isinstance(value, (bool, int, float, list)) else f"{name}={str(value)!r}"


def said_sets(terms: str, *items: str) -> str:
    """Recipe overrides ``items`` (``stage.field=value``) as the caller gives them: ``--set a=1 --set b=2`` for the
    CLI, ``overrides=['a=1', 'b=2']`` for build_bundle() (one list: build_bundle() takes one ``overrides``)."""
    if terms != "python":
        return " ".join(f"--set {item}" for item in items)
    return f"{BUILD_ARGUMENTS['--set']}={list(items)!r}"


def without(option: str, terms: str) -> str:
    """The fix that gives ``option`` up: ``drop --weight-bits`` for the CLI; for build_bundle() ``leave out
    weight_bits``, and ``pass resume=False`` (resume is a bool, and False its default)."""
    if terms != "python":
        return f"drop {option}"
    return "pass resume=False" if option == "--resume" else f"leave out {BUILD_ARGUMENTS[option]}"
# fn(model, checkpoint_dir) -> model, run after every load: stages that add modules of their own
# (the power stage's adapters) register one to put them back after ``from_pretrained``.
LOAD_HOOKS: list = []


# The files of a model (or adapter) directory a build reads: config and weights, and every tokenizer file
# transformers builds a tokenizer from (edgesdk/models/loader.py TOKENIZER_FILES): tokenizer.json, SentencePiece's
# tokenizer.model, a BPE vocabulary's vocab.json and merges.txt, WordPiece's vocab.txt, tiktoken's *.tiktoken. A
# changed merges.txt tokenizes the training text otherwise: the stages' checkpoints are not this build's.
FINGERPRINT_SUFFIXES = (".json", ".safetensors", ".bin", ".gguf", ".model", ".txt", ".tiktoken")


def file_fingerprint(path: str | Path) -> dict:
    """What a build read from ``path``: its absolute location, and size and modification time of
    each file (of a model directory: its config, weight and tokenizer files, FINGERPRINT_SUFFIXES), so a
    resumed build notices an input that changed under the same name."""
    path = Path(path).resolve()
    files = [path] if path.is_file() else sorted(
        f for f in path.iterdir() if f.suffix in FINGERPRINT_SUFFIXES) if path.is_dir() else []
    return {"path": str(path), "files": {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files}}


def check_work_dir(path: Path, terms: str = "cli") -> None:
    """``path`` may serve as a build's work directory: nothing is there, or a work directory (one holding
    the state file, or an empty one a kill left before its first state). Anything else is the user's, and
    a build would delete it when it starts over. ``terms``: whose option names the fix uses (:func:`said`)."""
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
                     f"move {path} away, or pass {said('--out', terms)} another path (the work directory is "
                     "<out>.build)")


_HELD: dict[str, int] = {}  # work directory -> locked descriptor, held by this process


def lock_work_dir(path: Path, terms: str = "cli") -> None:
    """Hold an exclusive lock on the work directory until :func:`release_work_dir` or the end of the
    process (the kernel drops it however the process ends): a second build to the same --out is
    refused instead of deleting the first one's checkpoints under it, in another process or in this one
    (a build_bundle() in another thread: a build gives its lock up when it ends, however it ends)."""
    key = str(Path(path).absolute())
    if key in _HELD:  # another build of this process holds it (or the directory it replaced, about to lock this one)
        raise _in_use(path, terms)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _in_use(path, terms) from None
    _HELD[key] = fd


def _in_use(path: Path, terms: str = "cli") -> BuildError:
    out = said("--out", terms)
    return BuildError(f"another edgesdk build is using the work directory {path} (the same {out}) right now",
                      f"wait for it to finish, or pass {out} another path")


def release_work_dir(path: Path) -> None:
    """Give up this process's lock on the work directory, if it holds one."""
    fd = _HELD.pop(str(Path(path).absolute()), None)
    if fd is not None:
        os.close(fd)


def remove_work_dir(path: Path) -> None:
    """Delete a work directory so that a kill part-way leaves no half of it: it is renamed aside in one
    step, then removed (a half-deleted directory without its state file would be refused by the next
    build as not a work directory). What an earlier kill left aside goes too."""
    path = Path(path)
    aside = path.with_name(f".{path.name}.removing")
    if aside.exists():
        shutil.rmtree(aside, ignore_errors=True)
    if path.exists():
        os.replace(path, aside)
        shutil.rmtree(aside, ignore_errors=True)


# What each part of the pipeline's build key stands for, as a refused --resume names it.
KEY_PARTS = {
    "model": "the model (--model or its files)",
    "target": "the target profile (--target or its YAML: its sparsity_block or power)",
    "recipe": "the recipe's stages (--recipe or its file)",
    "export": "the export settings (the recipe's export section, --set export.*, --weight-bits)",
    "context": "the bundle's context (--max-context)",
    "sparse_export": "the block-sparse export settings (export.sparse, export.sparse_layout, the target's gpu)",
    "data": "the training text (--data or its files, --data-skip-chars, --generated-sequences)",
    "adapters": "the LoRA adapters (--lora, --lora-scaled, their scales or their files)",
    "edgesdk": "the edgesdk version",
}
# The same, in build_bundle()'s arguments (edgesdk/api.py), for BuildConfig.terms "python".
KEY_PARTS_PYTHON = {
    "model": "the model (model or its files)",
    "target": "the target profile (target or its YAML: its sparsity_block or power)",
    "recipe": "the recipe's stages (recipe or its file)",
    "export": "the export settings (the recipe's export section, overrides of export.*, weight_bits)",
    "context": "the bundle's context (max_context)",
    "sparse_export": "the block-sparse export settings (export.sparse, export.sparse_layout, the target's gpu)",
    "data": "the training text (data or its files, data_skip_chars, generated_sequences)",
    "adapters": "the LoRA adapters (lora, their scales or their files)",
    "edgesdk": "the edgesdk version",
}


# Parts of the build key that only the steps named depend on: a resumed build where nothing else changed takes the
# other finished steps and makes these again. The bundle's context is the length of the export graph's rotary table,
# and the sparse_export part the block-sparse copy of the weights the export adds (and the GPU its kernels are
# compiled for); no stage reads either (their figures are of the exported weights, whose layout the "export" part
# holds).
REDONE_BY = {"context": ("export",), "sparse_export": ("export",)}


def _steps_of(part: str) -> tuple[str, ...] | None:
    """The steps that build key part ``part`` alone feeds: :data:`REDONE_BY`'s, and for a stage's settings (part
    ``stage:NAME``, the configs of that stage and of the stages before it) the stage and the export, made from its
    checkpoint; None for a part every step reads."""
    if part in REDONE_BY:
        return REDONE_BY[part]
    return (part, "export") if part.startswith("stage:") else None


def _redone(recorded: dict | None, parts: dict) -> tuple[list[str], list[str]] | None:
    """Where the build key a work directory recorded (its parts' digests, ``recorded``) differs from ``parts`` only in
    parts that some steps alone feed (:func:`_steps_of`): those parts, and the steps to make again; None for any other
    difference, and for a work directory that recorded no parts (an older edgesdk wrote it)."""
    if not isinstance(recorded, dict) or set(recorded) != set(parts):
        return None
    changed = [name for name, digest in parts.items() if recorded[name] != digest]
    if not changed or any(_steps_of(name) is None for name in changed):
        return None
    return changed, sorted({step for name in changed for step in _steps_of(name)})


def part_named(part: str, terms: str = "cli") -> str:
    """What build key part ``part`` stands for, in the caller's terms (:data:`KEY_PARTS`): ``stage:NAME`` is that
    stage's settings (with those of the stages before it, which its checkpoint is made from)."""
    named = KEY_PARTS_PYTHON if terms == "python" else KEY_PARTS
    if part.startswith("stage:") and part not in named:
        stage = part.partition(":")[2]
        given = f"--set {stage}.*, or a shortcut option" if terms != "python" else f"overrides of {stage}.*"
        return f"the settings of the {stage} stage or a stage before it (the recipe, {given})"
    return named.get(part, part)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _changed_parts(recorded: dict | None, parts: dict, terms: str = "cli") -> str:
    """The parts of the build key whose digest differs from the one a work directory recorded, a part that
    only one of the two builds has included (the killed build merged --lora adapters, this one none); all of
    them, as a list of candidates, for a work directory that recorded none (an older edgesdk wrote it). Where the
    recipe's list of stages changed, the stages' settings are not named besides it."""
    if isinstance(recorded, dict) and _layout(recorded) != _layout(parts):
        return "the layout of the build key (another edgesdk version wrote the work directory)"
    changed = [name for name, digest in parts.items() if isinstance(recorded, dict) and recorded.get(name) != digest]
    if isinstance(recorded, dict):
        changed += [name for name in recorded if name not in parts]
    listed = first_stage_only(changed or list(parts))
    if "recipe" in listed:
        listed = [name for name in listed if not name.startswith("stage:")]
    names = [part_named(name, terms) for name in listed]
    return " and ".join(names) if changed else "one of " + ", ".join(names)


def _resume_fix(recorded, inputs: dict, terms: str) -> str:
    """The fix of a refused --resume, whose work directory's state file kept the build key's values ``recorded``
    (``build_inputs``) where this build has ``inputs``: start over, or pass the killed build's arguments again
    (:func:`_what_differs`). A work directory another edgesdk version made is resumed by that version only, which no
    argument puts back: that version is named, to install."""
    start_over = f"{without('--resume', terms)} to start over"
    differs = _what_differs(recorded, inputs, terms)
    then = recorded.get("edgesdk") if isinstance(recorded, dict) else None
    if not isinstance(then, str) or then == inputs.get("edgesdk"):
        return f"{start_over}, or pass the same arguments as the killed build{differs}"
    return (f"the work directory was made by edgesdk {then} (this is edgesdk {inputs.get('edgesdk')}): {start_over}, "
            f"or install edgesdk {then} (pip install edgesdk=={then}) and pass the same arguments as the killed "
            f"build{differs}")


def _what_differs(recorded, inputs: dict, terms: str = "cli", most: int = 4) -> str:
    """How the build key's values (``inputs``) differ from those the work directory's state file kept
    (``build_inputs``; none in one an older edgesdk wrote): `` and put back what changed (model.safetensors: modified
    since the killed build read it; target.power.entropy_target: 1.2 then, 1.5 now)``, at most ``most`` of them; ''
    where nothing is known. The refusal's part names say only which input changed; this names the file or the
    setting. The edgesdk version is not among them (no argument puts it back: :func:`_resume_fix` names it), nor,
    besides a part that a resume cannot make again, a stage's settings (or the context) that a resume makes its steps
    again for (:func:`_steps_of`): with the first put back, the resume goes on under the new ones, as this says."""
    if not isinstance(recorded, dict):
        return ""
    parts = [*inputs, *(part for part in recorded if part not in inputs)]  # the build key's order: model first
    changed = [part for part in parts if recorded.get(part) != inputs.get(part)]
    if "recipe" in changed:  # another list of stages: the stages' settings are not listed besides it
        changed = [part for part in changed if not part.startswith("stage:")]
    kept = [part for part in changed if _steps_of(part) is not None]  # what the resume makes its steps again for
    if len(kept) < len(changed):
        changed = [part for part in changed if _steps_of(part) is None and part != "edgesdk"]
    else:  # only resumable parts changed, yet _redone refused: a state file whose build_parts do not match its
        kept = []  # build_inputs (edited, or another layout): those changes are what to put back, not what can stay
    found: list[str] = []
    try:
        for part in first_stage_only(changed):
            found += _differences(recorded.get(part), inputs.get(part), part)
    except (TypeError, KeyError, IndexError):  # an edited state file: the refusal stands without the details
        return ""
    stay = ""
    if kept:
        names = " and ".join(part_named(part, terms) for part in first_stage_only(kept))
        stay = f"; {names} can stay as now (a resume makes the steps that read them again)"
    if not found:
        return stay
    shown = "; ".join(found[:most]) + (f"; and {len(found) - most} more" if len(found) > most else "")
    return f" and put back what changed ({shown}){stay}"


def _differences(then, now, where: str) -> list[str]:
    """What differs between a build key value as recorded (``then``) and as it is (``now``), at ``where`` (the dotted
    name of the setting): a file fingerprint's (:func:`file_fingerprint`) files by name, a list of fingerprints' files
    by path (:func:`_given_changes`), a mapping's entries, a list's items where both have as many, else the two
    values."""
    if then == now:
        return []
    if _is_fingerprint(then) and _is_fingerprint(now):
        return _file_changes(then, now)
    if _paths_given(then) is not None and _paths_given(now) is not None and _paths_given(then) != _paths_given(now):
        return _given_changes(then, now, where)
    if isinstance(then, dict) and isinstance(now, dict):
        return [line for key in sorted(set(then) | set(now))
                for line in _differences(then.get(key), now.get(key), f"{where}.{key}")]
    if isinstance(then, list) and isinstance(now, list) and len(then) == len(now):
        return [line for old, new in zip(then, now, strict=True) for line in _differences(old, new, where)]
    return [f"{where}: {_short(then)} then, {_short(now)} now"]


def _is_fingerprint(value) -> bool:
    return isinstance(value, dict) and isinstance(value.get("files"), dict) and isinstance(value.get("path"), str)


def _paths_given(value) -> list[str] | None:
    """The paths of a list of file fingerprints (the --data files, the --lora adapters), each given once, in order;
    None for any other value."""
    if not (isinstance(value, list) and all(_is_fingerprint(item) for item in value)):
        return None
    paths = [item["path"] for item in value]
    return paths if len(set(paths)) == len(paths) else None


def _given_changes(then: list, now: list, where: str) -> list[str]:
    """How two lists of file fingerprints with other paths differ: each file given to only one of the builds by its
    path, what changed in a file given to both (:func:`_file_changes`), else their order: a file added to --data is
    named by its path, not shown as the start of the two lists, cut at 60 characters (:func:`_short`)."""
    before = {item["path"]: item for item in then}
    after = {item["path"]: item for item in now}
    changes = [f"{where}: {path} given to the killed build, not now" for path in before if path not in after]
    changes += [f"{where}: {path} given now, not to the killed build" for path in after if path not in before]
    changes += [line for path in before if path in after for line in _file_changes(before[path], after[path])]
    if not changes:  # the same files, each as it was: in another order
        changes = [f"{where}: in the order {', '.join(before)} then, {', '.join(after)} now"]
    return changes


def _file_changes(then: dict, now: dict) -> list[str]:
    """The files of a model, data file or adapter that changed (moved, gone, new, resized or modified), and its other
    settings (an adapter's scale)."""
    if then["path"] != now["path"]:
        return [f"the path {then['path']} then, {now['path']} now"]
    changes = [line for key in sorted((set(then) | set(now)) - {"path", "files"})
               for line in _differences(then.get(key), now.get(key), key)]
    for name in sorted(set(then["files"]) | set(now["files"])):
        old, new = then["files"].get(name), now["files"].get(name)
        if new is None:
            changes.append(f"{name}: gone since the killed build read it")
        elif old is None:
            changes.append(f"{name}: new since the killed build read it")
        elif old[:1] != new[:1]:
            changes.append(f"{name}: {old[0]} bytes then, {new[0]} now")
        elif old != new:
            changes.append(f"{name}: modified since the killed build read it")
    return changes


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _layout(parts: dict) -> set[str]:
    """The names of the build key's parts that every build has (not the adapters, not a stage's settings)."""
    return {name for name in parts if name != "adapters" and not name.startswith("stage:")}


def first_stage_only(parts: list[str]) -> list[str]:
    """``parts`` with only the first ``stage:`` part: a stage's part holds the settings of the stages before it, so
    one stage's change changes the parts of every stage after it too, and naming those would read as more changes."""
    stages = [name for name in parts if name.startswith("stage:")]
    return [name for name in parts if not name.startswith("stage:") or name == stages[0]]


@dataclass(frozen=True)
class ResumeChanges:
    """What a --resume whose stage settings or context changed makes again, as the build tells it: each setting that
    changed (``"qat.seed: 0 then, 1 now"``), and each stage's training in flight that it discards, made under the
    earlier settings (``"qat's training at batch 20 of 48"``). Read by :class:`WorkDir` from the state file it takes,
    before it records the new settings and removes those trainings; empty where the earlier build's key is this
    one's, and for a build that does not resume."""

    changed_settings: tuple[str, ...] = ()
    discarded_training: tuple[str, ...] = ()


class WorkDir:
    def __init__(self, path: Path, build_key: dict, resume: bool, terms: str = "cli"):
        """``terms``: whose option names the messages use, the CLI's or build_bundle()'s (:func:`said`)."""
        self.path = Path(path)
        self.terms = terms
        self.discarded: list[str] = []  # steps an earlier build had finished there, removed by this one
        self.discarded_resumable = False  # they were this build's (the same build key): --resume goes on from them
        self.discarded_training: list[str] = []  # the training in flight of a stopped stage there, removed by this one
        self.redone: list[str] = []  # parts of the build key a resumed build changed, whose steps it makes again
        self.resume_changes = ResumeChanges()  # what in them changed, and the training in flight that goes with it
        self.key = _digest(build_key)
        self.parts = {name: _digest(value) for name, value in build_key.items()}
        # the build key's values as the state file keeps them, so a refused --resume can say what differs
        self.inputs = {name: json.loads(json.dumps(value, sort_keys=True, default=str))
                       for name, value in build_key.items()}
        self.holding = False  # this build holds the lock on its work directory (:meth:`_lock`)
        self.in_flight = None  # the running stage's training in flight (edgesdk/compress/train.py TrainingProgress)
        self.locked = self.path.is_dir() and not self.path.is_symlink()  # the directory found, locked here
        if self.locked:
            self._lock()
        try:
            state_file = self.path / STATE
            if resume and state_file.is_file():
                if not self.holding:  # none found by __init__: made since, by a build that may hold it now
                    self._lock()
                self._resume(state_file)
            else:
                self._start_over(state_file)
        except BaseException:  # refused or failed: this build makes nothing there, and holds no lock on it
            self.release()  # (a lock another build of this process holds stays that build's)
            raise

    def _lock(self) -> None:
        """Lock the work directory now at the path, giving up this build's lock on the one it replaced."""
        self.release()
        lock_work_dir(self.path, self.terms)
        self.holding = True

    def _resume(self, state_file: Path) -> None:
        """Take the state of the killed build that wrote ``state_file``; a BuildError where it is another build's."""
        self.state = self._read_state(state_file)
        if self.state.get("build_key") != self.key:
            redone = _redone(self.state.get("build_parts"), self.parts)
            if redone is None:
                raise BuildError(
                    f"{said('--resume', self.terms)}: the work directory {self.path} belongs to a different build: "
                    f"{_changed_parts(self.state.get('build_parts'), self.parts, self.terms)} changed since it was "
                    "written",
                    _resume_fix(self.state.get("build_inputs"), self.inputs, self.terms),
                )
            self.redone, steps = redone
            # told before forget() removes the trainings it names and the state file forgets the earlier settings
            self.resume_changes = _resume_changes(self.state, self.inputs, self.path, self.redone, steps)
            self.state["build_key"], self.state["build_parts"] = self.key, self.parts
            self.state["build_inputs"] = self.inputs
            self.forget(*steps)  # saves the state: from here on, the work directory is this build's
        self._remove_finished_trainings()

    def _remove_finished_trainings(self) -> None:
        """Remove the training in flight of each stage the taken state records as done: a kill after the state file
        recorded the stage and before the stage removed its training left it, and nothing reads it (the stage's
        checkpoint holds what it made; a stage made again removes it with :meth:`forget`), nor would remove it
        where the resumed build skips the stage."""
        for step in self.state["done"]:
            if step.startswith("stage:"):
                for file in _training_files(self.path / "stages", step.partition(":")[2]):
                    file.unlink(missing_ok=True)

    def _start_over(self, state_file: Path) -> None:
        """Replace the work directory with an empty one holding a fresh state, locked by this process."""
        check_work_dir(self.path, self.terms)
        if not self.locked and self.path.is_dir() and not self.path.is_symlink():  # made since __init__ found
            self._lock()  # none: by a build that may hold it now, refused, not deleted under it
        # the pipeline says what starting over threw away, and whether --resume would have gone on from it
        state = _state_as_read(state_file)
        self.discarded, self.discarded_resumable = _finished_steps(state, self.key, self.parts)
        self.discarded_training = _trainings_in_flight(self.path, state, self.key, self.parts, self.terms)
        remove_work_dir(self.path)
        try:
            self.path.mkdir(parents=True)
        except FileExistsError:  # made since it was removed: by a build on the same --out, which holds it
            check_work_dir(self.path, self.terms)  # anything else put there meanwhile is named as such
            raise _in_use(self.path, self.terms) from None
        self._lock()
        self.state = {"build_key": self.key, "build_parts": self.parts, "build_inputs": self.inputs, "done": {}}
        try:
            self._save()
        except BuildError:  # no state written (a full disk): the directory made here is left to no one, nor kept
            remove_work_dir(self.path)
            raise

    def _read_state(self, state_file: Path) -> dict:
        """The state file as a mapping with its ``done`` steps; a damaged one (a disk error, an edit) is a
        BuildError (the caller gives up the lock taken to read it)."""
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))
            problem = _state_problem(state)
            if problem:
                raise ValueError(problem)
        except (OSError, ValueError) as exc:  # json's and the decoder's errors are ValueErrors
            raise BuildError(f"{said('--resume', self.terms)}: the work directory's state file {state_file} cannot "
                             f"be read ({exc}), so the steps it finished are not known",
                             f"{without('--resume', self.terms)} to start over (the build replaces {self.path})") \
                from exc
        return state

    def release(self) -> None:
        """Give up the lock this build holds, if any (the build is over: its work directory is kept or removed)."""
        if self.holding:
            release_work_dir(self.path)
            self.holding = False

    def done(self, step: str) -> dict | None:
        return self.state["done"].get(step)

    def record_files(self, step: str, root: Path) -> None:
        """Note every file under ``root`` with its size and sha256 as ``step``'s; saved with the step's
        :meth:`mark_done`, which follows."""
        self.state.setdefault("files", {})[step] = _file_digests(root)

    def damaged(self, step: str, root: Path) -> str | None:
        """What differs under ``root`` from the files noted for ``step`` (missing, resized, changed or added
        files); None when nothing does, or when none were noted."""
        recorded = self.state.get("files", {}).get(step)
        if recorded is None:
            return None
        problems = []
        for name, (size, digest) in sorted(recorded.items()):
            file = root / name
            if not file.is_file():
                problems.append(f"{name} is missing")
            elif file.stat().st_size != size:
                problems.append(f"{name} has {file.stat().st_size} bytes, {size} when it was written")
            elif sha256_file(file) != digest:
                problems.append(f"{name} changed since it was written")
        present = set(_file_digests(root, hashes=False)) if root.is_dir() else set()
        problems += [f"{name} was not there when the step finished" for name in sorted(present - set(recorded))]
        return "; ".join(problems) or None

    def forget(self, *steps: str) -> None:
        """Record ``steps`` as not done (they will run again); a stage's training in flight, made from what changed,
        goes with it."""
        for step in steps:
            self.state["done"].pop(step, None)
            self.state.get("files", {}).pop(step, None)
            if step.startswith("stage:"):
                for file in _training_files(self.path / "stages", step.partition(":")[2]):
                    file.unlink(missing_ok=True)
        self._save()

    def mark_done(self, step: str, record: dict) -> dict:
        """Record ``step`` as done; returns the record as a resumed build reads it back (keys sorted, tuples
        as lists), so a build that runs straight through writes the same bundle as one that resumes."""
        record = json.loads(json.dumps(record, sort_keys=True, default=str))
        self.state["done"][step] = record
        try:
            self._save()
        except BuildError:  # not recorded (the state file could not be written): not a finished step to name
            del self.state["done"][step]
            raise
        return record

    def stage_checkpoint(self, index: int, name: str) -> Path:
        return self.path / "stages" / f"{index:02d}-{name}"

    def training_file(self, index: int, name: str) -> Path:
        """Where stage ``name`` (the ``index``-th) keeps its training in flight, until its checkpoint is recorded."""
        return self.path / "stages" / f"{index:02d}-{name}{TRAINING}"

    def stage_identity(self, name: str) -> str:
        """A digest of the build key's parts that stage ``name`` reads (every part but those only other steps read,
        :func:`_steps_of`): a training kept under another digest is not this build's stage."""
        read = {part: digest for part, digest in self.parts.items()
                if _steps_of(part) is None or f"stage:{name}" in _steps_of(part)}
        return _digest(read)

    def _save(self) -> None:
        """Write the state file whole (a rename: a kill never leaves half of it) and durably: its data reaches the
        disk before the rename publishes it, and the rename before a step counts as done. Without the flushes a
        power cut could leave an empty state file under the final name (ext4 and most file systems may write a
        rename before the data of the file renamed), and the resume refused, the build starting over."""
        tmp = self.path / (STATE + ".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(self.state, indent=2, sort_keys=True, default=str))
                sync_file(handle)
        except OSError as exc:  # the state on disk is the one before: a resumed build goes on from there
            try:
                tmp.unlink()  # a full disk keeps no half state file
            except OSError:
                pass
            on_disk = _state_as_read(self.path / STATE)  # none before a first step
            recorded, _ = _finished_steps(on_disk, self.key, self.parts)
            raise disk_refused(exc, f"the work directory's state file {tmp}", self.path,
                                ", then run the build again" +
                                (f" with {said('--resume', self.terms)} to go on from the steps it recorded before"
                                 if recorded else "")) from exc
        os.replace(tmp, self.path / STATE)
        sync_directory(self.path)


def _state_as_read(state_file: Path) -> dict | None:
    """A work directory's state file as a mapping with its ``done`` steps; None where it is missing or cannot be
    read (a disk error, an edit)."""
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if _state_problem(state) is None else None


def _finished_steps(state: dict | None, key: str, parts: dict) -> tuple[list[str], bool]:
    """The steps a work directory's state (:func:`_state_as_read`) records as done (none where it has none), and
    whether they belong to the build of ``key`` (whose parts' digests are ``parts``), or to one that --resume would
    go on from all the same (:func:`_redone`)."""
    if state is None:
        return [], False
    return list(state["done"]), state.get("build_key") == key or _redone(state.get("build_parts"), parts) is not None


def _trainings_in_flight(work_dir: Path, state: dict | None, key: str, parts: dict, terms: str = "cli") -> list[str]:
    """The training in flight a stopped build kept in ``work_dir`` (whose state, :func:`_state_as_read`, is
    ``state``) for a stage it had not finished, each as "qat's training at batch 72 of 2000"; one whose stage's
    settings changed since (which --resume trains again, though it goes on from the steps before) says so."""
    stages = work_dir / "stages"
    if work_dir.is_symlink() or not stages.is_dir():
        return []
    done = state["done"] if state is not None else {}
    redone = None if state is None else _redone(state.get("build_parts"), parts)
    found = []
    for kept in _kept_trainings(stages):
        stage = kept.name[3:-len(TRAINING)]
        if f"stage:{stage}" in done:  # a finished stage's: its checkpoint holds what it made
            continue
        words = f"{stage}'s training{_training_reached(kept)}"
        if state is not None and state.get("build_key") != key and redone is not None and \
                f"stage:{stage}" in redone[1]:  # a build --resume goes on from, but not from this stage's training
            words += f" (made under other settings of the stage: {said('--resume', terms)} would train it again)"
        found.append(words)
    return found


def _resume_changes(state: dict, inputs: dict, work_dir: Path, changed: list[str], steps: list[str]) -> ResumeChanges:
    """What a --resume that makes ``steps`` again, for the build key parts ``changed`` (:func:`_redone`), tells of:
    each setting that changed, from the values the state (of the work directory ``work_dir``) kept
    (``build_inputs``) to this build's ``inputs``, and the training in flight of each stage made again that had not
    finished (:func:`_kept_trainings`), where it had got."""
    recorded = state.get("build_inputs") if isinstance(state.get("build_inputs"), dict) else {}
    settings: list[str] = []
    for part in first_stage_only(changed):
        then, now = recorded.get(part), inputs.get(part)
        if part.startswith("stage:") and isinstance(then, list) and isinstance(now, list) and then and now:
            # a stage's part lists the stages up to it; the first part that changed changed in its last stage
            then, now, part = then[-1][-1], now[-1][-1], part.partition(":")[2]
        try:
            settings += _differences(then, now, part)
        except (TypeError, KeyError, IndexError):  # an edited state file: the note names the part alone
            pass
    discarded = [f"{step.partition(':')[2]}'s training{_training_reached(kept)}" for step in steps
                 if step.startswith("stage:") and step not in state["done"]
                 for kept in _kept_trainings(work_dir / "stages", step.partition(":")[2])]
    return ResumeChanges(tuple(settings), tuple(discarded))


def _kept_trainings(stages: Path, stage: str | None = None) -> list[Path]:
    """The trainings in flight kept in a work directory's ``stages`` folder (of stage ``stage``; of every stage where
    None): the whole files a training renamed into place (:meth:`WorkDir.training_file`), the one a resumed build goes
    on from and the one a build names as reached. Not the temporary file of a save a kill cut short (it is renamed
    over the kept one only once whole) nor the sha256 beside it: those go with it (:func:`_training_files`)."""
    if not stages.is_dir():
        return []
    name = "*" if stage is None else glob.escape(stage)
    return sorted(kept for kept in stages.glob(f"[0-9][0-9]-{name}{TRAINING}") if kept.is_file())


def _training_files(stages: Path, stage: str) -> list[Path]:
    """Every file of stage ``stage``'s training in flight in a work directory's ``stages`` folder, removed together:
    the kept one, the sha256 recorded beside it, and the temporaries of a save a kill cut short (each named after the
    kept file: edgesdk/compress/train.py TrainingProgress, ``.tmp``, ``.sha256``, ``.sha256.tmp``)."""
    if not stages.is_dir():
        return []
    return sorted(stages.glob(f"[0-9][0-9]-{glob.escape(stage)}{TRAINING}*"))


def _training_reached(kept: Path) -> str:
    """Where the kept training ``kept`` stopped (" at batch 72 of 2000"), read without loading its tensors; "" where
    that cannot be read (a damaged file, one written by an older edgesdk without its total)."""
    try:
        import torch

        state = torch.load(kept, map_location="cpu", weights_only=True, mmap=True)
        batch, total, unit = int(state["batch"]), state.get("total"), state.get("unit") or "batch"
    except Exception:  # torch's unpickler and zip reader raise many kinds on a damaged file
        return ""
    return f" at {unit} {batch}" + (f" of {int(total)}" if isinstance(total, int) else "")


def _state_problem(state) -> str | None:
    """What in a state file's content is not the shape :class:`WorkDir` writes: a mapping whose ``done`` maps each
    step to its record (a mapping), and whose ``files``, where present, map each step to its files' [size, sha256]
    pairs. None for a sound one. A resumed build reads every part: an edited or damaged part was a traceback
    (``'list' object has no attribute 'get'``) part-way through the build, not a refused resume."""
    if not (isinstance(state, dict) and isinstance(state.get("done"), dict)):
        return f"a mapping with a 'done' mapping was expected, got {str(state)[:80]!r}"
    for step, record in state["done"].items():
        if not isinstance(record, dict):
            return f"the record of step {step!r} is {str(record)[:40]!r}, not a mapping"
    files = state.get("files", {})
    if not isinstance(files, dict):
        return f"'files' is {str(files)[:40]!r}, not a mapping of steps"
    for step, recorded in files.items():
        if not isinstance(recorded, dict):
            return f"the files of step {step!r} are {str(recorded)[:40]!r}, not a mapping of file names"
        for name, pair in recorded.items():
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)
                    and isinstance(pair[1], str)):
                return f"the file {name!r} of step {step!r} is recorded as {str(pair)[:40]!r}, not [size, sha256]"
    return None


def _file_digests(root: Path, hashes: bool = True) -> dict:
    """Relative name -> [size, sha256] of every file under ``root`` (the sha256 None without ``hashes``)."""
    return {file.relative_to(root).as_posix(): [file.stat().st_size, sha256_file(file) if hashes else None]
            for file in sorted(Path(root).rglob("*")) if file.is_file()}


def save_checkpoint(model, tokenizer, path: Path, terms: str = "cli") -> None:
    """safetensors weights + config, written beside the final name and renamed (never half-written), durably: the
    files reach the disk before the rename, and the rename before the state file records the stage as done
    (:meth:`WorkDir.mark_done`, which follows); without the flushes a power cut after that record could leave the
    checkpoint missing or its files empty, and the resumed build train the stage again. A write the
    disk refuses (full, over a quota or a file size limit) is a BuildError naming the checkpoint, the space left and
    how to resume (``terms``: whose name for --resume, :func:`said`), and leaves no half checkpoint taking that space;
    it was safetensors' bare ``I/O error: No space left on device (os error 28)`` traceback, naming no file. ``path``
    is a stage's checkpoint in a build's work directory, ``<work>/stages/<NN-name>``
    (:meth:`WorkDir.stage_checkpoint`)."""
    partial = path.with_name(path.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    try:
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        _sync_tree(partial)  # a write the disk refuses late (NFS, a quota) fails here, named as the others
    except Exception as exc:
        if not _write_refused(exc):
            raise
        shutil.rmtree(partial, ignore_errors=True)  # a full disk keeps no half checkpoint
        work = path.parent.parent
        raise disk_refused(exc, f"the stage checkpoint {path}", work,
                            f", then run the build again with {said('--resume', terms)}: the steps finished before "
                            "this one are kept there", named=f"the build's work directory {work}") from exc
    if path.exists():
        shutil.rmtree(path)
    os.replace(partial, path)
    sync_directory(path.parent)  # the rename; and the stages folder's own entry, made with the first checkpoint
    sync_directory(path.parent.parent)


def sync_step_files(root: Path) -> None:
    """Flush every file under ``root`` (the export a step wrote), its directories and the entry naming ``root`` to the
    disk, before the state file records the step as done: after a power cut a recorded step's files are there whole
    (edgesdk/bundle.py ``_sync_tree``, as a bundle's before its rename into place)."""
    _sync_tree(root)
    sync_directory(root.parent)


def _write_refused(exc: Exception) -> bool:
    """``exc`` is the operating system refusing a write: an OSError, or the SafetensorError that safetensors' Rust
    writer raises for one (``Error while serializing: I/O error: ... (os error 28)``), which is no OSError."""
    return isinstance(exc, OSError) or (type(exc).__name__ == "SafetensorError" and "I/O error" in str(exc))


def free_space(directory: Path) -> str:
    """The space left on the disk holding ``directory``, in MB ("unknown space" where it cannot be read)."""
    try:
        return f"{shutil.disk_usage(directory).free / 1e6:,.0f} MB"
    except OSError:
        return "unknown space"


def disk_refused(exc: BaseException, what: str, directory: Path, then: str, named: str | None = None) -> BuildError:
    """The BuildError for a write the operating system refused while a build wrote ``what`` (its state file, a stage
    checkpoint, the export, the bundle: ``"the bundle /x/b"``): what could not be written, with the file the error
    names where that is not ``what`` itself, the error's own words (an OSError's ``No space left on device``, not its
    ``[Errno 28] ...: '/x/.b.partial/model.onnx.data'``), and the space left on the disk holding ``directory``. The
    fix frees space on that disk where it had no room (:func:`disk_full`: full, a quota, a file size limit), else
    makes ``directory`` writable (``named``: how it names it, ``directory`` itself by default), and goes on with
    ``then``, how to run the build again (``", then run the build again with --resume: ..."``)."""
    written = (getattr(exc, "filename2", None) or getattr(exc, "filename", None)) if isinstance(exc, OSError) else None
    written = os.fsdecode(written) if isinstance(written, (str, bytes, os.PathLike)) else None  # not a descriptor
    its_file = f" (its file {Path(written).name})" if written and written not in what else ""
    reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
    named = named or str(directory)
    return BuildError(f"cannot write {what}{its_file}: {reason} ({free_space(directory)} free on its disk)",
                      (f"free space on the disk holding {named}" if disk_full(exc) else f"make {named} writable")
                      + then)


def load_checkpoint(path: Path):
    """The model a stage saved, pruned layer shapes included (edgesdk/compress/structure.py)."""
    from edgesdk.compress.structure import load_pruned

    model = load_pruned(path)
    for hook in LOAD_HOOKS:
        model = hook(model, path)
    return model
