"""``edgesdk deploy``: option combinations the command cannot honour both of are refused."""

from __future__ import annotations

from click.testing import CliRunner

from edgesdk.cli import main


def test_status_with_rollback_is_refused_before_anything_is_switched(tmp_path):
    root = tmp_path / "board"
    result = CliRunner().invoke(main, ["deploy", "--status", "--rollback", "--to", str(root)], prog_name="edgesdk")
    assert result.exit_code == 2, result.output
    assert "--status only shows the board's releases and --rollback switches current" in result.stderr
    assert "rollback [1/" not in result.stderr  # nothing was started
    assert not root.exists()
