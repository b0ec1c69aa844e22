"""``edgesdk build``: options that have nothing to act on are named."""

from __future__ import annotations

from click.testing import CliRunner

from edgesdk.cli import main


def test_data_skip_chars_without_data_is_named_as_unused(tiny_model_dir, tmp_path):
    out = tmp_path / "b"
    result = CliRunner().invoke(main, ["build", "--target", "host", "--model", str(tiny_model_dir), "--recipe",
                                       "fp32-fused", "--max-context", "64", "--out", str(out), "--no-progress",
                                       "--data-skip-chars", "200000"], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out.resolve()) or result.stdout.strip() == str(out)
    assert "--data-skip-chars 200000 is not used: it leaves out the head of each --data file, and no --data is given" \
        in result.stderr
