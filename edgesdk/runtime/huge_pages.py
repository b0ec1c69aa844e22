"""Transparent huge pages for the weights a decode step streams.

Batch-1 decode reads every weight once per token (SmolLM2-135M's default bundle: 72.6 MB). With
4 KiB pages that is some 18,000 TLB entries a token, far beyond the TLB, so the weight stream
pays a page walk every few cache lines. Backed by 2 MiB transparent huge pages the same stream
needs about 35. ONNX Runtime keeps its (prepacked) weights in memory from ``malloc``, and glibc
>= 2.35 asks the kernel for huge pages on its heap and mmap'd chunks (``madvise(MADV_HUGEPAGE)``)
when the tunable ``glibc.malloc.hugetlb=1`` is set and the kernel's THP mode is ``madvise`` (glibc manual,
"Memory Allocation Tunables"; Linux ``Documentation/admin-guide/mm/transhuge.rst``). In mode ``always``
the kernel backs the memory with huge pages by itself and glibc ignores the tunable's 1.
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
THP_MODE_UNDER_ROOT = "sys/kernel/mm/transparent_hugepage/enabled"
HUGEPAGES_UNDER_ROOT = "sys/kernel/mm/hugepages"  # one hugepages-<kB>kB folder per huge page size the kernel has
MEMINFO_UNDER_ROOT = "proc/meminfo"  # its Hugepagesize: line is the default huge page size (glibc.malloc.hugetlb=2)
MIN_GLIBC = (2, 35)  # the first glibc with the glibc.malloc.hugetlb tunable
STRICT_TUNABLES_GLIBC = (2, 39)  # from here glibc ignores a numeric tunable with text after its number
UINT64_MAX = 2**64 - 1
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
    the C library is not glibc >= 2.35, or the kernel's THP mode is not ``madvise``: glibc acts on
    ``glibc.malloc.hugetlb=1`` only there (``malloc/malloc.c`` ``do_set_hugetlb``; in mode ``always``
    the kernel hands out huge pages without it, so a re-execution would only cost a second start).
    """
    if environ.get(OPT_OUT, "1").strip().lower() in OPT_OUT_VALUES:
        return None
    existing = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in existing:
        return None
    version = _glibc_version(libc)
    if version is None or version < MIN_GLIBC or mode != "madvise":
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


def _tunable_number(text: str, version: tuple[int, ...]) -> int | None:
    """The number glibc reads from a numeric tunable's ``text``, or None where it ignores the setting.

    Mirrors ``_dl_strtoul`` (``elf/dl-misc.c``): spaces and tabs skipped, an optional sign, ``0x``
    hexadecimal, a leading ``0`` octal, ASCII digits only, a negative number wrapping to unsigned. Its overflow
    test, made before each digit is taken, errs on the safe side: it trips already from 18446744073709551606 in
    decimal (0xfffffffffffffff0 in hexadecimal), 2**64 - 1 itself included, short of any real overflow. Where it
    trips the number stops at that digit: 2**64 - 1, not negated even after a ``-``, the digit left unread.
    glibc before 2.39 takes the number before any other text (none: 0); from 2.39
    (``tunable_parse_num``) a value with text (or an unread digit) after its number is ignored."""
    rest = text.lstrip(" \t")
    negative = rest[:1] == "-"
    rest = rest[1:] if rest[:1] in ("-", "+") else rest
    base, digits = 10, "0123456789"
    if rest[:2] in ("0x", "0X"):
        base, digits, rest = 16, "0123456789abcdefABCDEF", rest[2:]
    elif rest[:1] == "0":
        base, digits = 8, "01234567"
    length = next((i for i, char in enumerate(rest) if char not in digits), len(rest))
    if length < len(rest) and version >= STRICT_TUNABLES_GLIBC:
        return None
    number = 0
    for char in rest[:length]:
        digit = int(char, base)
        if number >= (UINT64_MAX - digit) // base:  # _dl_strtoul's overflow test, before the multiplication
            return None if version >= STRICT_TUNABLES_GLIBC else UINT64_MAX
        number = number * base + digit
    return (-number) & UINT64_MAX if negative else number


def _hugetlb_setting(tunables: str, version: tuple[int, ...]) -> int | None:
    """The number glibc takes for ``glibc.malloc.hugetlb`` from ``tunables`` (the last setting it accepts
    wins), or None where it is unset."""
    setting = None
    for item in tunables.split(":"):
        name, _, value = item.partition("=")
        number = _tunable_number(value, version) if name == "glibc.malloc.hugetlb" else None
        setting = setting if number is None else number
    return setting


