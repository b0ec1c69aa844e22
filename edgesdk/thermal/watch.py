"""Wires sensors (or a simulated board), the guard, telemetry and the status line into the
generation loop's :class:`~edgesdk.runtime.generate.StepHook`, and builds that for ``edgesdk run``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from edgesdk.errors import EdgeSDKError
from edgesdk.profile import TargetProfile
from edgesdk.thermal.cpufreq import CpuFreqCap, recover, state_path
from edgesdk.thermal.cpufreq import cpufreq_root as cpufreq_root_from_env
from edgesdk.thermal.guard import (
    CLOCK_CAP_RATIO,
    FIRMWARE_CAUSES,
    FIRMWARE_SLOWDOWNS,
    Guard,
    GuardConfig,
    Level,
    Limits,
    configured_budget,
    firmware_limits,
)
from edgesdk.thermal.sensors import Poller, Reading, detect_sensors, thermal_root, zone_fields
from edgesdk.thermal.simulator import RealClock, SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import StatusLine, Telemetry

SETTLE_TIME_CONSTANTS = 5.0  # after 5 RC a cooling board is within 1 % of where it settles


class HorizonReached(Exception):  # noqa: N818 (a stop signal, not an error)
    """The simulated clock passed the hook's ``horizon_s`` while the guard held generation back."""


class BoardNeverCooled(EdgeSDKError):
    """The guard paused a simulated board that cannot cool below the resume point, nor below the hard limit less the
    guard's hysteresis, where a pause ends after one time constant (:meth:`Guard._stopped_cooling`). ``edgesdk run``
    prints it with its fix and exits 1, as it does every EdgeSDKError; ``edgesdk serve`` answers it 503
    ``board_too_hot`` (:meth:`edgesdk.serve.completion.Completer.complete`)."""


def settle_time_s(board: SimulatedBoard) -> float:
    """Simulated seconds after which a paused board has cooled as far as it ever will."""
    return SETTLE_TIME_CONSTANTS * board.model.resistance_c_per_w * board.model.capacity_j_per_c


@dataclass
class StepTotals:
    """One request's steps of one kind as the hook saw them, on its clock (simulated seconds on a simulated board):
    the tokens they yielded, their compute and the guard's waits before them (:attr:`ThermalHook.totals`), and of
    those waits the ones in a pause (``pause_s``: the board past its hard limit, not pacing), which ``run --stats``
    says apart: "10.00 s of thermal pacing" for a critical pause sent owners looking at the pacing."""

    tokens: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    pause_s: float = 0.0


