"""Thermal planning: run a request stream through the real generation loop on a simulated board.

The decoder is a stub (constant logits, no model), so the only clock is the simulated one: each
step costs the board's modelled token time at its current (possibly throttled) clock. Thirty
simulated minutes take seconds and are deterministic. :func:`compare` runs the same workload with
and without the guard; :func:`decode_rate_estimate` derives a board's decode rate from its
bandwidth when none is given.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.profile import TargetProfile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.thermal.guard import Guard, GuardConfig, Limits
from edgesdk.thermal.simulator import (
    PastHorizon,
    SimulatedBoard,
    SimulatedSensor,
    WorkModel,
    check_ambient,
)
from edgesdk.thermal.telemetry import RunSummary, Telemetry, summarize
from edgesdk.thermal.watch import HorizonReached, ThermalHook

# Memory-bound decode reaches ~60 % of the Pi 5's theoretical bandwidth (anchors: llama.cpp
# TinyLlama Q8_0 at 9 tok/s ~ 62 % of 17 GB/s) and small models reach about half of that
# roofline (DESIGN.md: per-token overhead dominates), hence 0.3 of bandwidth / weight bytes.
BANDWIDTH_EFFICIENCY = 0.6 * 0.5
PREFILL_TO_DECODE = 4.0  # llama.cpp on a Pi 5: TinyLlama prompt 35 vs generation 9 tok/s


class PlanInterrupted(KeyboardInterrupt):
    """Ctrl-C during a plan. ``files``: the telemetry file of each run begun, the last one cut short;
    each is closed, its meta record and every step record written before the stop a whole line."""

    def __init__(self, files: tuple[str, ...] = ()):
        super().__init__()
        self.files = files


@dataclass(frozen=True)
class Workload:
    """Requests back to back: ``prompt_tokens`` in, ``new_tokens`` out, ``think_s`` idle between."""

    prompt_tokens: int = 128
    new_tokens: int = 256
    think_s: float = 0.0


class _StubDecoder:
    """Stands in for a model: constant logits, so greedy decoding never stops early."""

    name = "stub"
    max_context = 1 << 30  # no limit: the workload sets the length

    def __init__(self, vocab: int = 8):
        self._logits = np.zeros(vocab, np.float32)
        self._logits[1] = 1.0
        self._position = 0

    @property
    def position(self) -> int:
        return self._position

    def reset(self) -> None:
        self._position = 0

    def prefill(self, token_ids: np.ndarray, keep_logits: int = 1) -> np.ndarray:
        self._position += len(token_ids)
        return np.tile(self._logits, (keep_logits, 1))

    def decode(self, token_id: int) -> np.ndarray:
        self._position += 1
        return self._logits


def decode_rate_estimate(profile: TargetProfile, weight_bytes: int) -> float:
    """Board decode tok/s from its bandwidth: 0.3 x bandwidth / bytes read per token."""
    return BANDWIDTH_EFFICIENCY * profile.memory.bandwidth_gbps * 1e9 / max(weight_bytes, 1)


@dataclass
class SimulatedRun:
    summary: RunSummary
    telemetry: Telemetry
    board: SimulatedBoard
    paused_at_end: bool = False  # the guard still held generation back when the horizon came

    @property
    def idle_c(self) -> float:
        """Where the simulated board settles when it does nothing."""
        model = self.board.model
        return self.board.ambient_c + model.resistance_c_per_w * model.idle_w


def _check_positive(name: str, value: float, what: str) -> None:
    """Refuse a ``simulate`` argument that is not a finite number above 0: a rate of 0 (or a negative or NaN one)
    made every step take no simulated time, so the run never reached its horizon and hung, its records filling
    memory; an infinite ``minutes`` did the same."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)  # a numpy scalar is a number too
    except (TypeError, ValueError):
        number = math.nan
    if not 0 < number < math.inf:
        raise EdgeSDKError(f"simulate: {name}={value!r} is not a finite number above 0", f"pass {what}")


