"""The edgesdk runtime on the board: a virtual environment under ``<root>/runtime/<key>``.

The key names exactly what is installed: ``<version>-<digest of the source files>`` when this
edgesdk runs from a checkout (a wheel is built from it with ``pip wheel --no-deps``, cached per
source digest under ``$EDGESDK_CACHE/wheels``), or ``<version>-pypi`` for an installed release,
which the board fetches from its package index. A board whose ``runtime/current`` carries the same
key is left alone, and one that holds a runtime of that key beside it only switches to it (no wheel is built
for either); otherwise a new venv is built next to the old one, and ``runtime/current``
moves to it together with the bundle's ``current``, after the new runtime ran the new bundle.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from edgesdk import __version__
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError
from edgesdk.hashing import sha256_file

# Top-level entries of a checkout that are not part of the wheel.
_NOT_SOURCE = {".git", ".venv", "venv", "build", "dist", "tests", "docker", "bundles", ".ci", "__pycache__",
               ".pytest_cache", ".ruff_cache", ".mypy_cache"}
# Top-level files a setuptools build reads (PEP 517/518 pyproject.toml, setup.py, setup.cfg, MANIFEST.in) and the
# metadata files it takes into the wheel (PEP 621 ``readme`` and license files; setuptools' default
# ``license-files`` globs LICEN[CS]E*, COPYING*, NOTICE*, AUTHORS*). Any other file at the top of a checkout (a
# GGUF model fetched there, a benchmark's results.json, a thermal log) is no part of the wheel.
_BUILD_FILES = {"pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in"}
_METADATA_PREFIXES = ("README", "LICENSE", "LICENCE", "COPYING", "NOTICE", "AUTHORS")


def checkout_root() -> Path | None:
    """The source checkout this edgesdk runs from (editable install), or None for an installed wheel."""
    import edgesdk

    candidate = Path(edgesdk.__file__).resolve().parent.parent
    pyproject = candidate / "pyproject.toml"
    if pyproject.is_file() and 'name = "edgesdk"' in pyproject.read_text(encoding="utf-8", errors="replace"):
        return candidate
    return None


def source_files(root: Path) -> list[Path]:
    """The files a wheel is built from, in a stable order: the top-level files and the directories holding
    Python source. A directory without any (a bundle, a build's ``<out>.build`` work directory, a model) is no
    part of the wheel; counted, it made every new build a new runtime key, so the next deploy installed a new
    runtime on the board, and a virtual environment (``pyvenv.cfg``) is none either. Of the top-level files only
    those the build reads count (``_BUILD_FILES``, ``_METADATA_PREFIXES``): any file written there (a model fetched
    into the checkout, ``results.json``) made a new runtime key too, so the next deploy hashed and copied it and
    reinstalled the runtime on every board."""
    files = []
    for entry in sorted(root.iterdir()):
        if entry.name in _NOT_SOURCE or entry.name.startswith(".") or entry.name.endswith(".egg-info"):
            continue
        if entry.is_file():
            if entry.name in _BUILD_FILES or entry.name.upper().startswith(_METADATA_PREFIXES):
                files.append(entry)
        elif entry.is_dir() and not (entry / "pyvenv.cfg").exists():
            found = sorted(p for p in entry.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                           and p.suffix not in (".pyc", ".pyo"))
            if any(p.suffix == ".py" for p in found):
                files += found
    return files


def source_digest(root: Path) -> str:
    """sha256 over the relative names and contents of the source files: the checkout's state."""
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + sha256_file(path).encode() + b"\n")
    return digest.hexdigest()


@dataclass(frozen=True)
class RuntimeSource:
    """What the board's runtime is installed from: a wheel, a PyPI spec, or neither for a runtime the board has."""

    key: str
    wheel: Path | None = None
    pip_spec: str | None = None

    def describe(self) -> str:
        if self.wheel:
            return f"wheel {self.wheel.name} built from this checkout"
        return f"'{self.pip_spec}' from PyPI" if self.pip_spec else f"runtime/{self.key} already on the board"


def cache_dir() -> Path:
    """Where wheels built from a checkout are kept: ``wheels/`` in the user cache."""
    from edgesdk.models.sources import cache_dir as user_cache

    return user_cache() / "wheels"


WHEEL_BUILD_TIMEOUT_S = 600  # one pip wheel run (the isolated one may wait on the package index)


