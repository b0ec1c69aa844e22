"""edgesdk.build_bundle(data="corpus.txt"): one file given alone is that file, as ``--data FILE``; a str was
iterated into a "file" per character and refused as "training text c does not exist"."""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.errors import EdgeSDKError
from tests._utils.tiny import save_tiny_model_dir

pytest.importorskip("torch")


@pytest.mark.parametrize("as_path", [False, True])
def test_one_data_file_given_alone_is_read_as_that_file(tmp_path, as_path):
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2)
    missing = tmp_path / "corpus-that-is-not-here.txt"
    with pytest.raises(EdgeSDKError) as caught:
        edgesdk.build_bundle("host", str(model_dir), out=tmp_path / "b", recipe="int8-prune-light", progress=False,
                             data=missing if as_path else str(missing))
    assert "corpus-that-is-not-here.txt" in str(caught.value)

