"""Review 61's mends: the prompt cache written in place on a full disk, tested without a small disk to mount
(edgesdk/runtime/cache_file.py), and the context refusal's fix worded once for the command line and the Python API
(edgesdk.bundle.context_fix, edgesdk/api.py)."""

from __future__ import annotations

import errno
import os
import stat
import types

import numpy as np
import pytest

from edgesdk.api import _too_long
from edgesdk.bundle import at_model_positions, context_fix, largest_context_rebuild
from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache
from tests.unit.test_prompt_cache61 import BUNDLE_ID, _filled, backend  # noqa: F401 - backend: the fixture


@pytest.fixture
def fill_disk(monkeypatch):
    """Fill the disk of the cache file at ``path``, leaving no room for a copy of the cache beside it: the write
    beside it fails ENOSPC, and os.statvfs reports half the file's size free (room for the cache once the old file's
    blocks are freed). Returns the directories statvfs is then asked about."""

    def fill(path) -> list[str]:
        measured, free = [], os.stat(path).st_size // 2

        def no_room(path, partial, mode, entries):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial))

        def statvfs(directory):
            measured.append(os.fspath(directory))
            return types.SimpleNamespace(f_bavail=free, f_frsize=1)

        monkeypatch.setattr(cache_file, "_write_beside", no_room)
        monkeypatch.setattr(os, "statvfs", statvfs)
        return measured

    return fill


def test_a_full_disk_writes_the_cache_over_the_old_file_keeping_its_inode_and_mode(backend, tmp_path, fill_disk):  # noqa: F811
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 40, seed=1), BUNDLE_ID)
    os.chmod(path, 0o640)
    inode = os.stat(path).st_ino
    measured = fill_disk(path)
    fresh = _filled(backend, 40, seed=2)
    cache_file.save(path, fresh, BUNDLE_ID)
    assert measured == [str(tmp_path)]
    assert (os.stat(path).st_ino, stat.S_IMODE(os.stat(path).st_mode)) == (inode, 0o640)
    assert sorted(os.listdir(tmp_path)) == ["prompt.cache"]
    loaded = PromptCache(backend)
    assert cache_file.load(path, loaded, BUNDLE_ID) == (40, None)
    assert loaded.tokens == fresh.tokens


def test_through_a_symlink_the_target_s_disk_is_measured_and_written_in_place(backend, tmp_path, fill_disk):  # noqa: F811
    """A link to a cache on another disk: the room measured is the target's disk, and the target is written over
    (the link stays a link), not the link's directory's."""
    (tmp_path / "card").mkdir()
    (tmp_path / "home").mkdir()
    target, link = tmp_path / "card" / "prompt.cache", tmp_path / "home" / "prompt.cache"
    cache_file.save(target, _filled(backend, 40, seed=1), BUNDLE_ID)
    link.symlink_to(target)
    inode = os.stat(target).st_ino
    measured = fill_disk(target)
    fresh = _filled(backend, 40, seed=3)
    cache_file.save(link, fresh, BUNDLE_ID)
    assert measured == [os.path.realpath(tmp_path / "card")]
    assert link.is_symlink()
    assert os.stat(target).st_ino == inode
    loaded = PromptCache(backend)
    assert cache_file.load(link, loaded, BUNDLE_ID) == (40, None)
    assert loaded.tokens == fresh.tokens


def test_a_cache_that_fits_nowhere_leaves_the_old_file_whole(backend, tmp_path, fill_disk):  # noqa: F811
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 40, seed=1), BUNDLE_ID)
    before = path.read_bytes()
    fill_disk(path)
    with pytest.raises(OSError, match="No space left on device") as caught:
        cache_file.save(path, _filled(backend, 100, seed=2), BUNDLE_ID)
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == before


def test_an_in_place_write_that_fails_leaves_an_empty_file_the_next_load_names(backend, tmp_path, fill_disk,  # noqa: F811
                                                                                monkeypatch):
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 40, seed=1), BUNDLE_ID)
    fill_disk(path)

    def savez(out, **entries):
        out.write(b"PK\x03\x04" + bytes(100))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "savez", savez)
    with pytest.raises(OSError, match="No space left on device") as caught:
        cache_file.save(path, _filled(backend, 40, seed=2), BUNDLE_ID)
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == b""
    assert cache_file.load(path, PromptCache(backend), BUNDLE_ID) == (0, "it cannot be read as a cache file: it is empty")


