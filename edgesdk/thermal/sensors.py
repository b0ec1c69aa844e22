"""Board temperature sensors: Linux sysfs thermal zones, Raspberry Pi ``vcgencmd``, jetson-stats.

Every reader turns an unreadable value into "no data" (``None``), never into an exception or a
cold reading:

* sysfs (kernel ``Documentation/thermal/sysfs-api.rst``): ``thermal_zoneN/type`` names the zone,
  ``temp`` is in millidegree Celsius, ``trip_point_N_{temp,type,hyst}`` are the trips
  (``critical`` | ``hot`` | ``passive`` | ``active``). ``temp`` fails with ENODATA while a sensor has
  no data yet (``drivers/thermal/thermal_sysfs.c``).
* An offline Jetson sensor reads -256 °C (jetson-stats ``TEMPERATURE_OFFLINE = -256``; tegrastats
  prints ``GPU@-256C`` when rail-gated).
* A sysfs zone whose ``temp`` read fails (EAGAIN or EIO from an I2C sensor, ENODATA, a value that is no
  temperature) keeps its last good reading for ``HOLD_S`` (:class:`SysfsThermal`): one failed read of the
  hottest zone is no data about it, not a board as cool as the other zones.
* Raspberry Pi: ``vcgencmd measure_temp`` prints ``temp=48.3'C`` and is the authoritative reading;
  ``vcgencmd get_throttled`` prints ``throttled=0x50005`` (bits below; Raspberry Pi documentation,
  ``computers/os.adoc#get_throttled`` and ``frequency-management.adoc``).
* jetson-stats (``jtop``, AGPL-3.0) is imported only when installed (``pip install edgesdk[jetson]``).
* Without it, a Jetson's power mode is read from ``/var/lib/nvpmodel/status`` (``pmode:0002``, with ``fmode:...``
  beside it on some releases: what ``nvpmodel -m`` last set) and named from ``/etc/nvpmodel.conf``
  (``< POWER_MODEL ID=2 NAME=MAXN_SUPER >``), both under the file-system root above the thermal directory
  (:class:`NvpmodelStatus`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

THERMAL_ROOT_ENV = "EDGESDK_THERMAL_ROOT"  # another sysfs thermal directory (tests, containers with /sys elsewhere)
THERMAL_DIR = "sys/class/thermal"  # under the file-system root ("/" on a board)
OFFLINE_C = -256.0  # jetson-stats TEMPERATURE_OFFLINE: a rail-gated sensor, "no data", never cold
# How long a sysfs zone whose reads fail keeps its last good reading: 3 polls at the guard's poll_s of 0.5 s. A board
# warms far less than a degree in it (Raspberry Pi 5 bare board: RC = 238 s; Jetson: 180-200 s); the guard's stale_s
# (5 s) is longer, so a held value never outlives what the guard would take as fresh. A sensor polled every 2 s or
# slower has no read held: a failed one is no data at once, as before.
HOLD_S = 1.5
VALID_C = (-60.0, 200.0)  # anything outside is garbage, not a temperature
THROTTLED_BITS = {  # vcgencmd get_throttled
    0: "under_voltage", 1: "arm_freq_capped", 2: "throttled", 3: "soft_temp_limit",
    16: "under_voltage_occurred", 17: "arm_freq_capping_occurred", 18: "throttling_occurred",
    19: "soft_temp_limit_occurred",
}


@dataclass(frozen=True)
class Trip:
    """One sysfs trip point of a watched zone."""

    zone: str
    index: int
    kind: str  # critical | hot | passive | active
    temp_c: float
    hyst_c: float = 0.0


@dataclass
class Reading:
    """One poll of every watched sensor. ``None`` means no data.

    ``held``: the zones whose read failed in this poll and whose value in ``zones`` is therefore their last good
    reading, held for at most ``HOLD_S`` (:class:`SysfsThermal`), each with that reading's age in seconds.
    ``lost``: the zones whose reads have failed for longer than that (no data in ``zones``), each with its last good
    reading in °C, for as long as its reads fail: where one was hotter than every zone left, :attr:`max_c` understates
    the board (the guard takes such a poll as no data for ``lost_zone_s``, then the zones left plus the zone's last
    lead over them, :meth:`~edgesdk.thermal.guard.Guard._lost_hottest`).
    ``offline``: the zones that read their sensor's offline value (-256 °C: rail-gated, a Jetson's GPU zone while the
    GPU is off), no data in ``zones`` as a failed read is, but no fault: ``thermal sensors`` and the status line say
    "offline" for them, where "no data" and "SENSOR FAILED" sent owners looking for a broken sensor."""

    time: float
    zones: dict[str, float | None] = field(default_factory=dict)
    throttled: dict[str, bool] | None = None  # decoded get_throttled bits (Pi) or the simulator's flag
    power_w: dict[str, float] = field(default_factory=dict)  # rails / board power when known
    nvpmodel: str | None = None
    source: str = ""
    held: dict[str, float] = field(default_factory=dict)  # zone -> age (s) of the last good reading it holds
    lost: dict[str, float] = field(default_factory=dict)  # zone -> its last good reading (°C), reads failing since
    offline: list[str] = field(default_factory=list)  # zones reading -256 °C (rail-gated), in reading order

    @property
    def max_c(self) -> float | None:
        """The hottest zone with data; the guard acts on it."""
        values = [v for v in self.zones.values() if v is not None]
        return max(values) if values else None


def zone_fields(held: Mapping[str, float], lost: Mapping[str, float]) -> dict:
    """A telemetry record's fields for the zones whose reads failed, each only where it names one: ``held_zones``
    (zone -> age in s of the last good reading acted on, :attr:`Reading.held`) and ``lost_zones`` (zone -> that
    reading in °C, reads failing past the hold, :attr:`Reading.lost`)."""
    return {**({"held_zones": {zone: round(age, 3) for zone, age in held.items()}} if held else {}),
            **({"lost_zones": dict(lost)} if lost else {})}


def parse_celsius(value: float | None) -> float | None:
    """A temperature in °C, or None when offline (-256 °C) or outside a physical range."""
    if value is None or value <= OFFLINE_C + 1 or not VALID_C[0] <= value <= VALID_C[1]:
        return None
    return float(value)


def parse_millidegree(text: str) -> float | None:
    """sysfs ``temp`` text (m°C, e.g. ``"45123\\n"``) -> °C, None for garbage or offline."""
    try:
        return parse_celsius(int(text.strip()) / 1000.0)
    except (ValueError, OverflowError):  # not an integer, or too many digits for a float
        return None


def _offline(text: str) -> bool:
    """Is sysfs ``temp`` text a sensor's offline value (-256 °C), not a failed read?"""
    try:
        return int(text.strip()) / 1000.0 <= OFFLINE_C + 1
    except (ValueError, OverflowError):
        return False


