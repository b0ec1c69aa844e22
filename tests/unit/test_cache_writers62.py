"""A prompt cache written over its old file (a disk without room for a copy beside it) by several processes at once,
and read while it is written: the writers take turns, a reader waits for the write, and a write the disk cuts short
is an error that leaves a file the next run refuses (edgesdk/runtime/cache_file.py). The writes and reads run in
processes of their own, ordered by events, never by time."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import resource
import signal
import types
from pathlib import Path

import numpy as np
import pytest

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache
from tests.unit.test_prompt_cache61 import BUNDLE_ID, _filled, backend  # noqa: F401 - backend: the fixture

SPAWN = multiprocessing.get_context("spawn")  # a process of its own, which the backend's threads are not forked into
WAIT_S = 120.0  # a bound on each wait for another process, so a broken order fails the test rather than hangs it


def _entries(backend, count: int, seed: int) -> tuple[list[int], list, str]:  # noqa: F811
    """A cache of ``count`` tokens drawn with ``seed``, as a writer process takes it: token ids, arrays, backend."""
    cache = _filled(backend, count, seed)
    return list(cache.tokens), backend.save_cache()[0], backend.name


def _no_room_beside(put=lambda name, value: setattr(cache_file, name, value)) -> None:
    """This process's disk has no room for a copy of the cache beside the old file, and room in its place (``put``:
    how cache_file's functions are replaced)."""

    def no_room(path, partial, mode, entries):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial))

    put("_write_beside", no_room)
    put("_fits_in_place", lambda path, entries: True)


def _save(path, tokens, state, name) -> None:
    snapshot = (tokens, state)
    cache_file.save(Path(path), types.SimpleNamespace(tokens=tokens, backend=types.SimpleNamespace(name=name)),
                    BUNDLE_ID, snapshot)


class _Pausing:
    """The file a write goes to, paused once ``pause_at`` bytes are written: ``paused`` is set, ``go`` awaited."""

    def __init__(self, out, pause_at: int, paused, go):
        self.out, self.pause_at, self.paused, self.go, self.written = out, pause_at, paused, go, 0

    def write(self, data) -> int:
        self.written += len(data)
        if self.written >= self.pause_at and not self.paused.is_set():
            written = self.out.write(data)
            self.paused.set()
            if not self.go.wait(WAIT_S):
                raise TimeoutError("the test never let this write go on")
            return written
        return self.out.write(data)

    def __getattr__(self, name):
        return getattr(self.out, name)


def _write_paused(path: str, tokens, state, name, pause_at: int, paused, go) -> None:
    """In a process of its own: write the cache in place, pausing half way (``_Pausing``)."""
    _no_room_beside()
    savez = np.savez
    np.savez = lambda out, **entries: savez(_Pausing(out, pause_at, paused, go), **entries)
    _save(path, tokens, state, name)


def _write_limited(path: str, tokens, state, name, limit: int, told) -> None:
    """In a process of its own whose files may not grow past ``limit`` bytes (RLIMIT_FSIZE, the write that crosses
    it cut short, as a disk that fills mid-write cuts it): write the cache in place; ``told`` gets what save did."""
    _no_room_beside()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails EFBIG, and does not end the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        _save(path, tokens, state, name)
    except OSError as exc:
        told.put(("failed", exc.errno))
    else:
        told.put(("saved", None))


@pytest.fixture
def turn(monkeypatch):
    """This process's flock: ``go`` is set as it asks for a lock (then waits for it), so a paused writer goes on
    once this process's write or read is at the lock, or with no lock taken, once it is done."""
    go, flock = SPAWN.Event(), fcntl.flock

    def asking(descriptor, operation):
        go.set()
        return flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", asking)
    return go