class ThermalHook:
    """A StepHook: reads the sensor around every step, lets the guard wait, records telemetry.

    ``clock`` is :class:`RealClock` on a board or the :class:`SimulatedBoard` itself, whose
    ``sleep`` advances simulated time (and cools the board) instead of sleeping. On a simulated
    clock a wait never ends by itself when the board cannot cool, so two limits stop it:
    ``horizon_s`` (clock time; :class:`HorizonReached`, for a plan's end) and ``max_pause_s``
    (one continuous pause; :class:`BoardNeverCooled`).
    """

    def __init__(self, clock: object, read: Callable[[], Reading | None], guard: Guard | None = None,
                 board: SimulatedBoard | None = None, telemetry: Telemetry | None = None,
                 status: StatusLine | None = None, wait_record_s: float = 1.0,
                 clock_cap: object | None = None, horizon_s: float | None = None,
                 max_pause_s: float | None = None, cap_pi5_table: bool = False, cap_moves_power: bool = True,
                 budget_target: object | None = None):
        self.clock = clock
        # the power gate in use (None: none), whose budget an unguarded record books (:attr:`compute_budget`)
        self.budget_target = budget_target
        self.clock_cap = clock_cap  # set_ratio(ratio | None): CpuFreqCap on a board, the SimulatedBoard in a plan
        # cpufreq's capped clock follows the Raspberry Pi 5's operating points (a BCM2712 board), else f alone
        self.cap_pi5_table = cap_pi5_table
        # a CPU clock cap sets the board's power where the CPU decodes; a board with a GPU may decode on it, where
        # the cap barely moves the power, and its capped power is left unknown (no frozen-sensor judgement)
        self.cap_moves_power = cap_moves_power
        self.read = read
        self.guard = guard
        self.board = board
        self.telemetry = telemetry
        self.status = status
        self.wait_record_s = wait_record_s
        self.horizon_s = horizon_s
        self.max_pause_s = max_pause_s
        self._paused_since: float | None = None
        self.start = clock.now()
        self.prompt_tokens = 0
        self._step_prompt: int | None = None  # the coming prefill step's prompt tokens, where prefill_chunk named them
        self._prompt_left: int | None = None  # ... and those left after it, where the prompt is prefilled in steps
        self._prompt_step = 0  # the request's prefill steps named so far (the coming one's number, from 1)
        self.reading: Reading | None = None
        self._waited = 0.0
        self._waited_paused = 0.0  # of _waited, the chunks waited in a pause
        # the Jetson power mode the telemetry last wrote (its meta record's, then a step record's where it changed)
        self.nvpmodel_recorded: str | None = telemetry.meta.get("nvpmodel") if telemetry is not None else None
        # the request's prefill and decode steps so far, by kind (``run --stats`` says the waits in them)
        self.totals: dict[str, StepTotals] = {}
        self._last_wait_record = -1e9
        # Called after every chunk of a wait, and before each of a prompt's prefill steps but its first: an exception
        # it raises ends the wait (or the prompt) there. A server sets it for the request generating (its client
        # left, the server stopping), so a pause on a board that stays hot does not hold the board's turn for nobody.
        self.abandon_wait: Callable[[], None] | None = None

    @property
    def compute_budget(self) -> float:
        """The budget the power gate runs under without the guard (``--compute-budget``; 1.0: no gate in use), read
        from the gate as it stands, as the guard reads it (:attr:`~edgesdk.thermal.guard.Guard.compute_budget`): a
        ``configure()`` after the session opened replaces it."""
        return configured_budget(self.budget_target)

    def _observe(self) -> Reading | None:
        reading = self.read()
        if self.guard is not None:
            self.guard.observe(self.clock.now(), reading)
        self.reading = self._fresh(reading)
        if self.guard is not None:
            if self.clock_cap is not None:
                self.clock_cap.set_ratio(self.guard.clock_ratio)
                self.guard.clock_applied = self._clock_applied()
                self.guard.clock_pi5_table = isinstance(self.clock_cap, SimulatedBoard) or self.cap_pi5_table
            self._paused_since = (self._paused_since if self._paused_since is not None else self.clock.now()
                                  ) if self.guard.paused else None
        return self.reading

    def _clock_applied(self) -> float | None:
        """The clock the cap applied, as a share of the maximum: the simulated board's (its power follows the Pi 5's
        operating points on every profile), or cpufreq's on every board (its highest cap over its policy's ceiling,
        :attr:`~edgesdk.thermal.cpufreq.CpuFreqCap.applied_ratio`; its power by the Pi 5's table with
        ``cap_pi5_table``, else taken as f alone: :attr:`~edgesdk.thermal.guard.Guard._dynamic_share`); None where
        the actuator reports none, or where the cap does not set the board's power (``cap_moves_power`` false: a
        board with a GPU, which may decode on it)."""
        cap = self.clock_cap
        if isinstance(cap, SimulatedBoard):
            return cap.cap_ratio
        return getattr(cap, "applied_ratio", None) if self.cap_moves_power else None

    def current(self) -> Reading | None:
        """The sensor's reading now, for ``/health`` and ``/metrics`` between requests: :attr:`reading` is
        renewed only while steps run, so an idle server would report a temperature hours old as current.
        ``read`` is the poller's latest reading (or the simulated board's), never a blocking sensor read; a
        reading older than ``stale_s`` is no data, as in :meth:`_fresh`."""
        return self._fresh(self.read())

    def _fresh(self, reading: Reading | None) -> Reading | None:
        """``reading``, or a copy with no data in it when it is older than the guard's ``stale_s``.

        A poller whose sensor hangs (a blocked sysfs read) or fails (a read that raises) keeps its last
        reading: the guard takes such a reading as no data (:meth:`Guard.observe`), and so do the records,
        the status line and ``/health``, which would show its temperature, throttle flags and power as
        current (a flat line in ``thermal report``, and ``sensor_ok`` on an unguarded run)."""
        if reading is None:
            return None
        stale_s = (self.guard.config if self.guard is not None else GuardConfig()).stale_s
        if self.clock.now() - reading.time <= stale_s:
            return reading
        return replace(reading, zones=dict.fromkeys(reading.zones), throttled=None, power_w={}, nvpmodel=None,
                       offline=[])

    def _check_wait_limits(self) -> None:
        """Stop a wait on a simulated clock at the horizon, or when the board has stopped cooling."""
        now = self.clock.now()
        if self.horizon_s is not None and now >= self.horizon_s:
            raise HorizonReached(now)
        if self.max_pause_s is None or self._paused_since is None or now - self._paused_since < self.max_pause_s:
            return
        temp = "unknown" if self.reading is None or self.reading.max_c is None else f"{self.reading.max_c:.1f} °C"
        ambient = f" at {self.board.ambient_c:g} °C ambient" if self.board is not None else ""
        limits, hysteresis = self.guard.limits, self.guard.config.hysteresis_c
        raise BoardNeverCooled(  # both ways a pause ends (Guard._update_level), not only the first
            f"the simulated board never cooled below the guard's resume point {limits.resume_c:g} °C, nor below "
            f"{limits.hard_c - hysteresis:g} °C (hard limit {limits.hard_c:g} °C less the {hysteresis:g} °C "
            f"hysteresis) where a pause ends after one time constant: paused for {now - self._paused_since:.0f} "
            f"simulated s{ambient}, still at {temp}",
            "lower --ambient, or pick a --thermal-target whose limits suit a board this warm")

    @property
    def waited_s(self) -> float:
        """Seconds the guard has held the coming step back so far; after a :meth:`before_step` that raised
        (:class:`BoardNeverCooled`), the wait it ended."""
        return self._waited

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.totals = {"prefill": StepTotals(), "decode": StepTotals()}
        self._step_prompt = self._prompt_left = None
        self._prompt_step = 0
        if self.guard is not None:
            self._observe()
            self.guard.begin(max_new_tokens, prompt_tokens)

    def before_step(self, kind: str) -> float:
        self._waited = 0.0
        self._waited_paused = 0.0
        if self.guard is None:
            return 0.0
        if kind == "prefill" and self._prompt_step > 1 and self.abandon_wait is not None:
            # between a prompt's steps, as llama-server drops a task whose client left between the batches of its
            # prompt (the slot is released before the next llama_decode): a client gone during a long prompt's
            # prefill stops it at its next step, not after the whole prompt (the steps run stay in the prompt cache)
            self.abandon_wait()
        # Waited since the last "wait" record, and the state (reading, guard state) and (level, pause flag) of those
        # chunks: a run of chunks is booked in one state, so pacing and a pause, or two levels, never share a record
        # (a record's level is the level its interval passed at; see _record).
        unrecorded, run_state, run_key = 0.0, None, None
        while True:
            self._observe()
            wait = self.guard.wait_s(kind)
            key = (self.guard.level, self.guard.paused)
            if wait <= 0.0:
                # the chunks not yet booked, at a level (or pause) the step that follows does not run at: a pause's
                # last chunks, pacing the guard left during the wait, booked in their own state
                if unrecorded > 0 and key != run_key:
                    self._record("wait", 0, 0.0, unrecorded, state=run_state)
                return self._waited
            chunk = min(wait, self.guard.config.poll_s)
            if unrecorded > 0 and key != run_key:  # pacing turned into a pause (or back), or the level changed
                self._record("wait", 0, 0.0, unrecorded, state=run_state)
                unrecorded, self._last_wait_record = 0.0, self.clock.now()
            run_state, run_key = (self.reading, self.guard.state()), key
            before, slept = self.clock.now(), False
            try:
                self.clock.sleep(chunk)
                slept = True
                self._waited += chunk
                self._waited_paused += chunk if key[1] else 0.0
                unrecorded += chunk
                if self.clock.now() - self._last_wait_record >= self.wait_record_s:
                    self._last_wait_record = self.clock.now()
                    self._record("wait", 0, 0.0, unrecorded)  # every chunk since the last record, not the last one
                    unrecorded = 0.0
                self._check_wait_limits()
                if self.abandon_wait is not None:
                    self.abandon_wait()
            except BaseException:
                # A wait that ends in the guard giving up (or Ctrl-C, a plan's horizon) has no step to carry it:
                # its chunks since the last record get their own record, as a pause's last chunks do, with the
                # part of a chunk slept before the sleep itself was cut short.
                if not slept:
                    part = min(max(self.clock.now() - before, 0.0), chunk)
                    self._waited += part
                    self._waited_paused += part if key[1] else 0.0
                    unrecorded += part
                if unrecorded > 0:
                    self._record("wait", 0, 0.0, unrecorded, state=run_state)
                raise

    def prefill_chunk(self, prompt_left: int) -> int | None:
        """The prompt tokens the coming prefill step takes (the generation loop's ``prefill_chunk``,
        :func:`edgesdk.runtime.generate._prefill`): the guard's :meth:`~edgesdk.thermal.guard.Guard.prefill_chunk`, so
        that it can pace and pause between a long prompt's steps; None (the whole prompt in one step) unguarded.
        The step's record and the simulated board's work count that step's tokens, so a prompt's tokens are counted
        once over its steps."""
        if self.guard is None:
            return None
        step = self.guard.prefill_chunk(prompt_left)
        if step < prompt_left or self._prompt_left is not None:
            self._prompt_left = prompt_left - step
        self._prompt_step += 1
        self._step_prompt = step
        return step

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        prompt = self.prompt_tokens if self._step_prompt is None else self._step_prompt
        count = prompt if kind == "prefill" else tokens
        seconds = self.board.compute(kind, count, compute_s) if self.board is not None else compute_s
        # The guard's state the step ran in (as of the last reading before it): the record books the step's time
        # at that level; the reading taken after the step (its temperature) goes with it, the level read then
        # starts the next record's interval (see _record).
        ran_in = self.guard.state() if self.guard is not None else None
        if self.guard is not None:
            self.guard.spend(kind, tokens, seconds)
        totals = self.totals.setdefault(kind, StepTotals())
        totals.tokens += tokens
        totals.compute_s += seconds
        totals.wait_s += self._waited
        totals.pause_s += self._waited_paused
        self._observe()
        self._record(kind, tokens, seconds, self._waited, guard_state=ran_in,
                     prompt_tokens=prompt if kind == "prefill" else None,
                     prompt_left=self._prompt_left if kind == "prefill" else None, prompt_step=self._prompt_step)
        self._waited = self._waited_paused = 0.0
        if kind == "prefill":
            self._step_prompt = None

    def end(self, stats: object) -> None:
        if self.clock_cap is not None:  # capped only while generating: an idle board gets its clock back
            self.clock_cap.set_ratio(None)
        if self.status is not None:
            self.status.update(self.status_text(), force=True)

    def _record(self, kind: str, tokens: int, seconds: float, waited: float,
                state: tuple[Reading | None, dict] | None = None, guard_state: dict | None = None,
                prompt_tokens: int | None = None, prompt_left: int | None = None, prompt_step: int = 0) -> None:
        """One step record; ``state`` (reading, guard state) when it is not the current one, ``guard_state`` when
        only the guard's is not.

        ``tokens`` and ``tok_s`` count the tokens a step yields (a prefill's is the answer's first token, so its
        ``tok_s`` is one over the time to first token); a prefill record also says what it computed, as llama.cpp's
        ``prompt eval time = ... ms / N tokens (... tokens per second)`` line and llama-server's ``timings``
        (``prompt_n``, ``prompt_per_second``) do: ``prompt_tokens``, the prompt tokens it ran (those the cache did
        not hold), and ``prompt_tok_s``, those over its compute time (its wait left out). A prompt the guard has
        prefilled in steps (:meth:`prefill_chunk`) has a record per step, each with its own ``prompt_tokens`` and
        ``prompt_left``, the prompt tokens still to prefill after it (0 on the step that yields the first token), and
        ``prompt_step``, its number in the prompt (1 the first: a request whose client left between its steps is not
        taken for the first steps of the next, which may leave the same tokens where the prompt cache kept the
        steps that ran): the prompt's requests and time to first token are its steps up to that one.

        A record books the interval since the record before it (up to its ``t``): its tokens, compute and wait,
        and the guard state (``level``, ``paused``, ``budget``, ...) that interval passed in, the state read
        before it; ``temp_c`` and the zones are the last reading (a step's, the one after it). The telemetry
        summary charges each interval to its record's level and ``thermal report`` draws the level back to the
        record before (``where="pre"``), as it bins tokens ``(start, end]``.
        """
        if self.telemetry is None and self.status is None:
            return
        reading = self.reading if state is None else state[0]
        guard_state = guard_state if state is None else state[1]
        elapsed = seconds + waited
        record = {
            "t": round(self.clock.now() - self.start, 6), "kind": kind, "tokens": tokens,
            "duration_s": round(seconds, 6), "wait_s": round(waited, 6),
            "tok_s": round(tokens / elapsed, 3) if elapsed > 0 and tokens else 0.0,
            **({} if prompt_tokens is None else {
                "prompt_tokens": prompt_tokens,
                "prompt_tok_s": round(prompt_tokens / seconds, 3) if seconds > 0 and prompt_tokens else 0.0}),
            **({} if prompt_left is None else {"prompt_left": prompt_left, "prompt_step": prompt_step}),
            "temp_c": None if reading is None or reading.max_c is None else round(reading.max_c, 3),
            "zones": {} if reading is None else reading.zones,
        }
        if self.guard is not None:
            record.update(self.guard.state() if guard_state is None else guard_state)
        else:
            record.update(level="unguarded", budget=self.compute_budget,
                          sensor_ok=bool(reading and reading.max_c is not None))
            if reading is not None:  # a zone's last good reading, held over a failed read, or lost past that hold
                record.update(zone_fields(reading.held, reading.lost))
        if reading is not None and reading.throttled is not None:
            # the firmware slows the clock now (bits 1-3); the sticky "occurred" bits say only that it did since boot
            record["throttled"] = any(reading.throttled.get(name) for name in FIRMWARE_SLOWDOWNS)
        if self.board is not None:
            record["clock"] = round(self.board.clock, 4)
        if reading is not None and reading.power_w:
            record["power_w"] = reading.power_w
        if reading is not None and reading.nvpmodel is not None and reading.nvpmodel != self.nvpmodel_recorded:
            # the Jetson power mode, where it changed (the meta record holds the one the run started in): a mode set
            # lower during a run slows it as heat would
            record["nvpmodel"] = self.nvpmodel_recorded = reading.nvpmodel
        if self.telemetry is not None:
            self.telemetry.step(**record)
        if self.status is not None:
            # the level now (the text shows it): a log's status line is printed when the guard changes level; a pause
            # that starts or ends, and a step whose tokens are streamed next, let a status line that shares stdout's
            # pipe print before the text (StatusLine.update)
            self.status.update(self.status_text(record), level=self.guard.level.value if self.guard else record["level"],
                               paused=self.guard.paused if self.guard is not None else None,
                               streams=kind in ("prefill", "decode") and tokens > 0)

    def status_text(self, record: dict | None = None) -> str:
        guard, reading = self.guard, self.reading
        temp = "--.-" if reading is None or reading.max_c is None else f"{reading.max_c:.1f}"
        parts = [f"{temp} °C", guard.level.value if guard else "unguarded"]
        if record is not None and record.get("kind") == "prefill":  # its tok_s is 1 / time to first token
            if record.get("prompt_tok_s"):
                parts.append(f"prompt {record['prompt_tok_s']:.1f} tok/s")
        elif record is not None and record.get("tok_s"):
            parts.append(f"{record['tok_s']:.1f} tok/s")
        if guard is not None:
            limit = guard.rate_limit_tok_s
            # pacing before any decode step measured the token rate (prompts only: embeddings, perplexity): a share
            # of the compute time, not "no pacing"
            pace = f"limit {limit:.1f} tok/s" if limit else (f"pacing at {guard.fraction:.0%}" if guard.pacing
                                                             else "no pacing")
            parts.append("paused" if guard.paused else "holding the prompt until cooler" if guard.holding else pace)
            if guard.budget_target is not None:  # without a power gate the budget moves nothing
                parts.append(f"budget {guard.budget_in_force:.2f}")
            if not guard.sensor_ok:
                offline = reading is not None and bool(reading.offline) and set(reading.zones) <= set(reading.offline)
                # every zone reads -256 °C: rail-gated sensors, no fault to look for
                parts.append(f"SENSORS OFFLINE ({', '.join(reading.offline)})" if offline
                             else "SENSOR FAILED" if guard.has_sensor else "no sensor")
        # what the firmware limits the board for, also unguarded: under-voltage wants a better supply, not cooling
        flags = guard.firmware_flags if guard is not None else firmware_limits(reading and reading.throttled)
        if flags:
            parts.append(", ".join(FIRMWARE_CAUSES[name] for name in flags))
        if reading is not None and reading.nvpmodel:  # the Jetson power mode sets the clocks the rate is had at
            parts.append(f"nvpmodel {reading.nvpmodel}")
        if reading is not None and reading.source:
            parts.append(f"[{reading.source}]")
        return "  ".join(parts)


