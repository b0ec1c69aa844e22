"""The thermal guard: levels with hysteresis, a compute budget, a token-rate controller, pauses.

Levels, from the effective limits (the profile's, lowered to the board's real trip points):

=========  =========================================  ============================================
level      entered at                                 action
=========  =========================================  ============================================
normal     below ``resume_c``                         none
warm       ``resume_c``                               compute budget lowered (power gate, if any)
hot        ``setpoint - hot_lead_c``                  token rate paced so the board holds
                                                      ``setpoint = soft_limit_c - setpoint_margin_c``
critical   ``hard_limit_c``                           generation paused, request kept; resumes
                                                      below ``resume_c``; after ``RC`` seconds (the
                                                      board's time constant), below ``hard_limit_c
                                                      - hysteresis_c`` (:meth:`Guard._stopped_cooling`)
=========  =========================================  ============================================

With ``hot_clock_ratio`` set, hot and critical (and a failed sensor, or a firmware flag: under-voltage,
throttling) also cap the CPU clock (``thermal/cpufreq.py``): the same heat then buys about 1.5x the tokens by the
model, each a little slower (1.42x measured in the acceptance run, tests/benchmarks/test_thermal_acceptance.py).

A level rises at once; it falls only ``hysteresis_c`` below its threshold and after
``min_dwell_s`` in it. The rate controller is a PI controller on the temperature whose gains come
from the profile's thermal model (plant gain ``K = R (active_w - idle_w)``, time constant ``RC``):
``Kp = RC / (K * response_s)``, ``Ti = response_s``; on entering ``hot`` (or ``critical`` from below it: a
pause holds the rate for when it ends) it starts from the rate that holds the setpoint in steady state, with
the ambient estimated from the first reading as if the board had been idle (``T0 - R idle_w``), then
re-estimated from the board's response every ``RC / 2`` (:meth:`Guard._track_ambient`). Its output feeds a token bucket whose depth is one
request, but never more tokens than the model says fit at full speed before the board is half a
degree under the soft limit. A request starts when the bucket can pay for that depth, so waiting
happens before the first token (time to first token) and the text streams at full speed; a request
longer than the depth is paced token by token. A prefill pays for its compute time (the decode tokens that time
would have made), not for the one token it yields; and, once a prefill rate is learned, a prefill that the model
says would end above the soft limit waits for the board to cool (:attr:`Guard.prefill_held`). A long prompt is
prefilled in steps of a few seconds of heat each (:meth:`Guard.prefill_chunk`), so the guard paces, holds and pauses
between them as between decode steps. A hottest zone more
than ``max_drop_c`` below the last reading taken, in one new reading, is a bad read (a sensor's 0 °C) until a second reading confirms it
(:meth:`Guard._screen`); a reading that stays exactly the same while the model says the board must have
moved by ``frozen_c`` is a frozen sensor (:meth:`Guard._frozen`). A zone whose read fails holds its last good reading
for a short while (``sensors.HOLD_S``, in the telemetry's ``held_zones``); a hottest zone whose reads fail past that
leaves a poll with no data too, for ``lost_zone_s``; then the guard goes on with the zones left plus the lead the zone
last had over them (:meth:`Guard._lost_hottest`, ``lost_margins_c`` in the telemetry). With no sensor data (a poll that read no temperature,
or a last reading older than ``stale_s``) the guard warns (once, and again at a later failure once the sensor has read for ``SENSOR_REWARN_S``) and paces steadily at ``fallback_fraction`` of the unpaced rate, or at the slower rate it was
pacing at when the data stopped (a bare Pi 5 held near 20 % at 35 °C ambient heats past its hard
limit into the firmware throttle at 50 %).

Sources for the limits are in the target profiles (``targets/*.yaml``); the Raspberry Pi's 80/85 °C
firmware scheme is in the Raspberry Pi documentation (``frequency-management.adoc``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from edgesdk.profile import ThermalLimits, ThermalModel
from edgesdk.thermal.sensors import Reading, Trip, zone_fields
from edgesdk.thermal.simulator import power_ratio


class Level(str, Enum):
    NORMAL = "normal"
    WARM = "warm"
    HOT = "hot"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {level: index for index, level in enumerate(Level)}


@dataclass(frozen=True)
class Limits:
    """Effective limits in °C (see :meth:`resolve`)."""

    resume_c: float
    soft_c: float
    hard_c: float
    throttle_c: float
    shutdown_c: float

    @classmethod
    def resolve(cls, limits: ThermalLimits, trips: Sequence[Trip] = ()) -> tuple[Limits, list[str]]:
        """The profile's limits, lowered so that they sit below the board's real trip points.

        * passive/hot trip below the profile's throttle point: it becomes the throttle point;
        * lowest critical trip: the shutdown point is never above it, and the throttle point stays
          :func:`critical_margin` below it;
        * resume, soft and hard limits move down by the same shift as the throttle point, so the
          profile's spacing between them is kept.

        Active (fan) trips are ignored, and so are trips at or below 0 °C (unset: x86_pkg_temp
        exposes such) and trips below the profile's resume point (not a plausible limit); the notes
        name each one.
        """
        usable, notes = _usable_trips(limits, trips)
        passive = [t for t in usable if t.kind in ("passive", "hot")]
        critical = [t for t in usable if t.kind == "critical"]
        throttle, throttle_notes = _throttle_point(limits, passive, critical)
        shutdown, shutdown_notes = _shutdown_point(limits, critical)
        shift = limits.firmware_throttle_c - throttle
        if shift > 0:
            notes += [f"{note}: guard limits lowered by {shift:g} °C" for note in throttle_notes]
        notes += shutdown_notes
        return cls(limits.resume_c - shift, limits.soft_limit_c - shift, limits.hard_limit_c - shift,
                   throttle, shutdown), notes


def _trip_name(trip: Trip) -> str:
    return f"board {trip.kind} trip {trip.zone}[{trip.index}] {trip.temp_c:g} °C"


def _usable_trips(limits: ThermalLimits, trips: Sequence[Trip]) -> tuple[list[Trip], list[str]]:
    """The passive/hot/critical trips that can be limits, and a note for each one left out."""
    usable, notes = [], []
    for trip in trips:
        if trip.kind not in ("passive", "hot", "critical"):
            continue
        if trip.temp_c <= 0:
            notes.append(f"{_trip_name(trip)} ignored: a trip at or below 0 °C is unset")
        elif trip.temp_c < limits.resume_c:
            notes.append(f"{_trip_name(trip)} ignored: below the profile's resume point {limits.resume_c:g} °C, "
                         "not a plausible limit")
        else:
            usable.append(trip)
    return usable, notes


def critical_margin(limits: ThermalLimits) -> float:
    """How far the throttle point stays below a critical trip: the profile's throttle-to-shutdown
    spacing, but no more than its hard-to-throttle spacing (some profiles' shutdown points are loose
    estimates: rpi5 puts 30 °C between throttle and shutdown, 2 °C between hard limit and throttle)."""
    return min(limits.shutdown_c - limits.firmware_throttle_c, limits.firmware_throttle_c - limits.hard_limit_c)


def _throttle_point(limits: ThermalLimits, passive: Sequence[Trip],
                    critical: Sequence[Trip]) -> tuple[float, list[str]]:
    """The effective throttle point and a note naming the trip that lowered it (if one did)."""
    spacing = critical_margin(limits)
    candidates = [(limits.firmware_throttle_c, "")]
    candidates += [(t.temp_c, f"{_trip_name(t)} is below the profile's throttle point "
                              f"{limits.firmware_throttle_c:g} °C") for t in passive]
    candidates += [(t.temp_c - spacing, f"{_trip_name(t)} is below the profile's shutdown point "
                                        f"{limits.shutdown_c:g} °C; the throttle point stays "
                                        f"{spacing:g} °C below it, at {t.temp_c - spacing:g} °C") for t in critical]
    throttle, reason = min(candidates, key=lambda candidate: candidate[0])
    return throttle, [reason] if reason else []


def _shutdown_point(limits: ThermalLimits, critical: Sequence[Trip]) -> tuple[float, list[str]]:
    """The profile's shutdown point, never above the board's lowest critical trip."""
    if not critical:
        return limits.shutdown_c, []
    lowest = min(critical, key=lambda trip: trip.temp_c)
    if lowest.temp_c >= limits.shutdown_c:
        return limits.shutdown_c, []
    return lowest.temp_c, [f"{_trip_name(lowest)} is the shutdown point (the profile's is {limits.shutdown_c:g} °C)"]


# get_throttled flags that mean the firmware is limiting the board now (thermal/sensors.py decodes them).
FIRMWARE_LIMITS = ("under_voltage", "arm_freq_capped", "throttled", "soft_temp_limit")
# ... those of them that mean the firmware has lowered the Arm clock now (bits 1-3): a record's ``throttled``. Under-voltage
# (bit 0) is a weak supply, not a slower clock by itself: the firmware sets bit 1 or 2 as well when it slows the board.
FIRMWARE_SLOWDOWNS = ("arm_freq_capped", "throttled", "soft_temp_limit")
# What each flag is, for the status line: under-voltage is fixed by the power supply, not by cooling.
FIRMWARE_CAUSES = {"under_voltage": "UNDER-VOLTAGE (power supply too weak)", "arm_freq_capped": "ARM CLOCK CAPPED",
                   "throttled": "FIRMWARE THROTTLING", "soft_temp_limit": "SOFT TEMPERATURE LIMIT"}


def firmware_limits(throttled: dict[str, bool] | None) -> tuple[str, ...]:
    """The :data:`FIRMWARE_LIMITS` a reading's decoded ``get_throttled`` bits set now, in bit order."""
    return tuple(name for name in FIRMWARE_LIMITS if throttled and throttled.get(name))


