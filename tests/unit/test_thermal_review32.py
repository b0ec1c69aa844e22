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
from tests._utils.unreadable import make_unreadable

STEP = {"type": "step", "t": 1.0, "kind": "decode", "tokens": 1, "duration_s": 0.1, "wait_s": 0.0, "tok_s": 10.0,
        "temp_c": 70.0, "zones": {"cpu-thermal": 70.0}, "level": "normal", "budget": 1.0, "sensor_ok": True}


@pytest.fixture
def unreadable(tmp_path, monkeypatch) -> Path:
    """A telemetry file this user may not read (root reads past chmod 000, so there the read is made to fail)."""
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"type": "meta", "profile": "rpi5"}) + "\n" + json.dumps(STEP) + "\n")
    make_unreadable(path, monkeypatch)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # thermal report reads a line at a time, through Path.open
        opener = Path.open

        def refuse(self, *args, **kwargs):
            if self == path:
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return opener(self, *args, **kwargs)

        monkeypatch.setattr(Path, "open", refuse)
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


def test_a_sensor_lost_while_pacing_a_hot_board_never_speeds_it_up():
    """A failed sensor paced at a fixed 50 % of the unpaced rate whatever the guard was doing: a bare Pi 5
    at 35 °C ambient held near 73 °C at about 20 % was sped up 2.5x by its sensor going, and heated past
    the hard limit (78 °C) into the firmware throttle, in the mode DESIGN.md calls conservative. It paces
    at the controller's steady-state rate (or 50 %, the lower) instead."""
    from edgesdk.profile import get_profile
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.thermal.guard import Guard, Limits
    from edgesdk.thermal.plan import _StubDecoder
    from edgesdk.thermal.simulator import PastHorizon, SimulatedBoard, SimulatedSensor, WorkModel
    from edgesdk.thermal.watch import HorizonReached, ThermalHook

    profile = get_profile("rpi5")
    board = SimulatedBoard.from_profile(profile, 35.0, work=WorkModel(decode_tok_s=35.0, prefill_tok_s=140.0),
                                        horizon_s=1000.0)
    sensor = SimulatedSensor(board, profile.thermal.zones[0])
    limits, _ = Limits.resolve(profile.thermal, sensor.trips(profile, sensor.zone))
    warnings = []
    guard = Guard(limits, profile.thermal_model, warn=warnings.append)
    lost_at = 350.0  # the guard has paced at hot for minutes
    hook = ThermalHook(board, lambda: sensor.read() if board.t < lost_at else None, guard, board, horizon_s=1000.0)
    temps_after = []
    try:
        while True:
            generate(_StubDecoder(), [2] * 128, SamplingConfig(max_new_tokens=256), stop_ids=set(), hook=hook)
            if board.t > lost_at:
                temps_after.append(board.temp_c)
    except (HorizonReached, PastHorizon):
        pass
    assert not guard.sensor_ok
    assert len(temps_after) > 3  # requests kept being answered without the sensor
    assert guard.fraction < 0.5
    assert max(temps_after) < limits.soft_c  # was 78.3 °C, past the hard limit 78 °C
    assert board.throttled_s == 0.0
    assert len(warnings) == 1
    assert f"pacing at a fixed {guard.fraction:.0%} of the unpaced token rate" in warnings[0]
    assert "at most 50%" in warnings[0]
