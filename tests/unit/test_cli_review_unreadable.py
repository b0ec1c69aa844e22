"""A text input that cannot be read (permissions, a directory) is an error naming it, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import BuildError, EdgeSDKError, read_utf8
from tests._utils.unreadable import make_unreadable


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


@pytest.fixture
def unreadable(tmp_path, monkeypatch) -> Path:
    """A file this user may not read (as root chmod does not stop a read, so the read is made to fail)."""
    path = tmp_path / "secret.txt"
    path.write_text("hello world " * 40, encoding="utf-8")
    make_unreadable(path, monkeypatch)
    yield path
    path.chmod(0o644)


def test_read_utf8_names_a_file_it_cannot_read(unreadable, tmp_path):
    with pytest.raises(BuildError, match=r"training text .*secret.txt cannot be read \(Permission denied\)"):
        read_utf8(unreadable, "training text", BuildError)
    with pytest.raises(EdgeSDKError, match="cannot be read") as caught:
        read_utf8(tmp_path, "--text")  # a directory
    assert "fix:" in str(caught.value)


def test_eval_text_that_cannot_be_read_is_a_clear_error(tiny_bundle, unreadable):
    result = invoke("eval", tiny_bundle.path, "--text", unreadable, "--context", 32)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert f"--text {unreadable} cannot be read (Permission denied)" in result.stderr
    assert "fix:" in result.stderr


def test_build_data_that_cannot_be_read_is_a_clear_error(tiny_model_dir, unreadable, tmp_path):
    result = invoke("build", "--target", "host", "--model", tiny_model_dir, "--recipe", "int8-only",
                    "--data", unreadable, "--out", tmp_path / "b", "--no-progress")
    assert result.exit_code == BuildError.exit_code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "cannot be read (Permission denied)" in result.stderr
