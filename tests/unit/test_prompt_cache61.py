"""The prompt cache, review 61 (edgesdk/runtime/cache_file.py, prompt_cache.py, cache_store.py,
edgesdk/cli_prompt_cache.py)."""

from __future__ import annotations

import errno
import os
import stat

import numpy as np
import pytest

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache
from tests._utils.small_disk import small_disk

pytest.importorskip("torch")

BUNDLE_ID = "0123456789abcdef"


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from tests.unit.test_prompt_cache import BACKENDS

    return BACKENDS["standard"](tmp_path_factory.mktemp("standard61"))


def _filled(backend, count: int, seed: int) -> PromptCache:
    """A cache holding ``count`` prefilled tokens drawn with ``seed``."""
    cache = PromptCache(backend)
    ids = [int(t) for t in np.random.default_rng(seed).integers(0, 320, count)]
    backend.reset()
    backend.prefill(np.array(ids))
    cache.took(ids)
    return cache


def _free_bytes(directory) -> int:
    disk = os.statvfs(directory)
    return disk.f_bavail * disk.f_frsize


def test_a_full_disk_with_room_for_the_cache_in_the_old_files_place_takes_the_new_cache(backend, tmp_path):
    """The write's copy beside the old file needs room for two caches: on a disk with less free than one cache (a
    board's nearly full SD card) every rewrite failed "No space left on device" after the answer, where llama-cli's
    fopen("wb") over the old file fits. The old file is written over there, keeping its mode and inode."""
    with small_disk(tmp_path / "disk", "40k") as disk:
        path = disk / "prompt.cache"
        cache_file.save(path, _filled(backend, 40, seed=1), BUNDLE_ID)
        os.chmod(path, 0o600)
        inode, size = os.stat(path).st_ino, os.stat(path).st_size
        assert _free_bytes(disk) < size  # no room for a second copy beside it
        fresh = _filled(backend, 40, seed=2)
        cache_file.save(path, fresh, BUNDLE_ID)
        assert sorted(os.listdir(disk)) == ["prompt.cache"]
        assert (os.stat(path).st_ino, stat.S_IMODE(os.stat(path).st_mode)) == (inode, 0o600)
        loaded = PromptCache(backend)
        assert cache_file.load(path, loaded, BUNDLE_ID) == (40, None)
        assert loaded.tokens == fresh.tokens


def test_a_cache_that_would_not_fit_even_in_the_old_files_place_leaves_the_old_one_whole(backend, tmp_path):
    with small_disk(tmp_path / "disk", "40k") as disk:
        path = disk / "prompt.cache"
        old = _filled(backend, 40, seed=1)
        cache_file.save(path, old, BUNDLE_ID)
        before = path.read_bytes()
        with pytest.raises(OSError, match="No space left on device") as caught:
            cache_file.save(path, _filled(backend, 100, seed=2), BUNDLE_ID)
        assert caught.value.errno == errno.ENOSPC
        assert path.read_bytes() == before
        assert sorted(os.listdir(disk)) == ["prompt.cache"]
