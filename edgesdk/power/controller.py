"""The run-time gate-threshold controller (numpy only; runs on the board).

Each decode step the runtime passes a threshold ``tau`` to the gated graph; a layer's FFN is
skipped for the token when its gate is below ``tau``. Raising ``tau`` skips more FFN blocks, which
saves compute, and concentrates the power on fewer tokens (lower windowed entropy) only as far as the
gates differ between tokens: the entropy is taken after min-max per window
(:mod:`edgesdk.power.distribution`), blind to the powers' scale, so gates that differ between layers
but hardly between tokens skip the same blocks for every token and leave it where it was
(``tests/benchmarks/test_power_gating.py::test_gates_differ_between_tokens`` prints both spreads).
The controller holds two things:

* the realised windowed entropy of the power stream at the profile's target (integral action on
  the entropy error: too high -> raise tau, too low -> lower it);
* the executed-FFN fraction, averaged over the same window, at or under the compute budget
  (a floor on tau that rises while the budget is exceeded and relaxes when it is met);
* and at or above ``min_compute`` (a ceiling on tau that falls while too few blocks run): when the
  entropy target cannot be reached by gating, the entropy loop alone would raise tau until every
  FFN is skipped. The thermal budget wins over this quality floor.

``set_compute_budget`` is the plain API the thermal guard calls when the board warms up (the
guard calls it on the backend, which forwards it here).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from edgesdk.power.distribution import FLOOR, SMOOTH, WINDOW, check_entropy_target, window_entropy

# The threshold that turns the adapters off: below 0 no gate skips and neither the FFN channel scales nor the query
# head scales act, so the gated graph computes the loaded model (gating off). Gates lie in (0, 1): tau 0 still runs
# every FFN, with the adapters' scales.
ADAPTERS_OFF_TAU = -1.0


@dataclass(frozen=True)
class ControllerConfig:
    """How the threshold is steered."""

    entropy_target: float = 1.5  # nats over the window (profile: 1.5 boards, 1.2 host)
    compute_budget: float = 1.0  # largest mean fraction of FFN blocks executed (1 = no limit)
    min_compute: float = 0.5  # smallest mean fraction executed for the entropy loop (quality floor)
    tau_init: float = 0.5  # the gates were trained against this threshold
    gain_entropy: float = 0.02  # tau change per nat of entropy error per step
    gain_budget: float = 0.05  # tau-floor change per unit of budget excess per step
    tau_min: float = 0.0  # 0: every FFN runs
    tau_max: float = 1.0  # gates are sigmoids: above every gate, every FFN is skipped
    window: int = WINDOW  # entropy window, as in training (edgesdk/power/distribution.py)
    smooth: int = SMOOTH  # moving-average width, as in training
    floor: float = FLOOR  # min-max floor, as in training

    def __post_init__(self):
        # window, smooth and floor come from the bundle's power.json: window 0 failed in math.log
        # ("math domain error"), smooth 0 made every power 0, so every window read ln W and tau went
        # to its bound; a negative floor or gain turned masses or the control action negative.
        shape = {name: getattr(self, name) for name in ("window", "smooth")}
        if any(isinstance(v, bool) or not isinstance(v, int) for v in shape.values()) \
                or self.window < 2 or self.smooth < 1:
            raise ValueError(f"window (tokens per entropy window) must be an integer >= 2 and smooth (moving-average "
                             f"width) an integer >= 1, got window={self.window!r}, smooth={self.smooth!r}; set them "
                             f"to the power stage's window={WINDOW}, smooth={SMOOTH} (the bundle's power.json)")
        for name in ("floor", "gain_entropy", "gain_budget"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}; set it to e.g. "
                                 f"{getattr(ControllerConfig, name)} (the default)")
        check_entropy_target(self.entropy_target, self.window, self.floor)  # the floor sets the lowest entropy
        if not 0 < self.compute_budget <= 1:
            raise ValueError(f"compute_budget must be in (0, 1], got {self.compute_budget}: the largest mean "
                             "fraction of FFN blocks a decode step may run; set it to e.g. 0.5 (half the blocks), or "
                             "1 for no limit")
        if not 0 <= self.min_compute <= 1:
            raise ValueError(f"min_compute must be in [0, 1], got {self.min_compute}: the smallest mean fraction of "
                             "FFN blocks the entropy loop may leave running; set it to e.g. 0.5 (the default), or 0 "
                             "for no quality floor")
        if not self.tau_min <= self.tau_init <= self.tau_max:
            raise ValueError(f"tau_init must lie in [tau_min, tau_max] (need tau_min <= tau_init <= tau_max), got "
                             f"{self.tau_min}/{self.tau_init}/{self.tau_max}; set tau_init to the threshold the gates "
                             "were trained against (the power stage's tau_train, 0.5 by default) inside those bounds")


class TauController:
    """Integral control of tau on the windowed entropy, with a budget-driven floor."""

    def __init__(self, config: ControllerConfig = ControllerConfig()):
        self.config = config
        self.limit = 1.0  # the budget last set through set_compute_budget (the thermal guard's), kept apart
        self.budget = config.compute_budget  # in force: the smaller of the limit and the configured budget
        self.reset()

    def reset(self) -> None:
        """Start over, for a new sequence: the control state and the statistics of :meth:`summary`."""
        c = self.config
        self._entropy_tau = c.tau_init
        self._floor = c.tau_min
        self._ceiling = c.tau_max
        self.tau = c.tau_init
        self.powers: deque[float] = deque(maxlen=c.window + c.smooth)
        self.executed: deque[float] = deque(maxlen=c.window)
        self.last_entropy: float | None = None  # the last window's, a prompt's too
        self.entropies: list[float] = []  # of the windows that ended at a counted (decode) step
        self.blocks_run = 0
        self.blocks_total = 0

    def statistics(self) -> tuple[list[float], int, int]:
        """What :meth:`summary` counts (entropies, blocks run, blocks in all), for :meth:`restore_statistics` after a
        reset that does not start a new answer (a context shift starts the sequence over, not the answer)."""
        return list(self.entropies), self.blocks_run, self.blocks_total

    def restore_statistics(self, statistics: tuple[list[float], int, int]) -> None:
        entropies, self.blocks_run, self.blocks_total = statistics
        self.entropies = list(entropies)

    def set_compute_budget(self, budget: float) -> None:
        """Lower (or restore) the mean executed-FFN fraction allowed; the thermal guard calls this."""
        if not 0 < budget <= 1:
            raise ValueError(f"compute budget must be in (0, 1], got {budget}: the largest mean fraction of FFN "
                             "blocks a decode step may run; pass e.g. 0.5 (half the blocks), or 1 to lift the limit")
        self.limit = float(budget)
        self.budget = min(self.limit, self.config.compute_budget)

    @property
    def entropy(self) -> float | None:
        """Realised entropy of the last window (None until a window has been seen)."""
        return self.last_entropy

    def observe(self, power: float | np.ndarray, executed: np.ndarray, steer: bool = True, count: bool = True
                ) -> float:
        """Tokens' power p_t (S,) and per-layer executed flags (S, L); returns the next step's tau.

        ``steer=False`` only measures (gating off: tau stays where it is); ``count=False`` leaves the
        rows out of the block counts, out of the executed window that drives the budget floor and the quality
        ceiling, and their window out of the realised entropy (a prompt, whose FFNs ran whatever the gates said:
        its flags are what tau would have skipped, not what ran, and no tau can change them). A prompt's powers
        still steer the entropy loop.
        """
        c = self.config
        fresh = False
        for value in np.atleast_1d(power).ravel():
            # A non-finite reading (an overflowed graph) would turn the smoothed window into NaN for
            # the next window + smooth steps, which reads as a window of equal powers (ln W) and
            # drives tau up; it carries no power to measure, so it is left out of the stream.
            if np.isfinite(value):
                self.powers.append(float(value))
                fresh = True
        executed = np.asarray(executed, np.float64).reshape(-1, np.asarray(executed).shape[-1])  # (S, L)
        # A prompt's flags in the window read as blocks run or skipped for the next window of decode steps: a
        # prompt whose gates passed tau raised the floor, which then held tau there for good once decoding met
        # the budget (nothing relaxes a floor at zero excess); one whose gates fell short lowered the ceiling so.
        for row in executed if count else ():
            self.executed.append(float(row.mean()))
            self.blocks_run += int(row.sum())
            self.blocks_total += row.size
        if fresh and len(self.powers) >= c.window:
            h = window_entropy(np.fromiter(self.powers, np.float64), c.window, c.smooth, c.floor)
            self.last_entropy = h
            if count:  # a prompt's window steers, but the realised entropy is the answer's
                self.entropies.append(h)
            step = c.gain_entropy * (h - c.entropy_target)
            # While the budget floor holds tau above the entropy loop's value, lowering that value
            # changes nothing now but winds it down (toward tau_min): when the floor let go, tau fell
            # far below where it held the target. It waits instead, and resumes from there.
            # The same while the quality ceiling holds tau below it: raising that value changes nothing now. It
            # used to be clamped to the ceiling instead, so every dip of the 8-token executed share below
            # min_compute dragged it down for good (the ceiling snaps to the tau in use), and it climbed back only
            # at the entropy loop's rate, near 0 at the target: a target held with 54 % of the blocks running was
            # missed (1.81 against 1.80 nats, 67 % run) under the default floor of 50 %.
            if steer and not (step < 0 and self._floor > self._entropy_tau) \
                    and not (step > 0 and self._ceiling < self._entropy_tau):
                self._entropy_tau += step
        if not steer:
            return self.tau
        # Only a call that added rows moves the bounds: a prompt adds none (nothing ran that tau decided), and
        # steering on the window the last answer left integrated its fraction once more for every prompt chunk.
        if count and len(executed):
            self._steer_bounds(float(np.mean(self.executed)))
        self._entropy_tau = min(c.tau_max, max(c.tau_min, self._entropy_tau))
        self.tau = max(min(self._entropy_tau, self._ceiling), self._floor)
        return self.tau

    def _steer_bounds(self, fraction: float) -> None:
        """Move the budget floor and the quality ceiling on the window's mean executed-FFN ``fraction``."""
        c = self.config
        excess = fraction - self.budget
        # Over the budget, the floor rises from the tau in use: left where it had relaxed to (tau_min
        # while the budget was met), it took (tau - floor) / (gain * excess) steps, a hundred tokens
        # and more, to reach tau, and until then the budget the thermal guard had set was ignored.
        floor = max(self._floor, self.tau) if excess > 0 else self._floor
        self._floor = min(c.tau_max, max(c.tau_min, floor + c.gain_budget * excess))
        deficit = min(c.min_compute, self.budget) - fraction
        ceiling = min(self._ceiling, self.tau) if deficit > 0 else self._ceiling  # the same, from above
        self._ceiling = min(c.tau_max, max(c.tau_min, ceiling - c.gain_budget * deficit))

    def summary(self) -> dict:
        ent = np.asarray(self.entropies)
        return {
            "mean_entropy": round(float(ent.mean()), 4) if ent.size else None,
            "blocks_skipped": self.blocks_total - self.blocks_run,
            "blocks_total": self.blocks_total,
            "executed_fraction": round(self.blocks_run / self.blocks_total, 4) if self.blocks_total else None,
            "tau": round(self.tau, 4),
            "budget": self.budget,
        }