def thermal_root() -> str:
    """The sysfs thermal directory the guard, ``thermal sensors``, ``env`` and ``bench`` read:
    ``$EDGESDK_THERMAL_ROOT`` or ``/sys/class/thermal``."""
    return os.environ.get(THERMAL_ROOT_ENV) or "/" + THERMAL_DIR


def filesystem_root(thermal_dir: str | Path) -> Path | None:
    """The file-system root above a sysfs thermal directory (``/host`` for ``/host/sys/class/thermal``: a container
    with the board's root mounted there), where the board's other files (``/var/lib/nvpmodel/status``) are read;
    None where the directory is not so named (a tree of zones alone): nothing above it is the board's."""
    parts = Path(thermal_dir).parts
    if len(parts) < 3 or parts[-3:] != tuple(THERMAL_DIR.split("/")):
        return None
    return Path(*parts[:-3]) if len(parts) > 3 else Path(".")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:  # missing file, ENODATA, EIO, permission
        return None


class SysfsThermal:
    """Thermal zones under ``root`` (``/sys/class/thermal``), picked by their ``type``.

    ``wanted`` are the profile's zone types; every zone of a wanted type is watched, the second
    and later zones of one type too (named ``type#N``). Types are compared without regard to case:
    JetPack 5 names an Orin's zones ``CPU-therm``, ``SOC0-therm`` ... but its junction zone
    ``tj-therm`` (tegrastats prints ``CPU@`` beside ``tj@``): a profile that writes ``Tj-therm`` still
    watches the zone the fan and the critical trip follow. When none of them exists (or none is asked for:
    a bundle whose target names no zones) every zone but a PMIC's is watched and :attr:`notes` says so.
    Tests pass a temporary directory as ``root``.

    A zone whose ``temp`` read fails (an error, or text that is no temperature) after a good one reads its last good
    value for ``hold_s`` seconds of that good read, and :attr:`Reading.held` names it with the value's age: a Jetson's
    ``tj-therm`` runs about 10 °C above ``cpu-thermal``, and one failed I2C read of it was a 10 °C drop of the poll's
    hottest zone, which let the guard run a hot board at full speed. Past ``hold_s`` it is no data, and
    :attr:`Reading.lost` keeps its last good value, so the guard can tell a hottest zone lost from a board that cooled
    (and, once it has been lost for the guard's ``lost_zone_s``, go on without it).
    A zone that reads offline (-256 °C: rail-gated) is no data at once, as it is no failed read.
    """

    def __init__(self, root: str | Path = "/sys/class/thermal", wanted: Sequence[str] = (),
                 clock: Callable[[], float] = time.monotonic, hold_s: float = HOLD_S):
        self.root = Path(root)
        self.clock = clock
        self.hold_s = hold_s
        self.last: dict[str, tuple[float, float]] = {}  # zone -> (clock time, °C) of its last good reading
        self.notes: list[str] = []
        found = self.discover(self.root)
        kinds = {kind.casefold() for kind in wanted}
        picked = {name: path for name, path in found.items() if zone_type(name).casefold() in kinds}
        if not picked and found:
            # A Jetson's PMIC-Die zone reads a fixed value (tegrastats' "PMIC@100C" on the TX family and
            # the Nano), not a die temperature: jetson-stats skips every zone whose type holds "PMIC"
            # (jtop/core/temperature.py), and so does this fallback; watched, it would pause a cool board.
            fixed = sorted(name for name in found if "PMIC" in zone_type(name))
            picked = {name: path for name, path in found.items() if name not in fixed}
            missing = f"none of the zones {list(wanted)} exist" if wanted else "no zone types were asked for"
            self.notes.append(f"{missing} under {self.root}; watching all of "
                              f"{sorted(picked)}" + (f" (not {', '.join(fixed)}: a PMIC zone reads a fixed "
                                                     "value, not a temperature)" if fixed else ""))
        self.zones: dict[str, Path] = picked

    @staticmethod
    def discover(root: Path) -> dict[str, Path]:
        """``type`` -> zone directory for every readable ``thermal_zone*`` (duplicates get ``#N``)."""
        zones: dict[str, Path] = {}
        for directory in sorted(root.glob("thermal_zone*"), key=lambda p: (len(p.name), p.name)):
            kind = _read_text(directory / "type")
            if not kind or not kind.strip():
                continue
            name = kind.strip()
            if name in zones:
                name = f"{name}#{directory.name.removeprefix('thermal_zone')}"
            zones[name] = directory
        return zones

    def __bool__(self) -> bool:
        return bool(self.zones)

    def read(self) -> Reading:
        reading = Reading(time=self.clock(), source="sysfs")
        for name, directory in self.zones.items():
            text = _read_text(directory / "temp")
            value = parse_millidegree(text) if text is not None else None
            reading.zones[name] = value
            if value is not None:
                self.last[name] = (reading.time, value)
            elif text is not None and _offline(text):  # rail-gated: no data, and no failed read to bridge
                self.last.pop(name, None)
                reading.offline.append(name)
            elif name in self.last:
                at, last = self.last[name]
                if reading.time - at <= self.hold_s:
                    reading.zones[name] = last
                    reading.held[name] = reading.time - at
                else:
                    reading.lost[name] = last
        return reading

    def trips(self) -> list[Trip]:
        """Every trip point of the watched zones, in the order of their numbers (``trip_point_2`` before
        ``trip_point_10``, as the kernel numbers them, not as text sorts); unreadable ones are skipped."""
        trips = []
        for name, directory in self.zones.items():
            for temp_file in sorted(directory.glob("trip_point_*_temp"), key=_trip_number):
                index_text = temp_file.name.removeprefix("trip_point_").removesuffix("_temp")
                kind = _read_text(directory / f"trip_point_{index_text}_type")
                temp_text = _read_text(temp_file)
                temp = parse_millidegree(temp_text) if temp_text is not None else None
                if kind is None or temp is None or not index_text.isdigit():
                    continue
                hyst_text = _read_text(directory / f"trip_point_{index_text}_hyst")
                hyst = parse_millidegree(hyst_text) if hyst_text is not None else None
                trips.append(Trip(name, int(index_text), kind.strip(), temp, hyst or 0.0))
        return trips


