"""The bundle: a directory holding everything a board needs to run a model (DESIGN.md, "Bundle").

Layout::

    manifest.json          schema version, edgesdk version, target profile, model facts, stages,
                           graph spec, tokenizer facts, runtime defaults, eval, and every file
                           with its size and sha256
    manifest.sha256        sha256 of manifest.json, so any byte flipped anywhere is detected
    model.onnx (+ .data)   the decoder graph and its weights (``model.onnx.data.zlib`` when the
                           recipe entropy-codes them: edgesdk/weights_file.py)
    tokenizer.json         the tokenizers (Rust) tokenizer; chat_template.jinja when the model has one
    report.md              what was built and measured

A bundle is written to a temporary sibling directory and renamed into place only when complete.
Loading verifies every hash and the target before anything runs; nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import hashlib
import json
import os
import re
import shlex
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edgesdk import __version__
from edgesdk.deploy.board_common import (  # the board's own check before a switch holds the same rules
    SHA256_HEX,
    DuplicateKey,
    listed_facts_problem,
    name_problem,
    unique_keys,
    weights_record_problems,
)
from edgesdk.errors import BundleError, disk_full
from edgesdk.hashing import sha256_file

SCHEMA_VERSION = 2  # 2 adds graph.weights: the weights file may be entropy-coded (edgesdk/weights_file.py)
READABLE_SCHEMAS = (1, 2)
MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest.sha256"
REQUIRED_KEYS = ("schema_version", "edgesdk_version", "bundle_id", "target", "model", "graph", "tokenizer",
                 "runtime", "stages", "files")


def _relative_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file())


@dataclass(frozen=True)
class Bundle:
    """A verified bundle on disk."""

    path: Path
    manifest: dict

    @property
    def target(self) -> str:
        return self.manifest["target"]["name"]

    @property
    def bundle_id(self) -> str:
        return self.manifest["bundle_id"]

    def file(self, name: str) -> Path:
        return self.path / name


class BundleWriter:
    """Collects files in a temporary directory next to the destination, then commits atomically. ``terms``: whose
    names the refusal of a destination taken meanwhile gives the output directory, ``"cli"`` edgesdk build's
    (``--out``), ``"python"`` build_bundle()'s (``out``): BuildConfig.terms."""

    def __init__(self, destination: Path, terms: str = "cli"):
        self.destination = Path(destination)
        self.terms = terms
        self.staging = self.destination.with_name(f".{self.destination.name}.partial")
        try:
            _remove(self.staging)  # a killed write's; a link or a file there is removed too, never followed
            self.staging.mkdir(parents=True)
        except OSError as exc:
            raise _staging_refusal(self.destination, self.staging, exc, terms) from exc

    def add_file(self, source: Path, name: str | None = None) -> Path:
        target = self.staging / (name or Path(source).name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return target

    def write_text(self, name: str, text: str) -> Path:
        target = self.staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        return target

    def discard(self) -> None:
        """Remove what a write that failed or was stopped had staged (a copy of the weights, hidden by its
        leading dot); a bundle already at the destination stays."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def commit(self, manifest: dict) -> Bundle:
        """Hash every file, write the manifest, and rename the staging directory into place."""
        files = {}
        for name in _relative_files(self.staging):
            if name in (MANIFEST, MANIFEST_DIGEST):
                continue
            path = self.staging / name
            files[name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
        body = {
            "schema_version": SCHEMA_VERSION,
            "edgesdk_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **manifest,
            "files": files,
        }
        # The id names the content: the same model, target and stages give the same id (when and
        # how long it took to build are not content).
        content = {k: v for k, v in body.items() if k not in ("created", "bundle_id", "timings")}
        body["bundle_id"] = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
        missing = [key for key in REQUIRED_KEYS if key not in body]
        if missing:
            raise BundleError(f"bundle manifest lacks {missing}", "this is a bug in the build pipeline")
        text = json.dumps(body, indent=2, sort_keys=True) + "\n"
        (self.staging / MANIFEST).write_text(text, encoding="utf-8")
        (self.staging / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
        check_replaceable(self.destination, terms=self.terms)
        self._check_publishable(body)
        _move_into_place(self.staging, self.destination)
        return Bundle(self.destination, body)

    def _check_publishable(self, body: dict) -> None:
        """Refuse, before the rename that publishes it, a manifest verification would refuse (its shape, a file name
        the board refuses): the earlier bundle at the destination stays, rather than being replaced by one that then
        fails verification."""
        problems = _manifest_shape_problems(body)
        problems += [f"{name}: its name {problem}" for name, problem in
                     ((name, name_problem(name)) for name in sorted(body["files"])) if problem is not None]
        if problems:
            kept = f"; the bundle at {self.destination} is left as it was" if self.destination.exists() else ""
            raise BundleError(f"the bundle for {self.destination} was not written: its {MANIFEST} would fail "
                              "verification:\n  - " + "\n  - ".join(problems) + kept,
                              "this is a bug in the build pipeline")


def _staging_refusal(destination: Path, staging: Path, exc: OSError, terms: str) -> BundleError:
    """The refusal of a bundle whose staging directory cannot be made: the file that lies where a directory above it
    must be, or the operating system's reason (a directory not writable, a disk full), with the fix in the caller's
    terms (``--out`` or build_bundle()'s ``out``)."""
    option = "out" if terms == "python" else "--out"
    above = staging.parent
    while not _exists_or_hidden(above) and above != above.parent:
        above = above.parent
    if _is_file(above):
        return BundleError(f"the bundle {destination} cannot be written: {above} is a file, so no directory can be "
                           f"made under it", f"pass {option} a path whose parent is a directory (or does not exist "
                           f"yet), or move {above} away")
    if disk_full(exc):  # a full disk, a quota (EDQUOT) or a file size limit: space to free, not a permission
        return BundleError(f"the bundle {destination} cannot be written: the disk of {above} is full",
                           f"free space there, or pass {option} a path on another disk")
    return BundleError(f"the bundle {destination} cannot be written: its staging directory {staging} cannot be made "
                       f"({exc.strerror or exc})", f"pass {option} a path in a directory you may write, or make "
                       f"{above} writable")


def _exists_or_hidden(path: Path) -> bool:
    """Whether ``path`` exists, or cannot be looked at (a directory above it may not be searched, where Python
    before 3.13 raises PermissionError from Path.exists())."""
    try:
        return path.exists()
    except OSError:
        return True


def _is_file(path: Path) -> bool:
    """Whether ``path`` exists and is no directory; False where it cannot be looked at."""
    try:
        return path.exists() and not path.is_dir()
    except OSError:
        return False


def _move_into_place(staging: Path, destination: Path) -> None:
    """Rename the complete bundle ``staging`` to ``destination``. An earlier bundle there is first
    renamed aside to ``.NAME.old`` (read_manifest points to it if a kill comes between the two
    renames) and removed last, so a kill at any step leaves a whole bundle at one of the two names.

    A power cut is a kill too: the staged files are flushed to the disk before the renames, and the
    renames before the earlier bundle is removed (fsync(2); ext4 and most file systems may otherwise
    write a rename before the data of the files renamed, leaving empty files at the new name with the
    earlier bundle already gone)."""
    _sync_tree(staging)
    old = destination.with_name(f".{destination.name}.old")
    if destination.exists() or destination.is_symlink():
        _remove(old)  # what a commit killed while removing it left
        try:
            os.replace(destination, old)
        except OSError as exc:  # EBUSY: a mount point check_replaceable could not see (no /proc/self/mountinfo)
            raise BundleError(f"cannot replace {destination} with the new bundle: renaming it aside to {old.name} "
                              f"failed ({exc.strerror or exc}); it is left as it was",
                              f"write the bundle to a new directory (e.g. {destination / 'bundle'} when "
                              f"{destination} is a mount point)") from exc
    os.replace(staging, destination)
    sync_directory(destination.parent)
    _remove(old)  # this commit's earlier bundle, or one a commit killed between its renames left


def _sync_tree(root: Path) -> None:
    """Flush every regular file under ``root``, then each directory, to the disk."""
    for directory, _, names in os.walk(root):
        for name in names:
            file = os.path.join(directory, name)
            if os.path.islink(file) or not os.path.isfile(file):  # only the regular files staged here
                continue
            handle = os.open(file, os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)
        sync_directory(Path(directory))


def sync_file(handle) -> None:
    """Flush an open file's data to the disk before a rename publishes it (as _move_into_place does a bundle's):
    an archive packed onto an SD card or a USB drive that is pulled, or a power cut, after 'edgesdk pack' returned
    (or a build's state file, edgesdk/build/checkpoint.py) would otherwise be empty or cut under the final name."""
    handle.flush()
    os.fsync(handle.fileno())


def sync_directory(path: Path) -> None:
    """Flush a directory's entries (the names renamed or written in it); a file system that cannot sync a
    directory (EINVAL on some network and FUSE file systems) is left to its own order."""
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _remove(path: Path) -> None:
    """Remove a directory tree, a file, or a link (to a bundle: the bundle it names stays)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


REPLACE_FIX = "pass --out a new directory (or an earlier bundle to replace)"
# the same for build_bundle(), whose argument is out (edgesdk.build.checkpoint.said("--out", "python"))
PYTHON_REPLACE_FIX = "pass out a new directory (or an earlier bundle to replace)"


def check_replaceable(path: Path, fix: str | None = None, terms: str = "cli") -> None:
    """A bundle may be written at ``path``: nothing is there, an empty directory, or an earlier
    bundle (which it replaces). Anything else is the user's and is refused before any work.

    An earlier bundle is a directory with both ``manifest.json`` and ``manifest.sha256`` (every bundle
    BundleWriter commits has both; a file left in it by hand goes with it, as verification refuses it): a
    directory with only a ``manifest.json`` (a web app's, a browser extension's, a project's) is the user's,
    and the replace would delete it whole. A mount point (an SD card, a container's volume) cannot be renamed,
    which the replace does, so it is refused here too rather than after the build.

    ``fix``: the refusals' fix; by default :data:`REPLACE_FIX`, naming ``--out``, or with ``terms`` "python"
    :data:`PYTHON_REPLACE_FIX`, naming build_bundle()'s ``out`` (a mount point's fix names a directory inside it in
    those terms)."""
    path = Path(path)
    given = fix
    fix = fix or (PYTHON_REPLACE_FIX if terms == "python" else REPLACE_FIX)
    try:
        if not path.exists():
            return
    except OSError as exc:  # a directory above it may not be searched (Python before 3.13 raises PermissionError)
        raise BundleError(f"the output path {path} cannot be looked at ({exc.strerror or exc})",
                          given or f"pass {'out' if terms == 'python' else '--out'} a path in a directory you may "
                          "search (or make the directories above it searchable: chmod +x)") from exc
    if not path.is_dir():
        raise BundleError(f"the output path {path} is a file, not a bundle directory", fix)
    if _is_mount_point(path):
        raise BundleError(f"the output directory {path} is a mount point (a file system is mounted there: an SD "
                          "card, a USB drive, a container volume); a bundle is written beside its directory and "
                          "renamed into place, and a mount point cannot be renamed",
                          fix if given not in (None, REPLACE_FIX, PYTHON_REPLACE_FIX) else
                          f"pass --out a directory inside it instead, e.g. {path / 'bundle'}" if fix == REPLACE_FIX
                          else f"pass out a directory inside it instead, e.g. out={str(path / 'bundle')!r}")
    if any(path.iterdir()) and not ((path / MANIFEST).is_file() and (path / MANIFEST_DIGEST).is_file()):
        raise BundleError(f"the output directory {path} holds files and is not a bundle: writing the bundle there "
                          "would replace them", fix)


def _is_mount_point(path: Path) -> bool:
    """``path`` has a file system mounted on it: os.path.ismount, and on Linux also a bind mount of a directory
    of the same file system, which only /proc/self/mountinfo names (field 5, octal-escaped: proc(5))."""
    if os.path.ismount(path):
        return True
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except OSError:
        return False
    resolved = os.path.realpath(path)
    unescape = re.compile(r"\\([0-7]{3})")
    return any(len(fields) > 4 and unescape.sub(lambda m: chr(int(m[1], 8)), fields[4]) == resolved
               for fields in (line.split(" ") for line in lines))


def model_not_bundle(path: Path) -> BundleError | None:
    """``path`` is a model ``edgesdk build`` takes (a GGUF file by its magic, a Hugging Face directory by its
    config.json) rather than a bundle: the error that says to build one from it, else None."""
    if path.is_file():
        try:
            with open(path, "rb") as handle:
                magic = handle.read(4)
        except OSError:
            return None
        kind = "a GGUF model file" if magic == b"GGUF" else None
    else:
        kind = "a Hugging Face model directory (config.json)" if (path / "config.json").is_file() else None
    if kind is None:
        return None
    return BundleError(f"{path} is {kind}, not an edgesdk bundle",
                       f"build a bundle from it first: edgesdk build --model {path} --target TARGET "
                       "('edgesdk targets list' names them), then pass the bundle directory it prints")


def read_manifest(path: Path) -> dict:
    """Read and integrity-check manifest.json without checking the other files."""
    path = Path(path)
    model = model_not_bundle(path) if not (path / MANIFEST).exists() else None
    if model is not None:
        raise model
    if path.is_file():
        # a bundle's own file (bundle/model.onnx, as llama.cpp's -m takes a model file): its fix is not an archive's
        if path.name in (MANIFEST, MANIFEST_DIGEST) or (path.parent / MANIFEST).is_file():
            raise BundleError(f"bundle {path} is a file, not a bundle directory: the {path.name} of a bundle",
                              f"pass the directory that holds it: {path.parent}")
        raise BundleError(f"bundle {path} is a file, not a bundle directory",
                          f"if it is an archive made by 'edgesdk pack', unpack it first: edgesdk unpack {path} DIR")
    if not path.is_dir():
        left = path.with_name(f".{path.name}.old")
        if left.is_dir():  # a write killed between its two renames (BundleWriter.commit)
            raise BundleError(f"bundle {path} does not exist, but {left} holds the bundle that was there before an "
                              "interrupted write", f"rename it back (mv {left} {path}) or build again")
        raise BundleError(f"bundle {path} does not exist or is not a directory",
                          "pass the directory written by 'edgesdk build' (or unpacked by 'edgesdk unpack')")
    manifest_path, digest_path = path / MANIFEST, path / MANIFEST_DIGEST
    for required in (manifest_path, digest_path):
        if not required.is_file():
            inner = _bundles_inside(path) if not manifest_path.exists() else []
            if inner:
                raise BundleError(f"{path} is not a bundle but holds {len(inner)}: {', '.join(map(str, inner[:3]))}",
                                  f"pass the bundle itself, e.g. {inner[0]}")
            raise BundleError(f"bundle {path} has no {required.name}: it is incomplete or not a bundle",
                              "rebuild it with 'edgesdk build'")
    try:
        raw = manifest_path.read_bytes()
        # Only the one newline the writer adds is dropped: strip() would also drop a "\n" flipped to "\v".
        expected = digest_path.read_text(encoding="utf-8", errors="replace").removesuffix("\n")
    except OSError as exc:  # not this user's to read, or a failing disk or card (EIO)
        name = Path(exc.filename).name if exc.filename else MANIFEST
        raise BundleError(f"bundle {path}: {name} cannot be read ({exc.strerror or exc})",
                          f"let this user read the bundle (as its owner or with sudo: chmod -R a+rX {path})"
                          if isinstance(exc, PermissionError) else "re-copy the bundle, or rebuild it") from exc
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected:
        raise _digest_refusal(path, actual, expected)
    try:
        manifest = json.loads(raw, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise BundleError(f"bundle {path}: {MANIFEST} gives the key {exc.args[0]!r} more than once in one object, so "
                          "readers could take either value", "rebuild the bundle with 'edgesdk build'") from exc
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, a 5000-digit number, deep nesting
        raise BundleError(f"bundle {path}: {MANIFEST} is not valid JSON ({exc})", "rebuild the bundle") from exc
    refusal = _schema_refusal(path, manifest)
    if refusal is not None:
        raise refusal
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise BundleError(f"bundle {path}: manifest lacks {missing}", "rebuild the bundle")
    problems = _manifest_shape_problems(manifest)
    if problems:
        raise BundleError(f"bundle {path}: {MANIFEST} is malformed:\n  - " + "\n  - ".join(problems),
                          "the manifest was edited by hand; rebuild the bundle with 'edgesdk build'")
    return manifest


def _schema_refusal(path: Path, manifest: object) -> BundleError | None:
    """The refusal of a manifest this edgesdk cannot read, else None. A schema version it does not know (a whole
    number from 1) names the edgesdk that wrote the bundle; a manifest that is no JSON object, or one whose
    schema_version is missing, no whole number or below 1, is no version's: it is named as malformed, with
    rebuilding as the fix (installing "the edgesdk that built it" was offered, naming this very edgesdk)."""
    readable = ", ".join(map(str, READABLE_SCHEMAS))
    malformed_fix = "the manifest was edited by hand or damaged; rebuild the bundle with 'edgesdk build'"
    if not isinstance(manifest, dict):
        return BundleError(f"bundle {path}: {MANIFEST} holds a JSON {type(manifest).__name__}, not the object (with "
                           f"a schema_version, one of {readable}) a bundle's manifest is", malformed_fix)
    schema = manifest.get("schema_version")
    found = _no_schema_version(manifest)
    if found is not None:
        return BundleError(f"bundle {path}{found}; this edgesdk ({__version__}) reads versions {readable}",
                           malformed_fix)
    if schema in READABLE_SCHEMAS:
        return None
    built_by = manifest.get("edgesdk_version")
    other = isinstance(built_by, str) and built_by != __version__
    return BundleError(
        f"bundle {path} has manifest schema version {schema}; this edgesdk ({__version__}) reads versions {readable}",
        "rebuild the bundle with this edgesdk version, or install the edgesdk that built it"
        + (f" (edgesdk {built_by})" if other else ""),
    )




def _no_schema_version(manifest: dict) -> str | None:
    """What makes the manifest's schema_version no version any edgesdk wrote (missing, no whole number, below 1: the
    versions count from 1), worded to follow "bundle PATH"; None for a whole number from 1."""
    if "schema_version" not in manifest:
        return f": {MANIFEST} has no schema_version"
    schema = manifest["schema_version"]
    if isinstance(schema, bool) or not isinstance(schema, int):
        return f" has manifest schema version {schema!r:.40}, which is no whole number"
    if schema < 1:
        return f" has manifest schema version {schema}, which no edgesdk wrote (the versions count from 1)"
    return None


def _digest_refusal(path: Path, actual: str, expected: str) -> BundleError:
    """The refusal of a manifest whose sha256 ``actual`` is not the one manifest.sha256 gives (``expected``, its
    text less the newline). A text that is no sha256 at all (an empty file, one cut short by a copy, a damaged
    byte) is shown quoted and named as the damaged file, with re-copying as the fix."""
    said = f"{MANIFEST_DIGEST} says {expected!r:.100}" if expected else f"{MANIFEST_DIGEST} is empty"
    if SHA256_HEX.fullmatch(expected) is None:
        return BundleError(f"bundle {path}: {said}, which is no sha256 (64 lowercase hex digits, as 'edgesdk build' "
                           f"writes it): {MANIFEST_DIGEST} is damaged or was cut short ({MANIFEST} has sha256 {actual})",
                           "re-copy the bundle from where it was built, or rebuild it with 'edgesdk build'")
    return BundleError(f"bundle {path}: {MANIFEST} has sha256 {actual}, {said}",
                       "the manifest was modified or corrupted; rebuild or re-copy the bundle")


def _bundles_inside(path: Path) -> list[Path]:
    """Bundles one level down: a deploy root's ``current``, or the folder 'edgesdk unpack' wrote into."""
    try:
        children = sorted(path.iterdir(), key=lambda child: (child.name != "current", child.name))
    except OSError:
        return []
    return [child for child in children if (child / MANIFEST).is_file()]


def _manifest_shape_problems(manifest: dict) -> list[str]:
    """What in a manifest (whose digest matched, so edited on purpose) the runtime could not use:
    wrong types, and files it opens that are not listed (they would escape verification)."""
    problems = []
    files = manifest["files"]
    if not isinstance(files, dict):
        return [f"'files' must map file names to {{size, sha256}}, got {type(files).__name__}"]
    for name, facts in files.items():  # a size of true, or a sha256 in capitals, named the intact file as corrupted
        problem = listed_facts_problem(name, facts)
        if problem is not None:
            problems.append(problem.removeprefix(f"{MANIFEST}: "))
    bundle_id = manifest["bundle_id"]
    if not _plain_name(bundle_id):  # names the engine directories (engines/<bundle-id>) and the board's release
        problems.append(f"'bundle_id' must be a plain name (letters, digits, '-', '_', '.'), got {bundle_id!r:.80}")
    for key, needed in (("target", "name"), ("graph", "file"), ("tokenizer", "file")):
        section = manifest[key]
        if not isinstance(section, dict) or not isinstance(section.get(needed), str):
            problems.append(f"'{key}' must be a mapping with a '{needed}' string, got {section!r:.80}")
    problems += _runtime_section_problems(manifest["runtime"])
    problems += _model_section_problems(manifest["model"])
    stages = manifest["stages"]
    if not (isinstance(stages, list) and all(isinstance(stage, dict) and isinstance(stage.get("stage"), str)
                                             for stage in stages)):
        problems.append(f"'stages' must be a list of mappings with a 'stage' string, got {stages!r:.80}")
    graph = manifest["graph"]
    if isinstance(graph, dict):
        problems += _graph_facts_problems(graph)
        problems += _weights_record_problems(graph.get("weights"))
    tokenizer = manifest["tokenizer"]
    if isinstance(tokenizer, dict):
        problems += _tokenizer_facts_problems(tokenizer)
    sparse = manifest.get("sparse")
    kernels = sparse.get("kernels") if isinstance(sparse, dict) else None
    if sparse is not None and not (isinstance(sparse, dict) and isinstance(sparse.get("weights"), str) and (
            not kernels or (isinstance(kernels, dict) and isinstance(kernels.get("dir"), str)))):
        problems.append(f"'sparse' must be a mapping with a 'weights' string (and 'kernels', when present, a "
                        f"mapping with a 'dir' string), got {sparse!r:.120}")
    problems += _generation_section_problems(manifest.get("generation"))
    if problems:
        return problems
    weights = manifest["graph"].get("weights") or {}
    # The triton backend reads the block-sparse weights and loads the kernel directory's index.json and the
    # cubins it names onto the GPU: both must lie in the bundle, under verification.
    opened = [manifest["graph"]["file"], manifest["tokenizer"]["file"], manifest["tokenizer"].get("chat_template"),
              weights.get("file"), sparse["weights"] if sparse is not None else None,
              f"{PurePosixPath(kernels['dir']).as_posix()}/index.json" if kernels else None]
    return [f"'{name}' is opened by the runtime but not listed in 'files'" for name in opened
            if name is not None and name not in files]


LARGEST_DIMENSION = (1 << 31) - 1  # the graphs take sequence lengths as int32 (seqlens_k, total_sequence_length)


def _plain_name(name) -> bool:
    """A directory or file name that names nothing else: the rule the board's deploy helper applies to bundle ids."""
    return (isinstance(name, str) and name != "" and not name.startswith(".")
            and all(char.isalnum() or char in "-_." for char in name))


def _whole(value, least: int = 1, most: int | None = LARGEST_DIMENSION) -> bool:
    """Whether ``value`` is an int (not a bool) from ``least`` to ``most`` (None: no upper bound)."""
    return (isinstance(value, int) and not isinstance(value, bool) and least <= value
            and (most is None or value <= most))


GRAPH_FACTS = ("kv_heads", "head_dim", "max_context", "vocab_size")


def _graph_facts_problems(graph: dict, required: bool = False) -> list[str]:
    """The graph facts every backend sizes its KV cache and checks token ids with (kv_heads per layer, head_dim,
    max_context, vocab_size), and the optional fields it reads: whole numbers in range, of the right types.
    Verification checks those present; ``required`` (opening the bundle to run it) needs all four."""
    problems = []
    kv_heads = graph.get("kv_heads")
    if (required or "kv_heads" in graph) and not (
            isinstance(kv_heads, list) and kv_heads and all(_whole(kv) for kv in kv_heads)):
        problems.append(f"'graph.kv_heads' must be a non-empty list of whole numbers from 1 to {LARGEST_DIMENSION} "
                        f"(the KV heads of each layer), got {kv_heads!r:.80}")
    for key in ("head_dim", "max_context", "vocab_size"):
        if (required or key in graph) and not _whole(graph.get(key)):
            problems.append(f"'graph.{key}' must be a whole number from 1 to {LARGEST_DIMENSION}, "
                            f"got {graph.get(key)!r:.80}")
    layers = graph.get("num_layers")
    if layers is not None and isinstance(kv_heads, list) and (not _whole(layers) or layers != len(kv_heads)):
        problems.append(f"'graph.num_layers' must be the number of layers 'graph.kv_heads' lists ({len(kv_heads)}), "
                        f"got {layers!r:.80}")
    for key in ("form", "dtype"):
        if key in graph and not isinstance(graph[key], str):
            problems.append(f"'graph.{key}' must be a string, got {graph[key]!r:.80}")
    for key in ("inputs", "outputs", "power"):
        if key in graph and not isinstance(graph[key], dict) and not (key == "power" and graph[key] is None):
            problems.append(f"'graph.{key}' must be a mapping, got {graph[key]!r:.80}")
    needed = graph.get("min_onnxruntime")
    if needed and not (isinstance(needed, list) and len(needed) >= 2 and all(_whole(part, 0) for part in needed)):
        problems.append(f"'graph.min_onnxruntime' must be a version as a list of whole numbers, e.g. [1, 22], "
                        f"got {needed!r:.80}")
    return problems


def _tokenizer_facts_problems(tokenizer: dict) -> list[str]:
    """The tokenizer facts the runtime reads besides its file: the ids that end generation and the
    special tokens' text the chat template is given (and the padding token, which the GGUF export writes; bundles
    built before it was recorded have none)."""
    problems = []
    ids = tokenizer.get("eos_token_ids", [])
    if not (isinstance(ids, list) and all(_whole(token, 0) for token in ids)):
        problems.append(f"'tokenizer.eos_token_ids' must be a list of token ids (whole numbers >= 0), got {ids!r:.80}")
    for key in ("chat_template", "bos_token", "eos_token", "pad_token"):
        if tokenizer.get(key) is not None and not isinstance(tokenizer[key], str):
            problems.append(f"'tokenizer.{key}' must be a string or null, got {tokenizer[key]!r:.80}")
    # the other special tokens the chat template is given, recorded only where the tokenizer has one (bundles built
    # before they were recorded have none, and the runtime then finds the unknown token in tokenizer.json)
    for key in ("unk_token", "sep_token", "cls_token", "mask_token"):
        if key in tokenizer and not isinstance(tokenizer[key], str):
            problems.append(f"'tokenizer.{key}' must be the token's text, a string (left out where the tokenizer has "
                            f"no such token), got {tokenizer[key]!r:.80}")
    return problems


def _weights_record_problems(record) -> list[str]:
    """'graph.weights' (edgesdk/weights_file.py), when present: the runtime reads every field, and
    writes the inflated bytes under 'external_name' in a temporary directory, so it must be a bare
    file name (a path would write them anywhere). The board's own check before a switch
    (edgesdk/deploy/board_common.py, standalone there) holds the rule; its lines lose its 'manifest.json: ' here."""
    return [problem.removeprefix(f"{MANIFEST}: ") for problem in weights_record_problems(record)]


def _runtime_section_problems(runtime) -> list[str]:
    """The 'runtime' section the session and 'inspect' read: backend, fallbacks and threads."""
    if not isinstance(runtime, dict):
        return [f"'runtime' must be a mapping with 'backend', 'fallbacks' and 'threads', got {runtime!r:.80}"]
    problems = []
    if not isinstance(runtime.get("backend"), str):
        problems.append(f"'runtime' must have a 'backend' string, got {runtime.get('backend')!r:.80}")
    fallbacks = runtime.get("fallbacks", [])
    if not (isinstance(fallbacks, list) and all(isinstance(name, str) for name in fallbacks)):
        problems.append(f"'runtime.fallbacks' must be a list of backend names, got {fallbacks!r:.80}")
    threads = runtime.get("threads")
    if not (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1):
        problems.append(f"'runtime.threads' must be a whole number of at least 1, got {threads!r:.80}")
    return problems


def _generation_section_problems(section) -> list[str]:
    """The optional 'generation' section: the sampling settings the model's authors publish (its
    generation_config.json or GGUF general.sampling keys, edgesdk/models/generation_defaults.py), which run, serve
    and load() take for every option not given. Absent: none (bundles built before it stay valid)."""
    if section is None:
        return []
    if not (isinstance(section, dict) and isinstance(section.get("sampling"), dict)
            and isinstance(section.get("source"), str)):
        return [f"'generation' must be a mapping with a 'sampling' mapping (temperature, top_p, ...) and a 'source' "
                f"string, got {section!r:.120}"]
    from edgesdk.models.generation_defaults import sampling_value_problem

    problems = []
    for name, value in section["sampling"].items():
        problem = sampling_value_problem(name, value)
        if problem is not None:
            problems.append(f"'generation.sampling.{name}' {problem}" if problem.startswith(("is ", "must "))
                            else f"'generation.sampling.{name}': {problem}")
    return problems


def _model_section_problems(model, required: bool = False) -> list[str]:
    """The 'model' section (the model's facts before and after the build): a mapping, its 'before' and 'after'
    mappings where present. Verification checks that much (deploy and pack read none of it); ``required`` (opening
    the bundle to run it) also needs the facts the runtime reads: 'model.before.source', which names the model in
    every answer (``<model>-<target>``, edgesdk/serve/openai_answer.py served_model_name), and the 'hidden_size' an
    embedding's width is checked against (``model.after``'s, else ``model.before``'s: serve/embeddings.py)."""
    if not isinstance(model, dict):
        return [f"'model' must be a mapping with the model's facts ('before', 'after'), got {model!r:.80}"]
    problems = [f"'model.{key}' must be a mapping of the model's facts, got {model[key]!r:.80}"
                for key in ("before", "after") if model.get(key) is not None and not isinstance(model[key], dict)]
    # optional (older bundles lack them): the model's attention window where it has one, which the graph holds only
    # where it is shorter than the bundle's context, and GGUF export writes (export/gguf_export.py); the model's
    # positions, which cap the context a build can give it (named where run's -c asks past the bundle's)
    problems += [f"'model.{key}.{fact}' must be a whole number from 1 to {LARGEST_DIMENSION} ({meaning}), got "
                 f"{model[key][fact]!r:.80}"
                 for fact, meaning in (("sliding_window", "the model's attention window, in tokens"),
                                       ("max_position_embeddings", "the model's positions, in tokens"))
                 for key in ("before", "after") if isinstance(model.get(key), dict)
                 and model[key].get(fact) is not None and not _whole(model[key][fact])]
    if problems or not required:
        return problems
    before = model.get("before")
    if not isinstance(before, dict) or not isinstance(before.get("source"), str):
        source = before.get("source") if isinstance(before, dict) else None
        problems.append("'model.before' must be a mapping with a 'source' string (the model the bundle was built "
                        f"from, which names it in answers), got source {source!r:.80}")
    facts = model.get("after") or before or {}
    if not _whole(facts.get("hidden_size")):
        where = "model.after" if model.get("after") else "model.before"
        problems.append(f"'{where}.hidden_size' must be a whole number from 1 to {LARGEST_DIMENSION} (the model's "
                        f"width, an embedding's values), got {facts.get('hidden_size')!r:.80}")
    return problems


def model_positions(manifest: dict) -> int | None:
    """The model's max_position_embeddings that ``manifest`` records ('model.before''s, else 'model.after''s): the
    most tokens of context 'edgesdk build --max-context' gives a bundle of the model (the build makes the bundle's
    context the smaller of the two). None for a bundle built before the manifest recorded it."""
    model = manifest.get("model") if isinstance(manifest, dict) else None
    for key in ("before", "after"):
        facts = model.get(key) if isinstance(model, dict) else None
        if isinstance(facts, dict) and _whole(facts.get("max_position_embeddings")):
            return int(facts["max_position_embeddings"])
    return None


# How a bundle of another context is built, in the caller's terms: the command line's ('edgesdk build') and the
# Python API's (build_bundle()): the words that make the build the fix, the build of a context of N, and the fix
# where the model's positions are not recorded
CONTEXT_TERMS = {"cli": ("rebuild the bundle with", "'edgesdk build --max-context {}'",
                         "rebuild the bundle with a larger --max-context"),
                 "python": ("build the bundle again with", "build_bundle(..., max_context={})",
                            "build the bundle again with a larger context (build_bundle(..., max_context=N))")}


def context_build(context: int | str, terms: str = "cli") -> str:
    """The build of a bundle with a context of ``context`` tokens in ``terms`` (:data:`CONTEXT_TERMS`)."""
    return CONTEXT_TERMS[terms][1].format(context)


def rebuild_with(context: int | str, terms: str = "cli") -> str:
    """The fix that builds the bundle again with a context of ``context`` tokens, in ``terms``."""
    return f"{CONTEXT_TERMS[terms][0]} {context_build(context, terms)}"


def _the_most(rebuild: str, positions: int) -> str:
    return f"{rebuild}, the most the model's max_position_embeddings ({positions}) allows"


def largest_context_rebuild(positions: int, terms: str = "cli") -> str:
    """The rebuild that gives a bundle of the model the most context its ``positions`` (:func:`model_positions`)
    allow, in ``terms``."""
    return _the_most(rebuild_with(positions, terms), positions)


def at_model_positions(positions: int) -> str:
    """Says that a bundle's context is its model's ``positions`` already (:func:`model_positions`)."""
    return (f"the model's max_position_embeddings is {positions}, this bundle's context: no build of the model goes "
            "past it")


# where a run's context held below its bundle's came from (:meth:`edgesdk.runtime.session.Runtime.cap_context`'s
# ``source``, kept as the backend's ``context_source``): the command line's -c N, llama.cpp's environment variable
# for it (edgesdk.cli_llama.CTX_SIZE_ENV, named here as importing that module imports click), the Python API's
# load(..., n_ctx=N). Each -> the setting a fix raises, and how it gives the bundle's whole context: a run held by
# the variable was told to "raise -c", which its user never passed
CTX_SIZE_SOURCE = "LLAMA_ARG_CTX_SIZE"
CONTEXT_SOURCES = {
    "-c": ("-c", "-c 0: all of it"),
    CTX_SIZE_SOURCE: (CTX_SIZE_SOURCE, f"{CTX_SIZE_SOURCE}=0 or unset: all of it"),
    "n_ctx": ("n_ctx", "n_ctx=0: all of it"),
}


def held_setting(source: str = "-c") -> tuple[str, str]:
    """(the setting, how it gives the whole context) for a run held below its bundle's context by ``source``
    (:data:`CONTEXT_SOURCES`): what a fix raises, "-c" and "-c 0: all of it" for the command line's ``-c N``. A
    label of no known source is named as given, as ``-c`` is."""
    return CONTEXT_SOURCES.get(source, (source, f"{source} 0: all of it"))


def capped_context(max_context: int, built: int | None = None, source: str = "-c") -> str | None:
    """The words for a run's context of ``max_context`` tokens held below the ``built`` one its bundle has (llama.cpp's
    ``-c N`` or LLAMA_ARG_CTX_SIZE, load()'s ``n_ctx``: :meth:`edgesdk.runtime.session.Runtime.cap_context`), which
    a refusal of tokens past it names in place of "the bundle's max_context": called that, a ``-c 512`` run of a
    2048-token bundle sent its user to rebuild a bundle that held the prompt already. ``source``: what held it (the
    backend's ``context_source``), named beside the context, as the user set it (:data:`CONTEXT_SOURCES`). None
    where the run holds the bundle's whole context (``built`` None, not a number, or not above ``max_context``)."""
    if isinstance(built, bool) or not isinstance(built, int) or built <= max_context:
        return None
    return f"this run's context, {max_context} ({source}), of the bundle's {built}"


# How a run held below its bundle's context gets more of it, in the caller's terms (as CONTEXT_TERMS): the command
# line's -c N, the Python API's load(..., n_ctx=N). Each: raising the run's context to the tokens needed; that the
# bundle's whole context holds fewer than them; raising it where the tokens needed are not counted
HELD_CONTEXT_TERMS = {
    "cli": ("raise -c to {needed} or more, up to the bundle's {built} (-c 0: all of it)",
            "raising -c up to the bundle's {built} holds fewer than {needed} tokens",
            "raise -c up to the bundle's {built} (-c 0: all of it)"),
    "python": ("load the bundle with load(..., n_ctx={needed}) or more, up to the bundle's {built} (n_ctx=0: all of "
               "it)",
               "load(..., n_ctx=N) up to the bundle's {built} holds fewer than {needed} tokens",
               "load the bundle with a larger load(..., n_ctx=N), up to the bundle's {built} (n_ctx=0: all of it)"),
    # a run held by llama.cpp's environment variable for -c (its ``source``: :data:`CONTEXT_SOURCES`)
    "env": (f"raise {CTX_SIZE_SOURCE} to {{needed}} or more, up to the bundle's {{built}} ({CTX_SIZE_SOURCE}=0 or "
            "unset: all of it)",
            f"raising {CTX_SIZE_SOURCE} up to the bundle's {{built}} holds fewer than {{needed}} tokens",
            f"raise {CTX_SIZE_SOURCE} up to the bundle's {{built}} ({CTX_SIZE_SOURCE}=0 or unset: all of it)"),
}
# a held run's ``source`` (:data:`CONTEXT_SOURCES`) -> the HELD_CONTEXT_TERMS that word raising it
SOURCE_TERMS = {"-c": "cli", CTX_SIZE_SOURCE: "env", "n_ctx": "python"}


def context_fix(shorten: str, max_context: int, positions: int | None, needed: int | None = None,
                unknown: str | None = None, terms: str = "cli", built: int | None = None,
                source: str | None = None) -> str:
    """The fix of a refusal of ``needed`` tokens (None: not counted) past a bundle's context, ``max_context``:
    ``shorten`` (what the caller can make shorter, e.g. "shorten the prompt") or, where the model's ``positions``
    (:func:`model_positions`) hold more, the context to build the bundle again with, the most they allow. Where the
    bundle's context is at them already, or ``needed`` is past them, no rebuild holds it: ``shorten`` is the fix,
    and says why. ``positions`` None (a bundle built before the manifest recorded them): ``unknown``, the caller's
    own words, by default ``shorten`` or a rebuild with a larger context. ``terms`` (:data:`CONTEXT_TERMS`) words
    the build: the command line's 'edgesdk build --max-context N' (``cli``), the Python API's
    build_bundle(..., max_context=N) (``python``). ``built``: the context the bundle was built with, where the run
    holds less (:func:`capped_context`): raising the run's context up to it (``-c``, or load()'s ``n_ctx`` in
    ``python`` terms: :data:`HELD_CONTEXT_TERMS`) comes before any rebuild, and is the whole fix where it holds
    ``needed``. ``source``: what held the run (the backend's ``context_source``), whose setting that fix raises
    (:data:`SOURCE_TERMS`: LLAMA_ARG_CTX_SIZE where the environment held it, not ``-c``); None: ``terms``' own."""
    if capped_context(max_context, built) is not None:
        held = HELD_CONTEXT_TERMS[SOURCE_TERMS.get(source, terms)]
        if needed is not None and needed <= built:
            return f"{shorten}, or {held[0].format(needed=needed, built=built)}"
        if needed is not None:  # the bundle's whole context holds fewer too: a rebuild's fix, of the built context
            return context_fix(f"{shorten} ({held[1].format(needed=needed, built=built)})", built, positions, needed,
                               None, terms)
        return context_fix(f"{shorten}, or {held[2].format(built=built)}", built, positions, None, None, terms)
    if positions is None:
        return unknown or f"{shorten}, or {CONTEXT_TERMS[terms][2]}"
    if max_context >= positions:
        return f"{shorten}: {at_model_positions(positions)}"
    largest = context_build(positions, terms)
    if needed is not None and needed > positions:
        return (f"{shorten}: the model's max_position_embeddings is {positions}, fewer than the {needed} tokens, and "
                f"no build of the model goes past it ({largest} gives the most)")
    return f"{shorten}, or {largest_context_rebuild(positions, terms)}"


def check_runnable(bundle: Bundle) -> None:
    """Refuse a verified bundle whose manifest lacks a graph fact the runtime sizes its KV cache with, or a model
    fact it reads (verification accepts a manifest without them: deploy and pack need none), before any backend
    opens: a missing one was a bare KeyError once the runtime had opened."""
    problems = (_graph_facts_problems(bundle.manifest["graph"], required=True)
                + _model_section_problems(bundle.manifest["model"], required=True))
    if problems:
        raise BundleError(f"bundle {bundle.path}: {MANIFEST} cannot be run:\n  - " + "\n  - ".join(problems),
                          "the manifest was edited by hand; rebuild the bundle with 'edgesdk build'")
    _check_weights_links(bundle)


def _check_weights_links(bundle: Bundle) -> None:
    """Refuse a plain weights file (the graph's external data, beside the graph) that is a link to a file outside the
    directory the graph itself lies in, where the installed ONNX Runtime is 1.30 or later. Verification takes a listed
    file that is a link (pack stores the file it names), but ONNX Runtime 1.30 on refuses external data whose resolved
    path leaves the model's resolved directory ("External data path escapes model directory"): a bundle whose weights
    were linked to a shared copy verified, then failed as the backend opened, its fix saying to run 'edgesdk verify',
    which passed. An older ONNX Runtime (pyproject takes 1.18 on; a board's wheel is often older than 1.30) reads
    such a link, and without ONNX Runtime (the tensorrt backend) nothing reads the weights through it: no refusal
    there. Entropy-coded weights ('graph.weights') are read by edgesdk itself and handed to ONNX Runtime as bytes: a
    link there is fine."""
    graph = bundle.manifest["graph"]
    if graph.get("weights") is not None:
        return
    model = bundle.path / graph["file"]
    folder = PurePosixPath(graph["file"]).parent
    linked = [name for name in bundle.manifest["files"]
              if PurePosixPath(name).parent == folder and name != graph["file"] and (bundle.path / name).is_symlink()]
    if not linked or not model.is_file():  # no link, nothing to read (every bundle edgesdk writes), or no graph yet
        return
    home = os.path.dirname(os.path.realpath(model))
    escaping = [name for name in linked if not _lies_in(os.path.realpath(bundle.path / name), home)]
    if not escaping or not _onnxruntime_refuses_escaping_links():
        return
    from edgesdk.weights_file import read_graph_tensors

    try:
        tensors, _ = read_graph_tensors(model)
    except BundleError:  # a graph that cannot be read is named when the backend opens it
        return
    locations = {tensor.external.get("location", "") for tensor in tensors if tensor.external is not None}
    read = [name for name in escaping if PurePosixPath(name).name in locations]
    if not read:
        return
    targets = [(bundle.path / name, os.path.realpath(bundle.path / name)) for name in read]
    raise BundleError(
        f"bundle {bundle.path}: " + "; ".join(f"{name} is a link to {target}" for name, (_, target) in
                                              zip(read, targets, strict=True))
        + f", outside the directory of its graph {graph['file']} ({home}): ONNX Runtime refuses to read a graph's "
        "weights through a link that leaves the graph's directory (\"External data path escapes model directory\")",
        "put the file itself in the bundle in place of the link (the bundle still verifies: the bytes are the same): "
        + " && ".join(f"cp --remove-destination {shlex.quote(target)} {shlex.quote(str(link))}"
                      for link, target in targets))


# the first ONNX Runtime release that refuses external data outside the model's directory
ESCAPING_LINKS_REFUSED_FROM = (1, 30)


def _onnxruntime_refuses_escaping_links() -> bool:
    """Whether the installed ONNX Runtime refuses a graph's external data whose resolved path leaves the graph's
    directory (1.30 on); False where none is installed, or its version (a development build's) cannot be read."""
    try:
        import onnxruntime
    except ImportError:
        return False
    try:
        installed = tuple(int(part) for part in onnxruntime.__version__.split(".")[:2])
    except ValueError:
        return False
    return installed >= ESCAPING_LINKS_REFUSED_FROM


def _lies_in(path: str, directory: str) -> bool:
    """Whether the resolved ``path`` lies in the resolved ``directory`` (at any depth)."""
    return os.path.commonpath([path, directory]) == directory


def _entries(root: Path) -> list[tuple[str, str]]:
    """Every entry under ``root`` but its real directories, as (relative name, kind): kind "" for a file (or a link
    to one: a listed file may be a link, which pack stores as the file it names), else what it is. A link to a
    directory and a link to nothing are entries of their own, and a linked directory is not entered: ``rglob``
    (what the writer lists with) yields neither, so an unlisted file behind a linked directory, or an unlisted
    dangling link, passed the check for unlisted files. BundleWriter never writes either."""
    entries = []
    for directory, subdirectories, names in os.walk(root):  # followlinks=False: a linked directory is not entered
        for name in [*names, *(sub for sub in subdirectories if os.path.islink(os.path.join(directory, sub)))]:
            full = os.path.join(directory, name)
            kind = ("" if os.path.isfile(full) else "a link to a directory" if os.path.isdir(full)
                    else "a link to nothing" if os.path.islink(full) else "not a regular file")
            entries.append((Path(full).relative_to(root).as_posix(), kind))
    return sorted(entries)


def _unlisted_fix(path: Path, names: list[str], listed: dict) -> str | None:
    """The fix for a bundle whose ``listed`` files are intact but which holds ``names`` its manifest does not list
    (a README or an editor's backup put there, what an older bundle left when this one was copied over it): move
    them out. Rebuilding is needless, and re-copying the bundle over the directory leaves them where they are. None
    where a listed file is read through one of them (a link to a directory): moving it would lose that file.

    Each name is moved as its first path part that holds no listed file (``old`` for ``old/a/config.json``): the
    files of a directory left there, moved one by one, would lose its tree and clash where two share a name."""
    if any(file.startswith(f"{name}/") for file in listed for name in names):
        return None
    tops: list[str] = []
    for name in names:
        parts = name.split("/")
        top = next(prefix for prefix in ("/".join(parts[:count]) for count in range(1, len(parts) + 1))
                   if not any(file == prefix or file.startswith(f"{prefix}/") for file in listed))
        if top not in tops:
            tops.append(top)
    shown = " ".join(shlex.quote(str(path / top)) for top in tops[:3])
    more = f", and the {len(tops) - 3} more listed above" if len(tops) > 3 else ""
    return ("move what the manifest does not list out of the bundle (its own files are intact; a copy of the bundle "
            f"made over this directory would leave them there): mv {shown} DIR{more}")


def verify_bundle(path: Path, expected_target: str | None = None) -> Bundle:
    """Check every file's size and sha256, refuse unlisted files and a wrong target.

    Args:
        path: the bundle directory.
        expected_target: canonical profile name the bundle must be built for (None: any).
    """
    path = Path(path)
    manifest = read_manifest(path)
    listed = manifest["files"]
    problems, denied = [], 0
    for name, facts in sorted(listed.items()):
        if not _safe_relative(name):
            problems.append(f"{name}: path escapes the bundle")
            continue
        if PurePosixPath(name).as_posix() != name:  # './a', 'a/' and 'a//b' would list a file a second time
            problems.append(f"{name}: not a plain relative path (the writer lists '{PurePosixPath(name).as_posix()}')")
            continue
        refused_on_board = name_problem(name)  # 'edgesdk deploy' would be refused on the board, after the build
        if refused_on_board is not None:
            problems.append(f"{name}: its name {refused_on_board}")
            continue
        file = path / name
        try:
            if file.is_dir():
                problems.append(f"{name}: a directory, not a file")
            elif not file.is_file():
                problems.append(f"{name}: missing" if not os.path.lexists(file) else f"{name}: not a regular file "
                                "(a link to nothing, a device or a pipe)")
            elif file.stat().st_size != facts["size"]:
                problems.append(f"{name}: {file.stat().st_size} bytes, manifest says {facts['size']}")
            elif sha256_file(file) != facts["sha256"]:
                problems.append(f"{name}: sha256 differs from the manifest (corrupted or modified)")
        except OSError as exc:  # not this user's to read, or a failing disk or card (EIO)
            problems.append(f"{name}: cannot be read ({exc.strerror or exc})")
            denied += isinstance(exc, PermissionError)
    extra = [(name, kind) for name, kind in _entries(path)
             if name not in listed and name not in (MANIFEST, MANIFEST_DIGEST)]
    problems += [f"{name}: not listed in the manifest" + (f" ({kind})" if kind else "") for name, kind in extra]
    if problems:
        fix = "rebuild the bundle with 'edgesdk build', or re-copy it (deploy checks hashes on the board)"
        if extra and len(extra) == len(problems):  # every listed file intact: only what was added is wrong
            fix = _unlisted_fix(path, [name for name, _ in extra], listed) or fix
        if denied:
            fix = (f"let this user read the bundle (as its owner or with sudo: chmod -R a+rX {path})"
                   + (f"; for the other files, {fix}" if denied < len(problems) else ""))
        raise BundleError(f"bundle {path} failed verification:\n  - " + "\n  - ".join(problems), fix)
    bundle = Bundle(path, manifest)
    if expected_target is not None and bundle.target != expected_target:
        raise BundleError(
            f"bundle {path} was built for target '{bundle.target}', not '{expected_target}'",
            f"build it for this board with 'edgesdk build --target {expected_target}', "
            "or pass --ignore-target to 'edgesdk run' or 'eval' to run it anyway",
        )
    return bundle


try:
    from lzma import LZMAError
except ImportError:  # a Python built without liblzma reads no .tar.xz at all (tarfile says so)
    LZMAError = tarfile.CompressionError

# What reading a damaged or unwritable archive raises: tar and file-system errors, and from a damaged
# compressed stream EOFError (truncated), zlib.error (gzip) or LZMAError (xz); bz2 raises OSError.
UNREADABLE = (tarfile.TarError, OSError, EOFError, zlib.error, LZMAError)


# What a bundle archive's headers may claim (_BoundedTarInfo): a pax header or a GNU long name holds a path and a
# few numbers (a few hundred bytes); a bundle has tens of files, each with at most a few headers.
EXTENDED_HEADER_LIMIT = 1 << 20
ARCHIVE_HEADER_LIMIT = 10_000
_EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                   tarfile.GNUTYPE_LONGLINK)


class _ArchiveRefused(tarfile.TarError):
    """An archive refused while its headers are read (its message names what and why)."""


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's member reader, bounded. tarfile reads into memory, whole and whatever size its header claims, the
    data of a pax header or GNU long name, an old GNU sparse member's extension blocks and a pax 1.0 sparse member's
    map, and it keeps every member it lists: a few kB of gzip unpack to gigabytes of any of them, which filled the
    memory while 'edgesdk unpack' (or deploy of an archive) listed the members, before any check ran. Each is
    refused here as its header is read (a sparse member is refused by unpack anyway)."""

    @classmethod
    def fromtarfile(cls, tar):
        count = getattr(tar, "_edgesdk_headers", 0) + 1
        if count > ARCHIVE_HEADER_LIMIT:
            raise _ArchiveRefused(f"it holds more than {ARCHIVE_HEADER_LIMIT:,} members and extended headers, where a "
                                  "bundle holds tens of files")
        tar._edgesdk_headers = count
        return super().fromtarfile(tar)

    @classmethod
    def frombuf(cls, buf, encoding, errors):
        info = super().frombuf(buf, encoding, errors)
        if info.type in _EXTENDED_TYPES and info.size > EXTENDED_HEADER_LIMIT:
            raise _ArchiveRefused(f"an extended header (pax, or a GNU long name) claims {info.size:,} bytes; one "
                                  f"holds a path and a few numbers, at most {EXTENDED_HEADER_LIMIT:,} bytes here")
        if info.type == tarfile.GNUTYPE_SPARSE:  # its extension blocks would be read before the member is refused
            raise _ArchiveRefused(f"sparse member {info.name!r} would escape the bundle or is not a plain file")
        return info

    def _proc_gnusparse_10(self, next, pax_headers, tar):  # noqa: A002 - tarfile's reader of a pax 1.0 sparse map
        raise _ArchiveRefused(f"sparse member {pax_headers.get('GNU.sparse.name', next.name)!r} would escape the "
                              "bundle or is not a plain file")


def _bundle_holding(directory: Path) -> Path | None:
    """The bundle that ``directory`` is or lies in (resolved), if any: what is written there breaks it."""
    resolved = Path(directory).resolve()
    return next((folder for folder in (resolved, *resolved.parents) if (folder / MANIFEST).is_file()), None)


def _safe_relative(name: str) -> bool:
    pure = PurePosixPath(name)
    return not pure.is_absolute() and ".." not in pure.parts and name not in ("", ".")


# An archive named for a compressor is written with it, as ``tar -a`` does: a plain tar under such a name fails
# ``tar xzf`` and every other tool that trusts the name ('edgesdk unpack' reads them all).
COMPRESSED_SUFFIXES = {".tar.gz": "gz", ".tgz": "gz", ".taz": "gz", ".gz": "gz", ".z": "gz", ".tar.bz2": "bz2",
                       ".tbz2": "bz2", ".tbz": "bz2", ".tz2": "bz2", ".bz2": "bz2", ".tar.xz": "xz", ".txz": "xz",
                       ".xz": "xz"}

# Names of compressors and archive formats the standard library's tarfile cannot write (GNU tar's suffix table for
# ``tar -a``, plus zip and 7z): a plain tar under such a name would fail every tool that trusts the name. A suffix
# is matched whatever its case, but one written here with a capital letter, which GNU tar tells from its lower-case
# form (``.taZ`` and ``.Z`` are compress, ``.taz`` and ``.z`` gzip: GNU tar 1.35's table), only as written.
UNSUPPORTED_SUFFIXES = {".zst": "zstd", ".tzst": "zstd", ".zstd": "zstd", ".lz4": "lz4", ".lz": "lzip",
                        ".tlz": "lzma", ".lzma": "lzma", ".lzo": "lzop", ".tzo": "lzop", ".Z": "compress (.Z)",
                        ".taZ": "compress (.Z)", ".zip": "zip", ".7z": "7-Zip"}
# Those of them that are archive formats of their own rather than a compressed tar
ARCHIVE_FORMATS = ("zip", "7-Zip")

# Leading bytes of the compressed formats 'edgesdk unpack' cannot read, and the command that decompresses each
# (zstd RFC 8878 §3.1.1, lz4 frame and legacy formats, lzip, compress, lzop, zip APPNOTE §4.3.7, 7z).
# A stream decompressor's command ends in "-dc": it writes to stdout, so it needs no suffix it knows on the file's name
# (``zstd -d mystery`` refuses "unknown suffix"); the archive formats extract as they are.
UNREADABLE_MAGIC = ((b"\x28\xb5\x2f\xfd", "zstd", "zstd -dc"), (b"\x04\x22\x4d\x18", "lz4", "lz4 -dc"),
                    (b"\x02\x21\x4c\x18", "lz4", "lz4 -dc"), (b"LZIP", "lzip", "lzip -dc"),
                    (b"\x1f\x9d", "compress (.Z)", "gzip -dc"), (b"\x89LZO", "lzop", "lzop -dc"),
                    (b"PK\x03\x04", "zip", "unzip"), (b"7z\xbc\xaf\x27\x1c", "7-Zip", "7z x"))

SUPPORTED_ARCHIVES = ".tar, .tar.gz / .tgz, .tar.bz2 / .tbz2, .tar.xz / .txz"


def archive_suffix(name: str, table: dict[str, str]) -> str:
    """The suffix of ``table`` that the file name ``name`` ends in, "" for none: the first that matches, in any
    case unless the suffix itself holds a capital letter (see UNSUPPORTED_SUFFIXES)."""
    return next((suffix for suffix in table
                 if (name if suffix != suffix.lower() else name.lower()).endswith(suffix)), "")


def _decompressed_name(archive: Path) -> Path:
    """Where the decompressed tar of ``archive`` goes: its name less a compressor's suffix, ending in ``.tar``
    (``b.tar.zst`` -> ``b.tar``, ``b.tzst`` -> ``b.tar``, ``mystery`` -> ``mystery.tar``), never the archive itself
    (a zstd stream named ``b.tar``, as ``tar --zstd -cf b.tar`` writes it, goes to ``b.decompressed.tar``: the
    shell's ``> b.tar`` would empty the archive before it is read)."""
    name = archive.name
    suffix = archive_suffix(name, UNSUPPORTED_SUFFIXES)
    name = name[:len(name) - len(suffix)]
    name = name if name.lower().endswith(".tar") else f"{name or 'bundle'}.tar"
    if name.lower() == archive.name.lower():  # compared as a case-insensitive file system compares them
        name = f"{name[:-len('.tar')]}.decompressed.tar"
    return archive.with_name(name)


def pack_bundle(path: Path, archive: Path) -> Path:
    """Verify a bundle and write it to an uncompressed .tar (weights do not compress well), or compressed
    where the name asks for it (``.tar.gz`` / ``.tgz``, ``.tar.bz2``, ``.tar.xz``); an ``archive`` that is a
    directory gets ``<bundle name>.tar`` in it, as ``cp`` does. A name asking for a compressor tarfile lacks
    (``.tar.zst``, ``.tar.lz4`` …) is refused. The archive is written under a ``.partial`` name and flushed to
    the disk before it is renamed to ``archive``: once this returns it is whole there.

    The archive is a function of the bundle's files alone (reproducible-builds.org): every entry carries the time of
    ``SOURCE_DATE_EPOCH`` (0 where it is not set), owner and group 0 without names and mode 644 (755 for a file any
    execute bit is set on), in one order, and a gzip header records no time."""
    path, archive = Path(path), Path(archive)  # a str as well: the files are named below as path / name
    mtime = _source_date_epoch()
    bundle = verify_bundle(path)
    if archive.is_dir():
        archive = archive / f"{path.resolve().name}.tar"
    suffix = archive_suffix(archive.name, UNSUPPORTED_SUFFIXES)
    if suffix:
        kind = UNSUPPORTED_SUFFIXES[suffix]
        stem = archive.name[:-len(suffix)]
        stem = stem[:-len(".tar")] if stem.lower().endswith(".tar") else stem
        names = f"name the archive {stem or 'bundle'}.tar.xz or {stem or 'bundle'}.tar.gz"
        if kind in ARCHIVE_FORMATS:  # an archive of its own, not a compressed tar
            raise BundleError(f"the archive name {archive} asks for {kind}, an archive format of its own, which edgesdk "
                              f"does not write: a bundle travels as a tar archive, the one format 'edgesdk unpack' and "
                              f"'edgesdk deploy' read; it writes {SUPPORTED_ARCHIVES}",
                              f"{names} ('edgesdk unpack' and 'edgesdk deploy' read those on every board, and tar "
                              "unpacks them where edgesdk is not installed)")
        raise BundleError(f"the archive name {archive} asks for {kind}, which edgesdk does not write (the tarfile "
                          "module of the boards' Python 3.10 / 3.11 compresses with gzip, bzip2 and xz alone); it "
                          f"writes {SUPPORTED_ARCHIVES}",
                          f"{names} ('edgesdk unpack' reads those on every board; a .tar compressed by another tool "
                          "must be decompressed before 'edgesdk unpack')")
    holder = _bundle_holding(archive.parent)
    if holder is not None:  # this bundle, or another one: either would then fail verification
        named = path if holder == path.resolve() else holder
        raise BundleError(f"the archive {archive} would be written inside the bundle {named}, which would then "
                          "fail verification (a file the manifest does not list)",
                          "write the archive outside the bundle directory")
    top = path.resolve().name  # "." and ".." name no directory of their own
    partial = archive.with_name(archive.name + ".partial")
    try:
        compression = COMPRESSED_SUFFIXES.get(archive_suffix(archive.name, COMPRESSED_SUFFIXES), "")
        # written to the partial file under the archive's name (a gzip header records it, not '.partial'). The name
        # is predictable: what is there (a killed pack's, or a link someone put in a shared directory such as /tmp
        # to have the archive written over a file of this user's) is removed, and the file is created anew, never
        # opened through a link (O_EXCL: a link made again in between fails the open instead).
        partial.unlink(missing_ok=True)
        created = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
        with open(created, "wb") as raw:
            # gzip by hand: tarfile's own writes the time of the pack into the gzip header
            with contextlib.ExitStack() as stack:
                fileobj, mode = raw, f"w:{compression}"
                if compression == "gz":
                    fileobj, mode = stack.enter_context(gzip.GzipFile(archive.name, "wb", 9, raw, mtime=0)), "w"
                tar = stack.enter_context(tarfile.open(archive.name, mode, fileobj=fileobj,
                                                       dereference=True))  # a link goes in as its file
                for name in [MANIFEST, MANIFEST_DIGEST, *sorted(bundle.manifest["files"])]:
                    tar.add(path / name, arcname=f"{top}/{name}", recursive=False,
                            filter=lambda info: _reproducible_entry(info, mtime))
            sync_file(raw)
        os.replace(partial, archive)
        sync_directory(archive.parent)
    except BaseException as exc:  # Ctrl-C as well: no .partial is left behind
        with contextlib.suppress(OSError):  # where a parent is a file, unlink fails too (NotADirectoryError)
            partial.unlink(missing_ok=True)
        if isinstance(exc, (tarfile.TarError, OSError)):
            raise BundleError(f"cannot write the archive {archive} ({exc})",
                              "pick a path in an existing, writable directory with room for the bundle") from exc
        raise
    return archive


def _source_date_epoch() -> int:
    """The time every entry of a packed archive carries: ``SOURCE_DATE_EPOCH`` where it is set (the
    reproducible-builds.org convention), else 0; a value that is not a whole number of seconds is refused."""
    value = os.environ.get("SOURCE_DATE_EPOCH")
    if value is None or value == "":
        return 0
    if not value.isascii() or not value.isdigit():
        raise BundleError(f"SOURCE_DATE_EPOCH is {value!r}, expected a whole number of seconds since 1970-01-01 "
                          "UTC (the time 'edgesdk pack' gives every file in the archive)",
                          "set it to a number such as $(git log -1 --format=%ct), or unset it (the files then "
                          "carry the time 0)")
    return int(value)


def _reproducible_entry(info: tarfile.TarInfo, mtime: int) -> tarfile.TarInfo:
    """A pack's tar entry made a function of the file's name and bytes: no owner, group or time of the machine
    that packed it, and mode 644, or 755 where the file is executable."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = mtime
    info.mode = 0o755 if info.mode & 0o111 else 0o644
    return info


_MANIFEST_READ_LIMIT = 16 << 20  # far above any manifest 'edgesdk build' writes (a few kB)


def _check_member_sizes(archive: Path, tar: tarfile.TarFile, members: list[tarfile.TarInfo], top: str) -> None:
    """Refuse, before anything is written, a file the archive's own manifest does not list or lists with another
    size: a tar header may claim any size (a few bytes of gzip unpack to gigabytes of zeros), and verification
    would find it only after it filled the disk. Without a readable manifest, verification after unpacking
    reports what is wrong."""
    listed = next((m for m in members if m.isfile() and PurePosixPath(m.name).parts == (top, MANIFEST)), None)
    if listed is None:
        return
    if listed.size > _MANIFEST_READ_LIMIT:
        raise BundleError(f"{archive}: member '{listed.name}' is {listed.size} bytes, far more than a {MANIFEST} "
                          "holds", "only unpack archives made by 'edgesdk pack'")
    try:
        with tar.extractfile(listed) as file:
            manifest = json.loads(file.read())
    except (*UNREADABLE, ValueError):  # verification names a damaged manifest
        return
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return
    for member in members:
        if not member.isfile():
            continue
        name = PurePosixPath(member.name).relative_to(top).as_posix()
        if name in (MANIFEST, MANIFEST_DIGEST):
            if member.size > (_MANIFEST_READ_LIMIT if name == MANIFEST else 1024):  # the digest: 64 hex digits
                raise BundleError(f"{archive}: member '{member.name}' is {member.size} bytes, far more than a "
                                  f"{name} holds", "only unpack archives made by 'edgesdk pack'")
            continue
        record = files.get(name)
        if not isinstance(record, dict):
            raise BundleError(f"{archive}: member '{member.name}' is not listed in the bundle's {MANIFEST}",
                              "only unpack archives made by 'edgesdk pack'")
        claimed = record.get("size")
        if isinstance(claimed, int) and member.size != claimed:  # a size of another type: verification names it
            raise BundleError(f"{archive}: member '{member.name}' is {member.size} bytes, but the bundle's "
                              f"{MANIFEST} lists {claimed}", "re-copy the archive, or re-create it with 'edgesdk pack'")


def _directory_not_archive(archive: Path, destination_dir: Path) -> BundleError:
    """The refusal of a directory given as the archive to unpack (tarfile says only "Is a directory"); a bundle
    directory needs no unpacking at all, and the fix says so."""
    if (archive / MANIFEST).is_file():
        into = shlex.quote(str(destination_dir))
        fix = (f"it is a bundle already: pass it as it is to run, serve or deploy, or copy it where unpack would "
               f"have put it (mkdir -p {into} && cp -r {shlex.quote(str(archive))} {into}/)")
    else:
        fix = "pass the archive file that 'edgesdk pack' wrote"
    return BundleError(f"{archive} is a directory, not an archive: 'edgesdk unpack' reads the {SUPPORTED_ARCHIVES} "
                       "file that 'edgesdk pack' writes", fix)


def unpack_bundle(archive: Path, destination_dir: Path) -> Bundle:
    """Unpack a bundle .tar, refusing members that escape it, then verify.

    Links, devices, sparse files, absolute paths and ``..`` components are refused before anything is written.
    """
    archive, destination_dir = Path(archive), Path(destination_dir)
    if archive.is_dir():
        raise _directory_not_archive(archive, destination_dir)
    try:
        tar = tarfile.open(archive, "r:*", tarinfo=_BoundedTarInfo)
    except _ArchiveRefused as exc:
        raise BundleError(f"{archive}: {exc}", "only unpack archives made by 'edgesdk pack'") from exc
    except UNREADABLE as exc:
        try:
            with open(archive, "rb") as file:
                head = file.read(8)
        except OSError:
            head = b""
        known = next(((kind, command) for magic, kind, command in UNREADABLE_MAGIC if head.startswith(magic)), None)
        if known is not None:
            kind, command = known
            decompress = f"{command} {shlex.quote(str(archive))}"  # quoted: a name with a space still works
            if command.endswith("-dc"):  # to stdout: the .tar's name is given, whatever the archive's suffix
                decompress += f" > {shlex.quote(str(_decompressed_name(Path(archive))))}"
            raise BundleError(f"{archive} is {kind}-compressed, which edgesdk cannot read (this Python's tarfile "
                              f"has no {kind}); it reads {SUPPORTED_ARCHIVES}",
                              f"decompress it first ({decompress}) and unpack the .tar, or re-create it "
                              "with 'edgesdk pack BUNDLE NAME.tar.xz'") from exc
        raise BundleError(f"{archive} is not a readable tar archive ({exc})", "re-create it with 'edgesdk pack'") \
            from exc
    with tar:
        try:
            members = tar.getmembers()
        except _ArchiveRefused as exc:
            raise BundleError(f"{archive}: {exc}", "only unpack archives made by 'edgesdk pack'") from exc
        except UNREADABLE as exc:  # a truncated archive fails here, not in open()
            raise BundleError(f"{archive} is truncated or corrupt ({exc})",
                              "re-copy the archive, or re-create it with 'edgesdk pack'") from exc
        members = [m for m in members if PurePosixPath(m.name).parts]  # "./" names the archive's root
        tops = {PurePosixPath(m.name).parts[0] for m in members}
        if any(m.isfile() and PurePosixPath(m.name).parts == (MANIFEST,) for m in members):  # tar -C BUNDLE -cf X .
            raise BundleError(f"{archive} holds a bundle's files at its top level ({MANIFEST} among them), not in "
                              "the one bundle directory 'edgesdk pack' writes",
                              "re-create it with 'edgesdk pack BUNDLE ARCHIVE', or with tar from the directory "
                              "above the bundle (tar -C PARENT -cf ARCHIVE NAME)")
        loose = [m.name for m in members if m.isfile() and len(PurePosixPath(m.name).parts) == 1
                 and _safe_relative(m.name) and not m.issparse()]
        for member in members:
            pure = PurePosixPath(member.name)
            if member.name in loose:
                if any(m.isdir() or len(PurePosixPath(m.name).parts) > 1 for m in members):
                    problem = f"holds the file '{member.name}' beside the bundle directory"
                else:  # tar -cf m.tar model.gguf: files alone
                    names = ", ".join(f"'{name}'" for name in loose[:5])
                    problem = f"holds no bundle directory, only the file{'s' if len(loose) > 1 else ''} {names}"
                raise BundleError(f"{archive} {problem}, where 'edgesdk pack' writes the one bundle directory and "
                                  "nothing else",
                                  "re-create it with 'edgesdk pack BUNDLE ARCHIVE', or with tar of the bundle "
                                  "directory alone (tar -C PARENT -cf ARCHIVE NAME)")
            if (pure.is_absolute() or ".." in pure.parts or not (member.isfile() or member.isdir())
                    or member.issparse()):  # a few bytes of archive that write any number of zeros
                kind = "link" if (member.issym() or member.islnk()) else "sparse member" if member.issparse() \
                    else "member"
                raise BundleError(f"{archive}: {kind} '{member.name}' would escape the bundle or is not a plain file",
                                  "only unpack archives made by 'edgesdk pack'")
        if len(tops) != 1:
            raise BundleError(f"{archive} holds {len(tops)} top-level entries ({sorted(tops)[:5]}), expected one "
                              "bundle directory", "only unpack archives made by 'edgesdk pack'")
        top = tops.pop()
        _check_member_sizes(archive, tar, members, top)
        blocking = next((parent for parent in (destination_dir, *destination_dir.parents)
                         if parent.exists() and not parent.is_dir()), None)
        if blocking is not None:
            raise BundleError(f"cannot unpack into {destination_dir}: {blocking} is a file, not a directory",
                              "pass a directory (it is created if it does not exist)")
        holder = _bundle_holding(destination_dir)
        if holder is not None:
            raise BundleError(f"cannot unpack into {destination_dir}: it lies in the bundle {holder}, which would "
                              "then fail verification (files its manifest does not list)",
                              "unpack into a directory outside every bundle (the folder that holds them)")
        final = destination_dir / top
        check_replaceable(final, f"unpack into another directory, or move {final} away")  # only a bundle is replaced
        staging = destination_dir / f".{top}.unpacking"
        try:
            _remove(staging)  # a killed unpack's; a link or a file there is removed too, never followed
            staging.mkdir(parents=True)
            for member in members:
                relative = PurePosixPath(member.name).relative_to(top)
                target = staging / relative
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        except UNREADABLE as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise BundleError(f"cannot unpack {archive} into {destination_dir}: {exc}",
                              "check the free space and permissions there, or re-copy the archive") from exc
    try:
        verify_bundle(staging)
    except BundleError as exc:  # named as the archive's bundle: the staging directory is gone once this is read
        shutil.rmtree(staging)
        named = f"the bundle {top} in {archive}"

        def rename(text: str | None) -> str | None:  # every mention, in any message's form
            return text and text.replace(f"bundle {staging}", named).replace(str(staging), named)

        raise BundleError(rename(exc.problem), rename(exc.fix)) from exc
    try:
        _move_into_place(staging, final)
    except BaseException:  # the unpacked copy is not left hidden beside the destination
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return verify_bundle(final)
