"""``edgesdk thermal``: sensors on this machine, a thermal plan for a bundle, telemetry plots.

Registered on the main CLI by one line at the bottom of ``edgesdk/cli.py``. Imports stay inside
the commands so ``edgesdk --help`` stays fast; matplotlib is imported by ``report`` only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import click

from edgesdk.thermal import AMBIENT_RANGE_C

if TYPE_CHECKING:
    from edgesdk.thermal.plan import SimulatedRun, Workload


def thermal_profile(bundle: Path | None, target: str | None, manifest: dict | None = None):
    """The profile whose thermal limits and model apply: ``--target``, else the bundle's own copy
    (``manifest``: the bundle's, already read)."""
    from edgesdk.errors import EdgeSDKError
    from edgesdk.profile import bundle_profile, get_profile

    if target:
        return get_profile(target)
    if bundle is None:
        raise EdgeSDKError("no target given", "pass --target rpi5 (or another board profile)")
    if manifest is None:
        from edgesdk.bundle import read_manifest

        manifest = read_manifest(bundle)
    return bundle_profile(manifest.get("target"), bundle)


class FiniteRange(click.FloatRange):
    """A float option that must be a finite number within ``[min, max]``.

    click's FloatRange lets NaN through (every comparison with NaN is false), and inf too where a
    bound is missing. The message names the value, what was expected and an example. Reusable:
    ``edgesdk run --ambient`` can take :data:`AMBIENT`.
    """

    name = "finite float range"

    def __init__(self, min: float | None = None, max: float | None = None, *, min_open: bool = False,
                 max_open: bool = False, what: str = "a number", example: str | None = None):
        super().__init__(min, max, min_open=min_open, max_open=max_open)
        self.what = what
        self.example = example

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)  # not a number at all: click's own message
        ok = math.isfinite(number)
        if ok:
            try:
                super().convert(number, param, ctx)
            except click.BadParameter:
                ok = False
        if not ok:
            name = param.opts[0] if param is not None and param.opts else ""
            example = f" (e.g. {name} {self.example})".replace("  ", " ") if self.example else ""
            self.fail(f"{value} is out of range: expected {self.what}, a finite number with "
                      f"{self._describe_range()}{example}", param, ctx)
        return number


# A day of simulated time: far past any board's thermal settling (minutes), and a guard paused for all of
# it writes one wait record a simulated second.
MAX_MINUTES = 24 * 60.0
MINUTES = FiniteRange(0, MAX_MINUTES, min_open=True, what="simulated minutes", example="30")
# rates: a 0 or negative one never ends a plan; no edge board decodes a million tokens a second
RATE = FiniteRange(1e-3, 1e6, what="a board's tokens per second", example="35")
THINK_S = FiniteRange(0, MAX_MINUTES * 60, what="idle seconds between requests", example="5")
AMBIENT = FiniteRange(*AMBIENT_RANGE_C, what="an ambient temperature in °C", example="35")
TOKENS = click.IntRange(min=1, max=1_000_000)  # the stub decoder holds a prompt as a list
# A plan simulates each step (prefill or decode) in Python (~20k a second) and keeps its record (~1 kB) in
# memory: 250k a run is ~15 s and ~300 MB for both runs (30 minutes at 138 tok/s); more would seem to hang.
MAX_PLAN_STEPS = 250_000


def check_plan_size(minutes: float, decode_tok_s: float, how: str, workload: Workload | None = None,
                    prefill_tok_s: float | None = None) -> None:
    """Refuse a plan whose steps would take too long: each request is one prefill step and
    ``new_tokens - 1`` decode steps, counted at full clock (the most there can be)."""
    from edgesdk.errors import EdgeSDKError
    from edgesdk.thermal.plan import PREFILL_TO_DECODE, Workload

    workload = workload or Workload()
    prefill_tok_s = prefill_tok_s or PREFILL_TO_DECODE * decode_tok_s
    steps_per_s = _plan_steps_per_s(decode_tok_s, workload, prefill_tok_s)
    steps = minutes * 60.0 * steps_per_s
    longest = longest_plan_minutes(decode_tok_s, workload, prefill_tok_s)
    if steps > MAX_PLAN_STEPS and minutes > longest:
        rate = (f"--decode-tok-s {decode_tok_s:g}" if how == "given"
                else f"a decode rate of {decode_tok_s:.1f} tok/s ({how})")
        raise EdgeSDKError(
            f"--minutes {minutes:g} of {workload.prompt_tokens} + {workload.new_tokens}-token requests at {rate} "
            f"and a prefill rate of {prefill_tok_s:g} tok/s means up to {steps:,.0f} simulated steps per run "
            f"(a prefill and {workload.new_tokens - 1} decode steps a request); "
            f"a plan simulates at most {MAX_PLAN_STEPS:,}",
            f"pass --minutes {longest:g} or less for these requests and rates"
            + ("" if how == "given" else ", or give --decode-tok-s"))