def _read_int(path: Path) -> int:
    """The integer in a sysfs counter file, 0 where it is missing or unreadable."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def _default_huge_page_kb(root: Path) -> int | None:
    """The kernel's default huge page size in kB (``Hugepagesize:`` of /proc/meminfo, as glibc reads it)."""
    try:
        lines = (root / MEMINFO_UNDER_ROOT).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        number = value.split()[0] if value.split() else ""
        if name == "Hugepagesize" and number.isascii() and number.isdigit():
            return int(number)
    return None


def hugetlb_pool_has_pages(size_kb: int, root: Path = Path("/")) -> bool:
    """Whether a ``MAP_HUGETLB`` mapping of ``size_kb`` pages can get any: the kernel has that size and its pool
    has a free page nobody reserved, or may overcommit more (``Documentation/admin-guide/mm/hugetlbpage.rst``).
    Both are 0 unless an administrator set ``nr_hugepages`` / ``nr_overcommit_hugepages``; the mmap then fails
    and glibc falls back to small pages."""
    pool = root / HUGEPAGES_UNDER_ROOT / f"hugepages-{size_kb}kB"
    if not pool.is_dir():
        return False
    free = _read_int(pool / "free_hugepages") - _read_int(pool / "resv_hugepages")
    overcommit = _read_int(pool / "nr_overcommit_hugepages") - _read_int(pool / "surplus_hugepages")
    return free > 0 or overcommit > 0


