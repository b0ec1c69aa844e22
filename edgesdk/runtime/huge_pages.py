"""Transparent huge pages for the weights a decode step streams.

Batch-1 decode reads every weight once per token (SmolLM2-135M's default bundle: 72.6 MB). With
4 KiB pages that is some 18,000 TLB entries a token, far beyond the TLB, so the weight stream
pays a page walk every few cache lines. Backed by 2 MiB transparent huge pages the same stream
needs about 35. ONNX Runtime keeps its (prepacked) weights in memory from ``malloc``, and glibc
>= 2.35 asks the kernel for huge pages on its heap and mmap'd chunks (``madvise(MADV_HUGEPAGE)``)
when the tunable ``glibc.malloc.hugetlb=1`` is set (glibc manual, "Memory Allocation Tunables";
Linux ``Documentation/admin-guide/mm/transhuge.rst``: THP mode ``always`` or ``madvise``).
Measured on the 2-core x86-64 host, SmolLM2-135M default bundle, fresh processes alternating
with and without the tunable (15 comparisons, either order): decode 0.97-1.41x, median 1.11x
(the host's own drift is ±15 %); 226 MiB on huge pages, the same RSS
(tests/benchmarks/test_decode_binding.py). llama.cpp gains as much when its
weights sit in anonymous memory (``--no-mmap``), so this speeds the board up without changing
the ratio between the two engines.

glibc reads tunables once, at process start, so the ``edgesdk run``, ``eval``, ``serve`` and
``bench`` commands re-execute themselves with the tunable added before they load a bundle (the
:func:`reexec_with_huge_pages` call in ``edgesdk.cli.entry``). ``EDGESDK_HUGE_PAGES=0`` opts out;
a program using the Python API sets ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` itself.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGEPAGES_DIR = Path("/sys/kernel/mm/hugepages")  # one hugepages-<kB>kB folder per huge page size the kernel has
MIN_GLIBC = (2, 35)  # the first glibc with the glibc.malloc.hugetlb tunable
OPT_OUT = "EDGESDK_HUGE_PAGES"
OPT_OUT_VALUES = ("0", "false", "no", "off")  # EDGESDK_HUGE_PAGES=0 (or these words) opts out


def thp_mode(path: Path = THP_MODE) -> str | None:
    """The kernel's THP mode (``always``, ``madvise``, ``never``), or None where there is none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def _glibc_version(libc: tuple[str, str]) -> tuple[int, ...] | None:
    name, version = libc
    if name != "glibc":
        return None
    try:
        return tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return None


def huge_page_environment(environ: dict[str, str], mode: str | None, libc: tuple[str, str]) -> dict[str, str] | None:
    """The environment to re-execute with, or None when it would change nothing.

    None when the user opted out, the tunable is already set (the re-executed process itself),
    the C library is not glibc >= 2.35, or the kernel has no THP or has it off.
    """
    if environ.get(OPT_OUT, "1").strip().lower() in OPT_OUT_VALUES:
        return None
    existing = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in existing:
        return None
    version = _glibc_version(libc)
    if version is None or version < MIN_GLIBC or mode not in ("always", "madvise"):
        return None
    return {**environ, "GLIBC_TUNABLES": f"{existing}:{TUNABLE}" if existing else TUNABLE}


def _hugetlb_value(tunables: str) -> str | None:
    """The value ``GLIBC_TUNABLES`` gives ``glibc.malloc.hugetlb`` (the last one wins), or None."""
    value = None
    for item in tunables.split(":"):
        name, _, setting = item.partition("=")
        if name == "glibc.malloc.hugetlb":
            value = setting
    return value


def commands_use_huge_pages(environ: dict[str, str], mode: str | None, libc: tuple[str, str],
                            hugepages_dir: Path = HUGEPAGES_DIR) -> bool:
    """Whether ``run`` / ``eval`` / ``serve`` / ``bench`` started with ``environ`` put the weights on huge
    pages: the tunable is already set to 1 (THP on) or 2 (reserved huge pages) on a glibc that reads it, or
    they would re-execute with it.

    glibc reads the value as a number: 1 is THP ``madvise``, 2 the default huge page size, and a larger value
    a huge page size in bytes, taken where the kernel has that size (``hugepages_dir`` holds
    ``hugepages-<kB>kB``) and ignored otherwise (glibc manual, "Memory Allocation Tunables"; ``malloc/arena.c``
    ``do_set_hugetlb``), so ``glibc.malloc.hugetlb=2097152`` asks for 2 MiB pages as ``=2`` does."""
    version = _glibc_version(libc)
    if version is None or version < MIN_GLIBC:
        return False
    value = _hugetlb_value(environ.get("GLIBC_TUNABLES", ""))
    if value is not None:
        number = int(value) if value.strip().isdigit() else None
        if number is not None and number > 2:
            return number % 1024 == 0 and (hugepages_dir / f"hugepages-{number // 1024}kB").is_dir()
        return number == 2 or (number == 1 and mode in ("always", "madvise"))
    return huge_page_environment(environ, mode, libc) is not None


# The re-executed interpreter's program: ``-m edgesdk`` would put the working directory first on
# sys.path, so a directory holding another ``edgesdk`` (a checkout) would run that code instead.
# ``-c`` puts it there as "" unless PYTHONSAFEPATH is set (Python >= 3.11): then sys.path[0] is the
# first PYTHONPATH entry, which may be where edgesdk itself comes from, and stays.
REEXEC_PROGRAM = "import sys; sys.path[:1] == [''] and sys.path.pop(0); from edgesdk.cli import entry; entry()"


def reexec_with_huge_pages(argv: list[str]) -> None:
    """Replace this process by the installed edgesdk CLI on ``argv[1:]`` with huge pages on, when that helps.

    Returns (doing nothing) where :func:`huge_page_environment` says it would change nothing, or
    where the interpreter cannot be started again (an embedded Python): the command then runs on
    small pages, as it would without this.
    """
    if not sys.platform.startswith("linux") or not sys.executable:
        return
    environment = huge_page_environment(dict(os.environ), thp_mode(), platform.libc_ver())
    if environment is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, "-c", REEXEC_PROGRAM, *argv[1:]], environment)
    except OSError:
        return


def huge_pages_in_use() -> int | None:
    """Bytes of this process's anonymous memory on huge pages (Linux), None where unknown."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def huge_pages_state(environ: dict[str, str] | None = None, mode_path: Path = THP_MODE) -> dict:
    """What ``bench`` records of huge pages: the kernel's THP mode, the ``glibc.malloc.hugetlb`` value this
    process started with (None unset) and the MiB of its anonymous memory on huge pages (None unknown)."""
    in_use = huge_pages_in_use()
    tunables = (os.environ if environ is None else environ).get("GLIBC_TUNABLES", "")
    return {"transparent_huge_pages": thp_mode(mode_path), "glibc_hugetlb": _hugetlb_value(tunables),
            "anon_huge_pages_mib": None if in_use is None else round(in_use / 2**20, 1)}
