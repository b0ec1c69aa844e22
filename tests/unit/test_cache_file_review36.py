"""run --prompt-cache FILE (edgesdk/runtime/cache_file.py): a file another edgesdk release or another backend wrote
is refused by name and rewritten, never loaded as this run's KV cache."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_cache_file import _cached, _run

pytest.importorskip("torch")


def _rewrite(path, **changes):
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    for name, value in changes.items():
        if value is None:
            arrays.pop(name)
        else:
            arrays[name] = np.array(value)
    with open(path, "wb") as out:
        np.savez(out, **arrays)


@pytest.mark.parametrize(("changes", "reason"), [
    ({"edgesdk_version": "0.0.1"}, "it was written by edgesdk 0.0.1, this is edgesdk "),
    ({"backend": "ort-trt"}, "it was written by the ort-trt backend, this run uses ort-cpu"),
    ({"format": 1, "edgesdk_version": None, "backend": None}, "it is format 1, this edgesdk writes format 3"),
])
def test_a_cache_of_another_release_or_backend_is_not_loaded_and_is_rewritten(tiny_bundle, tmp_path, changes, reason):
    """The file held only the bundle id beside the arrays: a cache written by another edgesdk release, or by a GPU
    backend whose keys and values differ from the CPU's (TensorRT's FP16), was loaded as if this run had made it."""
    path = tmp_path / "prompt.cache"
    first = _run(tiny_bundle, "--prompt-cache", path)
    _rewrite(path, **changes)
    refused = _run(tiny_bundle, "--prompt-cache", path)
    assert f"is not loaded: {reason}" in refused.stderr
    assert _cached(refused.stderr) == 0
    assert refused.stdout == first.stdout
    again = _run(tiny_bundle, "--prompt-cache", path)
    assert "tokens loaded" in again.stderr
    assert again.stdout == first.stdout
