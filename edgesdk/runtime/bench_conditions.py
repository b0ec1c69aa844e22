"""What the board was doing around ``edgesdk bench``: clocks, temperatures, throttling, load.

A tok/s figure without its conditions cannot be reproduced: the same board decodes at very
different speeds under another power mode, a capped clock, after heat-soak or beside other work
(jetson-containers#532 reports 20.6 tok/s where the published figure for the same model and board
was far higher; the Pi firmware halves the clock at 80-85 °C). ``bench`` records, before and after
its tests:

* the cpufreq driver and policies: governor, current and maximum clock against the hardware's maximum
  (``/sys/devices/system/cpu/cpufreq/policy*``; ``$EDGESDK_CPUFREQ_ROOT`` moves the root);
* the temperatures of the profile's thermal zones, Raspberry Pi's ``get_throttled`` bits and
  Jetson's nvpmodel mode where jetson-stats is installed (the thermal guard's sensors,
  ``$EDGESDK_THERMAL_ROOT`` moves the sysfs root);
* the 1-minute load average, against the cores, and the CPU time of the cores this process may run on
  and of this process (``/proc/stat``'s ``cpuN`` lines of the CPUs in its affinity, ``sched_getaffinity``,
  and ``/proc/self/stat``'s utime and stime, proc(5)), also around each test: the difference over the tests
  (not over a ``--delay`` cool-off or a model load between them) is the other
  processes' work on those cores while the tests ran, which the load average (a minute's decaying mean
  of the whole machine, taken before the run) misses when it starts during the run and counts when it
  was a previous run that has ended. A bench pinned with ``taskset`` (or a cpuset) counts only its own
  cores: work on the cores it does not use takes nothing from it;

and turns what would make the figures low into warnings: a clock of the cores the bench may run on capped below
the hardware's maximum or held by the ``powersave`` governor (the generic one: the ``powersave`` of intel_pstate and
amd-pstate-epp in active mode picks the clock from the load, as schedutil does; kernel
``Documentation/admin-guide/pm/intel_pstate.rst``, ``amd-pstate.rst``), throttling or under-voltage
during the run, a board that ended near its throttle point, and other work on the cores (before the run
or during it). A machine without these files (a container, a laptop) records them as unknown.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from edgesdk.thermal.cpufreq import CPUFREQ_DIR, cpufreq_root
from edgesdk.thermal.sensors import detect_sensors

NEAR_THROTTLE_C = 5.0  # a hottest zone within this of the throttle point after the run is worth a warning
BUSY_LOAD_PER_CORE = 0.5  # a 1-minute load average above this per core before the run: other work shares the cores
OTHER_CPU_CORES = 0.5  # other processes busy on more than this many cores on average during the run
# /proc/stat's cpu fields that are work (proc(5)); guest and guest_nice are already inside user and nice
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal
NOW_BITS = ("under_voltage", "arm_freq_capped", "throttled", "soft_temp_limit")
# cpufreq drivers whose own "powersave" algorithm follows the load: only the generic governor holds the lowest clock
DYNAMIC_POWERSAVE_DRIVERS = ("intel_pstate", "amd-pstate-epp")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _mhz(path: Path) -> float | None:
    text = _read(path)
    try:
        khz = int(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None
    return round(khz / 1000, 1) if khz is not None and 0 <= khz < 10**9 else None  # past 1 THz: garbage


def read_clocks(root: str | os.PathLike | None = None) -> list[dict]:
    """Each cpufreq policy: name, CPUs, governor, current / maximum / hardware maximum MHz (None unknown)."""
    base = Path(root if root is not None else cpufreq_root()) / CPUFREQ_DIR
    try:
        policies = sorted((p for p in base.iterdir() if p.name.startswith("policy")),
                          key=lambda p: int(p.name[6:]) if p.name[6:].isascii() and p.name[6:].isdigit() else 0)
    except OSError:
        return []
    return [{"policy": policy.name, "cpus": _read(policy / "affected_cpus"),
             "governor": _read(policy / "scaling_governor"), "cur_mhz": _mhz(policy / "scaling_cur_freq"),
             "max_mhz": _mhz(policy / "scaling_max_freq"), "hardware_max_mhz": _mhz(policy / "cpuinfo_max_freq")}
            for policy in policies]


def read_driver(root: str | os.PathLike | None = None) -> str | None:
    """The cpufreq scaling driver (one for the whole system; each policy's ``scaling_driver`` names it)."""
    base = Path(root if root is not None else cpufreq_root()) / CPUFREQ_DIR
    try:
        policies = sorted(base.glob("policy*"))
    except OSError:
        return None
    return next((driver for policy in policies if (driver := _read(policy / "scaling_driver"))), None)


def _ticks_per_s() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return 100  # USER_HZ on every Linux architecture


def affinity_cpus() -> list[int] | None:
    """The CPU numbers this process may run on (``taskset``, a cpuset; ``sched_getaffinity``), None where the
    platform does not say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return None


def read_cpu_seconds(proc_root: str | os.PathLike = "/proc", cpus: Sequence[int] | None = None
                     ) -> tuple[float | None, float | None]:
    """(CPU seconds the CPUs have spent working since boot, CPU seconds of this process and its threads), each
    None where unreadable: ``stat``'s aggregate ``cpu`` line, or where ``cpus`` names CPUs (the affinity) the sum of
    their ``cpuN`` lines (an offline CPU has none), and ``self/stat``'s utime and stime (proc(5))."""
    hz = _ticks_per_s()
    machine = own = None
    text = _read(Path(proc_root) / "stat")
    wanted = None if cpus is None else {f"cpu{cpu}" for cpu in cpus}
    lines = [line.split() for line in (text.splitlines() if text else [])]
    if wanted is None:
        lines = [line for line in lines[:1] if line and line[0] == "cpu"]
    else:
        lines = [line for line in lines if line and line[0] in wanted]
    if lines and all(len(line) > max(BUSY_FIELDS) + 1 for line in lines):
        try:
            machine = sum(int(line[1 + index]) for line in lines for index in BUSY_FIELDS) / hz
        except ValueError:
            machine = None
    text = _read(Path(proc_root) / "self" / "stat")
    fields = text.rpartition(")")[2].split() if text and ")" in text else []  # the name may hold spaces
    if len(fields) > 12:
        try:
            own = (int(fields[11]) + int(fields[12])) / hz  # utime and stime: fields 14 and 15 of the line
        except ValueError:
            own = None
    return machine, own


def snapshot(zones: Sequence[str], thermal_root: str | os.PathLike | None = None,
             cpufreq_root_dir: str | os.PathLike | None = None, use_jtop: bool = True,
             proc_root: str | os.PathLike = "/proc") -> dict:
    """One reading of the conditions (see the module docstring)."""
    root = thermal_root or os.environ.get("EDGESDK_THERMAL_ROOT", "/sys/class/thermal")
    sensor, _, _ = detect_sensors(zones, root, use_jtop=use_jtop)
    temperatures, throttled, nvpmodel = {}, None, None
    if sensor is not None:
        try:
            reading = sensor.read()
            temperatures = {name: value for name, value in reading.zones.items() if value is not None}
            throttled, nvpmodel = reading.throttled, reading.nvpmodel
        finally:
            sensor.close()
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not every platform keeps one (Windows has no getloadavg)
        load = None
    return {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **cpu_times(proc_root), "load_1min": load,
            "clocks": read_clocks(cpufreq_root_dir), "cpufreq_driver": read_driver(cpufreq_root_dir),
            "temperatures_c": temperatures, "throttled": throttled,
            "nvpmodel": nvpmodel}


def cpu_times(proc_root: str | os.PathLike = "/proc") -> dict:
    """The CPU-time part of a :func:`snapshot`: the monotonic clock, the affinity's CPUs, their busy CPU seconds and
    this process's (:func:`read_cpu_seconds`). ``bench`` takes one before and one after each test, so that other
    work is counted while the tests run (:func:`during_tests`), not during a ``--delay`` cool-off or a model load."""
    cpus = affinity_cpus()
    machine_s, own_s = read_cpu_seconds(proc_root, cpus)
    return {"monotonic_s": time.monotonic(), "cpus": cpus, "cpu_busy_s": machine_s, "own_cpu_s": own_s}


def during_tests(spans: Sequence[tuple[dict, dict]]) -> dict | None:
    """The CPU time of the tests alone: each (:func:`cpu_times` before a test, after it) summed, as ``windows`` (how
    many), ``wall_s``, ``cpu_busy_s`` and ``own_cpu_s``, with the affinity's ``cpus``; None without spans, or where a
    reading is unknown or the affinity changed (the sums would count other CPUs)."""
    keys = ("cpu_busy_s", "own_cpu_s", "monotonic_s")
    if not spans or any(reading.get(key) is None for span in spans for reading in span for key in keys) or \
            len({tuple(reading["cpus"] or ()) for span in spans for reading in span}) != 1:
        return None
    return {"windows": len(spans), "cpus": spans[0][0]["cpus"],
            **{name: sum(end[key] - start[key] for start, end in spans)
               for name, key in (("wall_s", "monotonic_s"), ("cpu_busy_s", "cpu_busy_s"), ("own_cpu_s", "own_cpu_s"))}}


def warnings(before: dict, after: dict, cores: int, throttle_c: float | None = None) -> list[str]:
    """What in the conditions makes the figures lower than the board can do."""
    found = []
    load, others = before.get("load_1min"), other_cores(before, after)
    # The load average is the fallback where the CPU times are unknown: it also counts work that ended before the run
    if others is None and load is not None and load > BUSY_LOAD_PER_CORE * cores:
        found.append(f"the 1-minute load average was {load} on {cores} cores before the run: other work may "
                     "have shared the cores (run nothing else heavy while benchmarking)")
    if others is not None and others > OTHER_CPU_CORES:
        where = f" of the {len(after['cpus'])} this bench may run on" if after.get("cpus") else ""
        found.append(f"other processes kept {others:.1f} cores{where} busy on average while the tests ran: they "
                     "shared the cores (run nothing else heavy while benchmarking)")
    for clock in (clock for clock in after.get("clocks", []) if _runs_on(clock, after.get("cpus"))):
        name = f"{clock['policy']} (cpus {clock['cpus']})" if clock.get("cpus") else clock["policy"]
        if clock.get("governor") == "powersave" and after.get("cpufreq_driver") not in DYNAMIC_POWERSAVE_DRIVERS:
            found.append(f"{name} runs the powersave governor, which holds the lowest clock "
                         "(echo performance or schedutil to its scaling_governor)")
        if clock.get("max_mhz") and clock.get("hardware_max_mhz") and clock["max_mhz"] < clock["hardware_max_mhz"]:
            found.append(f"{name} is capped at {clock['max_mhz']:g} of {clock['hardware_max_mhz']:g} MHz "
                         "(scaling_max_freq: nvpmodel, a thermal guard's --clock-cap or a user)")
    bits_before, bits_after = before.get("throttled") or {}, after.get("throttled") or {}
    now = [bit for bit in NOW_BITS if bits_after.get(bit)]
    new = [bit for bit, value in bits_after.items() if bit.endswith("_occurred") and value and not bits_before.get(bit)]
    # a board already throttled as the run began set its *_occurred bits before it, so only its "now" bits then tell
    began = [f"{bit} as the run began" for bit in NOW_BITS if bits_before.get(bit) and bit not in now]
    if now or new or began:
        # bits set only as the run began tell of a board throttled then, not of one that slowed during the run
        what = " and ".join(words for words, told in (("was already throttled as the run began", began),
                                                      ("slowed itself during the run", now or new)) if told)
        found.append(f"the firmware reports {', '.join(now + new + began)} (vcgencmd get_throttled): the board "
                     f"{what}, so the figures are low (cool it, check its power supply)")
    hottest = max(after.get("temperatures_c", {}).values(), default=None)
    if throttle_c is not None and hottest is not None and hottest >= throttle_c - NEAR_THROTTLE_C:
        found.append(f"the hottest zone read {hottest:g} °C after the run, within {NEAR_THROTTLE_C:g} °C of the "
                     f"{throttle_c:g} °C throttle point: a longer run would throttle")
    return found


def _runs_on(clock: dict, cpus: Sequence[int] | None) -> bool:
    """Whether the cpufreq policy ``clock`` drives a CPU of ``cpus``, the ones this bench may run on (its affinity):
    a policy of other cores (a cluster a ``taskset`` keeps the bench off, or one whose cores are all offline, whose
    ``affected_cpus`` is empty) slows nothing it ran. True where either is unknown."""
    listed = clock.get("cpus")
    if cpus is None or listed is None or not all(cpu.isdigit() for cpu in listed.split()):
        return True
    return not set(cpus).isdisjoint(int(cpu) for cpu in listed.split())


def other_cores(before: dict, after: dict) -> float | None:
    """Cores the other processes kept busy on average while the tests ran, counting only the CPUs the snapshots'
    ``cpu_busy_s`` covers (this process's affinity): over the tests alone where ``after`` holds ``during_tests``
    (:func:`during_tests`: a ``--delay`` cool-off between the tests and the model loads are not the tests' time),
    else between the two snapshots; None where unknown, or where the affinity changed between them (the two sums
    count other CPUs).

    ``/proc/stat`` and ``/proc/self/stat`` count whole clock ticks (USER_HZ, proc(5)), so each CPU's line and the
    process's time can each be a tick off across two readings: over a run of a few milliseconds (``bench -p 8
    -n 0 -r 1``) one tick read as 10 cores of a 2-core board. Other work within that error, (CPUs + 1) ticks a
    window, is none, and it is never more cores than were counted."""
    during = after.get("during_tests")
    if during is not None:
        busy, own, wall, windows, cpus = (during["cpu_busy_s"], during["own_cpu_s"], during["wall_s"],
                                          during["windows"], during.get("cpus"))
    else:
        keys = ("cpu_busy_s", "own_cpu_s", "monotonic_s")
        if any(before.get(key) is None or after.get(key) is None for key in keys) or \
                before.get("cpus") != after.get("cpus"):
            return None
        busy, own = after["cpu_busy_s"] - before["cpu_busy_s"], after["own_cpu_s"] - before["own_cpu_s"]
        wall, windows, cpus = after["monotonic_s"] - before["monotonic_s"], 1, after.get("cpus")
    if wall <= 0:
        return None
    counted = len(cpus) if cpus else (os.cpu_count() or 1)  # the affinity, or every CPU
    others = busy - own
    if others <= windows * (counted + 1) / _ticks_per_s():  # what the ticks cannot tell from no work (nor a skew)
        return 0.0
    return min(others / wall, float(counted))  # the files are read a moment apart: no more cores than there are


def summary(before: dict, after: dict) -> str:
    """One line for the table: clocks, temperatures before and after, load, throttling."""
    parts = []
    clocks = after.get("clocks") or []
    if clocks:
        parts.append("; ".join(f"{c['policy']} {c.get('governor') or '?'} max {c.get('max_mhz') or '?'}"
                               f"/{c.get('hardware_max_mhz') or '?'} MHz" for c in clocks))
    else:
        parts.append("clocks unknown (no cpufreq)")
    first, last = before.get("temperatures_c") or {}, after.get("temperatures_c") or {}
    if last:
        parts.append(", ".join(f"{zone} {first.get(zone, '?')} -> {value} °C" for zone, value in last.items()))
    else:
        parts.append("temperature unknown (no thermal zones)")
    if before.get("load_1min") is not None:
        parts.append(f"load {before['load_1min']}")
    if (others := other_cores(before, after)) is not None:
        parts.append(f"other processes {others:.2f} cores during the run")
    if after.get("nvpmodel"):
        parts.append(f"nvpmodel {after['nvpmodel']}")
    if after.get("throttled") is not None:
        throttled = [bit for bit, value in after["throttled"].items() if value]
        parts.append(f"get_throttled: {', '.join(throttled) if throttled else 'none'}")
    return "conditions: " + ", ".join(parts)