def _trip_number(temp_file: Path) -> tuple[int, str]:
    """Sort key of a ``trip_point_N_temp`` file: N as a number (a name that holds none sorts last)."""
    index_text = temp_file.name.removeprefix("trip_point_").removesuffix("_temp")
    return (int(index_text), "") if index_text.isdigit() else (1 << 62, temp_file.name)


def zone_type(name: str) -> str:
    """The sysfs ``type`` of a watched zone's name: ``acpitz#1`` (a second acpitz zone) -> ``acpitz``."""
    return name.split("#", 1)[0]


Runner = Callable[[list[str]], "str | None"]


class CommandHung(Exception):  # noqa: N818 (a sensor's "no data", never shown as an error)
    """A sensor command ran past its timeout and was killed."""


def run_command(args: list[str], timeout: float = 2.0) -> str | None:
    """stdout of a short command, or None when it is missing or fails; bytes that are not text in it
    are U+FFFD (a garbled line is no data to its parser, never a UnicodeDecodeError). A command that
    runs past ``timeout`` is killed and raises :class:`CommandHung`."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as error:
        raise CommandHung(f"{' '.join(args)} ran past {timeout:g} s") from error
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


_TEMP_RE = re.compile(r"temp=([-+]?\d+(?:\.\d+)?)'C")
_THROTTLED_RE = re.compile(r"throttled=(0[xX][0-9a-fA-F]+|\d+)\b")  # a whole number: "0x" cut short is no data


def parse_measure_temp(text: str | None) -> float | None:
    """``temp=48.3'C`` -> 48.3; None for anything else."""
    match = _TEMP_RE.search(text or "")
    return parse_celsius(float(match.group(1))) if match else None


