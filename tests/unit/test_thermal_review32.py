"""Thermal guard, telemetry and plan behaviour found in review."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import EdgeSDKError
from edgesdk.thermal.telemetry import load

STEP = {"type": "step", "t": 1.0, "kind": "decode", "tokens": 1, "duration_s": 0.1, "wait_s": 0.0, "tok_s": 10.0,
        "temp_c": 70.0, "zones": {"cpu-thermal": 70.0}, "level": "normal", "budget": 1.0, "sensor_ok": True}


@pytest.fixture
def unreadable(tmp_path, monkeypatch) -> Path:
    """A telemetry file this user may not read (root reads past chmod 000, so there the read is made to fail)."""
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"type": "meta", "profile": "rpi5"}) + "\n" + json.dumps(STEP) + "\n")
    path.chmod(0)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        read_text = Path.read_text

        def refuse(self, *args, **kwargs):
            if self == path:
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", refuse)
    yield path
    path.chmod(0o644)


def test_a_telemetry_path_that_cannot_be_read_is_an_error_naming_it(tmp_path):
    """load read the file bare: a directory (or a file this user may not read) raised the OSError."""
    with pytest.raises(EdgeSDKError, match=r"telemetry file .* cannot be read \(Is a directory\)") as caught:
        load(tmp_path)
    assert str(tmp_path) in str(caught.value)
    assert "fix:" in str(caught.value)


def test_report_of_an_unreadable_telemetry_file_is_a_clear_error(unreadable, tmp_path):
    """click checks that FILES exist, not that they can be read: 'thermal report' ended in a PermissionError
    traceback."""
    result = CliRunner().invoke(main, ["thermal", "report", str(unreadable), "-o", str(tmp_path / "run.png")])
    assert result.exit_code == 1, f"{result.output}\n{result.exception!r}"
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert f"telemetry file {unreadable} cannot be read (Permission denied)" in result.output
    assert not (tmp_path / "run.png").exists()
