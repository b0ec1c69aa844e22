"""Review 53 of huge pages: reserved huge pages need a pool that has pages, the tunable is read as glibc reads
it, THP mode ``always`` needs no re-execution, and ``edgesdk env`` reads the kernel files under its root."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.envinfo import collect_env
from edgesdk.runtime.huge_pages import (
    OPT_OUT,
    commands_use_huge_pages,
    huge_page_environment,
    hugetlb_pool_has_pages,
    thp_mode,
)

GLIBC = ("glibc", "2.36")
STRICT_GLIBC = ("glibc", "2.39")
EMPTY = {"nr_hugepages": 0, "free_hugepages": 0, "resv_hugepages": 0, "nr_overcommit_hugepages": 0,
         "surplus_hugepages": 0}
RESERVED = {**EMPTY, "nr_hugepages": 64, "free_hugepages": 64}


def _fake_root(root: Path, pools: dict[int, dict[str, int]], default_kb: int = 2048, mode: str = "madvise") -> Path:
    """A root holding the kernel files huge_pages reads: THP mode, /proc/meminfo and one pool per size."""
    thp = root / "sys/kernel/mm/transparent_hugepage"
    thp.mkdir(parents=True)
    (thp / "enabled").write_text(" ".join(f"[{m}]" if m == mode else m for m in ("always", "madvise", "never")) + "\n")
    (root / "proc").mkdir()
    (root / "proc/meminfo").write_text(f"MemTotal:       16384000 kB\nHugePages_Total:       0\n"
                                       f"Hugepagesize:       {default_kb} kB\nHugetlb:               0 kB\n")
    for size_kb, counters in pools.items():
        pool = root / f"sys/kernel/mm/hugepages/hugepages-{size_kb}kB"
        pool.mkdir(parents=True)
        for name, value in counters.items():
            (pool / name).write_text(f"{value}\n")
    return root


def _uses(tunables: str, root: Path, libc: tuple[str, str] = GLIBC, mode: str = "madvise") -> bool:
    return commands_use_huge_pages({"GLIBC_TUNABLES": tunables}, mode, libc, root)


@pytest.mark.parametrize(("value", "pools", "default_kb", "used"), [
    ("2", {2048: EMPTY}, 2048, False),  # the default: nothing reserved, MAP_HUGETLB fails, small pages
    ("2", {2048: RESERVED}, 2048, True),
    ("2", {2048: {**RESERVED, "resv_hugepages": 64}}, 2048, False),  # every free page is promised elsewhere
    ("2", {2048: {**EMPTY, "nr_overcommit_hugepages": 32}}, 2048, True),  # surplus pages may be allocated
    ("2", {2048: RESERVED, 1048576: EMPTY}, 1048576, False),  # 2 is the default size: 1 GiB, empty
    ("2097152", {2048: EMPTY}, 2048, False),
    ("2097152", {2048: RESERVED}, 2048, True),
    ("1073741824", {2048: RESERVED, 1048576: EMPTY}, 2048, False),
    ("1073741824", {2048: EMPTY, 1048576: {**EMPTY, "free_hugepages": 1}}, 2048, True),
])
def test_reserved_huge_pages_count_only_where_their_pool_has_pages(tmp_path, value, pools, default_kb, used):
    """glibc.malloc.hugetlb=2 (or a size) maps with MAP_HUGETLB, which takes pages from the hugetlb pool
    (nr_hugepages / nr_overcommit_hugepages, both 0 unless an administrator sets them); with none the mmap
    fails and glibc quietly uses small pages. `edgesdk env` said yes wherever the size existed."""
    root = _fake_root(tmp_path, pools, default_kb)
    assert _uses(f"glibc.malloc.hugetlb={value}", root) is used


@pytest.mark.parametrize(("value", "libc", "used"), [
    ("0x200000", GLIBC, True),  # _dl_strtoul reads hexadecimal: 2 MiB
    ("0X200000", GLIBC, True),
    (" 2", GLIBC, True),  # leading blanks skipped
    ("02", GLIBC, True),  # octal 2
    ("010", GLIBC, False),  # octal 8: no page size
    ("\u00b2", GLIBC, False),  # superscript two: str.isdigit() says yes, glibc sees no digit (0)
    ("2abc", GLIBC, True),  # before 2.39 the number before the text counts
    ("2abc", STRICT_GLIBC, False),  # from 2.39 the setting is ignored: unset
    ("-1", GLIBC, False),  # wraps to 2**64 - 1: no page size
])
def test_the_tunable_value_is_read_as_glibc_reads_it(tmp_path, value, libc, used):
    root = _fake_root(tmp_path, {2048: RESERVED})
    assert _uses(f"glibc.malloc.hugetlb={value}", root, libc) is used


def test_a_setting_glibc_ignores_leaves_the_one_before(tmp_path):
    root = _fake_root(tmp_path, {2048: RESERVED})
    tunables = "glibc.malloc.hugetlb=2:glibc.malloc.hugetlb=two"
    assert _uses(tunables, root, STRICT_GLIBC)  # 2.39 ignores "two": 2 stays
    assert not _uses(tunables, root, GLIBC)  # older glibc reads "two" as 0


def test_thp_always_needs_no_reexecution_and_its_huge_pages_are_reported(tmp_path):
    """glibc sets up THP madvise for glibc.malloc.hugetlb=1 only in mode madvise (malloc.c do_set_hugetlb);
    in mode always the kernel backs anonymous memory by itself, tunable or not, opted out or not."""
    assert huge_page_environment({"PATH": "/bin"}, "always", GLIBC) is None
    assert huge_page_environment({"PATH": "/bin"}, "madvise", GLIBC) is not None
    root = _fake_root(tmp_path, {2048: EMPTY}, mode="always")
    for environ in ({OPT_OUT: "0"}, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {}):
        assert commands_use_huge_pages(environ, "always", GLIBC, root)


def test_env_reads_the_huge_page_files_under_its_root(tmp_path):
    """collect_env(root) read the board and GPU nodes under root but THP and the pools of this machine."""
    root = _fake_root(tmp_path, {2048: RESERVED}, mode="never")
    memory = collect_env(root)["memory"]
    assert memory["transparent_huge_pages"] == "never"
    assert hugetlb_pool_has_pages(2048, root)
    assert not hugetlb_pool_has_pages(1048576, root)


def _anon_huge_kb(tunables: str) -> int:
    """AnonHugePages of a fresh interpreter that fills 64 MiB from malloc with ``tunables`` set."""
    program = ("buf = bytearray(64 * 2**20)\nfor i in range(0, len(buf), 4096): buf[i] = 1\n"
               "print(next(l.split()[1] for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')))")
    environment = {**os.environ, "GLIBC_TUNABLES": tunables}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=environment,
                          timeout=120, check=True)
    return int(done.stdout)


@pytest.mark.parametrize("value", ["2", "2097152"])
def test_the_answer_matches_a_real_process_without_a_pool(value):
    """On this machine, where the 2 MiB pool is empty (the default), a process with hugetlb=2 gets no huge
    pages at all, and the report must say so."""
    libc = platform.libc_ver()
    version = tuple(int(part) for part in libc[1].split(".")[:2]) if libc[0] == "glibc" else ()
    if thp_mode() != "madvise" or version < (2, 35) or not Path("/proc/self/smaps_rollup").exists():
        pytest.skip(f"needs THP madvise and glibc >= 2.35 (THP {thp_mode()}, C library {libc})")
    if hugetlb_pool_has_pages(2048):
        pytest.skip("this machine has 2 MiB huge pages reserved")
    tunables = f"glibc.malloc.hugetlb={value}"
    assert _anon_huge_kb(tunables) == 0
    assert not commands_use_huge_pages({"GLIBC_TUNABLES": tunables}, "madvise", libc)