def _pip_wheel(argv: list[str], root: Path) -> subprocess.CompletedProcess:
    """One ``pip wheel`` run; past :data:`WHEEL_BUILD_TIMEOUT_S` a DeployError naming it (subprocess's
    TimeoutExpired ended the deploy, or each board of a fleet, in a traceback)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=WHEEL_BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise DeployError(f"building the edgesdk wheel from {root} took more than {WHEEL_BUILD_TIMEOUT_S} s "
                          "(pip wheel; an isolated build waits on the package index)",
                          "pip install 'setuptools>=68' wheel into this environment so the build runs offline, "
                          "or deploy with --no-install onto a board that already has edgesdk") from exc


class _Build:
    """One wheel build in flight: the callers that need the same wheel meanwhile wait for it and share its end (the
    wheel, found in the cache, or ``error``)."""

    def __init__(self):
        self.done = threading.Event()
        self.error: BaseException | None = None


_BUILDS: dict[Path, _Build] = {}  # by cache directory (source digest), while a build runs
_BUILDS_LOCK = threading.Lock()


def build_wheel(root: Path, digest: str) -> Path:
    """A wheel of the checkout, built once per source digest (copied to a temporary tree first). Callers that need
    it while it is built (the boards of a fleet deploy, each in a thread of its own) wait for that one build and
    get its wheel, or its error as a DeployError, instead of each running pip wheel; a call after a failed build
    tries again, as does a waiter whose builder was interrupted (Ctrl-C in its thread)."""
    target = cache_dir() / digest[:24]
    while True:
        found = sorted(target.glob("edgesdk-*.whl")) if target.is_dir() else []
        if found:
            return found[0]
        with _BUILDS_LOCK:
            build = _BUILDS.get(target)
            first = build is None
            if first:
                build = _BUILDS[target] = _Build()
        if first:
            return _run_build(build, root, target)
        while not build.done.wait(0.2):  # a timeout: a Ctrl-C raised in this thread (fleet.py) lands meanwhile
            pass
        if isinstance(build.error, Exception):  # the build failed: so does it for each of its waiters
            raise _shared_failure(build.error) from build.error
        # built (the wheel is in the cache now), or the builder was interrupted: look again, or build


def _run_build(build: _Build, root: Path, target: Path) -> Path:
    """Run ``build`` (registered in ``_BUILDS``): its end, wheel or error, is the waiting callers' too."""
    try:
        return _build_wheel(root, target)
    except OSError as exc:  # the wheel cache or the temporary tree cannot be written: said as a DeployError
        build.error = _cache_failure(exc, root, target)
        raise build.error from exc
    except BaseException as exc:
        build.error = exc
        raise
    finally:
        with _BUILDS_LOCK:
            del _BUILDS[target]
        build.done.set()


def _cache_failure(error: OSError, root: Path, target: Path) -> DeployError:
    """The DeployError for an OSError of a wheel build: reading a file of the checkout ``root``, or writing the
    wheel cache ``target`` or the temporary directory, failed."""
    if error.filename and Path(error.filename).is_relative_to(root):
        return DeployError(f"building the edgesdk wheel from {root} failed: {error.strerror or error} reading "
                           f"{error.filename}", f"make {error.filename} readable (or restore it), or deploy with "
                           "--no-install onto a board that already has edgesdk")
    return DeployError(f"building the edgesdk wheel from {root} into the wheel cache {target} failed: "
                       f"{error.strerror or error}" + (f" ({error.filename})" if error.filename else ""),
                       f"make {target.parent} writable (or set EDGESDK_CACHE to a writable directory) and free "
                       "disk space there and in the temporary directory, or deploy with --no-install onto a board "
                       "that already has edgesdk")


def _shared_failure(error: Exception) -> DeployError:
    """The failure of a wheel build, for a caller that waited for it: its DeployError, or one that names another
    exception of the build."""
    if isinstance(error, DeployError):
        return DeployError(error.problem, error.fix)
    return DeployError(f"building the edgesdk wheel failed: {type(error).__name__}: {error}",
                       "see the error of the board that built it; deploy again, or with --no-install onto a board "
                       "that already has edgesdk")


def _pip_failure(runs: list[tuple[str, subprocess.CompletedProcess]]) -> str:
    """What each failed ``pip wheel`` run (named by how it ran) wrote to stderr, its last 2000 characters."""
    return "\n".join(f"pip wheel {how} (exit status {proc.returncode}):\n{proc.stderr[-2000:].rstrip()}"
                     for how, proc in runs)


