"""A simulated board: first-order thermal model, emulated firmware throttle, simulated clock.

Thermal model (profile ``thermal_model``): ``C dT/dt = P - (T - T_ambient) / R``. Over an interval
of constant power it is solved exactly, ``T(t) = T_ss + (T0 - T_ss) exp(-t / RC)`` with
``T_ss = T_ambient + R P``, so a 30-minute run is a few thousand cheap updates.

Power: ``P = idle_w`` while waiting and ``idle_w + (active_w - idle_w) * f/f0 * (V/V0)^2`` while
computing at clock f (dynamic CMOS power ~ f V^2). Clocks and voltages are the Raspberry Pi 5
operating points read by T. Kaiser with ``vcgencmd`` (geerlingguy/sbc-reviews#21, ◐): 2.4 GHz at
0.915 V down to 1.5 GHz at 0.82 V in 100 MHz steps; requests below 1.5 GHz still run at 1.5 GHz.

Firmware throttle (Raspberry Pi documentation, ``frequency-management.adoc`` ✅): between 80 and
85 °C the Arm cores are throttled progressively, at 85 °C Arm and GPU are throttled. Emulated as a
clock that falls linearly from 2.4 GHz at the throttle point to the 1.5 GHz floor of the operating
points 5 °C above it; beyond that the firmware goes below the floor (seen on the Pi 3, which ran at
470-560 MHz of 1.2 GHz at 86-88 °C, raspberrypi/linux#1337 ◐): 1.0 GHz at +7 °C, 0.6 GHz at +10 °C
(UNVERIFIED for the Pi 5). The same relative curve is applied to other boards' throttle points
(UNVERIFIED there: Jetson's passive trip steps cpufreq down in the kernel's step_wise governor).

Token time: ``t = t0 * (share * f0/f + 1 - share)``: the clock-bound share of a decode step is
0.5 (DESIGN.md: small-model decode reaches about half of its memory roofline, the rest is per-token
overhead that scales with the clock); prefill is compute-bound (share 1).

Raspberry Pi 5 parameters (``targets/rpi5.yaml``, bare board, all ◐ third-party measurements):
idle 2.8 W and all-core stress 9.7 W at the supply (geerlingguy/sbc-reviews), so decode on four
threads is taken as 9.0 W; the board idles at ~50 °C in a ~23 °C room, hence
``R = 27 °C / 2.8 W = 9.5 °C/W`` and an unthrottled full-load steady state of ~109 °C (bare boards
do sit at the 85 °C firmware limit under load: Phoronix measured an 81 °C average, 89 °C peak);
stress-ng takes it from idle to 80 °C "within a few minutes", which ``RC = 238 s`` (``C = 25 J/°C``)
reproduces in 2.8 minutes. With these, a bare Pi 5 under sustained decode settles near 83.5-87 °C at
1.8-1.0 GHz between 20 and 40 °C ambient (84-86 °C at 1.6-1.2 GHz between 25 and 35 °C).
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass

from edgesdk.errors import EdgeSDKError
from edgesdk.profile import ABSOLUTE_ZERO_C, MAX_CHIP_C, TargetProfile, ThermalModel
from edgesdk.thermal import AMBIENT_RANGE_C
from edgesdk.thermal.sensors import Reading, Trip

# Raspberry Pi 5 operating points (GHz, V), geerlingguy/sbc-reviews#21 (T. Kaiser, vcgencmd) ◐
PI5_OPP = ((1.5, 0.820), (1.6, 0.830), (1.7, 0.840), (1.8, 0.850), (1.9, 0.860), (2.0, 0.875),
           (2.1, 0.885), (2.2, 0.895), (2.3, 0.905), (2.4, 0.915))
# Emulated firmware: (°C above the throttle point, clock as a fraction of the maximum)
THROTTLE_CURVE = ((0.0, 1.0), (5.0, 1.5 / 2.4), (7.0, 1.0 / 2.4), (10.0, 0.6 / 2.4))


def _interp(x: float, points: tuple[tuple[float, float], ...]) -> float:
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def clock_ratio(temp_c: float, throttle_c: float) -> float:
    """Emulated firmware clock as a fraction of the maximum at ``temp_c``."""
    return _interp(temp_c - throttle_c, THROTTLE_CURVE)


def power_ratio(ratio: float) -> float:
    """Dynamic power at clock ``ratio`` relative to full clock: f/f0 * (V/V0)^2 (Pi 5 points)."""
    f_max, v_max = PI5_OPP[-1]
    volts = _interp(ratio * f_max, PI5_OPP)  # held at 0.82 V below 1.5 GHz
    return ratio * (volts / v_max) ** 2


def _finite(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


def _in_celsius_hint(value: float, low: float, high: float) -> str:
    """What ``value`` is in °C where it reads as millidegrees (sysfs ``thermal_zone*/temp``) or as kelvin, within
    ``low``..``high``; empty where it reads as neither."""
    if abs(value) >= 1000 and low <= value / 1000 <= high:
        return f" ({value:g} reads as millidegrees: {value / 1000:g} °C)"
    if 0 < value < 1000 and low <= value - 273.15 <= high:
        return f" ({value:g} reads as kelvin: {value - 273.15:g} °C)"
    return ""


def check_ambient(ambient_c: float, caller: str, option: str = "") -> None:
    """Refuse an ambient that is not a finite number in :data:`~edgesdk.thermal.AMBIENT_RANGE_C` (the range
    ``--ambient`` and a profile's ``ambient_c`` take), naming ``caller`` (``simulate``, ``SimulatedBoard``) and the
    command-line ``option`` that gives it, if any. A NaN made every temperature NaN (the guard never left "normal");
    25000 (m°C) or 298 (K) ran as a board at 25026 °C, critical from the first reading: the refusal says what such a
    value reads as in °C."""
    low, high = AMBIENT_RANGE_C
    given = f"{caller}: ambient_c={ambient_c!r}" + (f" ({option})" if option else "")
    example = "e.g. ambient_c=35" + (f" ({option} 35)" if option else "")
    if not _finite(ambient_c):
        raise EdgeSDKError(f"{given} is not a finite temperature in °C",
                           f"pass the room temperature around the board in °C, from {low:g} to {high:g}, {example}")
    if not low <= ambient_c <= high:
        raise EdgeSDKError(f"{given} is not an ambient from {low:g} to {high:g} °C, the industrial range a board's "
                           f"parts are rated for{_in_celsius_hint(ambient_c, low, high)}",
                           f"pass the room temperature around the board in °C, not millidegrees or kelvin, {example}")


def check_board_args(ambient_c: float, start_c: float | None, max_step_s: float) -> None:
    """Refuse what the model cannot run as a board: an ambient outside :data:`~edgesdk.thermal.AMBIENT_RANGE_C`
    (:func:`check_ambient`), a start temperature that is not one a chip reaches, and a ``max_step_s`` that
    is not a finite number of seconds above 0 (0 made every wait and step loop forever)."""
    check_ambient(ambient_c, "SimulatedBoard")
    if start_c is not None and (not _finite(start_c) or not ABSOLUTE_ZERO_C < start_c <= MAX_CHIP_C):
        hint = _in_celsius_hint(start_c, ABSOLUTE_ZERO_C, MAX_CHIP_C) if _finite(start_c) else ""
        raise EdgeSDKError(f"SimulatedBoard: start_c={start_c!r} is not a temperature a chip reaches, above "
                           f"{ABSOLUTE_ZERO_C:g} °C and at most {MAX_CHIP_C:g} °C{hint}",
                           "pass the board's temperature at the start in °C, e.g. start_c=50, or None for its idle "
                           "steady state")
    if not _finite(max_step_s) or max_step_s <= 0:
        raise EdgeSDKError(f"SimulatedBoard: max_step_s={max_step_s!r} is not a finite number of seconds above 0",
                           "pass how often the clock is read again, e.g. max_step_s=0.5 (the default)")


class PastHorizon(Exception):  # noqa: N818 (a stop signal, not an error)
    """A step or a wait on a :class:`SimulatedBoard` would have ended past its ``horizon_s``; the board
    stopped at the horizon (so an endless idle or a step of 1e300 s costs no more than the horizon)."""


@dataclass(frozen=True)
class WorkModel:
    """How long a step takes on the board at full clock; ``None`` rates use the measured time."""

    decode_tok_s: float | None = None
    prefill_tok_s: float | None = None
    speed: float = 1.0  # measured host seconds -> board seconds (board is ``speed`` times slower)
    decode_clock_share: float = 0.5
    prefill_clock_share: float = 1.0

    def seconds(self, kind: str, tokens: int, ratio: float, measured_s: float = 0.0) -> float:
        rate = self.prefill_tok_s if kind == "prefill" else self.decode_tok_s
        base = tokens / rate if rate else measured_s * self.speed
        share = self.prefill_clock_share if kind == "prefill" else self.decode_clock_share
        return base * (share / max(ratio, 1e-3) + 1.0 - share)


class SimulatedBoard:
    """One board on a simulated clock: :meth:`compute` and :meth:`sleep` advance time and heat."""

    def __init__(self, model: ThermalModel, throttle_c: float, ambient_c: float | None = None,
                 work: WorkModel | None = None, start_c: float | None = None, firmware: bool = True,
                 max_step_s: float = 0.5, horizon_s: float | None = None, throttle_flags: bool = True):
        check_board_args(model.ambient_c if ambient_c is None else ambient_c, start_c, max_step_s)
        self.model = model
        # Does the board's firmware report its throttling (a Raspberry Pi's ``vcgencmd get_throttled``)? A Jetson
        # has no such flags: its kernel throttles through the passive trip's cpufreq cooling, and its sensor path
        # (sysfs zones, jetson-stats) reports temperatures only.
        self.throttle_flags = throttle_flags
        self.horizon_s = horizon_s  # simulated time stops here (a plan's end): PastHorizon
        self.throttle_c = throttle_c
        self.ambient_c = model.ambient_c if ambient_c is None else ambient_c
        self.work = work or WorkModel()
        self.firmware = firmware
        self.max_step_s = max_step_s
        self.t = 0.0
        # Default start: the board has been idle long enough to sit at its idle steady state.
        self.temp_c = self.ambient_c + model.resistance_c_per_w * model.idle_w if start_c is None else start_c
        self.power_w = model.idle_w
        self.cap_ratio: float | None = None  # a clock cap the guard set (set_ratio)
        self.throttled_s = 0.0
        # The hottest the board has been: a run's records read it only at each step's end, and a step the horizon
        # cuts short (a long prompt's prefill, the last step of every run) ends with no record at all.
        self.peak_c = self.temp_c
        self.busy_s = 0.0
        self.energy_j = 0.0

    @classmethod
    def from_profile(cls, profile: TargetProfile, ambient_c: float | None = None, **kwargs) -> SimulatedBoard:
        kwargs.setdefault("throttle_flags", profile.family == "rpi")
        return cls(profile.thermal_model, profile.thermal.firmware_throttle_c, ambient_c, **kwargs)

    @property
    def firmware_clock(self) -> float:
        """The emulated firmware's clock as a fraction of the maximum (1.0 when not emulated)."""
        return clock_ratio(self.temp_c, self.throttle_c) if self.firmware else 1.0

    @property
    def clock(self) -> float:
        """Current clock: the firmware's, lowered further by a cap the guard set."""
        return min(self.firmware_clock, self.cap_ratio or 1.0)

    @property
    def throttling(self) -> bool:
        """The firmware is throttling (a cap the guard chose is not a throttle)."""
        return self.firmware_clock < 1.0

    def set_ratio(self, ratio: float | None) -> None:
        """The clock-cap protocol (as :class:`~edgesdk.thermal.cpufreq.CpuFreqCap`): cap at ``ratio``
        of the maximum clock, or uncap (``None``); like cpufreq, never below the lowest operating point."""
        self.cap_ratio = None if ratio is None else max(ratio, PI5_OPP[0][0] / PI5_OPP[-1][0])

    def _advance(self, seconds: float, busy: bool) -> None:
        m = self.model
        tau = m.resistance_c_per_w * m.capacity_j_per_c
        cut = self.horizon_s is not None and self.t + seconds > self.horizon_s
        if cut:
            seconds = max(self.horizon_s - self.t, 0.0)
        while seconds > 1e-12:
            step = min(seconds, self.max_step_s)
            ratio, throttled = self.clock, self.throttling
            dynamic = (m.active_w - m.idle_w) * power_ratio(ratio) if busy else 0.0
            self.power_w = m.idle_w + dynamic
            steady = self.ambient_c + m.resistance_c_per_w * self.power_w
            self.temp_c = steady + (self.temp_c - steady) * math.exp(-step / tau)
            self.peak_c = max(self.peak_c, self.temp_c)  # exact: constant power moves T one way over a step
            if throttled:
                self.throttled_s += step
            self.busy_s += step if busy else 0.0
            self.energy_j += self.power_w * step
            self.t += step
            seconds -= step
        if cut:
            raise PastHorizon(self.t)

    def compute(self, kind: str, tokens: int, measured_s: float = 0.0) -> float:
        """Run a step on the board; returns its simulated duration. The clock is read again every
        ``max_step_s``: a long step (a long prompt's prefill) that heats the board into the throttle
        slows down as it goes."""
        start, left = self.t, 1.0  # the share of the step still to run
        while left > 1e-9:
            whole_s = self.work.seconds(kind, tokens, self.clock, measured_s)  # the step at the clock now
            if whole_s <= 0.0:
                break
            slice_s = min(left * whole_s, self.max_step_s)
            self._advance(slice_s, busy=True)
            left -= slice_s / whole_s
        return self.t - start

    # Clock protocol (shared with RealClock): the guard waits through it.
    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self._advance(max(seconds, 0.0), busy=False)


class SimulatedSensor:
    """Reads a :class:`SimulatedBoard` like a thermal zone, plus its power and, where its firmware reports them (a
    Raspberry Pi's ``get_throttled``, :attr:`SimulatedBoard.throttle_flags`), its throttle flags: a simulated
    Jetson reads as a real one does, temperatures with no flags (``throttled`` None)."""

    def __init__(self, board: SimulatedBoard, zone: str = "sim"):
        self.board = board
        self.zone = zone
        self.source = f"simulated {zone}"

    def read(self) -> Reading:
        b = self.board
        flags = {"throttled": b.throttling, "arm_freq_capped": b.throttling} if b.throttle_flags else None
        return Reading(time=b.t, zones={self.zone: round(b.temp_c, 3)}, throttled=flags,
                       power_w={"board": round(b.power_w, 3)}, source=self.source)

    @staticmethod
    def trips(profile: TargetProfile, zone: str = "sim") -> list[Trip]:
        """What the simulated board reports as sysfs trips: the profile's throttle and shutdown points."""
        limits = profile.thermal
        return [Trip(zone, 0, "passive", limits.firmware_throttle_c), Trip(zone, 1, "critical", limits.shutdown_c)]


class RealClock:
    """Wall-clock time for the guard on a real board."""

    @staticmethod
    def now() -> float:
        return time.monotonic()

    @staticmethod
    def sleep(seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
