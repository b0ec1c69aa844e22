"""A refused disk check names the staging leftovers of interrupted deploys too: they can hold most of the space,
and the fix said the board held "no release besides current and previous"."""

from __future__ import annotations

import shlex

import pytest

from edgesdk.deploy.probe import check_disk
from edgesdk.deploy.transport import DeployError
from tests.unit.test_deploy52 import current_and_previous


def test_a_refused_disk_check_names_the_staging_leftovers(tmp_path):
    def cut_transfer(root):
        (root / "staging" / "cut-short").mkdir(parents=True)
        (root / "staging" / "cut-short" / "model.onnx.data").write_bytes(b"\0" * 4096)

    facts = current_and_previous(tmp_path / "board", cut_transfer)
    with pytest.raises(DeployError) as refused:
        check_disk(5_000_000, 0, facts, "pi@board")
    fix = refused.value.fix
    assert "no release besides current and previous" not in fix
    assert "interrupted deploys in staging/: cut-short" in fix
    assert fix.endswith(shlex.join(["rm", "-rf", f"{facts.root}/staging/cut-short"]))
