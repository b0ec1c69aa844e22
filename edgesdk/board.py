"""Detect the board this process runs on: Jetson (with its L4T and JetPack release), Raspberry Pi
or a plain host, and suggest the matching target profile.

Everything is read from files under a root directory (``"/"`` by default) so that tests can run
the detection on a fake tree. A missing or unreadable file never raises; it gives ``None`` or an
empty set.

Sources:

- ``/proc/device-tree/model``: the device-tree ``model`` property, a NUL-terminated string
  (Linux kernel, Documentation/ABI/testing/sysfs-firmware-ofw: ``/proc/device-tree`` is a link
  to ``/sys/firmware/devicetree/base``).
- ``/proc/cpuinfo`` (``Features`` on arm64, ``flags`` on x86; Documentation/arch/arm64/elf_hwcaps.rst
  for the arm64 names such as ``asimddp`` and ``i8mm``) and ``/proc/meminfo`` ``MemTotal`` in kB
  (Documentation/filesystems/proc.rst).
- ``/proc/device-tree/compatible``: the root node's ``compatible`` property, NUL-separated strings
  (Devicetree Specification, "compatible"), most specific first. A Jetson's names its module by part
  number, after the carrier's (``nvidia,p3768-0000+p3767-0000``, ``nvidia,p3767-0000``,
  ``nvidia,tegra234``; Linux ``Documentation/devicetree/bindings/arm/tegra.yaml``), also on a third-party
  carrier board, whose ``model`` is the carrier's and names no module.
- ``/etc/nv_tegra_release``: written by NVIDIA's ``nvidia-l4t-core`` package; its first line
  holds the L4T major (``# R36``) and ``REVISION: 4.3``. Its ``BOARD:`` field names no module
  (``generic`` on L4T R36; jetson_stats: "contains always wrong output"), so it is not read for one.
- The L4T to JetPack table follows jetson_stats (rbonghi/jetson_stats,
  ``jtop/core/jetson_variables.py``, ``NVIDIA_JETPACK``) and NVIDIA's JetPack archive.
- Arm CPU part numbers: Arm's Technical Reference Manuals (MIDR_EL1 PartNum), as listed in the
  kernel's ``arch/arm64/include/asm/cputype.h``.
"""

from __future__ import annotations

import os
import platform
import re
import stat
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

# L4T release -> JetPack release (jetson_stats jetson_variables.py, dusty-nv/jetson-containers
# jetson_containers/l4t_version.py, NVIDIA JetPack archive). Orin's releases start at R34.1 (JetPack 5.0 DP); R32 is
# the JetPack 4 line a Xavier NX may still run (from JetPack 4.4, its first).
L4T_TO_JETPACK: dict[str, str] = {
    "32.4.3": "4.4",
    "32.4.4": "4.4.1",
    "32.5.0": "4.5",
    "32.5.1": "4.5.1",
    "32.5.2": "4.5.1",
    "32.6.1": "4.6",
    "32.7.1": "4.6.1",
    "32.7.2": "4.6.2",
    "32.7.3": "4.6.3",
    "32.7.4": "4.6.4",
    "32.7.5": "4.6.5",
    "32.7.6": "4.6.6",
    "34.1.0": "5.0 DP",
    "34.1.1": "5.0.1 DP",
    "35.1.0": "5.0.2",
    "35.2.1": "5.1",
    "35.3.1": "5.1.1",
    "35.4.1": "5.1.2",
    "35.5.0": "5.1.3",
    "35.6.0": "5.1.4",
    "35.6.1": "5.1.5",
    "35.6.2": "5.1.5",
    "35.6.3": "5.1.5",
    "35.6.4": "5.1.6",
    "36.2.0": "6.0 DP",
    "36.3.0": "6.0",
    "36.4.0": "6.1",
    "36.4.2": "6.1 rev1",
    "36.4.3": "6.2",
    "36.4.4": "6.2.1",
    "36.4.7": "6.2.1",
    "36.5.0": "6.2.2",
    "38.2.0": "7.0",
    "38.2.1": "7.0",
    "38.2.2": "7.0",
    "38.4.0": "7.1",
}