def _plan_steps_per_s(decode_tok_s: float, workload: Workload, prefill_tok_s: float) -> float:
    """Simulated steps per simulated second at full clock (the most there can be): each request is one prefill step
    and ``new_tokens - 1`` decode steps."""
    request_s = (workload.prompt_tokens / prefill_tok_s + (workload.new_tokens - 1) / decode_tok_s
                 + workload.think_s)
    return workload.new_tokens / request_s


def longest_plan_minutes(decode_tok_s: float, workload: Workload, prefill_tok_s: float) -> float:
    """The longest ``--minutes`` :func:`check_plan_size` takes for these requests and rates, to 3 digits as its fix
    shows it: passed back, it is accepted even where it rounded up (by at most 0.5 %, a few hundred steps past the
    limit)."""
    return float(f"{MAX_PLAN_STEPS / 60.0 / _plan_steps_per_s(decode_tok_s, workload, prefill_tok_s):.3g}")


@click.group()
def thermal():
    """Thermal guard tools: list sensors, plan sustained speed, plot telemetry.

    \b
      edgesdk thermal sensors --target rpi5
      edgesdk thermal plan BUNDLE --target rpi5 --minutes 30 --ambient 35
      edgesdk thermal report run.jsonl -o run.png
    """


@thermal.command("sensors")
@click.option("--target", help="Profile whose zone types and limits to use [this board's, as edgesdk env detects "
                                "it; host where it detects none].")
@click.option("--root", default="/sys/class/thermal", show_default=True, envvar="EDGESDK_THERMAL_ROOT",
              show_envvar=True, help="sysfs thermal directory (the guard of run and serve reads the same one).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def sensors_cmd(target, root, as_json):
    """What the guard would read on this machine: zones, trip points, one reading, fallbacks."""
    from edgesdk.profile import get_profile
    from edgesdk.thermal.cpufreq import CpuFreqCap, cpufreq_root, recover_left_cap
    from edgesdk.thermal.guard import Limits
    from edgesdk.thermal.sensors import detect_sensors

    recovered = recover_left_cap()  # a cap a killed run left would be read here as the board's ceiling
    if target is None:  # the board's own profile, as its bundles carry it: a Pi's limits are not the host's
        from edgesdk.board import detect_board

        target = detect_board().suggested_target or "host"
    profile = get_profile(target)
    sensor, trips, notes = detect_sensors(profile.thermal.zones, root, family=profile.family)
    reading = sensor.read() if sensor is not None else None
    limits, limit_notes = Limits.resolve(profile.thermal, trips)
    if sensor is not None and hasattr(sensor, "close"):
        sensor.close()
    clock_cap = CpuFreqCap(cpufreq_root()).describe()  # reads only
    result = {"profile": profile.name, "sensor": sensor.source if sensor else None, "clock_cap": clock_cap,
              "reading": None if reading is None else {"zones": reading.zones, "offline": reading.offline,
                                                        "throttled": reading.throttled, "power_w": reading.power_w,
                                                        "nvpmodel": reading.nvpmodel},
              "trips": [t.__dict__ for t in trips], "limits": limits.__dict__,
              "notes": recovered + notes + limit_notes + ([] if sensor is not None else [no_sensor_note(root)])}
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"profile  {profile.name}")
    click.echo(f"sensor   {result['sensor'] or 'none'}")
    offline = set((result["reading"] or {}).get("offline", ()))  # -256 °C: rail-gated, no failed read
    for zone, value in (result["reading"] or {}).get("zones", {}).items():
        shown = f"{value:.1f} °C" if value is not None else "offline (-256 °C: powered down)" if zone in offline \
            else "no data"
        click.echo(f"  {zone:<20} {shown}")
    for trip in trips:
        click.echo(f"  trip {trip.zone}[{trip.index}] {trip.kind:<8} {trip.temp_c:g} °C")
    if not trips and (result["reading"] or {}).get("zones"):  # as --json's "trips": [] says
        click.echo(f"  no trip points in these zones: the limits below are the profile's ({profile.name})")
    if reading is not None:
        for line in reading_lines(reading.throttled, reading.power_w, reading.nvpmodel):
            click.echo(line)
    click.echo("limits   " + ", ".join(f"{k} {v:g}" for k, v in limits.__dict__.items()))
    click.echo(f"clock    {clock_cap}")
    for note in result["notes"]:
        click.echo(f"note     {note}")


