"""The simulated board refuses an ambient, a start temperature or a step it cannot run; a board-side install step
stopped at its time limit keeps what it printed; bench warns of a board already throttled as it began; a helper that
failed with words on stdout alone shows them."""

from __future__ import annotations

import math
import sys

import pytest

from edgesdk.deploy.board_install import run_step
from edgesdk.deploy.remote import parse_reply
from edgesdk.deploy.transport import DeployError
from edgesdk.errors import EdgeSDKError
from edgesdk.profile import get_profile
from edgesdk.runtime.bench_conditions import warnings
from edgesdk.thermal.plan import simulate
from edgesdk.thermal.simulator import SimulatedBoard


@pytest.fixture(scope="module")
def rpi5():
    return get_profile("rpi5")


@pytest.mark.parametrize(("ambient", "hint"), [(25000, "reads as millidegrees: 25 °C"),
                                               (298.15, "reads as kelvin: 25 °C"), (120, ""), (-300, "")])
def test_a_simulated_board_refuses_an_ambient_outside_the_range_naming_it_in_celsius(rpi5, ambient, hint):
    # 25000 (m°C) ran a one-minute plan on a board at 25026 °C, critical from the first reading; -300 ran below
    # absolute zero and printed tok/s for it
    with pytest.raises(EdgeSDKError, match=r"ambient_c=.* is not an ambient from -40 to 85 °C") as caught:
        simulate(rpi5, 1, ambient, True, 20.0)
    assert hint in caught.value.problem
    assert "ambient_c=35" in caught.value.fix
    with pytest.raises(EdgeSDKError, match=r"ambient_c="):
        SimulatedBoard.from_profile(rpi5, ambient)


def test_a_simulated_board_still_takes_the_ends_of_the_range(rpi5):
    for ambient in (-40, 85, 25.0):
        assert SimulatedBoard.from_profile(rpi5, ambient).ambient_c == ambient


@pytest.mark.parametrize("start", [75000, math.nan, -300.0])
def test_a_simulated_board_refuses_a_start_temperature_no_chip_reaches(rpi5, start):
    with pytest.raises(EdgeSDKError, match=r"start_c=.* is not a temperature a chip reaches") as caught:
        SimulatedBoard.from_profile(rpi5, 25.0, start_c=start)
    assert "start_c=50" in caught.value.fix


@pytest.mark.parametrize("step", [0, -0.5, math.nan, math.inf])
def test_a_simulated_board_refuses_a_step_that_is_not_seconds_above_0(rpi5, step):
    # max_step_s=0 made the first sleep or compute loop forever (a step of 0 s never uses the interval up)
    with pytest.raises(EdgeSDKError, match=r"max_step_s=.* is not a finite number of seconds above 0"):
        SimulatedBoard.from_profile(rpi5, 25.0, max_step_s=step)


def test_an_install_step_stopped_at_its_time_limit_keeps_what_it_printed():
    # a pip that hung was refused with "Command [...] timed out after 1800 seconds" alone: what it was doing
    # (the package it was building) was thrown away, and an unflushed print died with the SIGKILL
    code, out = run_step([sys.executable, "-c", "import time; print('Building wheel for tokenizers'); "
                          "time.sleep(120)"], 5)
    assert code == 124
    assert "Building wheel for tokenizers" in out
    assert "stopped after 5 s" in out


def test_bench_warns_of_a_board_already_throttled_as_the_run_began():
    # its *_occurred bits were set before the run, and the board had cooled out of the throttle by its end: no warning
    before = {"throttled": {"under_voltage": False, "arm_freq_capped": True, "throttled": True,
                            "soft_temp_limit": False, "arm_freq_capping_occurred": True, "throttling_occurred": True}}
    after = {"throttled": {"under_voltage": False, "arm_freq_capped": False, "throttled": False,
                           "soft_temp_limit": False, "arm_freq_capping_occurred": True, "throttling_occurred": True}}
    found = warnings(before, after, 4, 80.0)
    assert len(found) == 1
    assert "throttled as the run began" in found[0]
    assert "arm_freq_capped as the run began" in found[0]
    assert "vcgencmd get_throttled" in found[0]
    assert "the board was already throttled as the run began, so the figures are low" in found[0]
    assert "during the run" not in found[0]  # its bits were set before it, not during it
    calm = {"throttled": {**after["throttled"]}}
    assert warnings(calm, after, 4, 80.0) == []


def test_a_helper_that_failed_with_words_on_stdout_alone_shows_them():
    # a wrapper that says why on stdout (a pyenv shim, a conda script) read as "(no output)"
    reply = (1, b"pyenv: python3.11: command not found\nset PYENV_VERSION to use it\n", b"")
    with pytest.raises(DeployError) as failed:
        parse_reply(reply, "ssh pi@board", "python3", "probe")
    assert failed.value.problem.splitlines()[1:] == ["    pyenv: python3.11: command not found",
                                                     "    set PYENV_VERSION to use it"]
    with pytest.raises(DeployError) as failed:
        parse_reply((1, b"", b""), "ssh pi@board", "python3", "probe")
    assert failed.value.problem.splitlines()[1:] == ["    (no output)"]