# MIDR_EL1 (implementer, part) -> core name, for the cores found on supported boards.
_ARM_CPU_PARTS: dict[tuple[str, str], str] = {
    ("0x41", "0xd03"): "Cortex-A53",
    ("0x41", "0xd07"): "Cortex-A57",
    ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd0b"): "Cortex-A76",
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd41"): "Cortex-A78",
    ("0x41", "0xd42"): "Cortex-A78AE",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x41", "0xd83"): "Neoverse-V3AE",  # Jetson Thor (JetPack 7)
    ("0x4e", "0x004"): "NVIDIA Carmel",
}

_L4T_RE = re.compile(r"#\s*R(\d+)\b.*?REVISION:\s*(\d+)(?:\.(\d+))?")
_SIZE_RE = re.compile(r"(\d+)\s*GB", re.IGNORECASE)
_RPI_RE = re.compile(r"^Raspberry Pi (?:Compute Module )?(\d)")
_GENERIC_ARM_NAME = re.compile(r"^ARMv\d+\S* Processor rev \d+ \(v\d+\S*\)$")
_PART_NUMBER_RE = re.compile(r"\bp\d{4}-\d{4}\b")


@dataclass(frozen=True)
class BoardInfo:
    """What :func:`detect_board` found. ``None`` means "could not tell"."""

    model: str | None
    family: str  # "jetson", "rpi" or "host"
    l4t: str | None
    jetpack: str | None
    architecture: str | None
    cpu_count: int | None
    memory_gib: float | None
    cpu_model_name: str | None
    cpu_features: frozenset[str] = field(default_factory=frozenset)
    suggested_target: str | None = None
    # the Jetson module(s) the device tree's compatible names ("Orin NX 8GB (p3767-0001)"), None when it names none
    module: str | None = None
    # why the suggested target may be wrong: the model string and the module disagree (None when they do not); it
    # ends with target_advice(note_target)
    detection_note: str | None = None
    # the profile the note says to pass with --target where the module is the other one; None where it names none
    # (the module has no shipped profile, or the compatible names several)
    note_target: str | None = None

    def module_words(self) -> str | None:
        """The Jetson module the device tree's compatible names, as refusals show it ("module Orin NX 8GB
        (p3767-0001)"), None where it names none: on a third-party carrier board the model is the carrier's and
        names no module."""
        return f"module {self.module}" if self.module else None

    def note_reason(self) -> str | None:
        """:attr:`detection_note` without its closing advice (:func:`target_advice`), for a command whose way
        through is another (deploy takes no --target)."""
        if not self.detection_note:
            return None
        return self.detection_note.removesuffix(target_advice(self.note_target))

    def to_dict(self) -> dict:
        """A JSON-friendly dict (features as a sorted list)."""
        data = asdict(self)
        data["cpu_features"] = sorted(self.cpu_features)
        return data


# The files read here are small: a model string, a release line, /proc/cpuinfo of a many-core machine (well under
# 1 MiB). A larger one is not the kernel's.
_MAX_READ_BYTES = 4 * 1024 * 1024


def _read_text(root: str | os.PathLike, rel: str) -> str | None:
    """The text of the regular file ``rel`` under ``root``, or None.

    Only a regular file (procfs and sysfs files are) of at most ``_MAX_READ_BYTES`` is read:
    ``/tmp/nv_jetson_model`` is anyone's to create, and a FIFO there would block every detection
    (``edgesdk run``, ``serve``, ``env``) until someone wrote to it, a link to ``/dev/zero`` would be
    read without end. The file is opened without blocking (a FIFO swapped in after the check) and
    checked again once open.
    """
    path = Path(root) / rel.lstrip("/")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return None
    try:
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return None
            data = file.read(_MAX_READ_BYTES + 1)
    except OSError:
        return None
    if len(data) > _MAX_READ_BYTES:
        return None
    return data.decode("utf-8", errors="replace")


def _cpuinfo_fields(root: str | os.PathLike) -> list[tuple[str, str]]:
    text = _read_text(root, "proc/cpuinfo") or ""
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs.append((key.strip(), value.strip()))
    return pairs