def _paused_writer(path: Path, cache, go):
    paused = SPAWN.Event()
    writer = SPAWN.Process(target=_write_paused, args=(str(path), *cache, path.stat().st_size // 2, paused, go))
    writer.start()
    assert paused.wait(WAIT_S), "the writer never reached the middle of its write"
    return writer


def _loaded(backend, path: Path) -> tuple[int, str | None, list[int]]:  # noqa: F811
    loaded = PromptCache(backend)
    count, why = cache_file.load(path, loaded, BUNDLE_ID)
    return count, why, loaded.tokens


def test_a_second_in_place_writer_waits_for_the_first_and_leaves_its_cache_whole(backend, tmp_path,  # noqa: F811
                                                                                 turn, monkeypatch):
    """A run writes the cache over its old file (a full disk) and is half way when another run writes the same
    file: the second truncated the file under the first, whose rest then landed in the second's cache, leaving a
    file of both that no run loads. It now waits for the first to finish, and its whole cache stays."""
    path = tmp_path / "prompt.cache"
    first, second = _entries(backend, 40, seed=1), _entries(backend, 40, seed=2)
    _save(path, *first)
    writer = _paused_writer(path, first, turn)
    _no_room_beside(lambda name, value: monkeypatch.setattr(cache_file, name, value))  # this write goes in place too
    try:
        _save(path, *second)
    finally:
        turn.set()  # where no lock was asked for, the first writer goes on after this one is done
        writer.join(WAIT_S)
    assert writer.exitcode == 0
    assert _loaded(backend, path) == (40, None, second[0])
    assert sorted(os.listdir(tmp_path)) == ["prompt.cache"]


def test_a_reader_waits_for_an_in_place_write_and_loads_the_whole_new_cache(backend, tmp_path, turn):  # noqa: F811
    """A run that starts while another writes the cache in place read an archive cut short and prefilled its prompt
    whole; it now waits for the write and loads the cache written."""
    path = tmp_path / "prompt.cache"
    old, new = _entries(backend, 40, seed=3), _entries(backend, 40, seed=4)
    _save(path, *old)
    writer = _paused_writer(path, new, turn)
    try:
        loaded = _loaded(backend, path)
    finally:
        turn.set()
        writer.join(WAIT_S)
    assert writer.exitcode == 0
    assert loaded == (40, None, new[0])


def test_a_file_a_beside_write_replaces_mid_way_loads_one_whole_cache(backend, tmp_path, turn):  # noqa: F811
    """An in-place write paused half way, a write with room beside the file renamed over it meanwhile: the
    in-place write goes on into the file the rename replaced, and the path holds the renamed cache whole."""
    path = tmp_path / "prompt.cache"
    old, paused, renamed = (_entries(backend, 40, seed=seed) for seed in (5, 6, 7))
    _save(path, *old)
    writer = _paused_writer(path, paused, turn)
    try:
        _save(path, *renamed)
    finally:
        turn.set()
        writer.join(WAIT_S)
    assert writer.exitcode == 0
    assert _loaded(backend, path) == (40, None, renamed[0])


def test_an_in_place_write_the_disk_cuts_short_fails_and_leaves_a_file_load_refuses(backend, tmp_path):  # noqa: F811
    """The disk takes all but the last byte of the cache: the write of the archive's last bytes returns fewer bytes
    than it was given, which the unbuffered file passed on to zipfile unchecked: the run said nothing and left an
    archive one byte short. It is now an error, and the file is left empty, which the next run names."""
    path, whole = tmp_path / "prompt.cache", tmp_path / "whole.cache"
    old, new = _entries(backend, 40, seed=8), _entries(backend, 40, seed=9)
    _save(path, *old)
    _save(whole, *new)
    told = SPAWN.Queue()
    writer = SPAWN.Process(target=_write_limited, args=(str(path), *new, whole.stat().st_size - 1, told))
    writer.start()
    outcome = told.get(timeout=WAIT_S)
    writer.join(WAIT_S)
    assert outcome == ("failed", errno.EFBIG)
    assert path.read_bytes() == b""
    assert _loaded(backend, path)[:2] == (0, "it cannot be read as a cache file: it is empty")


def test_a_write_past_the_file_size_limit_is_told_to_raise_it():
    """EFBIG (a file past ``ulimit -f``, or the file system's largest file): the fix was to pass a path in a
    directory this user may write to, which the user could already."""
    from edgesdk.cli_prompt_cache import write_fix

    fix = write_fix(OSError(errno.EFBIG, os.strerror(errno.EFBIG)), Path("/tmp/prompt.cache"))
    assert fix == ("raise this shell's file size limit (ulimit -f unlimited), or pass a --prompt-cache path on a file "
                   "system that takes a file of the KV cache's size")