def parse_throttled(text: str | None) -> dict[str, bool] | None:
    """``throttled=0x50005`` -> the named bits (now: bits 0-3, since boot: bits 16-19)."""
    match = _THROTTLED_RE.search(text or "")
    if not match:
        return None
    digits = match.group(1)
    try:  # base 0 would refuse "010"; int() refuses more than 4300 decimal digits
        value = int(digits, 16) if digits[:2] in ("0x", "0X") else int(digits)
    except ValueError:
        return None
    return {name: bool(value >> bit & 1) for bit, name in THROTTLED_BITS.items()}


class Vcgencmd:
    """Raspberry Pi firmware readings through ``vcgencmd`` (``runner`` is injectable for tests).

    A ``vcgencmd`` that hangs (the firmware mailbox does not answer) is killed after the runner's
    timeout, and is not run again for ``retry_s``: its readings are no data meanwhile. Every poll
    would otherwise block on it for the timeout of both commands, and the sysfs zones read beside it
    in the same poll would reach the guard that much older (stale, at the defaults: a sensor failure
    on a board whose sysfs reading is fine).
    """

    zone = "vcgencmd"

    def __init__(self, runner: Runner = run_command, binary: str = "vcgencmd",
                 clock: Callable[[], float] = time.monotonic, retry_s: float = 30.0):
        self.runner = runner
        self.binary = binary
        self.clock = clock
        self.retry_s = retry_s
        self.quiet_until: float | None = None  # clock time before which a hung vcgencmd is not run

    @classmethod
    def available(cls, which: Callable[[str], str | None] = shutil.which) -> bool:
        return which("vcgencmd") is not None

    def read(self) -> Reading:
        if self.quiet_until is not None and self.clock() < self.quiet_until:
            return Reading(time=self.clock(), zones={self.zone: None}, source="vcgencmd")
        try:
            temp = parse_measure_temp(self.runner([self.binary, "measure_temp"]))
            throttled = parse_throttled(self.runner([self.binary, "get_throttled"]))
        except CommandHung:
            self.quiet_until = self.clock() + self.retry_s
            return Reading(time=self.clock(), zones={self.zone: None}, source="vcgencmd")
        self.quiet_until = None
        return Reading(time=self.clock(), zones={self.zone: temp}, throttled=throttled, source="vcgencmd")


