"""The prompt cache, review 59 (edgesdk/runtime/cache_file.py, edgesdk/cli_prompt_cache.py)."""

from __future__ import annotations

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache
from tests.unit.test_prompt_cache58 import BUNDLE_ID, _written, backend  # noqa: F401 (backend: a fixture)

CENTRAL_HEADER = b"PK\x01\x02"  # a zip archive's central directory file header (APPNOTE.TXT 4.3.12)


def _with_damaged_directory(data: bytes) -> bytes:
    """``data`` with the "version needed to extract" of its first central directory entry damaged (20.0, past the
    4.5 zipfile reads): one byte of the archive's directory changed on disk or in a copy."""
    damaged = bytearray(data)
    damaged[data.index(CENTRAL_HEADER) + 6] = 200
    return bytes(damaged)


def test_a_cache_file_with_a_damaged_directory_is_a_cache_file_to_rewrite(backend, tmp_path):  # noqa: F811
    """One damaged byte in the archive's directory made zipfile raise NotImplementedError ("zip file version 20.0"),
    which foreign() let through: ``edgesdk run --prompt-cache FILE`` ended in a traceback before the bundle loaded.
    It is a damaged cache file: load() names the damage and the next answer rewrites it."""
    from edgesdk.cli_prompt_cache import writable_prompt_cache

    path = tmp_path / "prompt.cache"
    path.write_bytes(_with_damaged_directory(_written(backend, path)))
    assert cache_file.foreign(path) is None
    assert writable_prompt_cache(path) == path
    loaded, why = cache_file.load(path, PromptCache(backend), BUNDLE_ID)
    assert loaded == 0
    assert "it is damaged inside, on disk or in a copy (zip file version 20.0)" in why
    _written(backend, path)
    assert cache_file.load(path, PromptCache(backend), BUNDLE_ID) == (12, None)