def read_device_tree_model(root: str | os.PathLike = "/") -> str | None:
    """The device-tree model string (``/proc/device-tree/model``), or None when absent.

    A container hides the device tree (Docker masks ``/sys/firmware``, where ``/proc/device-tree``
    points); there the Raspberry Pi kernel's ``Model`` line in ``/proc/cpuinfo``, the same string,
    still names the board. A Jetson kernel prints no such line: jetson-containers' ``run.sh``
    (dusty-nv/jetson-containers) copies the host's ``/proc/device-tree/model`` to ``/tmp/nv_jetson_model``
    and mounts it there ("/proc or /sys files aren't mountable into docker"), where jetson-utils reads
    it when the device tree is empty (``codec/gstEncoder.cpp``: "this is where it gets mounted in the
    container"); read only in a Jetson userland (``/etc/nv_tegra_release``, which L4T images carry).
    """
    for rel in ("proc/device-tree/model", "sys/firmware/devicetree/base/model"):
        text = _read_text(root, rel)
        if text is not None:
            model = text.replace("\x00", " ").strip()
            return model or None
    model = dict(_cpuinfo_fields(root)).get("Model")
    if model:
        return model
    if not os.path.exists(Path(root) / "etc/nv_tegra_release"):
        # not a Jetson userland (L4T images carry the file): /tmp is anyone's to write, and scripts elsewhere
        # write "Not a Jetson device" there, which was then the model of an x86 host
        return None
    return (_read_text(root, "tmp/nv_jetson_model") or "").replace("\x00", " ").strip() or None


def read_device_tree_compatible(root: str | os.PathLike = "/") -> tuple[str, ...]:
    """The device tree's root ``compatible`` strings, in order (empty when absent or hidden, as in a container)."""
    for rel in ("proc/device-tree/compatible", "sys/firmware/devicetree/base/compatible"):
        text = _read_text(root, rel)
        if text is not None:
            return tuple(part.strip() for part in text.split("\x00") if part.strip())
    return ()


def read_l4t_release(root: str | os.PathLike = "/") -> str | None:
    """The L4T release from ``/etc/nv_tegra_release`` ("R36 ... REVISION: 4.3" -> "36.4.3")."""
    text = _read_text(root, "etc/nv_tegra_release")
    if not text:
        return None
    match = _L4T_RE.search(text.splitlines()[0])
    if match is None:
        return None
    major, minor, patch = match.group(1), match.group(2), match.group(3) or "0"
    return f"{int(major)}.{int(minor)}.{int(patch)}"


def jetpack_for_l4t(l4t: str | None) -> str | None:
    """The JetPack release shipping an L4T release, or None when unknown."""
    if l4t is None:
        return None
    return L4T_TO_JETPACK.get(l4t.strip())


def read_cpu_features(root: str | os.PathLike = "/") -> frozenset[str]:
    """CPU feature names from ``/proc/cpuinfo`` (arm64 ``Features``, x86 ``flags``)."""
    features: set[str] = set()
    for key, value in _cpuinfo_fields(root):
        if key in ("Features", "flags"):
            features.update(value.split())
    return frozenset(features)


def read_cpu_model_name(root: str | os.PathLike = "/") -> str | None:
    """Best-effort CPU name: x86 ``model name``, arm64 ``CPU implementer``/``CPU part``, or ``Model``."""
    fields = _cpuinfo_fields(root)
    values: dict[str, str] = {}
    for key, value in fields:
        values.setdefault(key, value)
    part = values.get("CPU part", "").lower()
    # Vendor arm64 kernels (L4T R32, Android) and 32-bit task views print a generic "model name : ARMv8
    # Processor rev 1 (v8l)" beside the MIDR fields; the part number names the core.
    if values.get("model name") and not (part and _GENERIC_ARM_NAME.match(values["model name"])):
        return values["model name"]
    if part:
        implementer = values.get("CPU implementer", "").lower()
        return _ARM_CPU_PARTS.get((implementer, part), f"CPU part {part}")
    return values.get("Model") or None


def read_memory_gib(root: str | os.PathLike = "/") -> float | None:
    """``MemTotal`` from ``/proc/meminfo`` in GiB (the kernel reports kB), or None."""
    for line in (_read_text(root, "proc/meminfo") or "").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "MemTotal:":
            try:
                return round(int(parts[1]) / (1024 * 1024), 2)
            except ValueError:
                return None
    return None


def _is_local_root(root: str | os.PathLike) -> bool:
    return os.path.abspath(os.fspath(root)) == os.path.abspath(os.sep)


def _normalise_arch(machine: str) -> str | None:
    machine = machine.lower()
    if machine in ("x86_64", "amd64"):
        return "x86_64"
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    return machine or None