def no_sensor_note(root: str) -> str:
    """What ``thermal sensors`` says where it found no sensor at all: what the guard of ``run`` / ``serve
    --watch-thermal`` then does (edgesdk/thermal/watch.py ``open_session``: it paces at a fixed rate, and
    ``--telemetry`` records no temperature), and where the zones may be instead. "no thermal zones under ROOT" alone
    left a mistyped ``--root`` (or ``EDGESDK_THERMAL_ROOT``) looking like a board without sensors."""
    from edgesdk.thermal.guard import GuardConfig

    where = Path(root)
    state = ("does not exist" if not where.exists() else "is not a directory" if not where.is_dir()
             else "holds no thermal zone the guard can read")
    return (f"no thermal sensor found (no sysfs zone, no vcgencmd, no jetson-stats): {root} {state}; the guard of "
            "'run --watch-thermal' and 'serve --watch-thermal' would pace at a conservative fixed rate, "
            f"{GuardConfig().fallback_fraction:.0%} of the unpaced token rate, and --telemetry would record no "
            "temperature. Where the zones are mounted elsewhere (a container), pass --root DIR or set "
            "EDGESDK_THERMAL_ROOT=DIR (run and serve read it too)")


def reading_lines(throttled: dict[str, bool] | None, power_w: dict[str, float], nvpmodel: str | None) -> list[str]:
    """The rest of a reading as ``thermal sensors`` prints it: what ``--json`` holds beside the zones.

    * ``throttled``: the ``vcgencmd get_throttled`` value, rebuilt from its decoded bits, then the bits set
      (Raspberry Pi documentation, ``get_throttled``: bits 0-3 now, bits 16-19 since boot). The guard paces
      while one of bits 0-3 is set, so a board that the firmware slows (a weak supply) must say so here.
    * ``power_w``: jetson-stats' rails (its mW as W) and total.
    * ``nvpmodel``: the Jetson power mode's name, as jtop shows it.
    """
    from edgesdk.thermal.sensors import THROTTLED_BITS

    lines = []
    if throttled is not None:
        value = sum(1 << bit for bit, name in THROTTLED_BITS.items() if throttled.get(name))
        now = [name for bit, name in THROTTLED_BITS.items() if bit < 16 and throttled.get(name)]
        since = [name for bit, name in THROTTLED_BITS.items() if bit >= 16 and throttled.get(name)]
        lines.append(f"firmware get_throttled {value:#x}: "
                     + ("; ".join(part for part in (f"now {', '.join(now)}" if now else "",
                                                    f"since boot {', '.join(since)}" if since else "") if part)
                        or "no under-voltage, frequency capping, throttling or soft temperature limit"))
    if power_w:
        lines.append("power    " + ", ".join(f"{name} {watts:.2f} W" for name, watts in power_w.items()))
    if nvpmodel:
        lines.append(f"nvpmodel {nvpmodel}")
    return lines


@thermal.command("plan")
@click.argument("bundle", type=click.Path(path_type=Path), required=False)
@click.option("--target", help="Board profile to plan for [the bundle's target].")
# the 133: longest_plan_minutes(35, Workload(), 140), the default requests' limit at 35 tok/s
@click.option("--minutes", default=30.0, show_default=True, type=MINUTES,
              help=f"Simulated minutes: at most a day, and at most {MAX_PLAN_STEPS:,} simulated steps a run, so fewer "
                   "the faster the board decodes (133 at 35 tok/s with the default requests); a longer plan is "
                   "refused with the longest for its rates.")