def commands_use_huge_pages(environ: dict[str, str], mode: str | None, libc: tuple[str, str],
                            root: Path = Path("/")) -> bool:
    """Whether ``run`` / ``eval`` / ``serve`` / ``bench`` started with ``environ`` put the weights on huge
    pages, on the system whose /sys and /proc lie under ``root``.

    Yes where the THP mode is ``always`` (the kernel backs anonymous memory by itself). Otherwise on a glibc
    >= 2.35 only, by ``glibc.malloc.hugetlb`` as glibc reads it (``malloc/malloc.c`` ``do_set_hugetlb``): 1 is
    THP ``madvise`` and counts in mode ``madvise``; 2 is the default huge page size (/proc/meminfo
    ``Hugepagesize``) and a larger value a huge page size in bytes, matched against the kernel's
    ``hugepages-<kB>kB`` folders; both count only where that size's pool has pages
    (:func:`hugetlb_pool_has_pages`). Unset, they count where the commands would re-execute with 1."""
    if mode == "always":
        return True
    version = _glibc_version(libc)
    if version is None or version < MIN_GLIBC:
        return False
    setting = _hugetlb_setting(environ.get("GLIBC_TUNABLES", ""), version)
    if setting is None:
        return huge_page_environment(environ, mode, libc) is not None
    if setting == 1:
        return mode == "madvise"
    if setting == 2:
        size_kb = _default_huge_page_kb(root)
        return size_kb is not None and hugetlb_pool_has_pages(size_kb, root)
    return setting > 2 and setting % 1024 == 0 and hugetlb_pool_has_pages(setting // 1024, root)


# The re-executed interpreter's program where the command was not started as ``edgesdk`` (the console script) or
# ``python -m edgesdk`` (e.g. ``python -c`` calling ``entry()``): ``-m edgesdk`` would put the working directory first
# on sys.path, so a directory holding another ``edgesdk`` (a checkout) would run that code instead.
# ``-c`` puts it there as "" unless PYTHONSAFEPATH is set (Python >= 3.11): then sys.path[0] is the
# first PYTHONPATH entry, which may be where edgesdk itself comes from, and stays.
REEXEC_PROGRAM = "import sys; sys.path[:1] == [''] and sys.path.pop(0); from edgesdk.cli import entry; entry()"

# What a console script for ``edgesdk.cli:entry`` holds (pip's, uv's and setuptools' script writers alike), read in
# its first bytes before the script is run again as the program.
CONSOLE_SCRIPT_IMPORT = "from edgesdk.cli import entry"


def _path_flags() -> list[str]:
    """The interpreter options this process started with that decide its sys.path (-I, -E, -s, -P), so the
    re-executed interpreter imports the same edgesdk."""
    if sys.flags.isolated:
        return ["-I"]
    return [flag for flag, on in (("-E", sys.flags.ignore_environment), ("-s", sys.flags.no_user_site),
                                  ("-P", getattr(sys.flags, "safe_path", False))) if on]


def _is_console_script(path: str) -> bool:
    """Whether ``path`` is edgesdk's console script: a file this interpreter ran as its program (``__main__``'s)
    that imports ``edgesdk.cli``'s entry."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        if not main_file or not os.path.samefile(main_file, path):
            return False
        with open(path, "rb") as script:
            return CONSOLE_SCRIPT_IMPORT.encode() in script.read(4096)
    except (OSError, ValueError):
        return False


def reexec_argv(argv: list[str]) -> list[str]:
    """The command line that starts this edgesdk command again (``argv``: ``sys.argv``), as process tools show it.

    Started as the console script: this interpreter running the script (``python /venv/bin/edgesdk serve ...``),
    which ``pgrep -f 'edgesdk serve'`` finds; a script's own directory, not the working one, leads sys.path, so a
    checkout in the working directory is not imported. Started as ``python -m edgesdk``: the same, whose sys.path
    (the working directory first) is the one this process imported edgesdk from. Otherwise ``-c``
    :data:`REEXEC_PROGRAM`, which imports the installed edgesdk whatever the working directory holds."""
    python = [sys.executable, *_path_flags()]
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(main_spec, "name", None) == "edgesdk.__main__":
        return [*python, "-m", "edgesdk", *argv[1:]]
    if argv and _is_console_script(argv[0]):
        return [*python, argv[0], *argv[1:]]
    return [sys.executable, "-c", REEXEC_PROGRAM, *argv[1:]]


def reexec_with_huge_pages(argv: list[str]) -> None:
    """Replace this process by the installed edgesdk CLI on ``argv[1:]`` with huge pages on, when that helps,
    started as :func:`reexec_argv` says, so that ``ps`` and ``pgrep`` show it as ``edgesdk COMMAND``.

    Returns (doing nothing) where :func:`huge_page_environment` says it would change nothing, or
    where the interpreter cannot be started again (an embedded Python): the command then runs on
    small pages, as it would without this.
    """
    if not sys.platform.startswith("linux") or not sys.executable:
        return
    environment = huge_page_environment(dict(os.environ), thp_mode(), platform.libc_ver())
    if environment is None:
        return
    for stream in (sys.stdout, sys.stderr):  # None where the caller closed it (`>&-`): the command refuses that itself
        if stream is not None:
            stream.flush()
    try:
        os.execve(sys.executable, reexec_argv(argv), environment)
    except OSError:
        return


SMAPS_ROLLUP = Path("/proc/self/smaps_rollup")
# smaps_rollup's fields of private memory on huge pages (proc(5)): transparent ones (glibc.malloc.hugetlb=1, THP
# mode always) and hugetlb ones (glibc.malloc.hugetlb=2 or a page size: MAP_HUGETLB, which AnonHugePages leaves out)
HUGE_PAGE_FIELDS = ("AnonHugePages", "Private_Hugetlb")


def huge_pages_in_use(path: Path = SMAPS_ROLLUP) -> int | None:
    """Bytes of this process's private memory on huge pages (Linux), transparent and hugetlb ones together; None
    where unknown (no smaps_rollup, or one without AnonHugePages)."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    sizes = {}
    for line in lines:
        name, _, value = line.partition(":")
        kb = value.split()[0] if value.split() else ""
        if name in HUGE_PAGE_FIELDS and kb.isascii() and kb.isdigit():
            sizes[name] = int(kb) * 1024
    return sum(sizes.values()) if "AnonHugePages" in sizes else None


def huge_pages_state(environ: dict[str, str] | None = None, mode_path: Path = THP_MODE) -> dict:
    """What ``bench`` records of huge pages: the kernel's THP mode, the ``glibc.malloc.hugetlb`` value this
    process started with (None unset) and the MiB of its private memory on huge pages, transparent and hugetlb
    ones (:func:`huge_pages_in_use`; None unknown)."""
    in_use = huge_pages_in_use()
    tunables = (os.environ if environ is None else environ).get("GLIBC_TUNABLES", "")
    return {"transparent_huge_pages": thp_mode(mode_path), "glibc_hugetlb": _hugetlb_value(tunables),
            "anon_huge_pages_mib": None if in_use is None else round(in_use / 2**20, 1)}