# A 32-bit userland on a 64-bit kernel (32-bit Raspberry Pi OS boots a 64-bit kernel on the Pi 4 and 5): uname
# still says the kernel's machine, so the interpreter's pointer size tells what the userland runs.
_USERLAND_32 = {"aarch64": "armv7l", "x86_64": "i686"}


def userland_arch(machine: str | None, pointer_bits: int | None) -> str | None:
    """The architecture programs run as: ``machine`` (uname's, normalised), or its 32-bit userland when
    the Python that looked is 32-bit (``pointer_bits`` 32)."""
    arch = _normalise_arch(machine or "")
    if pointer_bits == 32 and arch in _USERLAND_32:
        return _USERLAND_32[arch]
    return arch


def _architecture(root: str | os.PathLike) -> str | None:
    if _is_local_root(root):
        return userland_arch(platform.machine(), struct.calcsize("P") * 8)
    fields = dict(_cpuinfo_fields(root))
    if "flags" in fields or "vendor_id" in fields:
        return "x86_64"
    arch = fields.get("CPU architecture")
    if arch == "8" or ("Features" in fields and arch is None):
        return "aarch64"
    if arch == "7":
        return "armv7l"
    return None


def _cpu_count(root: str | os.PathLike) -> int | None:
    if _is_local_root(root):
        return os.cpu_count()
    count = sum(1 for key, _ in _cpuinfo_fields(root) if key == "processor")
    return count or None


# (words in the model string, small variant, its GB, large variant, its GB)
_JETSON_SIZED = (
    ("agx orin", "agx-orin-32gb", 32, "agx-orin-64gb", 64),
    ("orin nx", "orin-nx-8gb", 8, "orin-nx-16gb", 16),
    ("orin nano", "orin-nano-4gb", 4, "orin-nano-8gb", 8),
)


@dataclass(frozen=True)
class _Module:
    part: str  # module part number, "p<board>-<SKU>"
    name: str
    words: str  # the words naming its line in a model string, as _JETSON_SIZED has them
    target: str | None  # the shipped profile made for it; None where none is


# Jetson module part numbers -> the shipped profile made for each (targets/*.yaml name their part numbers in their
# headers). Part numbers and SKUs: NVIDIA Jetson Linux Developer Guide r36.x, Quick Start "Jetson modules and
# developer kits" and "Jetson Module Adaptation and Bring-Up: Jetson Orin NX and Nano Series" (P3767 module on the
# P3768 carrier; Orin NX 16GB P3767-0000, 8GB -0001, Orin Nano 8GB -0003 and -0005 (developer kit, SD card slot),
# 4GB -0004; AGX Orin 32GB P3701-0004, 64GB -0005, P3701-0000 for development only, Industrial -0008), r35.x for
# Xavier NX (P3668-0000 developer kit, -0001, 16GB -0003); the same table in jetson_stats
# (rbonghi/jetson_stats, jtop/core/jetson_variables.py, MODULE_NAME_TABLE) and the compatible strings in NVIDIA's
# Jetson.GPIO (NVIDIA/jetson-gpio, gpio_pin_data.py: "nvidia,p3768-0000+p3767-0001", "nvidia,p3449-0000+p3668-0001").
# Modules no shipped profile covers are named, with no target: the AGX Orin Industrial (other clocks, ECC memory),
# the Xavier NX 16GB (xavier-nx is the 8 GB module) and the development-only P3701-0000 (the first AGX Orin
# developer kit's: 32 GB with the 64GB module's 12 cores, which neither AGX Orin profile is).
_JETSON_MODULES: dict[str, _Module] = {m.part: m for m in (
    _Module("p3767-0000", "Orin NX 16GB", "orin nx", "orin-nx-16gb"),
    _Module("p3767-0001", "Orin NX 8GB", "orin nx", "orin-nx-8gb"),
    _Module("p3767-0003", "Orin Nano 8GB", "orin nano", "orin-nano-8gb"),
    _Module("p3767-0004", "Orin Nano 4GB", "orin nano", "orin-nano-4gb"),
    _Module("p3767-0005", "Orin Nano 8GB (developer kit module)", "orin nano", "orin-nano-8gb"),
    _Module("p3701-0000", "AGX Orin (developer kit module, for development only)", "agx orin", None),
    _Module("p3701-0004", "AGX Orin 32GB", "agx orin", "agx-orin-32gb"),
    _Module("p3701-0005", "AGX Orin 64GB", "agx orin", "agx-orin-64gb"),
    _Module("p3701-0008", "AGX Orin Industrial", "agx orin", None),
    _Module("p3668-0000", "Xavier NX (developer kit module)", "xavier nx", "xavier-nx"),
    _Module("p3668-0001", "Xavier NX", "xavier nx", "xavier-nx"),
    _Module("p3668-0003", "Xavier NX 16GB", "xavier nx", None),
)}