class Jtop:
    """jetson-stats: temperatures, power rails and the nvpmodel name (exact names: reference §2b).

    ``zones`` are the profile's sysfs zone types: only jtop's temperatures of those zones are kept
    (jtop names a zone by its type cut at a ``-`` or ``_``, :func:`jtop_name`, and keeps its case: ``CPU`` on
    JetPack 5, ``cpu`` on JetPack 6), compared without regard to case as :class:`SysfsThermal` compares them;
    jtop also lists hwmon sensors (an NVMe drive's ``Composite``, a Wi-Fi card) whose heat is not the SoC's.
    When none of them is listed, every one is kept.

    A jtop whose service died (``jtop.service`` stopped or restarted) keeps its last stats for ever: its
    reader thread stores the error ("Lost connection with jtop server") and ends, and ``temperature``,
    ``power`` and ``nvpmodel`` go on returning what it read last. Every read therefore asks
    ``jetson.ok(spin=True)`` first, which raises that stored error without waiting (False once closed), and
    takes stats that jtop has not renewed for ``STALE_INTERVALS`` intervals (jtop's own ``TIMEOUT_GAIN``, after
    which ``ok()`` gives up) as no data; their age is tracked with ``jetson.attach``, called on every update.
    (``jetson.stats['time']`` cannot tell: it is ``datetime.now()`` at the moment it is read.)

    Raises ImportError when jetson-stats is not installed; it is never a hard dependency.
    """

    STALE_INTERVALS = 3  # jetson-stats TIMEOUT_GAIN: ok() waits interval x 3 for new data

    def __init__(self, interval_s: float = 1.0, zones: Sequence[str] = (),
                 clock: Callable[[], float] = time.monotonic):
        from jtop import jtop  # AGPL-3.0, optional extra [jetson]

        self.wanted = {jtop_name(zone).casefold() for zone in zones}  # jtop names, compared without case
        self.clock = clock
        self.jetson = jtop(interval=interval_s)
        self.jetson.attach(self._updated)
        self.jetson.start()  # returns once the first stats have arrived
        self.updated = self.clock()  # clock time of the last stats jtop received
        self.interval_s = interval_s

    @property
    def stale_after_s(self) -> float:
        """How long stats may go unrenewed: ``STALE_INTERVALS`` of the service's interval, read at each call (another
        client may slow the service at any time: "Another jtop set speed to ..."), or of ours where it is shorter."""
        served = getattr(self.jetson, "interval", None)
        served = served if isinstance(served, (int, float)) and not isinstance(served, bool) and served > 0 else 0
        return self.STALE_INTERVALS * max(self.interval_s, served)

    def _updated(self, jetson: object) -> None:
        """jtop's observer: called from its reader thread with every new set of stats."""
        self.updated = self.clock()

    def read(self) -> Reading:
        reading = Reading(time=self.clock(), source="jtop")
        try:
            if not self.jetson.ok(spin=True):  # raises the reader thread's error: the service is gone
                raise ConnectionError("jtop is closed")
            if reading.time - self.updated > self.stale_after_s:
                raise TimeoutError(f"jtop has sent no stats for {reading.time - self.updated:.1f} s")
            temperatures = dict(self.jetson.temperature)
            kept = {name: values for name, values in temperatures.items() if name.casefold() in self.wanted}
            temperatures = kept or temperatures
            for name, values in temperatures.items():
                online, temp = values.get("online", True), values.get("temp")
                reading.zones[f"jtop:{name}"] = parse_celsius(temp) if online else None
                if not online or (isinstance(temp, (int, float)) and temp <= OFFLINE_C + 1):
                    reading.offline.append(f"jtop:{name}")
            power = dict(self.jetson.power)
            for name, rail in dict(power.get("rail", {})).items():
                if rail.get("online", True) and rail.get("power") is not None:
                    reading.power_w[name] = float(rail["power"]) / 1000.0  # mW -> W
            total = power.get("tot") or {}
            if total.get("power") is not None:
                reading.power_w["total"] = float(total["power"]) / 1000.0
            model = self.jetson.nvpmodel
            reading.nvpmodel = str(model.name) if model is not None else None
        except Exception:  # a broken jtop socket is "no data", never a crash
            reading.zones = {name: None for name in reading.zones} or {"jtop": None}
            reading.offline = []
        return reading

    def close(self) -> None:
        try:
            self.jetson.close()
        except Exception:
            pass