CLOCK_CAP_RATIO = 0.625  # Raspberry Pi 5's lowest operating point, 1.5 of 2.4 GHz (thermal/simulator.py)
# The fewest prompt tokens a prefill teaches the guard its prefill rate from (Guard.prefill_tok_s). A pass reads every
# weight once whatever its length, so a short one takes about a decode step's time: a 1-token prefill (a prompt the
# cache holds all but the last token of, a regenerated answer) "ran" at the decode rate, a tenth of a long prompt's
# rate on a Pi 5, and after a few of them the guard held a 400-token prompt (4 s) as if it took 20 s, for up to RC
# seconds (238 s on a Pi 5).
PREFILL_LEARN_TOKENS = 64
# The most prompt tokens one prefill step takes before the guard has learned a prefill rate: llama.cpp's n_ubatch
# default (common/common.h ``n_ubatch = 512``), the micro-batch llama_decode splits a prompt into.
PREFILL_CHUNK_TOKENS = 512
# A sensor that failed and has read again for this long is warned of again when it next fails (Guard._sensor_failed):
# in a long run a second failure, hours after the first, paced the board at the fallback rate in silence, while one
# that flaps (fails past its hold, reads for a few polls, fails) is said once, not at every flap.
SENSOR_REWARN_S = 60.0


@dataclass(frozen=True)
class GuardConfig:
    setpoint_margin_c: float = 2.0  # the controller holds soft_limit - this (room for one request's heat)
    hot_lead_c: float = 1.5  # pacing starts this far below the setpoint
    hysteresis_c: float = 1.0
    min_dwell_s: float = 10.0
    warm_budget: float = 0.75  # compute budget handed to the power gate in warm
    hot_budget: float = 0.5  # ... in hot, critical and when the sensor failed
    fallback_fraction: float = 0.5  # largest token rate, as a fraction of the unpaced rate, without sensor data
    min_fraction: float = 0.02
    stale_s: float = 5.0
    # A hottest zone whose reads have failed for lost_zone_s (four stale_s) past its hold is no longer waited on: the
    # guard goes on with the zones left plus the lead it last read over them (see Guard._lost_hottest).
    lost_zone_s: float = 20.0
    # A hottest zone this far below the last one the guard took, in a single new reading, is held as a bad
    # read (the last temperature stands) until a second reading confirms it: see Guard._screen.
    max_drop_c: float = 20.0
    # A hottest zone that reads the very same value for at least frozen_s of continuous polls, over which the
    # thermal model expected it to move by frozen_c or more (the board computed, or idled, far from where it
    # settles), is a frozen sensor (see Guard._frozen): no data, paced at the fallback rate until it changes.
    frozen_s: float = 30.0
    frozen_c: float = 3.0
    response_s: float = 30.0  # closed-loop time constant of the rate controller
    max_burst_tokens: int = 512
    poll_s: float = 0.5  # longest single wait; the guard re-reads the sensor after each
    # While pacing, cap the CPU clock at this share of the maximum (None: never). 0.625 is the
    # Raspberry Pi 5's lowest operating point (1.5 of 2.4 GHz, 0.82 V), where energy per token is
    # lowest; see thermal/cpufreq.py. Off by default: the cap is system-wide and needs root.
    hot_clock_ratio: float | None = None  # CLOCK_CAP_RATIO with --clock-cap


def configured_budget(budget_target: object | None) -> float:
    """The compute budget set on the power gate in use (``run``/``serve --compute-budget``: the gated backend's
    controller settings, :class:`~edgesdk.power.controller.ControllerConfig`, or a controller's own), 1.0 where none
    is set or no gate is in use (``budget_target`` None)."""
    settings = getattr(getattr(budget_target, "controller", budget_target), "config", None)
    return float(getattr(settings, "compute_budget", 1.0))