@dataclass
class ThermalSession:
    """What ``edgesdk run`` needs: the hook, notes to print, and cleanup."""

    hook: ThermalHook
    notes: list[str] = field(default_factory=list)
    poller: Poller | None = None
    cpufreq: CpuFreqCap | None = None

    def close(self) -> None:
        """Give the clock back, stop the poller, clear the status line and close (and sync) the telemetry file:
        each of them also when one before it raised (the clock cap's warning to a stderr that is gone, a pipe
        closed by ``| head``), which then propagates; before, such a failure left the status line on the terminal
        and the telemetry file's last records unsynced."""
        steps = [self.cpufreq and self.cpufreq.close, self.poller and self.poller.stop,
                 self.hook.status and self.hook.status.close, self.hook.telemetry and self.hook.telemetry.close]
        failed: BaseException | None = None
        for step in steps:
            if step is None:
                continue
            try:
                step()
            except BaseException as error:  # the next ones still run; the first failure is raised after them
                failed = failed or error
        if failed is not None:
            raise failed


# Said where a power-gated bundle's guard paces because its gates are off (``run``/``serve`` and ``load()`` add the fix)
GATES_OFF = "the bundle's power gates are off, so the guard paces instead of lowering the compute budget"


class BundleGate(NamedTuple):
    """What the thermal guard of a run takes from the bundle it runs (:func:`bundle_gate`)."""

    budget_target: object | None  # the power gate in use: the gated backend while its gates skip blocks, else None
    model_facts: Mapping | None  # the manifest's ``model.after`` (the guard's FFN share of a decode step's power)
    gates_off: bool  # a power-gated bundle run with its gates off: the guard paces instead (:data:`GATES_OFF`)