def _build_wheel(root: Path, target: Path) -> Path:
    """Build the wheel of the checkout at ``root`` into the cache directory ``target``."""
    with tempfile.TemporaryDirectory(prefix="edgesdk-wheel-") as tmp:
        tree = Path(tmp) / "src"
        for path in source_files(root):
            destination = tree / path.relative_to(root)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)
        out = Path(tmp) / "out"
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w",
                str(out), str(tree)]
        # Offline with this environment's setuptools first; pip's isolated build (which fetches
        # setuptools from the package index) when that one is missing or too old.
        runs = [("without build isolation", _pip_wheel([*argv, "--no-build-isolation"], root))]
        if runs[0][1].returncode != 0:
            runs.append(("with build isolation", _pip_wheel(argv, root)))
        if runs[-1][1].returncode != 0:
            # both runs: offline, the isolated one only says the index has no setuptools, while the first one
            # says what is wrong with the checkout (or this environment's setuptools)
            raise DeployError(f"building the edgesdk wheel from {root} failed:\n{_pip_failure(runs)}",
                              "pip install 'setuptools>=68' wheel into this environment, or deploy with "
                              "--no-install onto a board that already has edgesdk")
        built = sorted(out.glob("edgesdk-*.whl"))
        if not built:
            raise DeployError(f"pip wheel of {root} produced no edgesdk wheel", "report this")
        target.mkdir(parents=True, exist_ok=True)
        # a name of its own: two builders of one digest (two deploys at once, in two processes) never write into
        # one partial file, and the wheel appears whole or not at all
        handle, partial = tempfile.mkstemp(dir=target, prefix=built[0].name + ".", suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as sink, built[0].open("rb") as source:
                shutil.copyfileobj(source, sink)
            os.replace(partial, target / built[0].name)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
        return target / built[0].name


RUNTIME_MIN_PYTHON = (3, 10)  # pyproject.toml requires-python; board_install.op_install refuses an older one


def check_runtime_python(python_version: tuple[int, ...]) -> None:
    """Refuse a board Python older than edgesdk needs (:data:`RUNTIME_MIN_PYTHON`) before any wheel is built: the
    board's install refused it only after the wheel was built here (``pip wheel``, up to
    :data:`WHEEL_BUILD_TIMEOUT_S`, whose own failure offline hid the board's refusal) and sent."""
    if tuple(python_version[:2]) >= RUNTIME_MIN_PYTHON:
        return
    need = ".".join(map(str, RUNTIME_MIN_PYTHON))
    raise DeployError(f"the board's Python {'.'.join(map(str, python_version))} is older than {need}, which "
                      "edgesdk needs, so the edgesdk runtime cannot be installed with it",
                      f"install Python >= {need} on the board and pass --remote-python /path/to/python{need}")


def runtime_source(python_version: tuple[int, ...] | None = None, inherit: bool = False,
                   installed: Collection[str] = ()) -> RuntimeSource:
    """A wheel of this checkout, or this version from PyPI when edgesdk was installed from a wheel.

    With ``python_version`` (the probe's: the board's Python, ``--remote-python``, that builds the venv) the key
    ends in ``-py<major><minor>``, and with ``inherit`` (a venv made with ``--system-site-packages``) in
    ``-site``: the venv runs that interpreter and the dependencies pip resolved for it (wheels are tagged per
    CPython minor, PEP 425), so a runtime installed under Python 3.10 is not "up to date" for a deploy run with
    another ``--remote-python``, nor after the board's Python was upgraded (the venv's ``bin/python`` points to
    the old interpreter, python -m venv, "How venvs work").

    A key among ``installed`` (the board's runtimes, :func:`installed_keys`) is on the board already: nothing is
    installed, so no wheel is built for it (``pip wheel``, up to :data:`WHEEL_BUILD_TIMEOUT_S`). A
    ``python_version`` older than edgesdk needs is refused before anything is built (:func:`check_runtime_python`)."""
    if python_version:
        check_runtime_python(python_version)
    root = checkout_root()
    digest = source_digest(root) if root is not None else None
    key = f"{__version__}-{digest[:12]}" if digest else f"{__version__}-pypi"
    if python_version:
        key += f"-py{python_version[0]}{python_version[1]}"
    if inherit:
        key += "-site"
    if key in installed:
        return RuntimeSource(key=key)
    if digest is None:
        return RuntimeSource(key=key, pip_spec=f"edgesdk=={__version__}")
    return RuntimeSource(key=key, wheel=build_wheel(root, digest))


def installed_key(probe_raw: dict) -> str | None:
    """The key of the board's active runtime (``runtime/current``), or None."""
    stamp = (probe_raw.get("runtime") or {}).get("stamp")
    return stamp.get("key") if stamp else None


def installed_keys(probe_raw: dict) -> list[str]:
    """Every complete runtime on the board (active or not)."""
    return list((probe_raw.get("runtime") or {}).get("installed") or [])


def install_runtime(board: Board, source: RuntimeSource, system_site_packages: bool) -> dict:
    """Install the runtime on the board (see module docstring); returns the helper's reply and bytes sent."""
    params: dict = {"key": source.key, "system_site_packages": system_site_packages}
    data = b""
    if source.wheel is not None:
        data = source.wheel.read_bytes()
        params.update(wheel_name=source.wheel.name, wheel_sha256=hashlib.sha256(data).hexdigest())
    else:
        params["pip_spec"] = source.pip_spec
    # how many bytes the wheel is: stdin stays open after it, and its end tells the board that deploy stopped
    # (board_install.end_with_host)
    params["wheel_size"] = len(data)
    reply = board.call("install", params, stdin=data, timeout=3600, hold_stdin=True)
    reply["bytes_sent"] = len(data)
    return reply


def runtime_argv(board: Board, local: bool, key: str = "current") -> list[str]:
    """How to start edgesdk on the board: a deployed runtime, or this very edgesdk for ``--to DIR``."""
    if local:
        return [sys.executable, "-m", "edgesdk.cli"]
    return [board.path("runtime", key, "bin", "edgesdk")]
