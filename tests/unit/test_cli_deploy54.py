"""`edgesdk deploy --keep` below 1 is refused with the value given, what it must be and the fix."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main


@pytest.mark.parametrize("keep", ["0", "-2"])
def test_a_keep_below_one_names_the_value_and_the_fix(tmp_path, keep):
    result = CliRunner().invoke(main, ["deploy", str(tmp_path), "--host", "user@board", "--keep", keep])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"{keep}: the releases kept on the board must number at least 1" in said, said
    assert "pass --keep 1 or more" in said, said