def bundle_gate(runtime) -> BundleGate:
    """The power gate and model facts :func:`open_session` takes for ``runtime`` (an opened bundle), read as the gates
    stand: ``edgesdk run``, ``serve`` and ``load(..., watch_thermal=True)`` call it once the gates are set. The guard's
    compute-budget lever works only while the gates skip blocks (``--gating``)."""
    backend = runtime.backend
    gating = bool(getattr(backend, "gating", False))
    model = runtime.bundle.manifest.get("model")
    facts = model.get("after") if isinstance(model, Mapping) else None
    return BundleGate(backend if gating else None, facts if isinstance(facts, Mapping) else None,
                      hasattr(backend, "configure") and not gating)


def open_session(profile: TargetProfile, guard: bool = True, simulate: bool = False,
                 telemetry_path: str | None = None, ambient_c: float | None = None, sim_speed: float = 1.0,
                 budget_target: object | None = None, status: bool = True,
                 sysfs_root: str | None = None, warn: Callable[[str], None] | None = None,  # without status
                 config: GuardConfig | None = None, clock_cap: bool = False,
                 cpufreq_root: str | None = None, model_facts: Mapping | None = None) -> ThermalSession:
    """Sensors or simulator + guard + telemetry for one ``edgesdk run``; every fallback is noted.

    ``model_facts``: the bundle's (its manifest's ``model.after``), whose FFN share of the weights a token reads sets
    how much of a decode step's power the power gate's skipped blocks save
    (:func:`~edgesdk.thermal.guard.ffn_weight_share`).

    ``clock_cap``: while pacing, the guard also caps the CPU clock (cpufreq on a board, the
    simulated board's clock with ``simulate``); ``cpufreq_root`` (or ``$EDGESDK_CPUFREQ_ROOT``) is
    the file-system root holding ``sys/devices/system/cpu/cpufreq``.
    """
    opened: list[object] = []  # closed again, newest first, when a later step fails
    try:
        notes: list[str] = []
        status_line = _opened(StatusLine() if status else None, opened)
        say = status_line.warn if status_line is not None else (warn or notes.append)
        board, poller = None, None
        if simulate:
            board = SimulatedBoard.from_profile(profile, ambient_c, work=WorkModel(speed=sim_speed))
            sensor = SimulatedSensor(board, profile.thermal.zones[0])
            trips = sensor.trips(profile, sensor.zone)
            read, clock = sensor.read, board
            notes.append(f"simulated {profile.name} board: ambient {board.ambient_c:g} °C, thermal model "
                         f"R={profile.thermal_model.resistance_c_per_w:g} °C/W, C={profile.thermal_model.capacity_j_per_c:g} "
                         f"J/°C; measured step times x{sim_speed:g}")
        else:
            # EDGESDK_THERMAL_ROOT points the sysfs reader at another tree (tests, containers with /sys mounted elsewhere)
            root = sysfs_root or thermal_root()
            sensor, trips, found = detect_sensors(profile.thermal.zones, root, family=profile.family)
            notes += found
            clock = RealClock()
            if sensor is None:
                notes.append("no thermal sensor found (no sysfs zone, no vcgencmd, no jetson-stats): "
                             + ("the guard paces at a conservative fixed rate, "
                                f"{(config or GuardConfig()).fallback_fraction:.0%} of the unpaced token rate"
                                if guard else "telemetry has no temperature"))
                read = lambda: None  # noqa: E731
            else:
                poller = _opened(Poller(sensor, (config or GuardConfig()).poll_s).start(), opened)
                read = lambda: poller.latest  # noqa: E731
                notes.append(f"thermal sensors: {sensor.source}")
        actuator, cpufreq = _clock_cap(clock_cap and guard, board, cpufreq_root, notes, say)
        _opened(cpufreq, opened)
        if clock_cap and not guard:
            notes.append("--clock-cap does nothing without the guard")
        if actuator is not None:
            config = replace(config or GuardConfig(), hot_clock_ratio=CLOCK_CAP_RATIO)
            notes.append(_clock_cap_note(board is not None))
        limits, limit_notes = Limits.resolve(profile.thermal, trips)
        notes += limit_notes
        the_guard = None
        if guard:
            # the guard reads the budget set on the gate from the gate itself, as it stands (configure() replaces it)
            the_guard = Guard(limits, profile.thermal_model, config, budget_target, warn=say,
                              has_sensor=sensor is not None, model_facts=model_facts)
            notes.append(f"guard ({profile.name}): warm {the_guard.thresholds[Level.WARM]:g} °C, "
                         f"pacing to {the_guard.setpoint_c:g} °C from {the_guard.thresholds[Level.HOT]:g} °C, "
                         f"pause at {limits.hard_c:g} °C until below {limits.resume_c:g} °C (after "
                         f"{profile.thermal_model.resistance_c_per_w * profile.thermal_model.capacity_j_per_c:.0f} s, "
                         f"below {limits.hard_c - the_guard.config.hysteresis_c:g} °C); "
                         f"compute budget {'via the power gate' if the_guard.budget_target else 'not adjustable (no power gate in use)'}")
        first = poller.latest if poller is not None else None  # its first reading: the power mode the run starts in
        meta = {"profile": profile.name, "mode": "simulated" if simulate else "board", "guarded": guard,
                "ambient_c": board.ambient_c if board else None, "limits": limits.__dict__,
                "setpoint_c": the_guard.setpoint_c if the_guard else None,
                **({"nvpmodel": first.nvpmodel} if first is not None and first.nvpmodel else {})}
        telemetry = _open_telemetry(telemetry_path, meta, _late_warner(status_line, warn)) if telemetry_path else None
        hook = ThermalHook(clock, read, the_guard, board, telemetry, status_line, clock_cap=actuator,
                           max_pause_s=settle_time_s(board) if board is not None else None,
                           cap_pi5_table="BCM2712" in profile.cpu.model, cap_moves_power=profile.gpu is None,
                           budget_target=budget_target)
        return ThermalSession(hook, notes, poller, cpufreq)
    except BaseException:
        _close_all(opened)
        raise


