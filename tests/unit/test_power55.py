"""Power distillation's board side: the numpy moving average is summed per window, as training's torch one is, so
one reading confines its effect to the next ``smooth`` positions; the c_t profiler's stored line is the one it fits."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.power import distribution as D
from edgesdk.power.profiler import fit_table


def test_a_large_power_reading_leaves_the_windows_after_its_smoothing_span_as_they_are():
    """The numpy average was a difference of running sums: a reading of 1e17 wiped the rest of the stream to 0 (a
    window of equal powers, ln 8 = 2.079 nats) while it stayed among the controller's last window + smooth powers."""
    rng = np.random.default_rng(0)
    rest = rng.random(10)  # (T,): the powers after the reading
    stream = np.r_[0.5, 1e17, rest]
    assert D.window_entropy(stream) == pytest.approx(D.window_entropy(rest), abs=1e-12)
    assert D.window_entropy(stream) < np.log(D.WINDOW) - 0.05


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_valid_power_reaches_only_the_next_smooth_positions_as_in_training(bad):
    torch = pytest.importorskip("torch")
    from edgesdk.power import vector

    p = np.linspace(0.1, 1.6, 16)[None].repeat(2, 0)  # (B, T)
    p[:, 3] = bad
    mask = np.ones_like(p)
    ours = D.smooth(p, mask)
    np.testing.assert_array_equal(ours, vector.smooth(torch.from_numpy(p), torch.from_numpy(mask)).numpy())
    assert np.isfinite(ours[:, 3 + D.SMOOTH:]).all()


def test_a_flat_cost_line_of_one_cache_length_keeps_its_step_time_as_the_intercept():
    table, slope, intercept = fit_table(64, [0], [2.5], 4)
    assert (table, slope) == ([0.0] * 4, 0.0)
    assert intercept == pytest.approx(2.5)  # it was 0 ms


def test_a_negative_slope_clamped_to_zero_takes_the_flat_lines_intercept():
    """Timer noise made the steps shorter at longer caches: the slope is clamped to 0, and the intercept was that of
    the falling line (2.02 ms, above every step timed), a line that is not the one stored."""
    times = [2.0, 1.9, 1.8]  # ms at buckets 0, 4, 7
    table, slope, intercept = fit_table(64, [0, 4, 7], times, 8)
    assert slope == 0.0
    assert table == [0.0] * 8
    assert intercept == pytest.approx(np.mean(times))


def test_a_rising_cost_line_is_the_least_squares_fit():
    centres = np.array([0, 3, 7]) * 64 + 32
    times = 1.5 + 0.002 * centres  # ms: 2 us per cached token
    table, slope, intercept = fit_table(64, [0, 3, 7], list(times), 8)
    assert slope == pytest.approx(0.002)
    assert intercept == pytest.approx(1.5)
    np.testing.assert_allclose(table, 0.002 * 64 * np.arange(8))