def jetson_modules(compatible: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The known Jetson module part numbers the ``compatible`` strings name, in order, each once (carrier boards'
    part numbers, ``p3768-0000`` beside the module's, are not modules and are left out)."""
    found = (part for entry in compatible for part in _PART_NUMBER_RE.findall(entry.lower()))
    return tuple(dict.fromkeys(part for part in found if part in _JETSON_MODULES))


def describe_modules(parts: tuple[str, ...] | list[str]) -> str | None:
    """The modules as detection shows them: "Orin NX 8GB (p3767-0001)", several joined by " or "."""
    named = [f"{_JETSON_MODULES[p].name} ({p})" for p in parts if p in _JETSON_MODULES]
    return " or ".join(named) or None


def _model_target(text: str, memory_gib: float | None) -> tuple[str, str, bool] | None:
    """(the module line the model string names, its profile, whether the string gave the size), or None when the
    model string names no module."""
    for words, small, _, large, large_gb in _JETSON_SIZED:
        if words in text:
            sizes = [int(s) for s in _SIZE_RE.findall(text)]
            if sizes:
                return words, (large if sizes[0] >= large_gb else small), True
            return words, _memory_sized(words, memory_gib) or small, False
    return ("xavier nx", "xavier-nx", True) if "xavier nx" in text else None


def _memory_sized(words: str, memory_gib: float | None) -> str | None:
    """The variant of the module line ``words`` that MemTotal points to, None where it cannot tell (no MemTotal, a
    line with one size)."""
    for line, small, small_gb, large, large_gb in _JETSON_SIZED:
        if line == words and memory_gib is not None:
            return large if memory_gib > (small_gb + large_gb) / 2 else small
    return None


def target_advice(profile: str | None) -> str:
    """The close of a detection note: pass ``profile`` with --target, or, where it names none, the module's own
    profile (:attr:`BoardInfo.note_target`)."""
    return f"pass --target {profile} (target= in Python)" if profile else \
        "pass --target with the module's profile (target= in Python)"


def _profile_modules(target: str) -> str | None:
    """The modules the shipped profile ``target`` is made for, as detection shows them."""
    return describe_modules([m.part for m in _JETSON_MODULES.values() if m.target == target])


def _jetson_target(model: str | None, memory_gib: float | None,
                   parts: tuple[str, ...]) -> tuple[str | None, str | None, str | None]:
    """(the profile, a note where the sources disagree, the profile the note says to pass) for a Jetson.

    The model string wins where it names a module line (and its size where it gives one); the module's part
    number in the compatible then gives the size the string leaves out, which MemTotal only estimates. Where the
    string names no module (a third-party carrier board's model), the part number alone picks the profile. A
    module no shipped profile is made for (the Xavier NX 16GB, the AGX Orin Industrial) keeps the model string's
    profile, with a note that it is another module's."""
    modules = [_JETSON_MODULES[p] for p in parts if p in _JETSON_MODULES]
    targets = {m.target for m in modules}
    module = modules[0] if len(targets) == 1 else None  # several SKUs of one profile are one module here
    shown = describe_modules(parts)
    named = _model_target((model or "").lower(), memory_gib)
    if named is not None:
        words, target, sized = named
        lines = {m.words for m in modules}
        if not modules or (lines == {words} and module is None):  # no module, or SKUs of the named line of two sizes
            return target, None, None
        if lines != {words} or (sized and module.target not in (None, target)):
            fix = module.target if module is not None else None
            return target, (f"the device-tree model {model!r} and compatible ({shown}) name different modules: "
                            f"{target} is suggested, from the model string; if the module is the compatible's, "
                            f"{target_advice(fix)}"), fix
        if module.target is None:
            return target, (f"the device tree's compatible names {shown}, which no shipped profile is made for: "
                            f"{target} is suggested, from the model string, and is made for "
                            f"{_profile_modules(target)}; for this module, {target_advice(None)}"), None
        if sized:
            return target, None, None
        # the model string names the module's line without its size: the part number's SKU gives it
    elif module is None:
        if len(targets) > 1:
            return None, (f"the device tree's compatible names more than one module ({shown}), so no target is "
                          f"suggested: {target_advice(None)}"), None
        return None, None, None
    if module.target is None:
        return None, None, None
    guess = _memory_sized(module.words, memory_gib)
    if guess is not None and guess != module.target:
        return module.target, (f"the device tree's compatible names {shown}, but MemTotal {memory_gib} GiB is that "
                               f"of {guess}: {module.target} is suggested, from the part number; if the module is "
                               f"the other one, {target_advice(guess)}"), guess
    return module.target, None, None


def suggest_target(
    model: str | None, family: str, architecture: str | None, memory_gib: float | None,
    modules: tuple[str, ...] = (),
) -> str | None:
    """The shipped profile name matching the board, "host" on x86-64, else None.

    A Jetson module size comes from the model string ("Orin NX 16GB") when it says, else from the
    module's part number in the device tree's compatible (``modules``, :func:`jetson_modules`), else from
    MemTotal, which sits below the module size (carve-outs), so the cut is between the two sizes.
    With none of them, the smaller variant is the safe guess (it has the smaller memory budget).
    A model string that names no module (a third-party carrier board's) leaves the part number to pick it.
    The Jetson and Raspberry Pi profiles are for 64-bit Arm userlands (JetPack, 64-bit Raspberry Pi OS):
    a board known to run another (32-bit Raspberry Pi OS) matches none.
    """
    return _suggest(model, family, architecture, memory_gib, modules)[0]


def suggest_target_and_note(model: str | None, family: str, architecture: str | None, memory_gib: float | None,
                            modules: tuple[str, ...] = ()) -> tuple[str | None, str | None, str | None]:
    """:func:`suggest_target`'s target, the :attr:`BoardInfo.detection_note` beside it and the note's
    :attr:`BoardInfo.note_target`, for facts read elsewhere (deploy's probe of a board, whose architecture is the
    board's Python's)."""
    return _suggest(model, family, architecture, memory_gib, tuple(modules))


def _suggest(model: str | None, family: str, architecture: str | None, memory_gib: float | None,
             modules: tuple[str, ...]) -> tuple[str | None, str | None, str | None]:
    """:func:`suggest_target`'s target, a note where the model string and the module disagree, and the profile
    the note says to pass (:attr:`BoardInfo.note_target`)."""
    if family in ("jetson", "rpi") and architecture not in (None, "aarch64"):
        return None, None, None
    if family == "jetson":
        return _jetson_target(model, memory_gib, tuple(modules))
    if family == "rpi":
        match = _RPI_RE.match(model or "")
        return {"5": "rpi5", "4": "rpi4"}.get(match.group(1) if match else ""), None, None
    return ("host" if architecture == "x86_64" else None), None, None


def _family(model: str | None, root: str | os.PathLike, modules: tuple[str, ...] = ()) -> str:
    text = model or ""
    if modules or os.path.exists(Path(root) / "etc/nv_tegra_release") or any(
        word in text for word in ("NVIDIA Jetson", "Orin", "Xavier")
    ):
        return "jetson"
    if text.startswith("Raspberry Pi"):
        return "rpi"
    return "host"


def detect_board(root: str | os.PathLike = "/") -> BoardInfo:
    """Detect the board from the files under ``root``; never raises on missing files."""
    model = read_device_tree_model(root)
    modules = jetson_modules(read_device_tree_compatible(root))
    family = _family(model, root, modules)
    l4t = read_l4t_release(root)
    architecture = _architecture(root)
    memory_gib = read_memory_gib(root)
    target, note, note_target = _suggest(model, family, architecture, memory_gib, modules)
    return BoardInfo(
        model=model,
        family=family,
        l4t=l4t,
        jetpack=jetpack_for_l4t(l4t),
        architecture=architecture,
        cpu_count=_cpu_count(root),
        memory_gib=memory_gib,
        cpu_model_name=read_cpu_model_name(root),
        cpu_features=read_cpu_features(root),
        suggested_target=target,
        module=describe_modules(modules),
        detection_note=note,
        note_target=note_target,
    )