def _clock_cap_note(simulated: bool) -> str:
    """What the clock cap does while the guard paces: a simulated board's clock is capped at a share of its
    maximum; cpufreq's at that share of each policy's ``scaling_max_freq`` as the cap begins (the board's
    ceiling then: lower in a reduced nvpmodel mode), the lowest offered frequency at or above it, never below
    ``scaling_min_freq`` (:meth:`~edgesdk.thermal.cpufreq.Policy.target`)."""
    if simulated:
        return f"while pacing, the simulated board's clock is capped at {CLOCK_CAP_RATIO:.1%} of its maximum"
    return (f"while pacing, the CPU clock is capped at {CLOCK_CAP_RATIO:.1%} of each policy's scaling_max_freq "
            "as the cap begins (the nearest offered frequency at or above it, never below scaling_min_freq)")


def _opened(thing: object | None, opened: list[object]) -> object | None:
    """Remember ``thing`` (a status line, poller or clock cap) so a failed open_session closes it."""
    if thing is not None:
        opened.append(thing)
    return thing


def _close_all(opened: list[object]) -> None:
    """Close (or stop) what a failed open_session had opened, newest first."""
    for thing in reversed(opened):
        (thing.stop if isinstance(thing, Poller) else thing.close)()


def _late_warner(status_line: StatusLine | None, warn: Callable[[str], None] | None) -> Callable[[str], None]:
    """Where a warning goes once the run is under way: the status line, else ``warn``, else stderr (the session's
    notes are printed as it opens, so one added to them later would never be seen)."""
    if status_line is not None:
        return status_line.warn
    return _unfailing(warn) if warn is not None else _warn_on_stderr


