"""The prompt cache, review 55 (edgesdk/runtime/cache_file.py, prompt_cache.py, cache_store.py,
edgesdk/cli_prompt_cache.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import numpy as np
import pytest

from edgesdk.cli_prompt_cache import prompt_cache_mode, writable_prompt_cache
from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache

BUNDLE_ID = "0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]
posix_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.unit.test_prompt_cache import _standard

    return _standard(tmp_path_factory.mktemp("standard55"))


def _filled(backend, count: int = 12) -> PromptCache:
    """A cache holding ``count`` prefilled tokens."""
    cache = PromptCache(backend)
    ids = [int(t) for t in np.random.default_rng(count).integers(0, 320, count)]
    backend.reset()
    backend.prefill(np.array(ids))
    cache.took(ids)
    return cache


@posix_only
def test_a_fifo_given_as_the_prompt_cache_is_refused_before_the_run(tmp_path):
    """A FIFO passed the check: its load then waited for good for a writer, and the write after the answer renamed a
    regular file over it. It is refused by name before the bundle loads."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(click.BadParameter, match=r"pipe is a FIFO \(named pipe\), not a prompt cache file"):
        writable_prompt_cache(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_directory_given_as_the_prompt_cache_is_refused_naming_a_file_in_it(tmp_path):
    """A directory passed the check, its load said "IsADirectoryError" and "the next answer rewrites it", and the
    write failed after the answer ("Is a directory", told to pass a writable directory, which it was)."""
    directory = tmp_path / "caches"
    directory.mkdir()
    with pytest.raises(click.BadParameter) as caught:
        writable_prompt_cache(directory)
    message = caught.value.format_message()
    assert "caches is a directory, not a prompt cache file" in message
    assert str(directory / "prompt.cache") in message


@posix_only
def test_the_write_does_not_rename_a_file_over_a_fifo(backend, tmp_path):
    """The write's rename replaced a FIFO (a device node such as /dev/null, as root) with a regular file."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="it is a FIFO"):
        cache_file.save(fifo, _filled(backend), BUNDLE_ID)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["pipe"]  # no temporary file left beside it


def test_a_directory_is_not_loaded_and_is_named_so(backend, tmp_path):
    """A directory's load was refused with numpy's "IsADirectoryError"; it is named for what it is."""
    cache = PromptCache(backend)
    assert cache_file.load(tmp_path, cache, BUNDLE_ID) == (0, "it is a directory, not a cache file")
    assert cache.tokens == []


def test_a_path_that_cannot_be_looked_up_is_refused_not_raised(backend, tmp_path):
    """pathlib's exists() raises where the lookup fails for another reason than a missing file (a directory above
    that this user may not search: EACCES; a name past NAME_MAX: ENAMETOOLONG): ``--prompt-cache-ro`` then ended
    in a PermissionError traceback, and load_prompt_cache() raised where it returns why nothing was loaded."""
    cache = PromptCache(backend)
    loaded, why = cache_file.load(tmp_path / ("x" * (cache_file.NAME_MAX + 1)), cache, BUNDLE_ID)
    assert loaded == 0
    assert why.startswith("it cannot be looked up (")
    assert cache.tokens == []


def _mode_message(path, as_nobody: bool, capsys) -> str:
    """What ``prompt_cache_mode`` says on stderr of ``path``, checked by this user or by uid/gid 65534."""
    if not as_nobody:
        capsys.readouterr()
        assert prompt_cache_mode(path, False, False) == "ro"
        return capsys.readouterr().err
    code = ("import sys; from pathlib import Path; from edgesdk.cli_prompt_cache import prompt_cache_mode; "
            "assert prompt_cache_mode(Path(sys.argv[1]), False, False) == 'ro'")
    done = subprocess.run([shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0, done.stderr
    return done.stderr


def _runs_as_nobody() -> bool:
    """Whether uid 65534 can run this interpreter and import edgesdk from this checkout (a parent folder of
    either may be closed to other users)."""
    done = subprocess.run([shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-c", "import edgesdk.cli_prompt_cache"], capture_output=True,
                          cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    return done.returncode == 0


@posix_only
def test_a_cache_file_another_user_owns_is_not_called_read_only_nor_told_to_chmod(tmp_path, capsys):
    """A file with write bits this user has none of (another user's 0644) was said to be "read-only (mode 0644)"
    with the fix "chmod u+w", which only its owner may run: it is said to be not writable by this user."""
    as_nobody = os.geteuid() == 0
    if as_nobody and shutil.which("setpriv") is None:
        pytest.skip("root writes any file; checking as another user needs setpriv")
    if as_nobody and not _runs_as_nobody():
        pytest.skip("root writes any file; uid 65534 cannot run this interpreter or read this checkout")
    if not as_nobody:
        pytest.skip("a file of another user is made by root (and checked as uid 65534)")
    where = Path(tempfile.mkdtemp())  # a directory uid 65534 can reach, holding root's 0644 file
    os.chmod(where, 0o755)
    path = where / "prompt.cache"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    try:
        message = _mode_message(path, as_nobody, capsys)
    finally:
        shutil.rmtree(where)
    assert "is not writable by this user (mode 0644, owned by uid 0)" in message
    assert "chmod u+w" not in message
    assert "is read-only" not in message
    assert "have its owner let this user write it" in message


def test_a_file_no_one_may_write_is_still_told_to_chmod(tmp_path, capsys):
    path = tmp_path / "prompt.cache"
    path.write_bytes(b"")
    os.chmod(path, 0o444)
    message = _mode_message(path, False, capsys)
    assert "is read-only (mode 0444): it is loaded and not written" in message
    assert "make it writable (chmod u+w) to have runs update it" in message


@posix_only
def test_a_cache_file_of_this_user_without_its_owner_write_bit_is_told_to_chmod(tmp_path, capsys):
    """This user's own file with write bits for its group and others but not for its owner (0422) is not another
    user's file: the fix is chmod u+w, not asking its owner."""
    as_nobody = os.geteuid() == 0  # root writes any file: the owner is uid 65534 then
    if as_nobody and (shutil.which("setpriv") is None or not _runs_as_nobody()):
        pytest.skip("root writes any file; checking as another user needs setpriv and a checkout uid 65534 reads")
    where = Path(tempfile.mkdtemp()) if as_nobody else tmp_path
    path = where / "prompt.cache"
    path.write_bytes(b"")
    os.chmod(path, 0o422)
    if as_nobody:
        os.chmod(where, 0o755)
        os.chown(path, 65534, 65534)
    try:
        message = _mode_message(path, as_nobody, capsys)
    finally:
        if as_nobody:
            shutil.rmtree(where)
    assert "is not writable by its owner, this user (mode 0422)" in message
    assert "make it writable (chmod u+w)" in message
    assert "have its owner let this user write it" not in message