@click.option("--ambient", type=AMBIENT, help="Ambient temperature in °C [the profile's].")
@click.option("--decode-tok-s", type=RATE,
              help="Board decode rate at full clock [0.3 x bandwidth / model bytes].")
@click.option("--prefill-tok-s", type=RATE, help="Board prefill rate [4 x decode].")
@click.option("--prompt-tokens", default=128, show_default=True, type=TOKENS)
@click.option("--new-tokens", default=256, show_default=True, type=TOKENS)
@click.option("--think-s", default=0.0, show_default=True, type=THINK_S,
              help="Idle seconds between requests.")
@click.option("--telemetry-dir", type=click.Path(path_type=Path), help="Write both runs' JSONL here.")
@click.option("--clock-cap", is_flag=True, help="The guarded run also caps the CPU clock while pacing "
                                                 "(as edgesdk run --clock-cap).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def plan_cmd(bundle, target, minutes, ambient, decode_tok_s, prefill_tok_s, prompt_tokens, new_tokens, think_s,
             telemetry_dir, clock_cap, as_json):
    """Predict sustained tok/s on a board: the same request stream simulated with and without the guard."""
    from edgesdk.thermal.guard import CLOCK_CAP_RATIO, GuardConfig
    from edgesdk.thermal.plan import (
        PREFILL_TO_DECODE,
        PlanInterrupted,
        Workload,
        compare,
        decode_rate_estimate,
    )

    if bundle is None and target is None:
        from edgesdk.errors import EdgeSDKError

        raise EdgeSDKError("thermal plan got neither BUNDLE nor --target: it needs a board to simulate and its "
                           "decode rate", "pass a bundle (edgesdk thermal plan bundles/smollm2-135m-rpi5), or a board "
                           "and a rate (edgesdk thermal plan --target rpi5 --decode-tok-s 35)")
    manifest = None
    if bundle is not None:  # always read: a missing or corrupt BUNDLE is an error even with --target
        from edgesdk.bundle import read_manifest

        manifest = read_manifest(bundle)
    profile = _plan_profile(bundle, target, manifest)
    how = "given"
    if decode_tok_s is None:
        if manifest is None:
            raise click.UsageError("give BUNDLE (its size sets the decode rate) or --decode-tok-s")
        packed = manifest.get("graph", {}).get("weights")  # an entropy-coded file: memory holds the inflated bytes
        weights = sum(packed["bytes"] if packed and name == packed["file"] else f["size"]
                      for name, f in manifest["files"].items() if name.startswith("model.onnx") or name.endswith(".data"))
        decode_tok_s = decode_rate_estimate(profile, weights)
        how = f"0.3 x {profile.memory.bandwidth_gbps:g} GB/s / {weights / 1e6:.1f} MB of weights"
    workload = Workload(prompt_tokens, new_tokens, think_s)
    check_plan_size(minutes, decode_tok_s, how, workload, prefill_tok_s)
    ambient = profile.thermal_model.ambient_c if ambient is None else ambient
    config = GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO) if clock_cap else None
    if telemetry_dir is not None:
        _make_telemetry_dir(telemetry_dir)
    try:
        runs = compare(profile, minutes, ambient, decode_tok_s, prefill_tok_s, workload, config,
                       telemetry_dir=str(telemetry_dir) if telemetry_dir else None)
    except PlanInterrupted as stop:
        for index, path in enumerate(stop.files):
            click.echo(f"edgesdk thermal plan: stopped; {path} is closed with " + (
                "every record written before the stop, each a whole line (that run is cut short)"
                if index == len(stop.files) - 1 else "the whole run"), err=True)
        raise
    guarded = runs["guarded"]
    result = {"profile": profile.name, "minutes": minutes, "ambient_c": ambient, "decode_tok_s": decode_tok_s,
              "decode_rate_source": how, "workload": workload.__dict__, "clock_cap": clock_cap,
              **{name: run.summary.to_json() for name, run in runs.items()},
              "guarded_paused_at_end": guarded.paused_at_end,
              "notes": ([paused_note(guarded)] if guarded.paused_at_end else []) + idle_heat_notes(guarded)
              + past_shutdown_notes(runs, profile.thermal.shutdown_c)
              + too_short_notes(runs["unguarded"], minutes, workload, prefill_tok_s or PREFILL_TO_DECODE * decode_tok_s,
                                decode_tok_s)
              + clock_cap_notes(profile, clock_cap)}
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"{profile.name}, {minutes:g} simulated min at {ambient:g} °C ambient; decode {decode_tok_s:.4g} tok/s "
               f"at full clock ({how}); requests of {prompt_tokens} + {new_tokens} tokens, {think_s:g} s apart"
               + (f"; the guard caps the clock at {CLOCK_CAP_RATIO:.1%} while pacing" if clock_cap else ""))
    rows = [("sustained tok/s (last third)", "sustained_tok_s", ".2f"), ("mean tok/s", "mean_tok_s", ".2f"),
            ("total tokens", "tokens", "d"), ("max temperature °C", "max_temp_c", ".1f"),
            ("firmware throttle s", "throttle_s", ".0f"), ("p95 inter-token ms", "p95_inter_token_ms", ".1f"),
            ("mean time to first token s", "mean_ttft_s", ".2f")]
    click.echo(f"  {'':<28} {'guarded':>10} {'unguarded':>10}")
    for title, key, fmt in rows:
        g, u = (_cell(result[name][key], fmt) for name in ("guarded", "unguarded"))
        click.echo(f"  {title:<28} {g:>10} {u:>10}")
    for note in result["notes"]:
        click.echo(f"note: {note}")