def jtop_name(zone_type: str) -> str:
    """jetson-stats' name for a sysfs thermal zone type (``jtop/core/temperature.py``): cut at the first
    ``-``, or at the first ``_`` when there is no ``-`` (``tj-thermal`` -> ``tj``, ``Tboard_tegra`` -> ``Tboard``)."""
    return zone_type.split("-")[0] if "-" in zone_type else zone_type.split("_")[0]


NVPMODEL_STATUS = "var/lib/nvpmodel/status"  # under the file-system root: "pmode:0002" (what nvpmodel -m last set)
NVPMODEL_CONF = "etc/nvpmodel.conf"  # ... and the modes' names: "< POWER_MODEL ID=2 NAME=MAXN_SUPER >"
_PMODE_RE = re.compile(r"\bpmode:(\d+)")
_POWER_MODEL_RE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>")


def parse_nvpmodel_status(text: str | None, names: Mapping[int, str]) -> str | None:
    """``pmode:0002 fmode:quiet`` -> the mode's name in ``names`` (``MAXN_SUPER``), ``mode 2`` where it has none;
    None for anything else."""
    match = _PMODE_RE.search(text or "")
    if not match:
        return None
    mode = int(match.group(1))
    return names.get(mode, f"mode {mode}")


def nvpmodel_names(text: str | None) -> dict[int, str]:
    """Mode number -> name from ``/etc/nvpmodel.conf``'s ``< POWER_MODEL ID=N NAME=... >`` lines (comment lines, which
    start with ``#``, left out)."""
    names: dict[int, str] = {}
    for line in (text or "").splitlines():
        match = _POWER_MODEL_RE.search(line)
        if match and not line.lstrip().startswith("#"):
            names.setdefault(int(match.group(1)), match.group(2))
    return names


