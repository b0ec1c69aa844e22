"""The CPU clock cap: the guard's second lever, through Linux cpufreq's ``scaling_max_freq``.

Kernel ``Documentation/admin-guide/pm/cpufreq.rst``: each ``/sys/devices/system/cpu/cpufreq/policyN``
has ``scaling_max_freq`` (a writable ceiling, kHz), ``scaling_min_freq``, ``cpuinfo_min_freq`` /
``cpuinfo_max_freq`` and, for table drivers, ``scaling_available_frequencies``. Writing the ceiling is
the portable way for a process to throttle the CPU itself; it needs root (or write permission on
the file) and changes the clock for every process on the board, so the guard uses it only when
asked (``edgesdk run --clock-cap``).

Why a lower clock gives more tokens at the same temperature: dynamic power goes as f V^2 and the
voltage falls with the clock (Raspberry Pi 5: 0.915 V at 2.4 GHz, 0.82 V at 1.5 GHz, its lowest
operating point), while a decode step only partly slows with the clock. Energy per token at
1.5 GHz is about 0.65 of that at 2.4 GHz (``thermal/simulator.py``), so under a fixed heat
budget paced work at the low clock makes about 1.5x the tokens of paced work at full clock, each
token taking about 1.3x as long (the acceptance run, whose guard also pauses and lowers the budget: 1.42x).

Rules, so the cap never fights the board's own tools and is never left behind:

* the ceiling in ``scaling_max_freq`` when a cap begins is the board's (nvpmodel, jetson_clocks or
  the user may have set it, and may change it between caps): it is re-read before every new cap,
  the cap never writes a value above the one in the file, and gives that ceiling back exactly;
* a policy whose ``scaling_min_freq`` is pinned at its ceiling (jetson_clocks pins the minimum to
  the maximum) is left alone, and one whose floor is above the wanted clock is capped at that floor;
* if someone else writes the ceiling while it is capped, that value wins: the cap stops touching
  that policy and does not restore over it. A value below the cap while a kernel cpufreq cooling
  device limits the policy is the kernel's limit, not a write: the cap stays, and is given back;
  a cap does not begin on a policy the kernel limits (its ceiling cannot be read then), nor on one whose
  CPUs are all offline (at the run's start or since); it begins at the first call after that ends;
* a policy that appears during the run (the kernel makes ``policyN`` when one of its CPUs first comes online) is
  capped by the next call while a cap is wanted; a policy left uncapped beside capped ones (a ceiling this process
  may not write) is named with why: at the start in :meth:`CpuFreqCap.describe`, later in a warning;
* while capped, a state file records each policy's original and written values (and, while a change
  from one cap to another is being written, the cap it replaces), so a run that
  is killed is undone by the next one (:func:`recover`); a cap that cannot be given back (not
  root, a failed write, a policy whose CPUs are all offline) stays recorded until one can; the file
  is replaced atomically (temporary file, fsync, rename), and one found broken all the same is said,
  with the whole records still in it given back;
* a capping run holds a lock beside the state file for as long as it runs (the kernel drops it
  however the process ends): other runs leave its caps alone, and do not cap themselves;
* each record names the boot it was written in (``/proc/sys/kernel/random/boot_id``, a UUID the
  kernel draws anew at every boot, ``Documentation/admin-guide/sysctl/kernel.rst``): after a
  restart the ceilings are the ones the board set at boot (nvpmodel's mode, config.txt), not the
  cap, so a record of an earlier boot is dropped unread, even where a ceiling happens to equal it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

CPUFREQ_DIR = "sys/devices/system/cpu/cpufreq"  # under the root directory ("/" on a board)
ROOT_ENV = "EDGESDK_CPUFREQ_ROOT"  # another root (tests, containers with /sys mounted elsewhere)


def cpufreq_root() -> str:
    """The file-system root holding ``sys/devices/system/cpu/cpufreq``: ``$EDGESDK_CPUFREQ_ROOT`` or "/"."""
    return os.environ.get(ROOT_ENV, "/")


def _read_khz(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


BOOT_ID = "proc/sys/kernel/random/boot_id"  # under the root directory: this boot's UUID


def _boot_id(root: Path | None) -> str | None:
    """This boot's ``boot_id`` under ``root`` ("/" on a board), or None where it cannot be read."""
    if root is None:
        return None
    try:
        return (root / BOOT_ID).read_text().strip() or None
    except (OSError, ValueError):
        return None


def _root_of(max_file: Path) -> Path | None:
    """The root directory of ``<root>/sys/devices/system/cpu/cpufreq/policyN/scaling_max_freq``."""
    parents = max_file.parents
    if len(parents) < 7 or parents[1].relative_to(parents[6]).as_posix() != CPUFREQ_DIR:
        return None
    return parents[6]