def clock_cap_notes(profile, clock_cap: bool) -> list[str]:
    """A note for ``plan --clock-cap`` on a board that is no Raspberry Pi 5: the simulated board's power under a capped
    clock follows the Raspberry Pi 5's operating points (edgesdk/thermal/simulator.py: 2.4 GHz at 0.915 V down to
    1.5 GHz at 0.82 V, power ~ f V^2) and the cap is the Pi 5's lowest point (CLOCK_CAP_RATIO), on every profile. The
    other boards' tables are others: a Raspberry Pi 4 (BCM2711) runs 1.5 GHz, 1.8 GHz on later boards, at its own
    voltages, so the Pi 5's 2.4 to 1.5 GHz span is no cap of it; a Jetson's CPU clock table and voltages differ too,
    and a Jetson may decode on its GPU, whose power a CPU cap barely moves (``run --clock-cap`` on such a board leaves
    the capped power unknown for that reason). A Pi 5 is told apart by its profile (``rpi5``, or a copy of it for
    another memory size, whose CPU is still the BCM2712). A note, not a refusal: the guarded run without the cap still
    holds, and the plan still shows what capping a Pi-5-like clock would do; the guarded figures with the cap are what
    would be taken for the board's, so they are flagged."""
    cpu_model = str(getattr(getattr(profile, "cpu", None), "model", "") or "")
    if not clock_cap or (profile.family == "rpi" and (profile.name == "rpi5" or "BCM2712" in cpu_model)):
        return []
    gpu = "; it may also decode on its GPU, whose power a CPU clock cap barely moves" if profile.gpu is not None else ""
    other = (" (a Raspberry Pi 4's CPU runs at 1.5 GHz, 1.8 GHz on later boards, at its own voltages)"
             if profile.family == "rpi" and ("BCM2711" in cpu_model or profile.name.startswith("rpi4")) else "")
    return [f"--clock-cap on {profile.name} ({profile.family}): the simulated cap follows the Raspberry Pi 5's clock "
            f"and voltage points (1.5-2.4 GHz, 0.82-0.915 V), not this board's{other}, so the guarded run's gain from "
            f"it is a Pi 5's, not a measurement of {profile.name}{gpu}; check it on the board with 'edgesdk run "
            "--watch-thermal --clock-cap --telemetry FILE', or compare the plan without --clock-cap"]


