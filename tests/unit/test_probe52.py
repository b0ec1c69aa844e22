"""A refused disk check names the staging leftovers of interrupted deploys too: they can hold most of the space,
and the fix said the board held "no release besides current and previous"."""

from __future__ import annotations

import os
import shlex

import pytest

from edgesdk.deploy.board_common import paths, release_list
from edgesdk.deploy.probe import BoardFacts, check_disk
from edgesdk.deploy.transport import DeployError
from tests.unit.test_deploy52 import release


def test_a_refused_disk_check_names_the_staging_leftovers(tmp_path):
    root = tmp_path / "board"
    for bundle_id in ("before", "now"):
        release(root, bundle_id, 1_000)
    os.symlink("releases/now", root / "current")
    os.symlink("releases/before", root / "previous")
    (root / "staging" / "cut-short").mkdir(parents=True)
    (root / "staging" / "cut-short" / "model.onnx.data").write_bytes(b"\0" * 4096)
    p, resolved = paths(str(root))
    facts = BoardFacts.from_probe({"root": resolved, "disk": {"free": 1_000_000}, "python": {"version": [3, 10, 12]},
                                   "memory": {}, "runtime": {}, "state": release_list(p)})
    with pytest.raises(DeployError) as refused:
        check_disk(5_000_000, 0, facts, "pi@board")
    fix = refused.value.fix
    assert "no release besides current and previous" not in fix
    assert "interrupted deploys in staging/: cut-short" in fix
    assert fix.endswith(shlex.join(["rm", "-rf", f"{resolved}/staging/cut-short"]))