class NvpmodelStatus:
    """A Jetson's power mode without jetson-stats: ``var/lib/nvpmodel/status`` under ``root``, read at every poll (a
    ``sudo nvpmodel -m N`` during a run changes it), named from ``etc/nvpmodel.conf`` as it stood at the start.

    The power mode sets the board's clocks and power ceiling, so a telemetry file (or a bug report about speed) without
    it cannot tell a hot board from one in a 7 W mode; only jtop's reading held it, so a board without jetson-stats
    (the ``[jetson]`` extra is AGPL and optional) recorded none."""

    zone = "nvpmodel"
    LINK_HOPS = 40  # symbolic links followed before a path is taken as unresolvable (Linux's own MAXSYMLINKS)

    def __init__(self, root: str | Path, clock: Callable[[], float] = time.monotonic):
        self.root = Path(root)
        self.status = self.under_root(self.root, NVPMODEL_STATUS)
        self.clock = clock
        self.names = nvpmodel_names(_read_text(self.under_root(self.root, NVPMODEL_CONF)))

    @classmethod
    def available(cls, root: str | Path) -> bool:
        return cls.under_root(Path(root), NVPMODEL_STATUS).is_file()

    @classmethod
    def under_root(cls, root: Path, relative: str) -> Path:
        """``relative`` under ``root`` with every symbolic link on the way followed inside ``root``, as the board
        itself would follow it. JetPack's ``/etc/nvpmodel.conf`` is a link with an absolute target
        (``/etc/nvpmodel/nvpmodel_p3767_0000.conf`` on an Orin Nano / NX): with the board's root mounted at ``/host``
        in a container, the operating system resolves that target in the container's own root, where it is absent,
        and every mode read as ``mode N`` without its name. An absolute target restarts at ``root``; ``..`` stops at
        it. A loop (more than LINK_HOPS links) gives the path unresolved, which then reads as missing."""
        root = Path(root)
        parts = [part for part in Path(relative).parts if part not in ("/", ".")]
        path, hops = root, 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                path = path.parent if path != root else root
                continue
            try:
                target = os.readlink(path / part)
            except OSError:  # no link there (a file, a directory, nothing): taken as it is
                path = path / part
                continue
            hops += 1
            if hops > cls.LINK_HOPS:
                return root / relative
            if os.path.isabs(target):
                path = root
            parts = [piece for piece in Path(target).parts if piece not in ("/", ".")] + parts
        return path

    def read(self) -> Reading:
        return Reading(time=self.clock(), nvpmodel=parse_nvpmodel_status(_read_text(self.status), self.names),
                       source="nvpmodel")


class Combined:
    """Several sensors read as one: zones and power merged, vcgencmd's throttle bits kept."""

    def __init__(self, sensors: Sequence[object], names: Sequence[str]):
        self.sensors = list(sensors)
        self.source = "+".join(names)

    def read(self) -> Reading:
        merged = Reading(time=time.monotonic(), source=self.source)
        for sensor in self.sensors:
            try:
                part = sensor.read()
            except Exception:  # one broken sensor must not stop the others
                continue
            merged.zones.update(part.zones)
            merged.held.update(part.held)
            merged.lost.update(part.lost)
            merged.offline += part.offline
            merged.power_w.update(part.power_w)
            merged.throttled = part.throttled if part.throttled is not None else merged.throttled
            merged.nvpmodel = part.nvpmodel or merged.nvpmodel
        return merged

    def close(self) -> None:
        for sensor in self.sensors:
            if hasattr(sensor, "close"):
                sensor.close()


