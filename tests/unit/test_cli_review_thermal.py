"""``edgesdk thermal plan`` without anything to plan for says all it needs at once."""

from __future__ import annotations

from click.testing import CliRunner

from edgesdk.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


def test_plan_without_bundle_or_target_names_both_ways_and_the_fix_works():
    result = invoke("thermal", "plan")
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "neither BUNDLE nor --target" in result.stderr
    assert "fix:" in result.stderr
    fix = result.stderr.split("fix:", 1)[1]
    assert "--target rpi5 --decode-tok-s 35" in fix  # --target alone would be refused next
    followed = invoke("thermal", "plan", "--target", "rpi5", "--decode-tok-s", 35, "--minutes", 0.5)
    assert followed.exit_code == 0, followed.output
