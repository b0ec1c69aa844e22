"""The prompt cache, review 57 (edgesdk/runtime/cache_file.py, prompt_cache.py, cache_store.py,
edgesdk/cli_prompt_cache.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from edgesdk.cli_prompt_cache import writable_prompt_cache

REPO = Path(__file__).resolve().parents[2]


def test_a_prompt_cache_name_too_long_for_a_file_is_refused_before_the_run(tmp_path):
    """A FILE whose name is past NAME_MAX passed the check before the bundle loaded: the load said "cannot be looked
    up ... the next answer rewrites it", and the write failed with "File name too long" once the answer had run. It
    is refused by name before the bundle loads; a name just within the limit (that of tmp_path's file system) still
    passes."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    too_long = tmp_path / ("c" * (name_max + 1))
    with pytest.raises(click.BadParameter) as caught:
        writable_prompt_cache(too_long)
    message = caught.value.format_message()
    assert f"is {name_max + 1} bytes, more than the {name_max} bytes a file name may have" in message
    assert "pass a path with a shorter name" in message
    within = tmp_path / ("c" * name_max)
    assert writable_prompt_cache(within) == within


def test_a_prompt_cache_below_a_directory_name_too_long_is_refused_for_its_length(tmp_path):
    """A directory name past NAME_MAX was said not to exist, with the fix "mkdir -p" it, which fails the same way."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    path = tmp_path / ("d" * (name_max + 1)) / "prompt.cache"
    with pytest.raises(click.BadParameter) as caught:
        writable_prompt_cache(path)
    message = caught.value.format_message()
    assert f"is {name_max + 1} bytes" in message
    assert "mkdir" not in message


CHECK_ON_READ_ONLY_MOUNT = """
import sys
from pathlib import Path
import click
from edgesdk.cli_prompt_cache import writable_prompt_cache
try:
    writable_prompt_cache(Path(sys.argv[1]) / "prompt.cache")
except click.BadParameter as exc:
    print(exc.format_message())
"""


def test_a_prompt_cache_on_a_read_only_file_system_is_told_so(tmp_path):
    """A new FILE in a directory of a file system mounted read-only (a container's ``:ro`` volume) was said to be in
    a directory "not writable by this user", with the fix "make it writable", which chmod cannot do there (EROFS).
    Checked in a mount namespace of its own, where a read-only tmpfs is mounted over ``tmp_path``."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount to mount a read-only file system")
    script = tmp_path / "check.py"
    script.write_text(CHECK_ON_READ_ONLY_MOUNT, encoding="utf-8")
    where = tmp_path / "mounted"
    where.mkdir()
    command = (f'mount -t tmpfs -o ro,size=64k tmpfs "$1" || exit 77; '
               f'exec "{sys.executable}" "$2" "$1"')
    done = subprocess.run(["unshare", "-rm", "sh", "-c", command, "sh", str(where), str(script)],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    if done.returncode == 77 or "unshare" in done.stderr:
        pytest.skip(f"cannot mount a read-only file system here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert f"its directory {where} is on a read-only file system" in done.stdout
    assert "pass a path on a writable file system" in done.stdout
    assert "not writable by this user" not in done.stdout


def test_the_temporary_file_of_a_name_the_check_takes_fits_its_file_systems_name_max(tmp_path, monkeypatch):
    """The check measured a name against the file system's NAME_MAX (eCryptfs: 143), but the write cut its temporary
    FILE.PID-HEX.partial to Linux's usual 255: a 130-byte name passed and its write failed "File name too long"
    after the answer. The temporary name is cut to the directory's own limit."""
    from types import SimpleNamespace

    import numpy as np

    from edgesdk.runtime import cache_file

    pathconf, opened = os.pathconf, []
    monkeypatch.setattr(os, "pathconf", lambda path, name: 143 if name == "PC_NAME_MAX" else pathconf(path, name))
    real_open = os.open

    def recording_open(path, *args, **kwargs):
        opened.append(os.path.basename(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    path = tmp_path / ("c" * 130)
    assert writable_prompt_cache(path) == path
    backend = SimpleNamespace(save_cache=lambda: ([np.zeros((1, 2), np.float32)], None))
    cache_file.save(path, SimpleNamespace(tokens=[1, 2], backend=backend), "bundle")
    partials = [name for name in opened if name.endswith(".partial")]
    assert partials
    assert all(len(os.fsencode(name)) <= 143 for name in partials)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [path.name]


def test_a_path_whose_temporary_file_passes_path_max_is_refused_before_the_run(tmp_path, monkeypatch):
    """The path of the write's temporary file is the FILE's with its suffix added: a path within PATH_MAX whose
    temporary file's is not was taken, and the write failed after the answer."""
    from edgesdk.runtime.cache_file import PARTIAL_SUFFIX_MAX

    path = tmp_path / "prompt.cache"
    size = len(os.fsencode(path))
    pathconf = os.pathconf
    monkeypatch.setattr(os, "pathconf", lambda where, name: size + 10 if name == "PC_PATH_MAX" else
                        pathconf(where, name))
    with pytest.raises(click.BadParameter) as caught:
        writable_prompt_cache(path)
    message = caught.value.format_message()
    assert f"the path is {size} bytes with the {PARTIAL_SUFFIX_MAX} bytes the write's temporary file adds" in message
    monkeypatch.setattr(os, "pathconf", lambda where, name: size + PARTIAL_SUFFIX_MAX + 1 if name == "PC_PATH_MAX"
                        else pathconf(where, name))
    assert writable_prompt_cache(path) == path


@pytest.mark.parametrize("name_max", [143, 255])
@pytest.mark.parametrize("name", ["prompt.cache", "c" * 130, "é" * 70, "d" * 140],
                         ids=["short", "cut", "two-byte", "near-name-max"])
def test_the_check_and_the_write_measure_the_temporary_file_by_one_helper(tmp_path, monkeypatch, name, name_max):
    """The check (edgesdk/cli_prompt_cache.py) worked out the temporary file's length apart from the write's cut
    (edgesdk/runtime/cache_file.py); both now take it from ``partial_name_size``: the longest name a write makes."""
    from edgesdk.runtime import cache_file

    pathconf = os.pathconf
    monkeypatch.setattr(os, "pathconf", lambda where, key: name_max if key == "PC_NAME_MAX" else pathconf(where, key))
    suffix = f".{2**22}-{'f' * 8}.partial"
    written = len(os.fsencode(cache_file._cut(name, suffix, tmp_path) + suffix))
    assert cache_file.partial_name_size(name, tmp_path) == written == min(len(os.fsencode(name)) + len(suffix), name_max)
    assert cache_file.partial_name_size(name, tmp_path, 10) == min(len(os.fsencode(name)) + 10, name_max)
    path = tmp_path / name
    longest = len(os.fsencode(path)) - len(os.fsencode(name)) + max(len(os.fsencode(name)), written)
    for path_max, taken in ((longest, False), (longest + 1, True)):  # PATH_MAX counts the terminating NUL
        monkeypatch.setattr(os, "pathconf", lambda where, key, path_max=path_max: name_max if key == "PC_NAME_MAX"
                            else path_max if key == "PC_PATH_MAX" else pathconf(where, key))
        if taken:
            assert writable_prompt_cache(path) == path
        else:
            with pytest.raises(click.BadParameter, match="PATH_MAX"):
                writable_prompt_cache(path)
