"""`edgesdk deploy --status` and `--rollback` refuse the options of a bundle's deploy that they would
ignore without a word, as --to refuses the options of ssh."""

from __future__ import annotations

import pytest

from tests.unit.test_cli_review35 import invoke


@pytest.mark.parametrize(("args", "named"), [
    (["--status", "--keep", "1"], "--keep"), (["--status", "--no-install"], "--no-install"),
    (["--status", "--ignore-target"], "--ignore-target"), (["--status", "--smoke-timeout", "5"], "--smoke-timeout"),
    (["--status", "--runtime-venv-system-site-packages"], "--runtime-venv-system-site-packages"),
    (["--rollback", "--keep", "1"], "--keep"), (["--rollback", "--no-install"], "--no-install"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_status_and_rollback_refuse_the_options_of_a_deploy(tmp_path, args, named):
    root = tmp_path / "root"
    result = invoke("deploy", "--to", root, *args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {named}: works only with a deploy of a bundle" in result.stderr, result.stderr
    assert not root.exists()  # refused before the directory was probed


def test_rollback_takes_the_options_its_smoke_test_uses(tmp_path):
    """--ignore-target and --smoke-timeout reach the smoke test of the release rolled back to: accepted (the
    rollback then says there is nothing to roll back to)."""
    result = invoke("deploy", "--to", tmp_path / "root", "--rollback", "--ignore-target", "--smoke-timeout", "5")
    assert result.exit_code == 8, result.output
    assert "has no previous release to roll back to" in result.stderr
