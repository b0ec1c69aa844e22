"""The board's install step refuses a runtime key that is no plain name as the edgesdk runtime key it is, with a
fix about the deploying host's edgesdk; it said "bundle id ...: rebuild the bundle with 'edgesdk build'"."""

from __future__ import annotations

import pytest

from edgesdk.deploy.board_common import Refused
from edgesdk.deploy.board_install import op_install


def test_a_runtime_key_that_is_no_plain_name_is_named_as_the_runtime_key(tmp_path):
    with pytest.raises(Refused) as refused:
        op_install({"root": str(tmp_path), "key": "../elsewhere"})
    assert str(refused.value).startswith("edgesdk runtime key '../elsewhere' is not a plain name")
    assert "edgesdk build" not in str(refused.value)
    assert not (tmp_path / "runtime").exists() or not any((tmp_path / "runtime").iterdir())
