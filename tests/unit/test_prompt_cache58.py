"""The prompt cache, review 58 (edgesdk/runtime/cache_file.py, prompt_cache.py, cache_store.py,
edgesdk/cli_prompt_cache.py)."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache

BUNDLE_ID = "0123456789abcdef"


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.unit.test_prompt_cache import _standard

    return _standard(tmp_path_factory.mktemp("standard58"))


def _written(backend, path, count: int = 12) -> bytes:
    """The bytes of a cache file of ``count`` prefilled tokens written at ``path``."""
    cache = PromptCache(backend)
    ids = [int(t) for t in np.random.default_rng(count).integers(0, 320, count)]
    backend.reset()
    backend.prefill(np.array(ids))
    cache.took(ids)
    cache_file.save(path, cache, BUNDLE_ID)
    return path.read_bytes()


def test_a_cache_file_missing_bytes_inside_is_called_damaged(backend, tmp_path):
    """A whole archive that lost a byte inside its first entry (a copy that dropped a block) was refused "(OSError:
    [Errno 22] Invalid argument)": zipfile moves every offset by the missing byte, the first to before the file's
    start. It is named damaged."""
    path = tmp_path / "prompt.cache"
    data = _written(backend, path)
    path.write_bytes(data[:7] + data[8:])
    loaded, why = cache_file.load(path, PromptCache(backend), BUNDLE_ID)
    assert loaded == 0
    assert "it is damaged inside, on disk or in a copy" in why
    assert "OSError" not in why


def test_an_entry_whose_data_run_past_the_end_is_called_damaged_with_a_cause(backend, tmp_path):
    """A byte of an entry's header that makes its data run past the file's end gave "(EOFError: )", naming nothing.
    It is named damaged, with the error's name where it has no words."""
    path = tmp_path / "prompt.cache"
    data = bytearray(_written(backend, path))
    data[29] ^= 0xFF  # the high byte of the extra field's length in the first entry's local header
    path.write_bytes(bytes(data))
    loaded, why = cache_file.load(path, PromptCache(backend), BUNDLE_ID)
    assert loaded == 0
    assert why.endswith("it is damaged inside, on disk or in a copy (EOFError)")
