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