def _plan_profile(bundle: Path | None, target: str | None, manifest: dict | None):
    """The board ``thermal plan`` simulates (:func:`thermal_profile`). A bundle whose copy of its profile this
    edgesdk cannot read (built by an older one, a key missing) is refused with the bundle's own fix, "rebuild ... or
    leave the thermal guard off", which is ``run``'s: a plan has no guard to leave off, but it can simulate a shipped
    board's profile (``--target``) for the same bundle, whose size still sets the decode rate."""
    from edgesdk.errors import BundleError

    try:
        return thermal_profile(bundle, target, manifest)
    except BundleError as error:
        if target is not None:
            raise
        raise BundleError(error.problem, f"pass the board to plan for, e.g. edgesdk thermal plan {bundle} --target "
                          "rpi5 (edgesdk targets lists the boards), or rebuild the bundle with 'edgesdk build' "
                          "(the manifest's 'target' is a copy of the profile it was built for)") from error


def _make_telemetry_dir(path: Path) -> None:
    """Create ``--telemetry-dir``; one that cannot be (a file is in the way) is an EdgeSDKError naming it."""
    from edgesdk.errors import EdgeSDKError

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EdgeSDKError(f"--telemetry-dir {path}: cannot create the directory ({error.strerror or error})",
                           "pass a directory (new or existing) whose parents are directories, not files, "
                           "e.g. --telemetry-dir telemetry") from error


def _cell(value: float | int | None, fmt: str) -> str:
    """One cell of the plan table; "-" where there is no value (no step inside a short horizon, no request that
    reached its first token)."""
    return "-" if value is None else format(value, fmt)


def paused_note(run: SimulatedRun) -> str:
    """Why the guarded plan ended paused: the board never cooled below the guard's resume point, nor below the
    hard limit less the hysteresis, where a pause also ends after one time constant (edgesdk/thermal/guard.py
    ``Guard._stopped_cooling``)."""
    from edgesdk.thermal.guard import GuardConfig

    limits = run.telemetry.meta["limits"]
    resume = limits["resume_c"]
    why = (f"at {run.board.ambient_c:g} °C ambient it idles at {run.idle_c:.1f} °C, above the guard's resume "
           f"point {resume:g} °C" if run.idle_c >= resume else f"it had not cooled below {resume:g} °C yet")
    hard = limits.get("hard_c")
    end = "" if hard is None else \
        f", nor below {hard - GuardConfig().hysteresis_c:g} °C, where a pause ends after one time constant"
    return f"the guarded run was paused when the plan ended: the board never cooled below resume ({why}){end}"


def idle_heat_notes(run: SimulatedRun) -> list[str]:
    """A note when the simulated board idles (its thermal model's steady state with no work) at or above the guard's
    resume point, so within ``soft - resume`` of the soft limit or past it: the guard then holds its setpoint with
    only the heat of a trickle of tokens to spare (a bare Pi 5 at 45 °C ambient idles at 71.6 °C, 3.4 °C under its
    soft limit, and plans 1.25 tok/s guarded), and the fix is a cooler board, not a guard setting."""
    limits = run.telemetry.meta["limits"]
    resume, soft = limits["resume_c"], limits["soft_c"]
    idle, model = run.idle_c, run.board.model
    if idle < resume:
        return []
    where = f"at or above the soft limit {soft:g} °C" if idle >= soft else \
        f"{soft - idle:.1f} °C under the soft limit {soft:g} °C"
    ambient = run.board.ambient_c
    cooler = (f"; under {math.floor((resume - ambient) / model.idle_w * 10) / 10:g} °C/W it idles below the guard's resume point "
              f"{resume:g} °C at this ambient" if ambient < resume else "")
    coolest = resume - model.resistance_c_per_w * model.idle_w  # the ambient at which it idles at the resume point
    room = f", or lower the ambient below {math.floor(coolest * 10) / 10:.1f} °C" if coolest > AMBIENT_RANGE_C[0] else ""
    return [f"at {ambient:g} °C ambient the board idles at {idle:.1f} °C (the thermal model's steady state with no "
            f"work), {where}, so the guard lets a trickle of tokens through at most; fix: cool the board (a "
            "heatsink and fan) and plan with a copy of its profile whose thermal_model.resistance_c_per_w is the "
            f"cooled board's ({model.resistance_c_per_w:g} °C/W now{cooler}), passed as --target my-board.yaml{room}"]


