"""Runtime review 51 (edgesdk/runtime/cache_file.py and the rest of its area)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache

pytest.importorskip("torch")

# A run writing its --prompt-cache file, killed by SIGKILL (the OOM killer, systemd's stop timeout) inside the write:
# fsync stands for the disk being slow, the moment the kill lands.
KILLED_WRITER = """
import os, pathlib, sys, time
import numpy as np
from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache
from edgesdk.runtime.session import open_runtime

runtime = open_runtime(sys.argv[1], threads=1)
cache = PromptCache(runtime.backend)
ids = list(range(1, 41))
runtime.backend.prefill(np.asarray(ids, np.int64))
cache.took(ids)
os.fsync = lambda fd: (print("writing", flush=True), time.sleep(120))
cache_file.save(pathlib.Path(sys.argv[2]), cache, runtime.bundle.bundle_id)
"""


def _filled(runtime, count: int) -> PromptCache:
    cache = PromptCache(runtime.backend)
    ids = list(range(3, 3 + count))
    runtime.backend.reset()
    runtime.backend.prefill(np.asarray(ids, np.int64))
    cache.took(ids)
    return cache


def _aged(path, seconds: float = 600.0) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_file_a_killed_write_left_beside_the_cache_is_removed_by_the_next_write(tiny_bundle, runtime, tmp_path):
    """A write goes to FILE.PID-HEX.partial renamed over FILE; a run killed by SIGKILL inside the write left that
    copy of the whole cache beside FILE for good (tens of MB on a board, one more at each such kill), as no write
    looked at it again. llama-cli writes its --prompt-cache file in place and leaves nothing beside it. The next
    write now removes it; the cache itself stays whole and loads."""
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(runtime, 20), runtime.bundle.bundle_id)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(tiny_bundle.path), str(path)],
                              stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert writer.stdout.readline().strip() == "writing"
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    left = sorted(entry.name for entry in tmp_path.iterdir() if entry.name != path.name)
    assert left == [f"{path.name}.{writer.pid}-{left[0].rsplit('-', 1)[1]}"]  # what the kill left
    assert cache_file.load(path, PromptCache(runtime.backend), runtime.bundle.bundle_id) == (20, None)
    _aged(tmp_path / left[0])  # the next run, minutes later
    cache_file.save(path, _filled(runtime, 30), runtime.bundle.bundle_id)
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]
    assert cache_file.load(path, PromptCache(runtime.backend), runtime.bundle.bundle_id) == (30, None)


def test_a_writer_s_file_that_may_still_be_written_and_other_files_are_left(runtime, tmp_path):
    """Only a temporary file of this cache whose writer is gone and that was left alone for a while is removed: not
    a running writer's (a concurrent run), not one written to a moment ago (a writer in another PID namespace
    sharing the directory), not another cache's, not a file of the user's."""
    path = tmp_path / "prompt.cache"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = _dead_pid()
        kept = {f"{path.name}.{sleeper.pid}-0123abcd.partial": True,  # a running writer's, however old
                f"{path.name}.{dead}-4567cdef.partial": False,  # a writer that is gone, written to just now
                f"other.cache.{dead}-89abcdef.partial": True,  # another cache's
                f"{path.name}.{dead}-notahex0.partial": True,  # not a name a write gives
                f"{path.name}.{dead}-0123abcd.partial.keep": True}
        for name, aged in kept.items():
            (tmp_path / name).write_bytes(b"PK\x03\x04")
            if aged:
                _aged(tmp_path / name)
        gone = f"{path.name}.{dead}-deadbeef.partial"
        (tmp_path / gone).write_bytes(b"PK\x03\x04")
        _aged(tmp_path / gone)
        cache_file.save(path, _filled(runtime, 12), runtime.bundle.bundle_id)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(entry.name for entry in tmp_path.iterdir()) == sorted([path.name, *kept])


def test_a_long_name_s_temporary_file_is_found_where_its_name_was_cut(runtime, tmp_path):
    """A name of 230 bytes and more is cut to leave room for the temporary file's suffix within NAME_MAX (255): the
    stale file of such a cache is found by its cut name."""
    path = tmp_path / ("é" * 120 + ".cache")  # 246 bytes
    dead = _dead_pid()
    suffix = f".{dead}-0123abcd.partial"
    stale = tmp_path / (os.fsdecode(os.fsencode(path.name)[: cache_file.NAME_MAX - len(suffix)]) + suffix)
    stale.write_bytes(b"PK\x03\x04")
    _aged(stale)
    cache_file.save(path, _filled(runtime, 12), runtime.bundle.bundle_id)
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]