def _check_workload(workload: Workload) -> None:
    """Refuse a :class:`Workload` the plan cannot run as asked: a prompt of 0 tokens failed inside the generation
    loop as "the prompt encodes to 0 tokens ... pass non-empty text (with --raw ...)", 0 new tokens as a
    ``max_new_tokens`` error, a fractional count as a TypeError, and a negative or NaN ``think_s`` was run as no
    wait at all while the run's meta record kept the value given."""
    for name in ("prompt_tokens", "new_tokens"):
        value = getattr(workload, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise EdgeSDKError(f"simulate: Workload.{name}={value!r} is not a whole number of tokens of 1 or more",
                               f"pass Workload({name}=...) a whole number >= 1, e.g. Workload({name}=128)")
    think = workload.think_s
    if isinstance(think, bool) or not isinstance(think, numbers.Real) or not 0 <= think < math.inf:
        raise EdgeSDKError(f"simulate: Workload.think_s={think!r} is not a finite number of seconds of 0 or more",
                           "pass the idle seconds between requests, e.g. Workload(think_s=5), or 0 for none")


def simulate(profile: TargetProfile, minutes: float, ambient_c: float, guarded: bool, decode_tok_s: float,
             prefill_tok_s: float | None = None, workload: Workload | None = None,
             config: GuardConfig | None = None, telemetry_path: str | None = None,
             label: str | None = None, board_profile: TargetProfile | None = None) -> SimulatedRun:
    """One run of ``workload`` for ``minutes`` of simulated time on ``profile`` at ``ambient_c``.

    ``board_profile`` (default ``profile``) is the board actually simulated; the guard only knows
    ``profile``, so a different one tests the guard against a wrong thermal model. The trip points the guard
    reads are the simulated board's, as a real guard reads its board's sysfs trips: a board whose firmware
    throttles below the profile's point lowers the guard's limits, as on the board. ``minutes``, ``decode_tok_s``
    and ``prefill_tok_s`` (when given) must be finite numbers above 0, ``ambient_c`` a finite number from -40 to 85 °C, ``workload``'s
    token counts whole numbers of 1 or more and its ``think_s`` a finite number of 0 or more, else an EdgeSDKError
    names the one that is not.
    """
    _check_positive("minutes", minutes, "the simulated minutes, e.g. minutes=30")
    _check_positive("decode_tok_s", decode_tok_s, "the board's decode rate at full clock, e.g. decode_tok_s=35 "
                    "(decode_rate_estimate gives one from the model's size)")
    if prefill_tok_s is not None:
        _check_positive("prefill_tok_s", prefill_tok_s, "the board's prefill rate at full clock, or None for "
                        f"{PREFILL_TO_DECODE:g} x decode_tok_s")
    check_ambient(ambient_c, "simulate", "--ambient")
    workload = workload or Workload()
    _check_workload(workload)
    work = WorkModel(decode_tok_s=decode_tok_s, prefill_tok_s=prefill_tok_s or PREFILL_TO_DECODE * decode_tok_s)
    horizon = minutes * 60.0
    board_profile = board_profile or profile
    # the board stops at the horizon: a step or an idle wait that would end past it ends the run there
    board = SimulatedBoard.from_profile(board_profile, ambient_c, work=work, horizon_s=horizon)
    sensor = SimulatedSensor(board, profile.thermal.zones[0])
    limits, _ = Limits.resolve(profile.thermal, sensor.trips(board_profile, sensor.zone))
    guard = Guard(limits, profile.thermal_model, config) if guarded else None
    meta = {"profile": profile.name, "mode": "simulated", "guarded": guarded, "ambient_c": ambient_c,
            "limits": limits.__dict__, "setpoint_c": guard.setpoint_c if guard else None,
            "label": label or ("guarded" if guarded else "unguarded"), "decode_tok_s": decode_tok_s,
            "workload": workload.__dict__}
    try:
        telemetry = Telemetry(telemetry_path, meta)
    except OSError as error:
        raise EdgeSDKError(f"--telemetry-dir: cannot create the telemetry file {telemetry_path} "
                           f"({error.strerror or error})",
                           "pass a --telemetry-dir that is a writable directory (or a new one)") from error
    clock_cap = board if guard is not None and guard.config.hot_clock_ratio else None
    hook = ThermalHook(board, sensor.read, guard, board, telemetry, clock_cap=clock_cap, horizon_s=horizon)
    decoder, sampling = _StubDecoder(), SamplingConfig(max_new_tokens=workload.new_tokens)
    prompt = [2] * workload.prompt_tokens
    try:
        while board.t < horizon:
            generate(decoder, prompt, sampling, stop_ids=set(), hook=hook)
            if workload.think_s:
                board.sleep(workload.think_s)
    except (HorizonReached, PastHorizon):
        pass  # time ran out inside a step, an idle wait or a guard's pause (one the board cannot cool out of)
    except KeyboardInterrupt as stop:  # Ctrl-C: the file is closed below, every record in it whole
        raise PlanInterrupted((telemetry_path,) if telemetry_path else ()) from stop
    finally:
        telemetry.close()
    paused = guard is not None and guard.paused
    # the board's own throttle time and peak: the records only see the board at each step's end, so an idle
    # wait (--think-s) the board began throttled and ended cool would count as not throttled at all, and a step
    # the horizon cut short (a long prompt's prefill) left the heat it made out of the maximum temperature
    summary = summarize(telemetry.records, horizon, board.throttled_s, round(board.peak_c, 3))
    return SimulatedRun(summary, telemetry, board, paused)


def _file_part(name: str) -> str:
    """``name`` as one file-name part: a profile's name is a plain name, but a bundle built before that rule
    carries its profile's name as written (edgesdk/profile.py ``bundle_profile``), where a '/' or '..' would put
    the telemetry file outside the directory asked for."""
    plain = "".join(char if char.isalnum() or char in "-_." else "_" for char in name).lstrip(".")
    return plain or "board"


def compare(profile: TargetProfile, minutes: float, ambient_c: float, decode_tok_s: float,
            prefill_tok_s: float | None = None, workload: Workload | None = None,
            config: GuardConfig | None = None, telemetry_dir: str | None = None) -> dict[str, SimulatedRun]:
    """The same workload guarded and unguarded."""
    runs: dict[str, SimulatedRun] = {}
    done: tuple[str, ...] = ()  # the telemetry files of the runs finished
    for name, guarded in (("guarded", True), ("unguarded", False)):
        path = f"{telemetry_dir}/{_file_part(profile.name)}-{ambient_c:g}C-{name}.jsonl" if telemetry_dir else None
        try:
            runs[name] = simulate(profile, minutes, ambient_c, guarded, decode_tok_s, prefill_tok_s, workload,
                                  config, path, name)
        except PlanInterrupted as stop:
            raise PlanInterrupted(done + stop.files) from stop.__cause__
        if path:
            done += (path,)
    return runs
