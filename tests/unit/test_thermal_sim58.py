"""thermal.plan.simulate refuses an ambient or a workload it cannot run as asked, naming the argument."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.profile import get_profile
from edgesdk.thermal.plan import Workload, simulate


@pytest.fixture(scope="module")
def rpi5():
    return get_profile("rpi5")


@pytest.mark.parametrize("ambient", [math.nan, math.inf, -math.inf, "35", None, True])
def test_simulate_refuses_an_ambient_that_is_not_a_finite_temperature(rpi5, ambient):
    # a NaN ambient ran to the end: max temperature NaN, throttled the whole minute, the guard "normal" throughout
    with pytest.raises(EdgeSDKError, match=r"ambient_c=.* is not a finite temperature") as caught:
        simulate(rpi5, 1, ambient, True, 20.0)
    assert "ambient_c=35" in caught.value.fix


@pytest.mark.parametrize(("field", "value"), [("prompt_tokens", 0), ("new_tokens", 0), ("prompt_tokens", 8.5),
                                              ("new_tokens", -3), ("prompt_tokens", True)])
def test_simulate_refuses_a_token_count_that_is_not_a_whole_number_of_1_or_more(rpi5, field, value):
    # prompt_tokens=0 failed as "the prompt encodes to 0 tokens" with a fix about text and --raw; 8.5 as a TypeError
    workload = Workload(**{field: value})
    with pytest.raises(EdgeSDKError, match=rf"Workload\.{field}={value!r} is not a whole number"):
        simulate(rpi5, 1, 25.0, False, 20.0, workload=workload)


@pytest.mark.parametrize("think", [-5.0, math.nan, math.inf])
def test_simulate_refuses_a_think_time_that_is_not_finite_and_non_negative(rpi5, think):
    # -5 and NaN ran as no wait at all, while the run's meta record kept the value given
    with pytest.raises(EdgeSDKError, match=r"Workload\.think_s=.* is not a finite number of seconds"):
        simulate(rpi5, 1, 25.0, False, 20.0, workload=Workload(8, 16, think))


def test_simulate_still_takes_numpy_numbers(rpi5):
    workload = Workload(np.int64(8), np.int32(16), np.float64(0.5))
    run = simulate(rpi5, 1, np.float64(25.0), False, 20.0, workload=workload)
    assert run.summary.requests > 1
    assert run.telemetry.meta["ambient_c"] == 25.0
