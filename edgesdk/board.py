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
- ``/etc/nv_tegra_release``: written by NVIDIA's ``nvidia-l4t-core`` package; its first line
  holds the L4T major (``# R36``) and ``REVISION: 4.3``.
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


def suggest_target(
    model: str | None, family: str, architecture: str | None, memory_gib: float | None
) -> str | None:
    """The shipped profile name matching the board, "host" on x86-64, else None.

    A Jetson module size comes from the model string ("Orin NX 16GB") when it says, else from
    MemTotal, which sits below the module size (carve-outs), so the cut is between the two sizes.
    With neither, the smaller variant is the safe guess (it has the smaller memory budget).
    The Jetson and Raspberry Pi profiles are for 64-bit Arm userlands (JetPack, 64-bit Raspberry Pi OS):
    a board known to run another (32-bit Raspberry Pi OS) matches none.
    """
    text = (model or "").lower()
    if family in ("jetson", "rpi") and architecture not in (None, "aarch64"):
        return None
    if family == "jetson":
        for words, small, small_gb, large, large_gb in _JETSON_SIZED:
            if words in text:
                sizes = [int(s) for s in _SIZE_RE.findall(text)]
                if sizes:
                    return large if sizes[0] >= large_gb else small
                if memory_gib is not None and memory_gib > (small_gb + large_gb) / 2:
                    return large
                return small
        return "xavier-nx" if "xavier nx" in text else None
    if family == "rpi":
        match = _RPI_RE.match(model or "")
        return {"5": "rpi5", "4": "rpi4"}.get(match.group(1) if match else "")
    return "host" if architecture == "x86_64" else None


def _family(model: str | None, root: str | os.PathLike) -> str:
    text = model or ""
    if os.path.exists(Path(root) / "etc/nv_tegra_release") or any(
        word in text for word in ("NVIDIA Jetson", "Orin", "Xavier")
    ):
        return "jetson"
    if text.startswith("Raspberry Pi"):
        return "rpi"
    return "host"


def detect_board(root: str | os.PathLike = "/") -> BoardInfo:
    """Detect the board from the files under ``root``; never raises on missing files."""
    model = read_device_tree_model(root)
    family = _family(model, root)
    l4t = read_l4t_release(root)
    architecture = _architecture(root)
    memory_gib = read_memory_gib(root)
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
        suggested_target=suggest_target(model, family, architecture, memory_gib),
    )
