"""Helpers for deploy tests: bundle variants, the board's tree, and running ``edgesdk deploy``."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from edgesdk.bundle import Bundle, BundleWriter, read_manifest
from tests._utils.signals import default_signals

FAULTY_SSH = Path(__file__).with_name("faulty_ssh.py")
_OWN_KEYS = ("schema_version", "edgesdk_version", "created", "bundle_id", "files")


def bundle_variant(source: Path, destination: Path, note: str, padding: int = 0, target: str | None = None) -> Bundle:
    """A new bundle (new id) with the files of ``source``, a note, optional random padding and target."""
    manifest = read_manifest(source)
    writer = BundleWriter(destination)
    for name in manifest["files"]:
        writer.add_file(source / name, name)
    if padding:
        (writer.staging / "padding.bin").write_bytes(random.Random(note).randbytes(padding))
    body = {key: value for key, value in manifest.items() if key not in _OWN_KEYS}
    body["deploy_test_note"] = note
    if target is not None:
        from edgesdk.profile import get_profile

        body["target"] = get_profile(target).summary()
    return writer.commit(body)


def tree_state(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its size, mtime or link target: equal states mean an untouched board."""
    if not root.exists():
        return {}
    state = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            state[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            stat = path.stat()
            state[rel] = f"{stat.st_size} {stat.st_mtime_ns}"
        else:
            state[rel] = "dir"
    return state


def current_id(root: Path) -> str | None:
    link = root / "current"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def edgesdk(*args, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """``edgesdk ARGS`` through this interpreter (the installed entry point's code)."""
    return subprocess.run([sys.executable, "-m", "edgesdk.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def faulty_ssh_command(mode: str, sshd_pid: int) -> str:
    """``--ssh-command`` value that runs :mod:`tests._utils.faulty_ssh` in ``mode``."""
    return f"{sys.executable} {FAULTY_SSH} {mode} {sshd_pid}"


def interrupt_once_held(argv: list, marker: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``edgesdk ARGV`` in its own process group; once ``marker`` exists (a held step wrote it), SIGINT the
    group, as a Ctrl-C at the terminal does, and return what the command did and said."""
    proc = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", *map(str, argv)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the command never reached its held step ({marker.name})"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def tiny_checkout(root: Path) -> Path:
    """A checkout of an edgesdk with one empty package under ``root``: what a runtime wheel is built from (its
    pyproject, README and LICENSE as the real one's), small enough that its source digest stays put while it runs."""
    (root / "edgesdk").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=68"]\n'
                                         'build-backend = "setuptools.build_meta"\n\n'
                                         '[project]\nname = "edgesdk"\nversion = "0.1.0"\nreadme = "README.md"\n'
                                         '\n[tool.setuptools]\npackages = ["edgesdk"]\n')
    (root / "README.md").write_text("# edgesdk\n")
    (root / "LICENSE").write_text("Apache-2.0\n")
    (root / "edgesdk" / "__init__.py").write_text("__version__ = '0.1.0'\n")
    return root