def too_short_notes(unguarded: SimulatedRun, minutes: float, workload: Workload, prefill_tok_s: float,
                    decode_tok_s: float) -> list[str]:
    """A note when the plan ended before the unguarded run finished its first prefill: every figure is
    0 or "-" because nothing was timed, not because the board is slow. The ``--minutes`` it suggests holds
    three whole requests (the sustained rate is the last third's) even at the emulated firmware's lowest
    clock (a day at most), and at least the default 30; where that is no longer than the plan's, or a day
    cannot hold three requests even at full clock, the fix is a shorter or faster prompt."""
    from edgesdk.thermal.simulator import THROTTLE_CURVE, WorkModel

    if unguarded.summary.requests:
        return []
    prefill_s = workload.prompt_tokens / prefill_tok_s
    work = WorkModel(decode_tok_s, prefill_tok_s)

    def request_s(clock: float) -> float:  # one request at ``clock`` (a fraction of the full one)
        return (work.seconds("prefill", workload.prompt_tokens, clock)
                + work.seconds("decode", workload.new_tokens - 1, clock) + workload.think_s)

    # the longest plan: a day, or less where these requests' steps reach check_plan_size's limit first
    cap = min(MAX_MINUTES, longest_plan_minutes(decode_tok_s, workload, prefill_tok_s))
    longer = min(max(30.0, float(math.ceil(3 * request_s(THROTTLE_CURVE[-1][1]) / 60.0))), cap)
    if longer <= minutes or 3 * request_s(1.0) > cap * 60:  # not even the longest plan holds three requests
        fix = (f"a plan of these requests simulates at most --minutes {cap:g}: pass fewer --prompt-tokens or "
               "--new-tokens, or a higher --prefill-tok-s")
    elif longer == 30.0:
        fix = "pass a longer --minutes (e.g. --minutes 30: the board settles within minutes)"
    elif longer < cap:
        fix = (f"pass --minutes {longer:g} or more (three whole requests, even at the firmware's lowest clock: "
               "the sustained rate is the last third's)")
    else:
        fix = (f"pass --minutes {cap:g} (the longest plan; three whole requests fit in it at full clock: "
               "the sustained rate is the last third's)")
    return [f"the plan's {_seconds(minutes * 60)} simulated s end before the first request's prefill "
            f"({workload.prompt_tokens} tokens, {_seconds(prefill_s)} s at full clock) finished: no step was timed; "
            + fix]


def _seconds(value: float) -> str:
    """Seconds as a note prints them: 3 significant digits (0.914, 60), whole ones from 1,000 on (3,600, not the
    3.6e+03 that ``:.3g`` writes)."""
    return f"{value:,.0f}" if value >= 999.5 else f"{value:.3g}"  # 999.6 rounded to '1e+03' under .3g


def past_shutdown_notes(runs: dict[str, SimulatedRun], shutdown_c: float) -> list[str]:
    """A note for each run whose simulated board got to the shutdown point: the model heats on where a
    real board would have switched itself off, so that run's numbers do not hold."""
    return [f"the {name} run reached {run.summary.max_temp_c:.1f} °C, at or past the board's shutdown point "
            f"{shutdown_c:g} °C: a real board would have switched off, so its numbers do not hold"
            for name, run in runs.items()
            if run.summary.max_temp_c is not None and run.summary.max_temp_c >= shutdown_c]


@thermal.command("report")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", "-o", type=click.Path(path_type=Path),
              help="PNG path [FILE with .png; for a directory, report.png in it].")
@click.option("--title", help="Figure title.")
def report_cmd(files, out, title):
    """Render telemetry JSONL FILES (overlaid) as a PNG of temperature, guard level and tok/s. A directory stands for
    the .jsonl files in it (those 'thermal plan --telemetry-dir' writes)."""
    from edgesdk.thermal.report import render, telemetry_files

    listed = [(given, telemetry_files([given])) for given in files if given.is_dir()]  # one with none is refused
    for given, found in listed:
        click.echo(f"edgesdk thermal report: {given} is a directory; drawing the {len(found)} telemetry "
                   f"file{'s' if len(found) > 1 else ''} in it: {', '.join(map(str, found))}", err=True)
    if out is None:
        out = files[0] / "report.png" if files[0].is_dir() else files[0].with_suffix(".png")
    click.echo(str(render(files, out, title=title)))
