"""Conversation state and caches, review 46 (edgesdk/runtime/cache_file.py, prompt_cache.py, cache_store.py,
conversation.py, generate.py)."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache

pytest.importorskip("torch")

BUNDLE_ID = "0123456789abcdef"


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from tests.unit.test_prompt_cache import _standard

    return _standard(tmp_path_factory.mktemp("standard46"))


def _filled(backend, count: int = 30) -> PromptCache:
    """A cache holding ``count`` prefilled tokens."""
    cache = PromptCache(backend)
    ids = [int(t) for t in np.random.default_rng(count).integers(0, 320, count)]
    backend.reset()
    backend.prefill(np.array(ids))
    cache.took(ids)
    return cache


def test_a_private_cache_file_stays_private_when_it_is_written_again(backend, tmp_path):
    """The write renamed a new file over the old one, created with the umask's mode: a cache made private (chmod
    600; its token ids are the prompt's text) came back 0644, readable by every user of the board. llama-cli's
    fopen("wb") over the file keeps its permissions; so does the write now."""
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 20), BUNDLE_ID)
    os.chmod(path, 0o600)
    cache_file.save(path, _filled(backend, 30), BUNDLE_ID)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o640)
    cache_file.save(path, _filled(backend, 25), BUNDLE_ID)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert cache_file.load(path, PromptCache(backend), BUNDLE_ID) == (25, None)


def test_a_new_cache_file_gets_the_mode_open_gives_a_new_file(backend, tmp_path):
    """A file that did not exist is created as open() creates one: 0666 less the umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 20), BUNDLE_ID)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_a_cache_file_with_a_long_valid_name_is_written(backend, tmp_path):
    """The temporary file's name was the file's name plus ".PID-HEX.partial" (up to 25 bytes): a valid name of
    230 bytes or more failed with "File name too long" once the answer had run, where llama-cli writes it."""
    for name in ("k" * 250 + ".npz", "é" * 125 + ".npz"):  # 254 and 254 bytes: within NAME_MAX (255)
        path = tmp_path / name
        cache_file.save(path, _filled(backend, 20), BUNDLE_ID)
        assert cache_file.load(path, PromptCache(backend), BUNDLE_ID) == (20, None)
        path.unlink()
    assert list(tmp_path.iterdir()) == []  # no temporary file left beside it


def _damaged(path, how: str) -> None:
    """``path`` (a whole cache file) cut short, with a byte of its first cache array flipped, or emptied."""
    import zipfile

    raw = bytearray(path.read_bytes())
    if how == "cut short":
        raw = raw[: len(raw) // 2]
    elif how == "flipped":
        with zipfile.ZipFile(path) as archive:
            member = archive.getinfo("cache_0.npy")
        raw[member.header_offset + 200] ^= 0xFF  # inside the array's data (past the zip and .npy headers)
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(("how", "said"), [
    ("cut short", "it is cut short (the archive's end is missing"),
    ("flipped", "its data fail their checksum, damaged on disk or in a copy (Bad CRC-32 for file 'cache_0.npy')"),
    ("emptied", "it is empty"),
])
def test_a_damaged_cache_file_is_refused_saying_what_is_wrong(backend, tmp_path, how, said):
    """A file cut short (a copy that did not finish) was refused as "BadZipFile: File is not a zip file", which it
    is, at its start; now the refusal says it is cut short, that its data fail their checksum, or that it is
    empty. Each is still refused, and the live cache is left empty."""
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 30), BUNDLE_ID)
    _damaged(path, how)
    cache = PromptCache(backend)
    loaded, why = cache_file.load(path, cache, BUNDLE_ID)
    assert loaded == 0
    assert why.startswith("it cannot be read as a cache file: ")
    assert said in why
    assert "not a zip file" not in why
    assert cache.tokens == []


def test_a_file_of_another_kind_is_not_said_to_hold_pickled_data(backend, tmp_path):
    """A text file given as the cache was refused with numpy's words for it: "This file contains pickled (object)
    data. If you trust the file you can load it unsafely ..." - neither true nor advice to follow. It is named as
    not being an .npz archive, with its first bytes."""
    path = tmp_path / "prompt.cache"
    path.write_text("a prompt, not its cache\n")
    loaded, why = cache_file.load(path, PromptCache(backend), BUNDLE_ID)
    assert loaded == 0
    assert why == ("it cannot be read as a cache file: it is not a NumPy .npz archive (it starts with b'a prompt', "
                   "an .npz with b'PK\\x03\\x04')")