def _unfailing(warn: Callable[[str], None]) -> Callable[[str], None]:
    """``warn`` that gives up quietly where stderr refuses the warning (a full disk under ``2> run.log``): a warning
    that cannot be written must not end the run it warns about."""

    def told(message: str) -> None:
        try:
            warn(message)
        except (OSError, ValueError):
            pass

    return told


def _warn_on_stderr(message: str) -> None:
    """A warning on stderr, where there is one that takes it (a closed stderr, ``sys.stderr`` None, would make
    ``print`` write it into the answer on stdout)."""
    if sys.stderr is None:
        return
    try:
        print(f"edgesdk thermal: warning: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _open_telemetry(path: str, meta: dict, warn: Callable[[str], None] = _warn_on_stderr) -> Telemetry:
    """The run's telemetry file, appended to: a run restarted on the same file (a serve unit restarted by
    systemd after a crash) keeps the records of the run before it, the ones that show what happened. A path
    that cannot be written is an EdgeSDKError naming --telemetry and what is in the way. A step record the file
    takes no more (its disk filled up during the run) is warned of once, on one line (the status line shows it),
    with ``warn``, used as given (one that cannot fail: :func:`_late_warner`'s; stderr without one), and the run
    goes on without its records: generating and the guard do not depend on them (before, ``run`` stopped with the
    error mid-answer and ``serve`` failed the request generating)."""
    try:
        return Telemetry(path, meta, keep=False, append=True,
                         on_write_error=lambda error: warn(f"{error.problem}; the run goes on without them "
                                                           f"(fix: {error.fix})"))
    except OSError as error:
        raise EdgeSDKError(*_telemetry_path_problem(path, error)) from error


def _telemetry_path_problem(path: str, error: OSError) -> tuple[str, str]:
    """(problem, fix) for a ``--telemetry`` path that could not be opened: the path a directory, a parent of it a
    file (``mkdir`` says only "File exists"), the file there but not writable, or the file not creatable."""
    target = Path(path)
    reason = error.strerror or str(error)
    if target.is_dir():
        return (f"--telemetry {path}: is a directory, not a file",
                f"name a file in it, e.g. --telemetry {target / 'run.jsonl'}")
    blocking = next((parent for parent in target.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        return (f"--telemetry {path}: cannot create the file: {blocking} is a file, not a directory",
                "pass a path whose parent is a writable directory, e.g. --telemetry run.jsonl")
    if target.exists():
        return (f"--telemetry {path}: cannot open the file to append to it ({reason})",
                "make the file writable by this user (records are appended after the runs in it), or pass "
                "another path")
    return (f"--telemetry {path}: cannot create the file ({reason})",
            "pass a path whose parent is a writable directory (not a file), e.g. --telemetry run.jsonl")


def _clock_cap(wanted: bool, board: SimulatedBoard | None, root: str | None, notes: list[str],
               warn: Callable[[str], None]) -> tuple[object | None, CpuFreqCap | None]:
    """The clock-cap actuator (the simulated board, or cpufreq when writable) and the cpufreq cap to
    close. On a board, a cap that a killed run left behind is undone even when this run does not cap."""
    if board is not None:
        return (board if wanted else None), None
    state = state_path()
    if not wanted:
        notes += recover(state)
        return None, None
    cpufreq = CpuFreqCap(root or cpufreq_root_from_env(), state, warn=warn)
    notes += [*cpufreq.notes, cpufreq.describe()]
    return (cpufreq if cpufreq.available else None), cpufreq