# ------------------------------------------------------------------------------------------- the context refusal

PYTHON_TERMS = {"terms": "python"}


def test_the_fix_takes_how_a_rebuild_is_written():
    shorten = "shorten the prompt"
    assert context_fix(shorten, 256, 512, 300, **PYTHON_TERMS) == (
        "shorten the prompt, or build the bundle again with build_bundle(..., max_context=512), the most the model's "
        "max_position_embeddings (512) allows")
    assert context_fix(shorten, 256, 512, 600, **PYTHON_TERMS) == (
        "shorten the prompt: the model's max_position_embeddings is 512, fewer than the 600 tokens, and no build of "
        "the model goes past it (build_bundle(..., max_context=512) gives the most)")
    assert context_fix(shorten, 256, 256, 300, **PYTHON_TERMS) == f"{shorten}: {at_model_positions(256)}"
    assert context_fix(shorten, 256, 512) == f"{shorten}, or {largest_context_rebuild(512)}"  # the command line's


class _Refusal(Exception):
    """An ApiError's fields as _too_long reads them."""

    def __init__(self, param: str, context):
        super().__init__("the prompt has 300 tokens, the context holds 256 (POST /tokenize counts them)")
        self.message, self.param, self.context = str(self), param, context


PYTHON_SHORTEN = "shorten the prompt (model.tokenize(text) counts a text's tokens, model.n_ctx() is the context)"


@pytest.mark.parametrize(("context", "fix"), [
    ((300, 256, 512), f"{PYTHON_SHORTEN}, or build the bundle again with build_bundle(..., max_context=512), the most "
                      "the model's max_position_embeddings (512) allows"),
    ((600, 256, 512), f"{PYTHON_SHORTEN}: the model's max_position_embeddings is 512, fewer than the 600 tokens, and "
                      "no build of the model goes past it (build_bundle(..., max_context=512) gives the most)"),
    ((300, 256, 256), f"{PYTHON_SHORTEN}: {at_model_positions(256)}"),
    ((300, 256, None), f"{PYTHON_SHORTEN}, or build the bundle again with a larger context (build_bundle(..., "
                       "max_context=N))"),
    (None, f"{PYTHON_SHORTEN}, or build the bundle again with a larger context (build_bundle(..., max_context=N))"),
])
def test_the_python_api_s_fix_is_the_shared_one_in_its_terms(context, fix):
    refused = _too_long("create_completion", _Refusal("prompt", context))
    assert refused.fix == fix
    assert "tokenize()" in str(refused)
    assert "POST /tokenize" not in str(refused)


def test_a_cache_that_fits_the_old_files_place_in_bytes_but_not_in_whole_blocks_leaves_it_whole(backend, tmp_path,  # noqa: F811
                                                                                                monkeypatch):
    """The disk gives a file whole blocks: a cache whose bytes just fit the free space plus the old file's blocks,
    with nothing over for a partial last block, was written in place and would run out of room after truncating,
    losing the old cache."""
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 40, seed=1), BUNDLE_ID)
    before, freed = path.read_bytes(), os.stat(path).st_blocks * 512
    free = []

    def no_room(path, partial, mode, entries):  # the free space left: the cache's bytes exactly, with the old file's
        needed = sum(array.nbytes for array in entries.values()) + cache_file.ENTRY_OVERHEAD * len(entries)
        free.append(needed - freed)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial))

    monkeypatch.setattr(cache_file, "_write_beside", no_room)
    monkeypatch.setattr(os, "statvfs", lambda directory: types.SimpleNamespace(f_bavail=free[-1], f_frsize=1))
    with pytest.raises(OSError, match="No space left on device"):
        cache_file.save(path, _filled(backend, 40, seed=2), BUNDLE_ID)
    assert free[-1] > 0
    assert path.read_bytes() == before