def detect_sensors(zones: Sequence[str], root: str | Path = "/sys/class/thermal",
                   which: Callable[[str], str | None] = shutil.which, use_jtop: bool = True,
                   family: str | None = None) -> tuple[Combined | None, list[Trip], list[str]]:
    """Every sensor this machine has, its trip points, and a note for each choice made.

    ``family``: the profile's (``rpi``, ``jetson``, ``host``). A Raspberry Pi profile without ``vcgencmd`` on PATH is
    noted (:func:`missing_vcgencmd_note`): its firmware's under-voltage and throttle bits are never read then, so the
    guard cannot pace for them. Without jetson-stats, a Jetson's power mode is read from the nvpmodel status file
    under the file-system root above ``root`` (:class:`NvpmodelStatus`), beside a temperature sensor only."""
    notes: list[str] = []
    sensors, names = [], []
    sysfs = SysfsThermal(root, zones)
    notes += sysfs.notes
    if sysfs:
        sensors.append(sysfs)
        names.append(f"sysfs {', '.join(sysfs.zones)}")
    else:
        notes.append(f"no thermal zones under {root}")
    binary = which("vcgencmd")
    if binary is not None:
        vcgencmd = Vcgencmd(binary=binary)
        sensors.append(vcgencmd)
        names.append("vcgencmd")
        notes += vcgencmd_notes(vcgencmd.read(), binary, hung=vcgencmd.quiet_until is not None)
    elif family == "rpi":
        notes.append(missing_vcgencmd_note())
    jtop = False
    if use_jtop:
        try:
            sensors.append(Jtop(zones=zones))
            names.append("jetson-stats")
            jtop = True
        except ImportError:
            pass  # not a Jetson, or the [jetson] extra is not installed: nothing to say
        except Exception as exc:  # jtop.service down, not in group 'jtop'
            notes.append(f"jetson-stats is installed but unusable ({exc}); power rails unknown")
    above = filesystem_root(root)
    if sensors and not jtop and above is not None and NvpmodelStatus.available(above):  # the mode, not a temperature
        sensors.append(NvpmodelStatus(above))
        names.append("nvpmodel")
    trips = sysfs.trips() if sysfs else []
    return (Combined(sensors, names) if sensors else None), trips, notes


def missing_vcgencmd_note() -> str:
    """The note for a Raspberry Pi profile whose machine has no ``vcgencmd`` on PATH: the sysfs zone still gives a
    temperature, but the firmware's ``get_throttled`` bits (under-voltage, frequency capping, throttling) come from
    ``vcgencmd`` alone, and the guard's fixed pace while they are set never happens, without a word (a container
    image without the Raspberry Pi tools, a Pi running Ubuntu without them installed)."""
    return ("vcgencmd is not on PATH: the firmware's temperature and its get_throttled bits (under-voltage, frequency "
            "capping, throttling) are not read, so the guard cannot pace while the firmware limits the board; install "
            "it (Raspberry Pi OS: sudo apt install raspi-utils; older releases and Ubuntu: libraspberrypi-bin), and in "
            "a container also pass the firmware's device to it (docker run --device /dev/vcio)")


def vcgencmd_notes(reading: Reading, binary: str, hung: bool = False) -> list[str]:
    """A note when an installed ``vcgencmd`` gave no temperature: the firmware's reading, which the Raspberry Pi
    documentation calls authoritative, is then missing from every poll, and nothing else would say why. ``hung``:
    it did not answer in time (a firmware mailbox that hangs), which no group membership mends."""
    if reading.zones.get(Vcgencmd.zone) is not None:
        return []
    lost = (f"{binary} measure_temp gave no temperature (the firmware's reading and its get_throttled bits are "
            "no data; the guard reads the other sensors only)")
    if hung:
        return [f"{lost}: it did not answer within its timeout, and is tried again later; check the firmware with "
                "'vcgencmd measure_temp', and reboot the board if it hangs there too"]
    return [f"{lost}: a user outside the group 'video' cannot open /dev/vcio; run 'sudo usermod -aG video $USER' "
            "and log in again, then check with 'vcgencmd measure_temp', which prints the cause"]


class Poller:
    """Reads a sensor every ``interval_s`` on a daemon thread; :attr:`latest` is the last reading."""

    def __init__(self, sensor: object, interval_s: float = 0.5):
        self.sensor = sensor
        self.interval_s = interval_s
        self.latest: Reading | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edgesdk-thermal-poll", daemon=True)

    def start(self) -> Poller:
        self.latest = self._safe_read()
        self._thread.start()
        return self

    def _safe_read(self) -> Reading | None:
        try:
            return self.sensor.read()
        except Exception:  # a sensor failure is "no data"; the guard warns
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            reading = self._safe_read()
            if reading is not None:
                self.latest = reading

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval_s + 1)
        if hasattr(self.sensor, "close"):
            self.sensor.close()