def _read_list(path: Path) -> list[int]:
    try:
        return sorted(int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return []


def _kernel_limiting(policy_dir: Path) -> bool:
    """Does a kernel cpufreq cooling device hold this policy below its ceiling now?

    Since freq QoS (Linux 5.4), ``scaling_max_freq`` reads the policy's effective maximum: the lowest
    of the value written to it and the kernel's own limits, among them the cooling device a thermal
    zone's passive trip drives (Jetson's ``cpu-thermal``, reference/targets-thermal.md §2a).
    ``drivers/thermal/cpufreq_cooling.c`` adds that limit as a FREQ_QOS_MAX request and names the
    device ``cpufreq-cpuN`` after the policy's first CPU (``thermal-cpufreq-N``, numbered in
    registration order, before Linux 5.12: counted for every policy). ``cur_state`` above 0 is a
    limit in force. The devices are under ``sys/class/thermal`` beside ``sys/devices``.
    """
    try:
        thermal = policy_dir.parents[4] / "class" / "thermal"  # <root>/sys/devices/system/cpu/cpufreq/policyN
        devices = [thermal / name for name in os.listdir(thermal) if name.startswith("cooling_device")]
    except (IndexError, OSError):
        return False
    cpus = set(_read_list(policy_dir / "related_cpus"))
    if policy_dir.name[len("policy"):].isdigit():
        cpus.add(int(policy_dir.name[len("policy"):]))
    for device in devices:
        try:
            kind = (device / "type").read_text().strip()
            state = int((device / "cur_state").read_text())
        except (OSError, ValueError):
            continue
        if state <= 0:
            continue
        if kind.startswith("thermal-cpufreq-"):
            return True
        number = kind[len("cpufreq-cpu"):]
        if kind.startswith("cpufreq-cpu") and number.isdigit() and int(number) in cpus:
            return True
    return False


def _offline(policy_dir: Path) -> bool:
    """Are all the CPUs of this policy offline? An nvpmodel mode with fewer cores takes whole clusters
    down (a 4-core mode on an 8-core Orin NX leaves the policy of CPUs 4-7 without an online CPU).

    ``affected_cpus`` lists the policy's online CPUs (kernel ``Documentation/admin-guide/pm/cpufreq.rst``);
    it reads empty for such an inactive policy. Since Linux 5.19 ("cpufreq: Abort show/store for half
    initialized policy") every read of an inactive policy's files fails (EBUSY); before it (L4T R35's
    5.10, R36's 5.15 unless patched) ``scaling_max_freq`` still shows a value but a write fails with
    EINVAL (``store()`` checks ``cpu_online(policy->cpu)``), which would read as a failed cap. A
    missing or unreadable file says nothing.
    """
    try:
        return not (policy_dir / "affected_cpus").read_text().split()
    except (OSError, ValueError):
        return False


def _read_only(path: Path) -> bool:
    """Is the file system holding ``path`` mounted read-only (False where that cannot be told)?"""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _why_not_writable(policy_dir: Path) -> str:
    """What to do about a ``scaling_max_freq`` this process may not write: root's ``access(2)`` passes every
    permission check, so for root it fails only with EROFS, a file system mounted read-only, as Docker and
    Podman mount ``/sys`` in a container that is not privileged; "run as root" would send root round in
    circles there."""
    if _read_only(policy_dir):
        return ("its file system is mounted read-only, as a container that is not privileged mounts /sys: run the "
                "container with --privileged, or mount /sys read-write")
    return "run as root"


def _stored(policy: Policy, written_khz: int) -> int:
    """The cap the kernel keeps of ``written_khz`` just written to the policy's ``scaling_max_freq``, read back: it
    clamps the value to ``scaling_min_freq`` .. ``cpuinfo_max_freq`` and, since "cpufreq: Make policy min/max hard
    requirements", rounds it to a frequency of the table, so the file may read another value than the one written.
    Remembered as written, a later pass read that value as someone else's write and let the policy go, cap and all.
    A value below the write while a kernel cooling device limits the policy is that limit, not the cap: the write
    is kept then, as it is where the file cannot be read back."""
    stored = _read_khz(policy.max_file)
    if stored is None or (stored < written_khz and _kernel_limiting(policy.path)):
        return written_khz
    return stored


def _write_fix(policy: Policy, error: OSError) -> str:
    """What to do about a write to the policy's ``scaling_max_freq`` that failed with ``error``."""
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return _why_not_writable(policy.path)
    return (f"see what the kernel says of it (dmesg), and check that {policy.path.name} takes a value between its "
            "scaling_min_freq and cpuinfo_max_freq")


@dataclass
class Policy:
    """One cpufreq policy: its directory, the board's ceiling and the frequencies it offers."""

    path: Path
    ceiling_khz: int  # scaling_max_freq when the current (or next) cap began: the board's, never raised; 0: not read
    # yet (since Linux 5.19 an inactive policy's files fail to read), read when its first cap begins
    floor_khz: int  # scaling_min_freq then
    offered: list[int]  # scaling_available_frequencies (kHz, ascending); [] for drivers without a table
    lowest_khz: int  # the hardware minimum (cpuinfo_min_freq), for drivers without a table
    written_khz: int | None = None  # what the cap last wrote (None: not capped)
    held_khz: int | None = None  # while a cap is recorded but not yet written: what the file held before it
    released: bool = False  # someone else changed the ceiling, or a write failed: hands off
    stuck: bool = False  # capped, and a write (the ceiling back, or another cap) failed: the state file keeps it
    pinned_said: bool = False  # the warning that scaling_min_freq holds the clock up was given
    unread_said: bool = False  # the warning that a cap could not be given back, its file unreadable, was given
    offline_said: bool = False  # the warning that a cap could not be given back, its CPUs offline, was given

    @property
    def max_file(self) -> Path:
        return self.path / "scaling_max_freq"

    @property
    def frequencies(self) -> list[int]:
        """The frequencies the cap may pick, up to the ceiling (kHz, ascending)."""
        if self.offered:
            return [f for f in self.offered if f <= self.ceiling_khz]
        return sorted({min(self.lowest_khz, self.ceiling_khz), self.ceiling_khz})

    def rebase(self, ceiling_khz: int) -> None:
        """A new cap begins: ``ceiling_khz`` (scaling_max_freq now) is the board's ceiling, and the
        floor is re-read too (nvpmodel or the user may have changed both since the last cap)."""
        self.ceiling_khz = ceiling_khz
        floor = _read_khz(self.path / "scaling_min_freq")
        self.floor_khz = self.floor_khz if floor is None else floor
        if not self.offered:  # found inactive (its files unreadable): the table and minimum are read now
            self.offered = _read_list(self.path / "scaling_available_frequencies")
        self.lowest_khz = self.lowest_khz or _read_khz(self.path / "cpuinfo_min_freq") or self.floor_khz or ceiling_khz

    def target(self, ratio: float) -> int:
        """The lowest offered frequency at or above ``ratio`` x the ceiling (never below the floor).

        A driver without a frequency table (``intel_pstate``, ``amd-pstate``, ``cppc_cpufreq``: no
        ``scaling_available_frequencies``) takes any kHz value between ``cpuinfo_min_freq`` and the
        ceiling as its ``scaling_max_freq`` (kernel ``Documentation/admin-guide/pm/cpufreq.rst``; as
        ``cpupower frequency-set -u`` writes it): the cap is ``ratio`` x the ceiling itself, never the
        ceiling, which would cap nothing.
        """
        wanted = ratio * self.ceiling_khz
        if not self.offered:
            return max(self.floor_khz, min(self.ceiling_khz, max(self.lowest_khz, math.ceil(wanted))))
        above = [f for f in self.frequencies if f >= wanted - 1]
        return max(self.floor_khz, above[0] if above else self.ceiling_khz)


def _describe(policy: Policy) -> str:
    """One policy in :meth:`CpuFreqCap.describe`: its ceiling, or why it is not capped now. A policy whose CPUs are
    all offline is said so whether its files still read (before Linux 5.19) or not: its cap begins once it is back."""
    if not policy.ceiling_khz:
        return f"{policy.path.name} offline (scaling_max_freq cannot be read now): capped once it is back"
    if _offline(policy.path):
        return f"{policy.path.name} offline (affected_cpus is empty): capped once it is back"
    pinned = policy.floor_khz >= policy.ceiling_khz
    return (f"{policy.path.name} {policy.ceiling_khz / 1e6:g} GHz"
            + (" pinned by scaling_min_freq, as jetson_clocks pins it: cannot be capped" if pinned else ""))


_UNSETTLED = -1.0  # CpuFreqCap.ratio while a set_ratio pass runs: equal to no ratio, so the next call redoes it
RETRY_INTERVAL_S = 1.0  # a cap put off (the kernel limits the policy, its CPUs offline) is tried again this often
# While a cap is wanted, the cpufreq directory is listed again this often for a policy that appeared since (the kernel
# makes policyN when one of its CPUs first comes online: a CPU brought up after boot, an nvpmodel mode with more cores)
RESCAN_INTERVAL_S = 1.0


class CpuFreqCap:
    """Caps every writable cpufreq policy at a share of its ceiling; ``set_ratio(None)`` restores.

    ``root`` is the file-system root ("/" on a board, a temporary tree in tests); ``state_path``
    the file that remembers an active cap across a crash; ``clock`` the monotonic clock in seconds that
    spaces the retries of a cap put off (:data:`RETRY_INTERVAL_S`).
    """

    def __init__(self, root: str | Path = "/", state_path: str | Path | None = None,
                 warn: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        # absolute: the state file names each capped file by its path, and a run started from another directory
        # (a service's WorkingDirectory) would find nothing at a relative one, drop the record and leave the cap
        self.root = Path(root).absolute()
        self.state_path = Path(state_path) if state_path else None
        self._warn = warn or (lambda message: None)
        self.notes: list[str] = []
        self.policies: list[Policy] = []
        self.reason = ""
        self.ratio: float | None = None
        self._lock: IO[bytes] | None = None
        self._state_warned = False  # the state file could not be written: said once
        self._closed = False  # closed: the ceilings are back and the lock is another run's to take
        self._kept: dict[str, dict] = {}  # a stopped run's records recover() kept (a policy unreadable now)
        self._clock = clock
        # (ratio, clock) of the last pass that put a cap (or a restore: None) off
        self._put_off: tuple[float | None, float] | None = None
        self._known: set[str] = set()  # the policyN names found so far, capped or not
        self._scanned_at: float | None = None  # when the cpufreq directory was last listed
        # the policies this run does not cap, each with why (a ceiling it may not write, ...): in describe()
        self.left_out: list[str] = []
        if self.state_path is not None:
            # one capping run at a time: the clock is the whole board's, and another run's cap
            # would be read here as the board's ceiling
            if _held_elsewhere(self.state_path):
                self.reason = "another edgesdk run that caps the clock is still going"
                self.state_path = None  # its state file: never this object's to write
                return
            try:
                self._lock = _lock(lock_path(self.state_path))
            except BlockingIOError:  # a run that started at the same instant took it after the check above
                self.reason = "another edgesdk run that caps the clock is still going"
                self.state_path = None
                return
            notes, self._kept = _recover(self.state_path, holding_lock=self._lock is not None)
            self.notes += notes
        self._discover()
        if not self.available and self._lock is not None:
            self._lock.close()  # nothing to cap here (no policies, not root): leave the clock to a run that can
            self._lock = None

    def _discover(self) -> None:
        base = self.root / CPUFREQ_DIR
        self._scanned_at = self._clock()
        try:  # a root this user may not search (EACCES) has no policy it could cap: no data, as when there is none
            paths = sorted(base / name for name in os.listdir(base) if name.startswith("policy"))
        except (FileNotFoundError, NotADirectoryError):
            paths = []
        except OSError as error:
            self.reason = f"cannot read {base} ({error.strerror or error})"
            return
        if not paths:
            self.reason = f"no cpufreq policies under {base}"
            return
        skipped = []
        for path in paths:
            self._known.add(path.name)
            policy, notes = self._admit(path)
            skipped += notes
            if policy is None:
                self.left_out += notes
            else:
                self.policies.append(policy)
        if all(not policy.ceiling_khz or _offline(policy.path) for policy in self.policies):  # no CPU to slow down
            self.policies = []
            self.reason = "; ".join(skipped)

    def _admit(self, path: Path) -> tuple[Policy | None, list[str]]:
        """The policy at ``path`` to cap (None: it cannot be), and a note for each thing that keeps it from a cap now
        (its CPUs offline, its ceiling unreadable now: kept, capped once that ends) or for good."""
        if str(path / "scaling_max_freq") in self._kept:  # its ceiling now would be a stopped run's cap
            return None, [f"{path.name}: a stopped run's cap on it is still recorded, to be given back"]
        skipped = []
        ceiling, error = _read_now(path / "scaling_max_freq")
        floor = _read_khz(path / "scaling_min_freq")
        if ceiling is None and (error is None or isinstance(error, (FileNotFoundError, NotADirectoryError))):
            return None, [f"{path.name}: scaling_max_freq unreadable"]
        if ceiling is None:  # kept, its ceiling read when a cap begins (_apply puts it off till the file reads)
            skipped.append(f"{path.name}: scaling_max_freq cannot be read now ({error.strerror or error}; "
                           "an offline cluster reads so)")
        if _offline(path):  # kept, for a cap to begin once its cluster is back (_apply puts it off till then)
            skipped.append(f"{path.name}: none of its CPUs is online (affected_cpus is empty)")
        if not os.access(path / "scaling_max_freq", os.W_OK):
            return None, [*skipped, f"{path.name}: scaling_max_freq not writable ({_why_not_writable(path)})"]
        offered = _read_list(path / "scaling_available_frequencies")  # [] for drivers without a table
        lowest = _read_khz(path / "cpuinfo_min_freq") or floor or ceiling or 0
        return Policy(path, ceiling or 0, floor or 0, offered, lowest), skipped

    def _found_new(self) -> bool:
        """Has a policy appeared since the directory was last listed (at most every :data:`RESCAN_INTERVAL_S`)? One
        that can be capped joins :attr:`policies`; one that cannot is warned of once, with why and the fix. A
        directory whose ``scaling_max_freq`` is not there yet (the kernel still making it) is looked at again."""
        now = self._clock()
        if self._scanned_at is not None and now - self._scanned_at < RESCAN_INTERVAL_S:
            return False
        self._scanned_at = now
        base = self.root / CPUFREQ_DIR
        try:
            names = sorted(name for name in os.listdir(base) if name.startswith("policy") and name not in self._known)
        except OSError:
            return False
        found = False
        for name in names:
            if not (base / name / "scaling_max_freq").exists():
                continue
            self._known.add(name)
            policy, notes = self._admit(base / name)
            if policy is not None:
                self.policies.append(policy)
                found = True
                continue
            self.left_out += notes
            self._warn(f"{name} appeared since the run began (a CPU brought online) but the clock cap leaves it "
                       f"uncapped: {'; '.join(note.removeprefix(f'{name}: ') for note in notes)}")
        return found

    @property
    def available(self) -> bool:
        return bool(self.policies)

    @property
    def applied_ratio(self) -> float | None:
        """The cap in place, as a share of the ceiling: the highest policy's ``scaling_max_freq`` as written over its
        ceiling (the offered frequency at or above the ratio asked, never below ``scaling_min_freq``), or None where
        no cap holds every policy (none asked, a pass put off or cut short, a policy let go or never capped)."""
        if self.ratio is None or self.ratio == _UNSETTLED or not self.policies:
            return None
        if any(p.released or p.written_khz is None or not p.ceiling_khz for p in self.policies):
            return None
        return max(p.written_khz / p.ceiling_khz for p in self.policies)

    def describe(self) -> str:
        """What the cap acts on: each policy it caps, and each it leaves uncapped with why (a ceiling this process may
        not write beside others it may: the cap slows only part of the CPU, which the run must say)."""
        if not self.available:
            return f"CPU clock cap unavailable: {self.reason}"
        left_out = f"; not capped: {'; '.join(self.left_out)}" if self.left_out else ""
        return ("CPU clock cap via cpufreq scaling_max_freq (" + ", ".join(map(_describe, self.policies)) + ")"
                + left_out)

    def set_ratio(self, ratio: float | None) -> None:
        """Cap at ``ratio`` of each ceiling, or restore the ceilings (``None``); writes only on change.
        After :meth:`close` nothing is written: a step still running as its process stops (a server's
        answer) must not cap the clock again once it was given back and the lock let go. A pass that put a
        cap (or a restore) off is done again for the same ratio at most once every :data:`RETRY_INTERVAL_S` (the guard
        asks at every reading, each token of a decode: every pass reads each policy's files in sysfs)."""
        if self._closed:
            return
        if ratio is not None and self.policies and self._found_new():
            self.ratio = _UNSETTLED  # a policy that appeared while a cap is wanted gets it at this pass
        if ratio == self.ratio or self._retry_not_due(ratio):
            return
        # Unsettled until every policy has it: a pass cut short (Ctrl-C or SIGTERM's exit landing in it, a warning
        # that cannot be written to a closed stderr) is done again by the next call, close()'s restore among them.
        # Set first, a restore cut short after its first policy left the others capped: close() took the ceilings
        # for given back and wrote nothing.
        self.ratio = _UNSETTLED
        failed: Exception | None = None
        deferred = False  # a policy the kernel limits, or with no CPU online: its cap (or restore) is at a later call
        before = [(p.written_khz, p.released, p.stuck) for p in self.policies]
        for policy in self.policies:
            if not policy.released:
                try:
                    deferred = not self._apply(policy, ratio) or deferred
                except Exception as error:  # its warning failed: the other policies still get their ceiling back
                    failed = failed or error
        self.ratio = ratio if failed is None and not deferred else _UNSETTLED
        self._put_off = (ratio, self._clock()) if deferred and failed is None else None
        if not deferred or before != [(p.written_khz, p.released, p.stuck) for p in self.policies]:
            self._save_state()  # a retry that changed nothing leaves the file as it is (no fsync at every reading)
        if failed is not None:
            raise failed

    def _retry_not_due(self, ratio: float | None) -> bool:
        """The last pass put a cap at this same ``ratio`` (None: a restore) off less than RETRY_INTERVAL_S ago."""
        return (self._put_off is not None and self._put_off[0] == ratio
                and self._clock() - self._put_off[1] < RETRY_INTERVAL_S)

    def _apply(self, policy: Policy, ratio: float | None) -> bool:
        """Cap one policy at ``ratio`` of its ceiling, or give the ceiling back (``None``). False where a cap could
        not begin because a kernel cpufreq cooling device holds the policy lower now, or none of its CPUs is online
        (before Linux 5.19 its files still read, since then they fail): the next :meth:`set_ratio` call, with the
        same ratio too, tries again (the guard asks at every reading; it tries at most once a second), so the cap
        begins once the kernel's limit lifts or the cluster is back, and is not left out for the rest of the
        pacing."""
        current = _read_khz(policy.max_file)
        if current is None:  # unreadable now (since Linux 5.19 an inactive policy's files fail with EBUSY): nothing
            # is written that could raise it, and a cap not begun yet is tried again at a later call
            if ratio is None and policy.written_khz is not None and not policy.unread_said:
                policy.unread_said = True  # the cap stays (recorded): said, or the run would end capped in silence
                self._warn(f"{policy.path.name}: scaling_max_freq cannot be read now (an offline cluster reads so), "
                           f"so its cap at {policy.written_khz} kHz cannot be given back yet: it stays recorded, and "
                           f"the next edgesdk run that can read it gives {policy.ceiling_khz} kHz back")
            return ratio is None or policy.written_khz is not None
        policy.unread_said = False  # read again: a later spell of unreadable files is said again
        if policy.written_khz is not None and policy.held_khz is not None and current == policy.held_khz:
            # a cap recorded, its write cut short (a Ctrl-C that stops an answer, the chat going on): the file holds
            # what it held before, the ceiling (not capped yet) or the earlier cap, never someone else's setting
            policy.written_khz = None if current == policy.ceiling_khz else current
        policy.held_khz = None
        if ratio is None and policy.written_khz is not None and current == policy.ceiling_khz:
            policy.written_khz = None  # back already: a restore whose write took, cut short before this was noted
            return True
        lowered = _kernel_limiting(policy.path)  # the file reads the kernel's lower limit, not a write
        if policy.written_khz is not None and current != policy.written_khz and not (
                current < policy.written_khz and lowered):
            policy.released = True  # nvpmodel, jetson_clocks or the user changed it: theirs now
            self._warn(f"{policy.path.name}: scaling_max_freq changed to {current} kHz by someone else; "
                       "the clock cap leaves it alone")
            return True
        if ratio is None and policy.written_khz is None:
            return True  # not capped: the ceiling in the file is the board's, whatever it is now
        if policy.written_khz is None:
            if lowered:
                return False  # the kernel holds it lower already, and its ceiling cannot be read now: a later call
            if _offline(policy.path):
                # an nvpmodel mode with fewer cores took its cluster down (at the run's start or since): before Linux
                # 5.19 the write fails (EINVAL), which read as a failed cap and let the policy go for good; a later call
                return False
            policy.rebase(current)  # a new cap: the ceiling as it is now, never the one of an earlier cap
        value = policy.ceiling_khz if ratio is None else min(policy.target(ratio), policy.ceiling_khz)
        requested = current if policy.written_khz is None else policy.written_khz  # what the file was given
        # a cap beginning only: a policy capped already reads its cap, which a floor at the cap (a Pi 5's 1.5 GHz) equals
        if (ratio is not None and policy.written_khz is None and value >= current and policy.floor_khz >= current
                and not policy.pinned_said):
            policy.pinned_said = True  # jetson_clocks pins the minimum to the maximum: said, never fought
            self._warn(f"{policy.path.name}: scaling_min_freq is pinned at {policy.floor_khz} kHz, at its "
                       f"scaling_max_freq {current} kHz (as jetson_clocks pins it), so the clock cap cannot lower "
                       "the clock and leaves it alone; for --clock-cap to act, undo that (sudo jetson_clocks "
                       "--restore after a --store, or re-apply the power mode: sudo nvpmodel -m <mode>) or lower "
                       "scaling_min_freq")
        if value != requested and policy.written_khz is not None and _offline(policy.path):
            return self._hold_offline_cap(policy, ratio)
        if value != requested:
            before = policy.written_khz
            if ratio is not None:
                # Noted (and recorded in the state file) before the write: a Ctrl-C landing just after the write
                # still leaves close() a cap to give back, and a run killed there (SIGKILL, the OOM killer) leaves
                # recover() one. A cap that was never written reads back as what the file held before it (held_khz,
                # recorded beside it where that is an earlier cap): the ceiling, where nothing is undone, or that
                # earlier cap, given back too; neither is taken for someone else's setting, leaving a cap behind.
                policy.held_khz = requested
                policy.written_khz = value
                self._save_state()
            if not self._write(policy, value, held_khz=before):
                policy.written_khz, policy.held_khz = before, None
                return True
            policy.held_khz = None
            if ratio is not None:
                value = _stored(policy, value)
                if value != policy.written_khz:  # the kernel keeps another value: recorded at once, or a run killed
                    policy.written_khz = value  # before the pass ends leaves recover() a record it reads as a
                    self._save_state()  # change made since, and the cap stays until a reboot
        policy.written_khz = None if ratio is None else value
        return True

    def _hold_offline_cap(self, policy: Policy, ratio: float | None) -> bool:
        """Leave a capped policy whose CPUs all went offline since (an nvpmodel mode with fewer cores) as it is, and
        return False: a later call changes or gives back its cap once a CPU is online again. Before Linux 5.19 its
        ``scaling_max_freq`` still reads, but a write fails with EINVAL; tried, the policy was let go as a failed
        write, its cap kept for the rest of the run once the cluster was back. A restore put off is said once, as
        the cap stays recorded for the next run while the cluster is down."""
        if ratio is None and not policy.offline_said:
            policy.offline_said = True
            self._warn(f"{policy.path.name} has no CPU online now (affected_cpus is empty), so its cap at "
                       f"{policy.written_khz} kHz cannot be given back yet: it stays recorded, and {policy.ceiling_khz} "
                       "kHz is given back once one of its CPUs is online (by this run, or the next edgesdk run)")
        return False

    def _write(self, policy: Policy, value: int, held_khz: int | None = None) -> bool:
        """Write ``value`` kHz to the policy's scaling_max_freq; on failure warn and stop capping it.
        ``held_khz`` is the cap the file still holds when the write fails (None: not capped): a restore that
        failed, or a change from one cap to another (a cap that was left there would otherwise be given back by
        no one), stays in the state file for the next run to give the ceiling back."""
        try:
            policy.max_file.write_text(f"{value}\n")
        except OSError as error:
            policy.released = True
            policy.stuck = held_khz is not None
            self._warn(f"{policy.path.name}: cannot write {value} kHz to scaling_max_freq ({error}); the clock cap stops"
                       + (f", still at {held_khz} kHz: the next edgesdk run gives {policy.ceiling_khz} kHz back, or give "
                          f"it back yourself: echo {policy.ceiling_khz} | sudo tee {policy.max_file}"
                          if held_khz is not None else f"; for --clock-cap to act, {_write_fix(policy, error)}"))
            return False
        return True

    def close(self) -> None:
        """Give every ceiling back, then let another run cap (also when a warning on the way fails). A restore put
        off (a capped cluster offline) is tried once more now, however recently: the last chance this run has."""
        self._put_off = None
        try:
            self.set_ratio(None)
        finally:
            self._closed = True
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        boot = {"boot": boot} if (boot := _boot_id(self.root)) else {}
        capped = {str(p.max_file): {"original": p.ceiling_khz, "written": p.written_khz,
                                    **({"held": p.held_khz} if p.held_khz not in (None, p.ceiling_khz) else {}),
                                    **boot}
                  for p in self.policies if p.written_khz is not None and (p.stuck or not p.released)}
        try:  # a cache directory that cannot be written must not stop generation mid-answer
            records = {**self._kept, **capped}  # a stopped run's caps recover() could not give back yet stay
            if records:
                self.state_path.parent.mkdir(parents=True, exist_ok=True)
                _write_state(self.state_path, records)
            elif self.state_path.exists():
                self.state_path.unlink()
        except OSError as error:
            if not self._state_warned:
                self._state_warned = True
                self._warn(f"cannot record the clock cap in {self.state_path} ({error.strerror or error}); "
                           "the cap still works and this run gives it back, but a run killed while capping "
                           "leaves it for you to undo: point EDGESDK_CACHE at a writable directory")


STATE_FILE = "clock-cap.json"  # in the user cache: the caps an active run holds


def state_path() -> Path:
    """Where a capping run records its caps: ``clock-cap.json`` in the edgesdk user cache."""
    from edgesdk.models.sources import cache_dir

    return cache_dir() / STATE_FILE


def recover_left_cap() -> list[str]:
    """Undo a clock cap a killed run left behind, before anything else runs. Cheap: it reads
    nothing but the state file's existence unless a cap was left."""
    return recover(state_path())


_RECORD = re.compile(r'"((?:[^"\\]|\\.)+)":\s*\{\s*"original":\s*(\d+),\s*"written":\s*(\d+)'
                     r'(?:,\s*"held":\s*(\d+))?(?:,\s*"boot":\s*"([^"\\]*)")?\s*\}')  # one record, as laid out


def _valid(entry: object) -> bool:
    return (isinstance(entry, dict) and all(isinstance(entry.get(key), int) for key in ("original", "written"))
            and isinstance(entry.get("held", 0), int) and isinstance(entry.get("boot", ""), str))


def _load_state(state_path: Path) -> tuple[dict[str, dict], str | None]:
    """The state file's records (scaling_max_freq path -> original and written kHz, and the boot they
    were written in when known), and what is wrong with the file (None: nothing). Records this code did
    not write count as none. A file that is not JSON (cut short: the disk filled, or a version of edgesdk
    that wrote it in place was killed mid-write) gives the whole records still in it, found by their layout,
    and says so: read as "no caps", a cap it names would be left until a reboot."""
    try:
        text = state_path.read_text()
    except (OSError, ValueError) as error:
        return {}, f"cannot read it ({getattr(error, 'strerror', None) or error})"
    try:
        state = json.loads(text)
    except ValueError:
        salvaged = {}
        for match in _RECORD.finditer(text):
            try:
                file = json.loads(f'"{match[1]}"')
            except ValueError:
                continue
            salvaged[file] = {"original": int(match[2]), "written": int(match[3]),
                              **({"held": int(match[4])} if match[4] else {}),
                              **({"boot": match[5]} if match[5] else {})}
        return salvaged, (f"it is not JSON ({len(text)} bytes, cut short?); {len(salvaged)} whole "
                          f"record{'' if len(salvaged) == 1 else 's'} read from it")
    if not isinstance(state, dict):
        return {}, None  # JSON, but not this code's: nothing of it to give back
    return {file: entry for file, entry in state.items() if _valid(entry)}, None


def _write_state(state_path: Path, records: dict[str, dict]) -> None:
    """Replace the state file with ``records`` atomically: written to a temporary file in the same
    directory, flushed to disk (``fsync``) and renamed over it (``rename(2)`` replaces a name in one step,
    POSIX). Written in place, a kill or a full disk between truncating and writing left a file that is
    not JSON: no record, and the caps it named were never given back. OSError when it cannot be written
    (the old file is then left as it was)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{state_path.name}.", suffix=".tmp", dir=state_path.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(json.dumps(records, indent=1))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, state_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk; best effort (not every file system)
        directory = os.open(state_path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def lock_path(state_path: Path) -> Path:
    """The lock a run able to cap holds while it runs, beside the state file."""
    return state_path.with_name(state_path.name + ".lock")


def _lock(path: Path) -> IO[bytes] | None:
    """``path`` opened (created) with an exclusive ``flock`` held on it until the file is closed (the
    kernel drops it however the process ends). BlockingIOError when another process holds it: taking
    the lock is the one check two runs starting at the same instant cannot both pass. None when no
    lock can be had here (directory not writable, no flock): then nothing stops a second capping run."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path, "ab")  # noqa: SIM115 (held until CpuFreqCap.close)
    except OSError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise
    except OSError:
        lock.close()
        return None
    return lock


def _held_elsewhere(state_path: Path) -> bool:
    """Does a running process hold the clock-cap lock (so the caps in the state file are its own)?"""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        lock = open(lock_path(state_path), "rb")  # noqa: SIM115 (closed below)
    except OSError:
        return False  # no lock file: no run has capped here
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False  # no flock on this file system
        return False


_LIVE_CAPS_NOTED: set[Path] = set()  # state files whose live capping run this process has named


def recover(state_path: Path, holding_lock: bool = False) -> list[str]:
    """Undo the cap a killed run left: restore each ceiling still holding the value it wrote.

    A run still going (it holds the lock; ``holding_lock``: this process does) keeps its caps; a
    ceiling that cannot be written back (not root) stays in the state file, and the note says how
    to give it back. A state file this user may not look for (a cache directory it cannot search,
    EACCES) holds no cap it could give back: nothing is done, as when there is none."""
    return _recover(state_path, holding_lock)[0]


def _read_now(path: Path) -> tuple[int | None, OSError | None]:
    """``scaling_max_freq`` now, or the error reading it gave (None, None: it reads no number)."""
    try:
        return int(path.read_text().split()[0]), None
    except OSError as error:
        return None, error
    except (ValueError, IndexError):
        return None, None


def _restore_fix(max_file: Path, original: int, error: OSError) -> str:
    """What to do about a stopped run's cap whose ceiling ``original`` could not be written back to ``max_file``
    (``error``). Root passes every permission check, so for root a file system mounted read-only (``/sys`` in a
    container that is not privileged) fails the write: "run as root" and ``sudo tee`` would fail the same way there."""
    if _read_only(max_file.parent):
        return ("its file system is mounted read-only, as a container that is not privileged mounts /sys: run "
                "edgesdk where /sys is writable (on the board, or in a container run with --privileged) to give "
                "it back; it stays recorded until then")
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"run edgesdk as root to give it back, or write it yourself: echo {original} | sudo tee {max_file}"
    return (f"see what the kernel says of it (dmesg); it stays recorded, and the next edgesdk run tries again, or "
            f"write it yourself: echo {original} | sudo tee {max_file}")


def _recover(state_path: Path, holding_lock: bool = False) -> tuple[list[str], dict[str, dict]]:
    """:func:`recover`'s notes, and the records kept in the state file for a later run.

    A record whose ``scaling_max_freq`` cannot be read now is kept, not dropped: since Linux 5.19 every
    read of an inactive policy fails with EBUSY (kernel ``drivers/cpufreq/cpufreq.c``, ``show()``: "cpufreq:
    Abort show/store for half initialized policy"), as it does for a cluster an nvpmodel mode with fewer
    cores takes down, and the kernel keeps the policy's limits (its freq QoS requests) until the cluster
    comes back: capped. A record whose file is gone (ENOENT: the policy, or the whole root, no longer
    exists) is dropped, and the note says so."""
    try:
        if not state_path.exists():
            return [], {}
    except OSError:  # Path.exists raises EACCES (only a missing path or component is False)
        return [], {}
    if not holding_lock and _held_elsewhere(state_path):
        if state_path in _LIVE_CAPS_NOTED:  # said once a process (edgesdk run asks twice)
            return [], {}
        _LIVE_CAPS_NOTED.add(state_path)
        return ["the CPU clock is capped by another edgesdk run that is still going; left to it"], {}
    notes = []
    kept = {}
    records, broken = _load_state(state_path)
    if broken is not None:
        aside = state_path.with_name(state_path.name + ".broken")
        with contextlib.suppress(OSError):
            os.replace(state_path, aside)
        notes.append(f"warning: the clock-cap state file {state_path} is broken: {broken}. A cap a stopped run "
                     f"left on a policy it does not name may still hold: compare each policy's scaling_max_freq "
                     f"with its cpuinfo_max_freq under /sys/devices/system/cpu/cpufreq, and give the ceiling back "
                     f"(sudo nvpmodel -m <mode> on a Jetson, or echo <kHz> | sudo tee .../scaling_max_freq); the "
                     f"file is kept as {aside.name}")
    for file, entry in records.items():
        path, original = Path(file), entry["original"]
        boot = _boot_id(_root_of(path))
        if entry.get("boot") and boot and entry["boot"] != boot:
            continue  # written before the board restarted: the ceiling now is the one it set at boot
        current, error = _read_now(path)
        if isinstance(error, (FileNotFoundError, NotADirectoryError)):
            notes.append(f"dropped the record of a cap at {entry['written']} kHz on {path}: the file no longer "
                         "exists (the policy, or the directory holding it, is gone)")
            continue
        if error is not None:
            kept[file] = entry
            notes.append(f"{path.parent.name} scaling_max_freq cannot be read now ({error.strerror or error}; "
                         f"an offline cluster reads so): a stopped run capped it at {entry['written']} kHz, "
                         f"given back to {original} kHz by the next edgesdk run that can read it")
            continue
        if (current is None or current not in (entry["written"], entry.get("held", entry["written"]))) and not (
                current is not None and current < entry["written"] and _kernel_limiting(path.parent)):
            continue  # changed since, or reads no number: that setting wins (a kernel cooling limit below the cap is
            # not a change; the cap a killed run held while it recorded a change to another, the change unwritten,
            # is its own)
        try:
            path.write_text(f"{original}\n")
            notes.append(f"restored {path.parent.name} scaling_max_freq to {original} kHz "
                         "(a previous run was stopped while it capped the clock)")
        except OSError as error:
            kept[file] = entry
            if _offline(path.parent):  # before Linux 5.19 an inactive policy reads, but a write fails (EINVAL)
                notes.append(f"{path.parent.name} has no CPU online now: its cap at {entry['written']} kHz, left by a "
                             f"stopped run, is given back to {original} kHz by the next edgesdk run once one is")
                continue
            notes.append(f"could not restore {path} to {original} kHz, where a stopped run had capped it at "
                         f"{entry['written']} kHz ({error.strerror or error}): {_restore_fix(path, original, error)}")
    try:
        if kept:
            _write_state(state_path, kept)
        else:
            state_path.unlink(missing_ok=True)
    except OSError as error:
        notes.append(f"could not update {state_path} ({error.strerror or error})")
    return notes, kept
