"""Review 53 of the cache area: what a refused --prompt-cache file is said to be (edgesdk/runtime/cache_file.py)."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache

pytest.importorskip("torch")

BUNDLE_ID = "0123456789abcdef"


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from tests.unit.test_prompt_cache import BACKENDS

    return BACKENDS["standard"](tmp_path_factory.mktemp("standard"))


def _written(backend, path, count: int = 30) -> None:
    """A cache file at ``path`` holding ``count`` prefilled tokens."""
    cache = PromptCache(backend)
    ids = [int(t) for t in np.random.default_rng(count).integers(0, 320, count)]
    backend.reset()
    backend.prefill(np.array(ids))
    cache.tokens = ids
    cache_file.save(path, cache, BUNDLE_ID)


def _rewritten(path, change) -> None:
    """The cache file at ``path`` written again with ``change`` applied to its arrays (a dict by entry name)."""
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    change(arrays)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path.write_bytes(buffer.getvalue())


def test_a_whole_file_with_a_damaged_entry_header_is_not_said_to_be_cut_short(backend, tmp_path):
    """A byte flipped in an entry's local header (a whole file, its end and directory there) was refused as "cut
    short (the archive's end is missing, as a copy or download that did not finish leaves)": the user sent to
    copy it again whole, which it already is."""
    path = tmp_path / "prompt.cache"
    _written(backend, path)
    size = path.stat().st_size
    with zipfile.ZipFile(path) as archive:
        offset = archive.getinfo("cache_1.npy").header_offset
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF  # the entry's signature, PK\x03\x04
    path.write_bytes(bytes(raw))
    cache = PromptCache(backend)
    loaded, why = cache_file.load(path, cache, BUNDLE_ID)
    assert (loaded, cache.tokens, backend.position) == (0, [], 0)
    assert path.stat().st_size == size
    assert "cut short" not in why
    assert "it is damaged inside, on disk or in a copy (Bad magic number for file header)" in why


def test_a_file_cut_short_is_still_said_to_be(backend, tmp_path):
    path = tmp_path / "prompt.cache"
    _written(backend, path)
    path.write_bytes(path.read_bytes()[:-40])  # the end of central directory record (22 bytes) and more gone
    loaded, why = cache_file.load(path, PromptCache(backend), BUNDLE_ID)
    assert loaded == 0
    assert "it is cut short (the archive's end is missing" in why


def test_a_file_with_fewer_cache_arrays_says_how_many(backend, tmp_path):
    """One past tensor fewer than the backend's cache was refused as "cannot be read as a cache file (KeyError:
    'cache_3 is not a file in the archive')", where one more was counted ("it holds 5 cache arrays, ...")."""
    path = tmp_path / "prompt.cache"
    _written(backend, path)
    layers = len(backend.save_cache()[0])

    def drop_last(arrays):
        del arrays[f"cache_{layers - 1}"]

    _rewritten(path, drop_last)
    loaded, why = cache_file.load(path, PromptCache(backend), BUNDLE_ID)
    assert loaded == 0
    assert why == f"it holds {layers - 1} cache arrays, this backend's cache has {layers}"


def test_an_array_of_another_dtype_names_the_dtype_expected(backend, tmp_path):
    """An array of another precision (float16 where the backend keeps float32) was refused as "its arrays ((1, 2,
    30, 16), float16) do not fit this backend's cache ((1, 2, 0, 16))": the dtype expected unsaid, and a length
    of 0 where the file's 30 tokens were expected."""
    path = tmp_path / "prompt.cache"
    _written(backend, path, 30)
    expected = backend.save_cache()[0][0]

    def halve(arrays):
        arrays["cache_0"] = arrays["cache_0"].astype(np.float16)

    _rewritten(path, halve)
    loaded, why = cache_file.load(path, PromptCache(backend), BUNDLE_ID)
    assert loaded == 0
    shape = (*expected.shape[:2], 30, *expected.shape[3:])
    assert why == (f"its arrays do not fit this backend's cache: cache_0 is float16 {shape}, the cache of its 30 "
                   f"tokens {expected.dtype} {shape}")


def test_an_array_of_another_shape_names_the_shape_expected(backend, tmp_path):
    path = tmp_path / "prompt.cache"
    _written(backend, path, 30)
    expected = backend.save_cache()[0][0]

    def cut(arrays):
        arrays["cache_2"] = arrays["cache_2"][:, :, :-1]

    _rewritten(path, cut)
    loaded, why = cache_file.load(path, PromptCache(backend), BUNDLE_ID)
    assert loaded == 0
    shape = (*expected.shape[:2], 30, *expected.shape[3:])
    short = (*expected.shape[:2], 29, *expected.shape[3:])
    assert why == (f"its arrays do not fit this backend's cache: cache_2 is {expected.dtype} {short}, the cache "
                   f"of its 30 tokens {expected.dtype} {shape}")


def _directory_entry(raw: bytes, name: str, start: int) -> int:
    """The offset of ``name``'s central directory header (46 bytes before its name: APPNOTE.TXT 4.3.12)."""
    return raw.index(name.encode(), start) - 46


@pytest.mark.parametrize(("field", "value", "said"), [
    (10, b"\x63\x00", "That compression method is not supported"),  # compression method 99, which zipfile lacks
    (8, b"\x01\x00", "is encrypted, password required for extraction"),  # general purpose flag bit 0: encrypted
])
def test_a_damaged_directory_entry_is_refused_not_raised(backend, tmp_path, field, value, said):
    """One byte of the zip directory damaged raised out of load (NotImplementedError, RuntimeError): a traceback
    from ``edgesdk run --prompt-cache FILE`` before any answer, and at every run after it, where a damaged cache file
    is refused and rewritten."""
    path = tmp_path / "prompt.cache"
    _written(backend, path)
    with zipfile.ZipFile(path) as archive:
        start = archive.start_dir
    raw = bytearray(path.read_bytes())
    entry = _directory_entry(bytes(raw), "cache_0.npy", start)
    assert raw[entry:entry + 4] == b"PK\x01\x02"
    raw[entry + field:entry + field + len(value)] = value
    path.write_bytes(bytes(raw))
    cache = PromptCache(backend)
    loaded, why = cache_file.load(path, cache, BUNDLE_ID)
    assert (loaded, cache.tokens, backend.position) == (0, [], 0)
    assert why.startswith("it cannot be read as a cache file: it is damaged inside, on disk or in a copy (")
    assert said in why
    _written(backend, path, 20)  # the next write replaces it
    assert cache_file.load(path, PromptCache(backend), BUNDLE_ID) == (20, None)