def ffn_weight_share(facts: Mapping | None, head_dim: int | None = None) -> float | None:
    """The FFN blocks' share of the weights a decoded token reads, from a bundle's model facts (the manifest's
    ``model.after``: ``layers``, ``hidden_size``, ``attention_heads``, ``kv_heads``, ``intermediate_size``,
    ``vocab_size``, and the per-layer ``intermediate_sizes``, ``attention_heads_per_layer`` and
    ``kv_heads_per_layer`` pruning leaves); None where they do not say.

    A decode step on a bandwidth-bound board draws power by the bytes it reads: per layer the FFN's gate, up and down
    projections (``3 x hidden x intermediate``) and the attention's q, k, v and o (``hidden x head_dim x (2 heads +
    2 kv_heads)``), and once the LM head (``vocab x hidden``; the embedding table, tied or not, is read a row a
    token). SmolLM2-135M: 79.6 M of 134.4 M, 59 %. ``head_dim``: the graph's (the gate's), which a pruned model's
    facts do not hold; else the facts' ``head_dim``, else ``hidden_size / attention_heads``."""
    if not isinstance(facts, Mapping):
        return None

    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    layers, hidden, vocab = facts.get("layers"), facts.get("hidden_size"), facts.get("vocab_size")
    if not (whole(layers) and whole(hidden) and whole(vocab)):
        return None

    def per_layer(key: str, listed: str) -> list[int] | None:
        values = facts.get(listed)
        if isinstance(values, list) and len(values) == layers and all(whole(v) for v in values):
            return values
        return [facts[key]] * layers if whole(facts.get(key)) else None

    widths = per_layer("intermediate_size", "intermediate_sizes")
    heads = per_layer("attention_heads", "attention_heads_per_layer")
    kv_heads = per_layer("kv_heads", "kv_heads_per_layer")
    if widths is None or heads is None or kv_heads is None:
        return None
    head_dim = next((size for size in (head_dim, facts.get("head_dim")) if whole(size)),
                    hidden // facts["attention_heads"] if whole(facts.get("attention_heads")) else 0)
    if head_dim <= 0:
        return None
    ffn = sum(3 * hidden * width for width in widths)
    attention = sum(hidden * head_dim * 2 * (q + kv) for q, kv in zip(heads, kv_heads, strict=True))
    return ffn / (ffn + attention + vocab * hidden)


class Guard:
    """Decides, before every step, how long generation must wait. Pure logic: no I/O, no clock."""

    def __init__(self, limits: Limits, plant: ThermalModel, config: GuardConfig | None = None,
                 budget_target: object | None = None, warn: Callable[[str], None] | None = None,
                 has_sensor: bool = True, model_facts: Mapping | None = None):
        """``has_sensor=False``: the board has no sensor at all (said once when the run starts), so the
        fixed pace is the plan from the first step, not a failure to warn about. The budget set on the power gate
        (``run``/``serve --compute-budget``, :attr:`compute_budget`) is read from the gate's settings as they stand.
        ``model_facts``: the bundle's (the manifest's ``model.after``), whose FFN share of the weights a token reads
        (:attr:`ffn_share`) is the share of a decode step's power the gate's skipped blocks save."""
        self.limits = limits
        self.plant = plant
        self.config = c = config or GuardConfig()
        self.setpoint_c = limits.soft_c - c.setpoint_margin_c
        self.thresholds = {
            Level.WARM: limits.resume_c,
            Level.HOT: max(self.setpoint_c - c.hot_lead_c, limits.resume_c + 0.5),
            Level.CRITICAL: limits.hard_c,
        }
        self.level = Level.NORMAL
        self.since = 0.0
        self.now = None
        self.temp_c: float | None = None
        self.sensor_ok = True
        self.ambient_c: float | None = None
        self.fraction = 1.0  # rate-controller output: allowed share of the unpaced token rate
        self._integral = 1.0
        self.unpaced_tok_s: float | None = None
        # the unpaced decode rate learned at each clock a decode step ran at (:attr:`_clock_key`): a capped step is
        # slower (1.3x at the Pi 5's 62.5 %), and an answer started uncapped was timed at the capped rate
        self._clock_rates: dict[float | None, float] = {}
        self.prefill_tok_s: float | None = None  # prompt tokens per second of prefill compute, learned
        # ... and learned at each clock a prefill step ran at (:attr:`_prefill_rate_now`): a prefill is compute-bound,
        # 1.6x slower at the Pi 5's 62.5 % cap, and a capped step timed at the uncapped rate heated the board longer
        # than the hold predicted
        self._prefill_rates: dict[float | None, float] = {}
        self.prompt_tokens = 0  # the coming (or last) prefill step's prompt tokens
        self._held_since: float | None = None  # when the hold before this request's prefill began
        self.holding = False  # the last wait_s held the prefill back (prefill_held): for the status line
        self.capacity = float(c.max_burst_tokens)
        self.credit = self.capacity
        self.budget = 1.0  # the guard's own, handed to the power gate
        self.budget_target = budget_target if hasattr(budget_target, "set_compute_budget") else None
        # The FFN blocks' share of a decode step's dynamic power (:func:`ffn_weight_share`: attention and the LM head
        # draw the rest whatever the gate skips); 1.0 where the model's facts do not say: all of it taken as the FFN's
        share = ffn_weight_share(model_facts, getattr(self.budget_target, "head_dim", None))
        self.ffn_share = 1.0 if share is None else share
        self._warn = warn or (lambda message: None)
        self.has_sensor = has_sensor
        self._warned = not has_sensor
        self._back_since: float | None = None  # when the sensor read again after a failure (SENSOR_REWARN_S)
        # The ambient re-estimate's window (:meth:`_track_ambient`): (reading time, °C) at its start, compute seconds
        # spent in it (each at the dynamic power of the FFN blocks the power gate ran: :meth:`_gate_shares`), and
        # whether something the model does not cover (a capped clock, ...) happened in it.
        self._window: tuple[float, float] | None = None
        self._window_busy_s = 0.0
        self._window_tainted = False
        self._ambient_measured = False
        # The run of identical readings (:meth:`_frozen`): [first reading time judged from, °C, last reading time,
        # compute seconds at that reading], and the compute seconds spent in it since the first, and those seconds
        # weighted by their dynamic power as a share of full power (the clock they ran at, the guard's own cap, and
        # the FFN blocks the power gate ran: :meth:`_gate_shares`), at the most and at the least the gate allows.
        self._flat: list[float] | None = None
        self._flat_busy_s = 0.0
        self._flat_work_s = 0.0
        self._flat_least_s = 0.0
        # The clock the actuator reports it applied for the guard's cap, as a share of the maximum (set by the hook
        # after each cap: :class:`~edgesdk.thermal.watch.ThermalHook`); None: not known (the capped power is then too).
        self.clock_applied: float | None = None
        # ... and whether its power follows the Pi 5's operating points (:func:`~edgesdk.thermal.simulator.power_ratio`:
        # the simulated board, a BCM2712 board's cpufreq); False: another board's, taken as f alone (:attr:`_dynamic_share`)
        self.clock_pi5_table = True
        self.frozen_s: float | None = None  # seconds the sensor has read the same value, once taken as frozen
        self._frozen_note = ""
        self.firmware_limited = False  # the firmware reports under-voltage or throttling right now
        self.firmware_flags: tuple[str, ...] = ()  # ... which of FIRMWARE_LIMITS it reports, in bit order
        self._suspect: tuple[float, float] | None = None  # (reading time, °C) of a drop not yet confirmed
        # The last fresh reading's zones that hold their last good value after a failed read (zone -> its age, s), and
        # those whose reads have failed past that hold (zone -> last good °C): in :meth:`state` for the telemetry.
        self.held_zones: dict[str, float] = {}
        self.lost_zones: dict[str, float] = {}
        self._hottest: set[str] = set()  # the zones at the hottest value of the last reading taken
        # Each zone's lead (°C) over the hottest of the other zones at its last live read, when its reads began failing
        # past the hold (the reading time the guard first saw it lost), and the lost zones it now stands in for with
        # the zones left plus that lead (zone -> the lead, in :meth:`state`): :meth:`_lost_hottest`.
        self._leads: dict[str, float] = {}
        self._lost_since: dict[str, float] = {}
        self.lost_margins: dict[str, float] = {}
        self._margin_warned: set[str] = set()
        self._lost_note = ""
        self._drop_warned = False
        self._firmware_warned: set[str] = set()  # the firmware flags a warning has named
        self._dynamic_w = dynamic_w = max(plant.active_w - plant.idle_w, 1e-6)  # a profile may have active_w == idle_w
        self._gain_c = plant.resistance_c_per_w * dynamic_w  # °C of steady-state rise per unit of rate
        self._kp = plant.resistance_c_per_w * plant.capacity_j_per_c / (self._gain_c * c.response_s)
        self._ki = self._kp / c.response_s

    # -- observing ---------------------------------------------------------------------------
    def observe(self, now: float, reading: Reading | None) -> Level:
        """Take a reading at ``now`` (same time base as the reading): level, controller, bucket."""
        dt = 0.0 if self.now is None else max(now - self.now, 0.0)
        self.now = now
        fresh = reading is not None and now - reading.time <= self.config.stale_s
        temp = reading.max_c if fresh else None
        self.held_zones = dict(reading.held) if fresh else {}
        self.lost_zones = dict(reading.lost) if fresh else {}
        if fresh:
            self._note_leads(reading)
        self.lost_margins = {}
        if temp is not None:
            temp = self._lost_hottest(reading, temp)
        frozen = temp is not None and self._frozen(reading, temp)
        if temp is not None and not frozen:
            temp = self._screen(reading, temp)
        screened = temp is not None and temp != reading.max_c  # a drop held as a bad read: the last value stands
        if temp is None or frozen:
            temp = None
            self._sensor_failed(reading)
        else:
            self._note_back(now)
            self.sensor_ok, self.temp_c = True, temp
            if not screened:
                self._hottest = {zone for zone, value in reading.zones.items() if value is not None and value >= temp}
            self._seed_ambient(temp)
            self._update_level(now, temp)
            self._update_rate(dt, temp)
        self._observe_firmware(reading if fresh else None)  # a stale poll's flags are no longer "now"
        if self.pacing:
            self.credit = min(self._depth, self.credit + self.fraction * self._unit_tok_s * dt)
        self._apply_budget()
        self._track_ambient(reading, None if temp is None or screened else temp)
        return self.level

    def _note_leads(self, reading: Reading) -> None:
        """Keep, from a fresh ``reading``, each zone's lead over the hottest other zone where it read live (not held),
        and when each lost zone was first seen lost (:meth:`_lost_hottest`)."""
        values = {zone: value for zone, value in reading.zones.items() if value is not None}
        for zone, value in values.items():
            others = [other for name, other in values.items() if name != zone]
            if others and zone not in reading.held:
                self._leads[zone] = value - max(others)
        self._lost_since = {zone: self._lost_since.get(zone, reading.time) for zone in reading.lost}
        self._margin_warned &= set(reading.lost)  # a zone that read again is said again when next lost for good

    def _lost_hottest(self, reading: Reading, temp: float) -> float | None:
        """The temperature to take from ``reading``, whose hottest zone left reads ``temp``, where a hotter zone's reads
        fail: None (no data) while that zone may come back, then the zones left plus the zone's last lead over them.

        A sysfs zone whose read fails keeps its last good reading for a short hold (``sensors.HOLD_S``, named in
        :attr:`held_zones`); past it the zone is no data and ``reading.lost`` keeps that last reading. A lost zone that
        read above ``temp``, or that was the hottest zone of the last reading the guard took (a Jetson's ``tj-therm``,
        about 10 °C above ``cpu-thermal``), leaves only cooler zones: acted on, their maximum was a sudden drop caused
        by nothing but failed reads, which lifted pacing on a hot board. Such a poll is no data (the fallback pace of
        :meth:`_sensor_failed`) for ``lost_zone_s`` from when the zone was first seen lost; a zone lost that long
        is taken as gone (a sensor that died), and the guard goes on with ``temp`` plus the lead the zone had over the
        others at its last live read (at least 0; :attr:`lost_margins`, said once in a warning): held at the fallback
        pace, the board ran at half speed for the rest of the run however cool it was. A zone never read beside
        another has no lead to go on with, and stays no data. A cooler zone lost changes nothing."""
        hotter = {zone: last for zone, last in reading.lost.items() if last > temp or zone in self._hottest}
        if not hotter:
            return temp
        gone = {zone for zone in hotter if zone in self._leads
                and reading.time - self._lost_since.get(zone, reading.time) >= self.config.lost_zone_s}
        if gone != set(hotter):
            zones = ", ".join(f"{zone} (last read {last:g} °C{'' if last > temp else ', the hottest zone then'})"
                              for zone, last in hotter.items())
            self._lost_note = (f"no data from {zones}: its reads fail, and the zones left, at {temp:g} °C, do not "
                               "show the board's hottest temperature")
            return None
        self.lost_margins = {zone: round(max(self._leads[zone], 0.0), 3) for zone in sorted(gone)}
        said = sorted(gone - self._margin_warned)
        if said:
            self._margin_warned.update(said)
            leads = ", ".join(f"{zone} (last read {hotter[zone]:g} °C, {self.lost_margins[zone]:g} °C above the "
                              "others then)" for zone in said)
            self._warn(f"thermal zone {leads} has read nothing for {self.config.lost_zone_s:g} s past its hold: "
                       f"taken as gone, the guard goes on with the zones left plus that margin; restart the board's "
                       f"sensor driver, or check the zone's temp file, to watch it again")
        return temp + max(self.lost_margins.values())

    def _seed_ambient(self, temp: float) -> None:
        """Take the ambient from ``temp`` as if the board had been idle until now (``T - R idle_w``): at the first
        reading, and again at a reading taken while no estimate has been measured (:meth:`_track_ambient`) where the
        guess is not an ambient a board at ``temp`` can have: above ``temp``, or more than ``R active_w`` (the rise
        at full power) below it. The bound is the one :meth:`_track_ambient` keeps its estimates within.

        The first reading is the one :meth:`_screen` cannot hold as a bad read (there is no last one to hold): a
        sensor's 0 °C there (an I2C or firmware-mailbox glitch) put a Pi 5's ambient at -26.6 °C, and a board read at
        73 °C next (45 °C enclosure) entered hot pacing at the full rate, where the steady-state rate is 2 %: it
        reached the hard limit and was paused for 220 s, and the first re-estimate, ``RC / 2`` (119 s) on and
        measured from the bad read, put the ambient at the board's own temperature. The re-estimate's window starts
        again at the reading that re-seeds it."""
        p = self.plant
        if self.ambient_c is None:
            self.ambient_c = temp - p.resistance_c_per_w * p.idle_w
        elif not self._ambient_measured and not temp - p.resistance_c_per_w * p.active_w <= self.ambient_c <= temp:
            self.ambient_c = temp - p.resistance_c_per_w * p.idle_w
            self._window = None

    def _track_ambient(self, reading: Reading | None, temp: float | None) -> None:
        """Re-estimate the ambient from the board's measured response, every half time constant ``RC / 2``.

        The first reading gives the ambient only as if the board had been idle long enough to sit at its idle
        temperature (``T0 - R idle_w``). A board that starts cooler (a cold boot, ``edgesdk serve`` started with
        the board: it reads the room's temperature) had it ``R idle_w`` too low, 26.6 °C on a Pi 5, so the model
        underestimated every heating prediction (the bucket depth, :attr:`prefill_held`, :meth:`prefill_chunk`):
        a bare Pi 5 at 20 °C serving 2,000-token prompts was held by the guard only at the hard limit, spent half of
        a 40-minute run above the soft limit and most of that paused at 78 °C. A room that warms through a long
        session (or an enclosure that heats up) moves the ambient too. Over a window of ``dt`` the model
        (``C dT/dt = P - (T - T_amb) / R``, solved exactly at the window's mean power ``P = idle_w + (active_w -
        idle_w) busy / dt``) gives ``T_amb = (T1 - T0 k) / (1 - k) - R P`` with ``k = exp(-dt / RC)``; the first
        such estimate replaces the idle assumption, later ones are averaged in by halves. An estimate is kept
        within what a board at ``T1`` allows (``T1 - R active_w`` to ``T1``). A compute second counts at the dynamic
        power of the FFN blocks the power gate ran in it, the rest of the model's weights read in full
        (:meth:`_gate_shares`). A window in which the model's power is not known (the clock capped by the guard or the firmware, a power gate that reports no executed fraction
        running under a budget below 1) or the sensor had no data (or a bad read held) gives no estimate and starts
        again.
        """
        p = self.plant
        tau = p.resistance_c_per_w * p.capacity_j_per_c
        # a reading unchanged for frozen_s is no measurement of the board's response (a frozen sensor, or one too
        # coarse to show it): learnt from, it would turn the ambient into whatever makes the frozen value fit
        flat = self._flat
        capped = self._power_unknown or (flat is not None and flat[2] - flat[0] >= self.config.frozen_s)
        if temp is None or reading is None or tau <= 0:
            self._window = None
            return
        self._window_tainted = self._window_tainted or capped
        if self._window is None or reading.time < self._window[0]:
            self._window, self._window_busy_s, self._window_tainted = (reading.time, temp), 0.0, capped
            return
        start, start_c = self._window
        elapsed = reading.time - start
        if elapsed < tau / 2:
            return
        if not self._window_tainted:
            kept = math.exp(-elapsed / tau)
            power = p.idle_w + self._dynamic_w * min(self._window_busy_s / elapsed, 1.0)
            estimate = (temp - start_c * kept) / (1.0 - kept) - p.resistance_c_per_w * power
            estimate = min(max(estimate, temp - p.resistance_c_per_w * p.active_w), temp)
            self.ambient_c = (estimate if not self._ambient_measured or self.ambient_c is None
                              else 0.5 * (self.ambient_c + estimate))
            self._ambient_measured = True
        self._window, self._window_busy_s, self._window_tainted = (reading.time, temp), 0.0, capped

    def _screen(self, reading: Reading, temp: float) -> float:
        """The temperature to act on: ``temp``, or the last one taken when ``temp`` is a bad read.

        A sensor that answers with a wrong value (an I2C or firmware-mailbox read of 0 °C, a rail-gated
        zone's garbage) is no data, not a cold board: one such value would lift a critical pause, drop a
        hot level to normal and wind the rate controller's integral up, so that a sensor glitching every
        few polls leaves the board unpaced until it reaches the hard limit. A board cannot cool by
        ``max_drop_c`` between two polls (Raspberry Pi 5 bare board: RC = 238 s; Jetson: 180-200 s), so
        a drop that large is held: the last temperature stands until a later reading (another poll, not
        the same reading observed again) confirms the new value within ``max_drop_c``. A real drop costs
        one poll at the hotter value, the safe side. Rises are taken at once (hot is the safe side).
        """
        last = self.temp_c
        suspect, self._suspect = self._suspect, None
        if last is None or temp >= last - self.config.max_drop_c:
            return temp
        if suspect is not None and reading.time > suspect[0] and abs(temp - suspect[1]) <= self.config.max_drop_c:
            return temp  # a second reading agrees: the board really is that much cooler
        self._suspect = suspect if suspect is not None and reading.time <= suspect[0] else (reading.time, temp)
        if not self._drop_warned:
            self._drop_warned = True
            self._warn(f"thermal sensor read {temp:g} °C, {last - temp:g} °C below the last reading {last:g} °C "
                       f"(more than max_drop_c {self.config.max_drop_c:g} °C in one poll): held as a bad read; "
                       "the guard keeps acting on the last temperature until a second reading confirms it")
        return last

    def _frozen(self, reading: Reading, temp: float) -> bool:
        """Has the sensor read ``temp``, exactly, for so long while the board worked that it must be frozen?

        Neither the kernel's thermal framework (``thermal_zone_get_temp`` returns what the driver reports) nor
        jetson-stats (``jtop/core/temperature.py`` checks only for its offline value, -256 °C) notices a sensor that
        keeps answering with the same value: a firmware mailbox returning a cached ``measure_temp``, a thermal zone
        whose driver stopped updating. The guard then acted on that value for ever: a board frozen at 50 °C ran
        unpaced to the firmware's throttle. Here a run of identical hottest-zone readings, polled without a gap
        longer than ``stale_s``, is taken as frozen once it has lasted ``frozen_s`` and the profile's thermal model
        (``C dT/dt = P - (T - T_amb) / R`` at the run's mean power, from its compute seconds) says the board should
        have moved by ``frozen_c`` or more by then. A real steady state, at idle or under a steady load, is where the
        model expects no change, so it is never taken as frozen. The guard's own clock cap (``hot_clock_ratio``) is in
        the model where the actuator reports the clock it applied (:attr:`clock_applied`: the simulated board's, or
        cpufreq's): a compute second at the capped clock counts at its share of the full clock's dynamic power
        (:attr:`_dynamic_share`: the Pi 5's operating points, or on another board the clock's share alone, which
        overstates it and so errs towards "frozen", the safe side). Without it, under
        ``--clock-cap`` a run was never judged while the guard paced: a sensor frozen under the setpoint wound the
        controller up to the full rate at the capped clock and a bare Pi 5 at 30 °C ambient ran into the firmware's
        throttle, still read at 72 °C. The cap the guard asks for is not the clock the board runs at (rounded up to
        an offered frequency, held up by ``scaling_min_freq``, a write that failed): counted at the asked cap's
        share, a real board settled at full clock was taken as frozen.
        A power gate's skipped FFN blocks are in the model too (:meth:`_gate_shares`): a compute second counts at the
        power of the blocks the gate reports it ran (and of the attention and LM head, read whatever it skips), at any
        budget. A gate that reports none is known only to run at most its budget in force: the run is judged at the
        least move the model expects over that range (from no block to the budget's share), so a lowered budget is
        not taken for a frozen sensor, while a reading that no share of the blocks can hold still is. Skipping the judgement for the whole run under ``--compute-budget``
        below 1 left a sensor frozen under the setpoint trusted to the firmware's throttle.
        While the model's power is not the board's (the capped clock not reported, the firmware limits the board) or
        the board is paused, a run is not judged: it is judged over the ``frozen_s`` after. It ends at the first
        reading that differs.
        """
        c, p = self.config, self.plant
        tau = p.resistance_c_per_w * p.capacity_j_per_c
        flat = self._flat
        # unwatched idle time (the gap between two readings less the compute in it: between requests) breaks a run
        idle_gap = reading.time - flat[2] - (self._flat_busy_s - flat[3]) if flat is not None else 0.0
        if flat is None or temp != flat[1] or idle_gap > c.stale_s or reading.time < flat[2]:
            self._flat, self._flat_busy_s = [reading.time, temp, reading.time, 0.0], 0.0
            self._flat_work_s = self._flat_least_s = 0.0
            self.frozen_s = None
            return False
        if self.frozen_s is not None:  # taken as frozen: until it changes (the pace it set caps the clock, ...)
            self.frozen_s = reading.time - flat[0]
            flat[2], flat[3] = reading.time, self._flat_busy_s
            return True
        # the model's power is not known, or the board is paused (idle, which is already the safe side: a pause
        # ends by its own rule, and a board cooled to a steady reading while the ambient is still the first
        # reading's guess would be taken as frozen and paced at the fallback rate): judged from the next reading on
        if self._power_unmodelled or self.paused:
            flat[0], self._flat_busy_s = reading.time, 0.0
            self._flat_work_s = self._flat_least_s = 0.0
        flat[2], flat[3] = reading.time, self._flat_busy_s
        elapsed = reading.time - flat[0]
        if elapsed < c.frozen_s or tau <= 0:
            return False
        ambient = p.ambient_c if self.ambient_c is None else self.ambient_c
        kept = math.exp(-elapsed / tau)
        # the move at the most and at the least power the power gate allows (the same where it reports what ran): the
        # run is judged on the smaller, none where they differ in sign (some share of the blocks holds the reading)
        most, least = ((ambient + p.resistance_c_per_w * (p.idle_w + self._dynamic_w * min(work / elapsed, 1.0))
                        - temp) * (1.0 - kept) for work in (self._flat_work_s, self._flat_least_s))
        expected = min(most, least, key=abs) if most * least > 0 else 0.0
        if abs(expected) < c.frozen_c:
            return False
        self._frozen_note = (f"{reading.source or 'the sensor'} has read {temp:g} °C for {elapsed:.0f} s while the "
                             f"board computed {min(self._flat_busy_s / elapsed, 1.0):.0%} of the time, where the "
                             f"thermal model expects {expected:+.1f} °C by now: frozen")
        self.frozen_s = elapsed
        return True

    @property
    def _power_unknown(self) -> bool:
        """The model's power (``idle_w + (active_w - idle_w) x busy share``) is not the board's now: the clock is
        capped, by the guard or the firmware."""
        return self.clock_ratio is not None or self._power_unmodelled

    @property
    def _power_unmodelled(self) -> bool:
        """The board's power is not the model's at any clock the guard knows: the guard caps the clock and the
        actuator did not report the clock it applied, or the firmware limits the board (a clock of its own choosing,
        or a weak supply). A reported cap is modelled (:attr:`_dynamic_share`), and so are a power gate's skipped
        blocks, per step (:meth:`_gate_shares`)."""
        return self._dynamic_share is None or self.firmware_limited

    def _gate_shares(self, kind: str) -> tuple[float, float]:
        """The least and the most dynamic power per compute second of a ``kind`` step, as a share of a step that runs
        every FFN block, as the power gate allows: ``(1 - f) + f x ran``, ``ran`` the share of the FFN blocks it ran
        (a skipped block's weights are not read) and ``f`` the FFN blocks' share of the weights a token reads
        (:attr:`ffn_share`: attention, the embeddings and the LM head are read whatever the gate skips; 59 % on
        SmolLM2-135M: modelled as drawing nothing outside the FFNs, its board's warming was put down to a warmer
        room).

        Without a power gate in use, and in a prefill (the gate runs a prompt's FFN for every token), every block
        runs: 1. A decode step ran the share the gate reports (the gated backend's ``executed_fraction``), at any
        budget: at 1.0 the entropy loop still skips blocks, half of them on a small model, and modelled from the
        budget such a board, warming far slower than modelled, was taken as a frozen sensor. A gate that reports
        none runs at most its budget in force (:attr:`budget_in_force`; every block at 1.0), and nothing says how
        few: from none (``1 - f``) to the budget below 1. Modelled at full power under ``--compute-budget 0.3``, a
        bare Pi 5 reading in whole degrees was taken as a frozen sensor within a minute and paced at the fallback
        rate."""
        if self.budget_target is None or kind != "decode":
            return 1.0, 1.0
        rest, ffn = 1.0 - self.ffn_share, self.ffn_share
        ran = getattr(self.budget_target, "executed_fraction", None)
        if isinstance(ran, (int, float)) and 0.0 <= ran <= 1.0:
            share = rest + ffn * float(ran)
            return share, share
        budget = self.budget_in_force
        return (1.0, 1.0) if budget >= 1.0 else (rest, rest + ffn * budget)

    @property
    def _dynamic_share(self) -> float | None:
        """Dynamic power per compute second at the clock the guard's cap applied (:attr:`clock_applied`), as a share
        of the full clock's: dynamic power goes as f V^2 (:func:`~edgesdk.thermal.simulator.power_ratio`, the
        Raspberry Pi 5's operating points, the ones :data:`CLOCK_CAP_RATIO` is chosen on, with
        :attr:`clock_pi5_table`); on another CPU-bound board, whose table the guard does not know, as f alone: a
        lower clock runs at the same voltage or a lower one, so this overstates the capped power, and a settled
        board errs towards "frozen" (paced at the fallback rate, the safe side) rather than a frozen sensor towards
        trusted. 1.0 uncapped, None while capped at a clock not reported (the hook reports none for a board with a
        GPU, whose power a CPU clock cap barely moves: :class:`~edgesdk.thermal.watch.ThermalHook`)."""
        if self.clock_ratio is None:
            return 1.0
        if self.clock_applied is None:
            return None
        return power_ratio(self.clock_applied) if self.clock_pi5_table else self.clock_applied

    def _observe_firmware(self, reading: Reading | None) -> None:
        """Raspberry Pi firmware flags (``vcgencmd get_throttled``): under-voltage, a capped ARM clock,
        throttling or the soft temperature limit, now. The firmware is already slowing the board, for
        a reason the temperature may not show (a weak supply): pace at the fixed fallback rate until
        the flags clear, as the Pi documentation's margins suggest (stop work on bits 0 and 2). Warned once per
        flag: a weak supply that first shows after a thermal throttle was warned of is still said, with its fix."""
        self.firmware_flags = firmware_limits(reading.throttled if reading is not None else None)
        active = self.firmware_flags
        self.firmware_limited = bool(active)
        if not active:
            return
        if not self._firmware_warned.issuperset(active):
            supply = ("; under-voltage is the power supply's: use one that holds 5 V under load (the board's "
                      "official supply), cooling does not clear it" if "under_voltage" in active else "")
            self._warn(f"the firmware reports {', '.join(active)}: pacing at a fixed "
                       f"{self.config.fallback_fraction:.0%} of the unpaced token rate until it clears{supply}")
            self._firmware_warned.update(active)
        self.fraction = min(self.fraction, self.config.fallback_fraction)

    def _stale_note(self, reading: Reading) -> str:
        """What is wrong with a reading that has data but is older than ``stale_s`` (a poller whose sensor read hangs
        keeps its last one), or "" for a fresh one: "no data from" it would blame a sensor that did answer."""
        age = (self.now or 0.0) - reading.time
        if age <= self.config.stale_s:
            return ""
        return (f"the last reading from {reading.source or 'the sensor'} is {age:.0f} s old, older than stale_s "
                f"{self.config.stale_s:g} s: its reads hang or fail")

    def _note_back(self, now: float) -> None:
        """A reading with data at ``now``: note when a failed sensor came back, and, once it has read again for
        :data:`SENSOR_REWARN_S`, let its next failure be warned of (:meth:`_sensor_failed`)."""
        if not self.sensor_ok:
            self._back_since = now
        elif self._back_since is not None and now - self._back_since >= SENSOR_REWARN_S:
            self._warned, self._back_since = False, None

    def _sensor_failed(self, reading: Reading | None) -> None:
        """No data: pace steadily at the fallback rate, or slower where the controller was pacing a hot
        board: at its steady-state estimate (the integral, the rate that holds the setpoint) or its
        output, the lower; the conservative mode never speeds a hot board up. Warned of once, and again at a failure
        after the sensor has read again for :data:`SENSOR_REWARN_S` (:meth:`_note_back`)."""
        held = self.fraction if self.level.rank < Level.HOT.rank else min(self.fraction, self._integral)
        self.fraction = min(held, self.config.fallback_fraction)
        if self.sensor_ok and not self._warned:
            what = ("no reading" if reading is None else self._frozen_note if self.frozen_s is not None
                    else self._stale_note(reading) or (self._lost_note if reading.max_c is not None else "")
                    or f"no data from {reading.source or 'the sensor'}")
            slower = (f" (the rate it was pacing at; at most {self.config.fallback_fraction:.0%})"
                      if self.fraction < self.config.fallback_fraction else "")
            self._warn(f"thermal sensor failed ({what}): pacing at a fixed "
                       f"{self.fraction:.0%} of the unpaced token rate{slower} until it recovers")
            self._warned = True
        self.sensor_ok = False
        self.credit = min(self.credit, self._depth)

    def _target(self, temp: float) -> Level:
        for level in (Level.CRITICAL, Level.HOT, Level.WARM):
            if temp >= self.thresholds[level]:
                return level
        return Level.NORMAL

    def level_for(self, temp: float, now: float | None = None) -> Level:
        """The level a reading of ``temp`` °C taken at ``now`` (the guard's time base; None: its last reading's time)
        puts the guard in, its state left as it is: a rise at once, a fall only ``hysteresis_c`` below the threshold,
        after ``min_dwell_s`` at the level held, and out of a pause only below ``resume_c`` (or once it stopped cooling:
        :meth:`_stopped_cooling`). :meth:`_update_level` moves the guard by it, and ``serve``'s ``/health`` and
        ``/metrics`` report it between requests: the guard observes only while a request's steps run, so its own level
        is the last request's, beside a temperature read since (an idle board at 95 °C shown "hot", not paused; the
        same board cooled to 50 °C, still "hot"). What they report is the level a request starting now would start at.
        """
        target = self._target(temp)
        if target.rank >= self.level.rank:
            return target
        c = self.config
        now = self.now if now is None else now
        if now is None or now - self.since < c.min_dwell_s:
            return self.level
        if self.level is Level.CRITICAL and temp >= self.limits.resume_c and not self._stopped_cooling(now, temp):
            return self.level
        lower = self._target(temp + c.hysteresis_c)
        return lower if lower.rank < self.level.rank else self.level

    def _update_level(self, now: float, temp: float) -> None:
        level = self.level_for(temp, now)
        if level is self.level:
            return
        # straight to critical too (a first reading above the hard limit, a sensor back after a gap): the pause holds
        # the integral, and one never seeded left it at 1.0, so a pause that ended into hot paced at full rate
        if level.rank >= Level.HOT.rank > self.level.rank:
            self._enter_hot()
        self.level, self.since = level, now

    def _stopped_cooling(self, now: float, temp: float) -> bool:
        """Has a pause that has not reached ``resume_c`` gone on long enough to end anyway?

        After one time constant ``RC`` paused (the bound :attr:`prefill_held` puts on a hold, for the same reason: an
        idle board has covered 63 % of its way to where it settles, and waiting longer cools it little more), a
        board ``hysteresis_c`` under the hard limit leaves the pause for the level its temperature gives, and is
        paced from there. Without this, a board that idles above ``resume_c`` (a Pi 5 in a 45 °C enclosure idles
        near 72 °C, above its 70 °C resume point) stayed paused for ever after one excursion to the hard limit,
        while a guard that first read the same board at the same temperature paced it; on a simulated board
        :class:`~edgesdk.thermal.watch.BoardNeverCooled` stopped the run. A board that idles within
        ``hysteresis_c`` of the hard limit (or above it) stays paused.
        """
        p = self.plant
        return (now - self.since >= p.resistance_c_per_w * p.capacity_j_per_c
                and temp < self.limits.hard_c - self.config.hysteresis_c)

    def _enter_hot(self) -> None:
        """Start pacing from the rate that holds the setpoint in steady state (model feed-forward)."""
        p = self.plant
        ambient = p.ambient_c if self.ambient_c is None else self.ambient_c
        steady = ((self.setpoint_c - ambient) / p.resistance_c_per_w - p.idle_w) / self._dynamic_w
        self._integral = min(1.0, max(self.config.min_fraction, steady))
        self.credit = self._depth

    def _update_rate(self, dt: float, temp: float) -> None:
        """The PI controller's output, :attr:`fraction`. A pause holds the integral (anti-windup): paused, the rate is
        not applied, and integrating the hard limit's error for the pause (up to ``RC`` seconds) wound it down to
        ``min_fraction``, so that a pause that ended into hot (:meth:`_stopped_cooling`) paced the board at that
        floor until the integral climbed back below the setpoint, instead of from the rate it held before the pause.
        While the firmware limits the board (its fixed ``fallback_fraction`` pace, :meth:`_observe_firmware`) the
        integral does not climb past that pace, for the same reason: a board held below the setpoint by the fixed
        pace says nothing of a faster one, and 5 minutes of under-voltage at 72.5 °C on a Pi 5 wound it from 0.22 to
        0.89, so that the pace jumped to 96 % of the unpaced rate the moment the flags cleared."""
        c = self.config
        if self.level.rank < Level.HOT.rank:
            self.fraction = 1.0
            return
        error = self.setpoint_c - temp
        if not self.paused:
            integral = self._integral + self._ki * error * dt
            if self.firmware_limited:  # the flags of the interval just ended: its rate was the fixed pace
                integral = min(integral, max(self._integral, c.fallback_fraction))
            self._integral = min(1.0, max(c.min_fraction, integral))
        self.fraction = min(1.0, max(c.min_fraction, self._integral + self._kp * error))

    def _apply_budget(self) -> None:
        c = self.config
        budget = {Level.NORMAL: 1.0, Level.WARM: c.warm_budget}.get(self.level, c.hot_budget)
        budget = budget if self.sensor_ok else c.hot_budget
        if budget != self.budget:
            self.budget = budget
            if self.budget_target is not None:
                self.budget_target.set_compute_budget(budget)

    @property
    def budget_in_force(self) -> float:
        """The executed-FFN fraction the power gate runs under now: the lower of the budget set on it
        (``compute_budget``) and the guard's (the gated backend's controller takes the lower of the two,
        :meth:`~edgesdk.power.controller.TauController.set_compute_budget`); 1.0 without a power gate in use, where
        every FFN block runs at every level."""
        return 1.0 if self.budget_target is None else min(self.budget, self.compute_budget)

    @property
    def compute_budget(self) -> float:
        """The budget set on the power gate (``run``/``serve --compute-budget``), which the gate keeps under the
        guard's (:attr:`budget_in_force`): read from the gate's settings as they stand (:func:`configured_budget`;
        ``configure()`` replaces them); 1.0 without a power gate in use."""
        return configured_budget(self.budget_target)

    # -- pacing --------------------------------------------------------------------------------
    @property
    def pacing(self) -> bool:
        return not self.sensor_ok or self.firmware_limited or self.level.rank >= Level.HOT.rank

    @property
    def paused(self) -> bool:
        return self.sensor_ok and self.level is Level.CRITICAL

    @property
    def _depth(self) -> float:
        """Bucket depth: one request, but no more tokens than the thermal headroom allows at full
        speed (profile model: net heating ``P - (T - T_amb) / R`` into ``C``, up to half a
        degree below the soft limit, ``P`` full power and the decode rate those at the clock the guard's cap applied,
        :attr:`_busy_w` and :attr:`_rate_now`: counted at the uncapped power, a capped Pi 5's depth was a third of the
        tokens that fit, and an answer the hold had let start as fitting was paced token by token for its last 40,
        0.4-0.7 s apart at 10 tok/s); one token, a steady pace, without a sensor or while the firmware
        limits the board (its flags say nothing of the headroom: a full bucket would let a whole answer
        through unpaced)."""
        if not self.sensor_ok or self.firmware_limited:
            return 1.0
        p = self.plant
        if self.temp_c is None or not self.unpaced_tok_s:
            return self.capacity
        ambient = p.ambient_c if self.ambient_c is None else self.ambient_c
        heating_w = self._busy_w - (self.temp_c - ambient) / p.resistance_c_per_w
        if heating_w <= 0:
            return self.capacity
        seconds = (self.limits.soft_c - 0.5 - self.temp_c) * p.capacity_j_per_c / heating_w
        return max(1.0, min(self.capacity, seconds * self._rate_now))

    @property
    def _clock_key(self) -> float | None:
        """The clock a step taken now runs at, as a share of the maximum: 1.0 uncapped, the clock the guard's cap
        applied (:attr:`clock_applied`; None where the actuator reports none)."""
        return 1.0 if self.clock_ratio is None else self.clock_applied

    @property
    def _rate_now(self) -> float | None:
        """The unpaced decode rate at the clock a step taken now runs at (:attr:`_clock_key`), or
        :attr:`unpaced_tok_s` (every clock's) until a decode step has run at it."""
        return self._clock_rates.get(self._clock_key, self.unpaced_tok_s)

    @property
    def _prefill_rate_now(self) -> float | None:
        """The prefill rate at the clock a step taken now runs at (:attr:`_clock_key`): the one learned there; else,
        capped at a reported clock, the full clock's scaled by it (a prefill is compute-bound: its time goes as 1 / f,
        :class:`~edgesdk.thermal.simulator.WorkModel`); else :attr:`prefill_tok_s` (every clock's). Timed at the
        uncapped rate, a capped Pi 5's prefill step ran 1.6x the seconds :attr:`prefill_held` predicted its heat
        for, and ended above the bound it was let through under."""
        key = self._clock_key
        known = self._prefill_rates.get(key)
        if known is not None:
            return known
        full = self._prefill_rates.get(1.0)
        return full * key if full is not None and key is not None else self.prefill_tok_s

    @property
    def _busy_w(self) -> float:
        """The board's power while it computes at the clock a step taken now runs at (:attr:`_dynamic_share`): the
        guard's cap lowers it (to about half on a Pi 5 at :data:`CLOCK_CAP_RATIO`); full power uncapped, and where
        the capped clock is not reported."""
        share = self._dynamic_share
        return self.plant.idle_w + self._dynamic_w * (1.0 if share is None else share)

    @property
    def _unit_tok_s(self) -> float:
        """Bucket tokens per second of compute: the unpaced decode rate, or 1 until a decode step measured it (a
        workload of prompts only, embeddings, perplexity windows or ``max_tokens`` 0, is paced by its compute
        time: one token a second)."""
        return self.unpaced_tok_s or 1.0

    @property
    def clock_ratio(self) -> float | None:
        """The CPU clock cap the guard asks for now, as a share of the maximum (None: uncapped)."""
        return self.config.hot_clock_ratio if self.pacing else None

    @property
    def rate_limit_tok_s(self) -> float | None:
        """The token rate the guard allows now (None: unlimited or not yet known)."""
        if not self.pacing or not self.unpaced_tok_s:
            return None
        return self.fraction * self.unpaced_tok_s

    def begin(self, max_new_tokens: int, prompt_tokens: int = 0) -> None:
        """A request starts: the bucket holds at most one request (or ``max_burst_tokens``); ``prompt_tokens``, the
        tokens its prefill computes, let the guard hold a long prefill back (:meth:`prefill_held`)."""
        self.prompt_tokens = max(int(prompt_tokens), 0)  # until prefill_chunk names a step of them
        self._held_since = None
        self.capacity = float(max(1, min(max_new_tokens, self.config.max_burst_tokens)))
        self.credit = min(self.credit, self.capacity) if self.pacing else self.capacity

    def prefill_chunk(self, prompt_left: int) -> int:
        """The prompt tokens the coming prefill step takes, of the ``prompt_left`` still to prefill; they are then the
        step :attr:`prefill_held` predicts and :meth:`spend` learns the prefill rate from.

        A prompt's prefill as one step runs however hot it makes the board: the guard looks at the board again only
        when it ends, and a 4,000-token prompt (100 s on a Pi 5) from a board near the hard limit ends in the
        firmware's throttle. In steps the guard paces and pauses between them, as between decode steps. A step is
        at most half the time the board takes at full power to heat from the hard limit to the throttle point
        (``(throttle_c - hard_c) C / (active_w - (hard_c - T_amb) / R)``: 4.5 s on a bare Pi 5 at 45 °C ambient,
        8.6 s at 20 °C), so one that starts just under the pause's threshold ends before the throttle; at the
        prefill rate learned at the clock in force (:attr:`_prefill_rate_now`: a capped step takes longer), and at
        least :data:`PREFILL_LEARN_TOKENS` so each step still teaches the rate. Before
        a rate is learned a step is llama.cpp's default micro-batch, :data:`PREFILL_CHUNK_TOKENS`. A board that
        cannot reach the hard limit at full power takes the prompt in one step."""
        left = max(int(prompt_left), 1)
        step = left
        if not self.prefill_tok_s:
            step = min(left, PREFILL_CHUNK_TOKENS)
        else:
            p = self.plant
            ambient = p.ambient_c if self.ambient_c is None else self.ambient_c
            heating_w = p.active_w - (self.limits.hard_c - ambient) / p.resistance_c_per_w
            if heating_w > 0:
                seconds = 0.5 * max(self.limits.throttle_c - self.limits.hard_c, 0.0) * p.capacity_j_per_c / heating_w
                step = min(left, max(PREFILL_LEARN_TOKENS, int(seconds * self._prefill_rate_now)))
        self.prompt_tokens, self._held_since = step, None  # a new step: its own hold, up to RC (prefill_held)
        return step

    @property
    def prefill_held(self) -> bool:
        """Is the coming prefill step held back until the board has cooled enough to run it?

        A prefill step (the whole prompt, or the step :meth:`prefill_chunk` named) runs to its end before the guard
        can look at the board again, and a long one (100 s on a Pi 5 for 4,000 tokens) from a warm board runs it past
        the hard limit into the firmware's throttle
        (reference/targets-thermal.md: Pi 5 Arm cores throttle from 80 °C) before the pause can act. So, with the
        prefill rate learned, the profile's model (``C dT/dt = P - (T - T_amb) / R``, ``P`` full power at the clock
        the guard's cap applied, :attr:`_busy_w`, as :attr:`_depth` counts it, for the time the prefill takes at that
        clock, :attr:`_prefill_rate_now`) predicts the temperature at the prefill's end, and the prefill waits while that is above half a degree under the soft limit (the bucket
        depth's bound, :attr:`_depth`), at any level: a prompt that fits from a start the board
        reaches idle (where the model says it settles, ``T_amb + R idle_w``) waits for that start also below
        ``resume_c`` (4,000 tokens at 40 tok/s, 100 s, from 69.9 °C ends near 82 °C on a Pi 5 in a 20 °C room, in
        the firmware throttle; it fits from 58 °C, and the board idles at 47 °C). A prompt too long for any start is
        held only while the board is at or above ``resume_c`` (not held past the point a pause ends: waiting cools
        a board near idle little more). The hold ends after ``RC`` seconds (the board's time constant: waiting
        longer cools it little more; a board that idles above ``resume_c`` would be held for ever).

        A prefill whose compute fits in the bucket's depth (its seconds times the decode rate at the clock in force,
        :attr:`_rate_now`, the rate the depth is counted in; once a decode step has measured a rate) is not held: the bucket paces it as it paces decode
        steps. Above the depth's bound the depth is one token, so a prefill no longer than a decode step (a
        one-token prompt: a regenerated answer, a turn the cache holds all but the last token of) is not held for up
        to ``RC`` seconds while decode steps run.
        """
        if not self.sensor_ok or self.temp_c is None or not self.prefill_tok_s or not self.prompt_tokens:
            return False
        p = self.plant
        tau = p.resistance_c_per_w * p.capacity_j_per_c
        if self._held_since is not None and self.now is not None and self.now - self._held_since >= tau:
            return False
        ambient = p.ambient_c if self.ambient_c is None else self.ambient_c
        steady = ambient + p.resistance_c_per_w * self._busy_w  # full power at the clock in force, as _depth's
        seconds = self.prompt_tokens / self._prefill_rate_now  # at the clock in force, as steady's power
        # fits in the bucket: paced by it, as a decode step is. Only with a decode rate measured: before one, the
        # depth is the request's tokens unbounded by the headroom (:attr:`_depth`) and a token is a second of
        # compute, so a 40 s prompt "fitted" a 256-token request's bucket and ran from a hot board unheld
        if self.unpaced_tok_s and seconds * self._rate_now <= self._depth:
            return False
        bound, kept = self.limits.soft_c - 0.5, math.exp(-seconds / tau)  # the prefill's end: steady + (T0 - steady) kept
        if steady + (self.temp_c - steady) * kept <= bound:
            return False
        idle = ambient + p.resistance_c_per_w * p.idle_w
        return self.temp_c >= self.limits.resume_c or steady + (idle - steady) * kept <= bound

    @property
    def answer_held(self) -> bool:
        """Is the coming prefill step held back until the board has cooled enough for the whole request to run at
        full speed?

        The bucket lets through at full speed only the tokens that fit under the soft limit from where the board
        stands (:attr:`_depth`); a request longer than that was paced token by token for the rest, at the rate the
        controller gave a board driven above its setpoint by the burst before them: near its floor. At a slower decode
        rate a token is a longer step at the same power, so fewer tokens fit: on a bare Pi 5 at 35 °C, below about
        22 tok/s the last 100-170 tokens of every 256-token answer came 0.5-0.9 s apart (p95 inter-token 942 ms at
        10 tok/s, against 147 ms unguarded), while at 25 tok/s the whole answer fitted and streamed at full speed.

        So, with the decode and prefill rates learned, the step waits while the profile's model (``C dT/dt = P - (T -
        T_amb) / R``, solved exactly, ``P`` full power at the clock the guard's cap applied, :attr:`_busy_w`, the
        answer timed at the decode rate learned at that clock, :attr:`_rate_now`) says the prompt step and the
        request's answer (:attr:`capacity` tokens)
        at full speed would end above half a degree under the soft limit (the bucket depth's bound), but would not from
        where the board idles (``T_amb + R idle_w``): the wait goes to the time to first token and the answer streams
        at full speed, as at the faster rates (p95 inter-token 100 ms at 10 tok/s in the same run). A request too long
        for any start is not held: the bucket paces it. The hold ends after ``RC`` seconds, as :attr:`prefill_held`'s
        does, and once the sensor has read the same value for ``frozen_s`` (a frozen sensor, read at a temperature the
        answer does not fit from, held every request for ``RC`` on a board idling too near it for :meth:`_frozen` to
        tell, where paced the board's work shows it). Not while the sensor has no data or the firmware limits the board (a steady pace, :attr:`_depth`).
        """
        if (not self.sensor_ok or self.firmware_limited or self.temp_c is None or not self.unpaced_tok_s
                or not self.prefill_tok_s):
            return False
        p = self.plant
        tau = p.resistance_c_per_w * p.capacity_j_per_c
        if self._held_since is not None and self.now is not None and self.now - self._held_since >= tau:
            return False
        flat = self._flat  # the same reading for frozen_s: the sensor does not show the board cooling, nothing to wait on
        if flat is not None and flat[2] - flat[0] >= self.config.frozen_s:
            return False
        ambient = p.ambient_c if self.ambient_c is None else self.ambient_c
        # full power and the decode rate at the clock the guard's cap applied, or uncapped
        steady = ambient + p.resistance_c_per_w * self._busy_w
        seconds = self.prompt_tokens / self._prefill_rate_now + self.capacity / self._rate_now
        bound, kept = self.limits.soft_c - 0.5, math.exp(-seconds / tau)  # the answer's end: steady + (T0 - steady) kept
        if self.temp_c >= bound or steady + (self.temp_c - steady) * kept <= bound:
            return False
        idle = ambient + p.resistance_c_per_w * p.idle_w
        return steady + (idle - steady) * kept <= bound

    def wait_s(self, kind: str) -> float:
        """Seconds to wait before the next step; the caller waits (at most ``poll_s``) and asks again."""
        if self.paused:
            return self.config.poll_s
        self.holding = kind == "prefill" and (self.prefill_held or self.answer_held)
        if self.holding:
            if self._held_since is None:
                self._held_since = self.now
            return self.config.poll_s
        if not self.pacing or (kind == "decode" and self.unpaced_tok_s is None):
            return 0.0  # a decode step before any other measures the rate the bucket is counted in
        rate = self.fraction * self._unit_tok_s
        # before a decode rate is known the bucket counts compute seconds: a prefill waits for one
        need = self._depth if kind == "prefill" and self.unpaced_tok_s else 1.0
        return 0.0 if self.credit >= need - 1e-9 else (need - self.credit) / rate

    def spend(self, kind: str, tokens: int, seconds: float) -> None:
        """A step produced ``tokens`` in ``seconds`` of compute: learn the unpaced rate, pay the bucket.

        A prefill pays for its compute time, as the decode tokens that time would have made (the same heat: the
        board runs at full power either way), not for the one token it yields: a long prompt's prefill heats the
        board as much as an answer of ``seconds`` x the decode rate, and a pass that yields no token (an embedding,
        a perplexity window, ``max_tokens`` 0) would otherwise never be paced, whatever its length.
        """
        if kind == "decode" and seconds > 0:
            rate = tokens / seconds
            self.unpaced_tok_s = rate if self.unpaced_tok_s is None else 0.9 * self.unpaced_tok_s + 0.1 * rate
            key = self._clock_key
            known = self._clock_rates.get(key)
            self._clock_rates[key] = rate if known is None else 0.9 * known + 0.1 * rate
        self.holding = False
        seconds_run = max(seconds, 0.0)
        least, most = self._gate_shares(kind)
        if self._window is not None:
            self._window_busy_s += seconds_run * most
            self._window_tainted = self._window_tainted or (least < most and seconds_run > 0)
        if self._flat is not None:
            self._flat_busy_s += seconds_run
            share = self._dynamic_share  # None: the run is judged afresh from the next reading (_power_unmodelled)
            clock = 1.0 if share is None else share
            self._flat_work_s += seconds_run * clock * most
            self._flat_least_s += seconds_run * clock * least
        if kind == "prefill" and seconds > 0 and self.prompt_tokens >= PREFILL_LEARN_TOKENS:
            rate = self.prompt_tokens / seconds
            self.prefill_tok_s = rate if self.prefill_tok_s is None else 0.5 * self.prefill_tok_s + 0.5 * rate
            key = self._clock_key
            known = self._prefill_rates.get(key)
            self._prefill_rates[key] = rate if known is None else 0.5 * known + 0.5 * rate
        if self.pacing:
            cost = tokens if kind == "decode" else max(tokens, max(seconds, 0.0) * self._unit_tok_s)
            self.credit = max(self.credit - cost, -max(self.capacity, cost))

    def state(self) -> dict:
        """A JSON-friendly summary for telemetry and the status line."""
        limit = self.rate_limit_tok_s
        return {"level": self.level.value, "paused": self.paused, "budget": self.budget_in_force,
                "sensor_ok": self.sensor_ok, "firmware_limited": self.firmware_limited,
                "rate_limit_tok_s": None if limit is None else round(limit, 3),
                "fraction": round(self.fraction, 4), "clock_cap": self.clock_ratio,
                # a zone whose read failed, acted on at its last good value (its age, s), or lost past that hold
                **zone_fields(self.held_zones, self.lost_zones),
                # a zone lost past lost_zone_s: the guard acts on the zones left plus this lead of its (°C)
                **({"lost_margins_c": dict(self.lost_margins)} if self.lost_margins else {})}
