"""Review 48 of the board area: JetPack releases of Orin's first L4T lines, Jetson Thor's core name, and huge
page sizes given to glibc.malloc.hugetlb in bytes."""

from __future__ import annotations

import pytest

from edgesdk.board import detect_board, jetpack_for_l4t
from edgesdk.runtime.huge_pages import commands_use_huge_pages

GLIBC = ("glibc", "2.36")


@pytest.mark.parametrize(("line", "l4t", "jetpack"), [
    ("# R35 (release), REVISION: 1.0, GCID: 31346300, BOARD: t186ref, EABI: aarch64, DATE: Thu Aug 25 18:41:45 UTC "
     "2022", "35.1.0", "5.0.2"),
    ("# R34 (release), REVISION: 1.1, GCID: 30414990, BOARD: t186ref, EABI: aarch64", "34.1.1", "5.0.1 DP"),
    ("# R34 (release), REVISION: 1.0, GCID: 30102743, BOARD: t186ref, EABI: aarch64", "34.1.0", "5.0 DP"),
    ("# R38 (release), REVISION: 2.2, GCID: 42205042, BOARD: generic, EABI: aarch64", "38.2.2", "7.0"),
])
def test_orin_s_first_releases_and_jetpack_7_0_s_update_name_their_jetpack(tmp_path, line, l4t, jetpack):
    """jetson_stats (jtop/core/jetson_variables.py) and jetson-containers (l4t_version.py) map R35.1 to JetPack
    5.0.2, the first production JetPack of the AGX Orin, R34.1 / R34.1.1 to the 5.0 developer previews, and
    jetson-containers R38.2.2 to JetPack 7.0: an Orin on them read as JetPack unknown (env, deploy's probe, the
    TensorRT engine cache key "jpunknown")."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nv_tegra_release").write_text(line + "\n")
    (tmp_path / "proc" / "device-tree").mkdir(parents=True)
    (tmp_path / "proc" / "device-tree" / "model").write_bytes(b"NVIDIA Jetson AGX Orin Developer Kit\x00")
    board = detect_board(tmp_path)
    assert (board.family, board.l4t, board.jetpack) == ("jetson", l4t, jetpack)
    assert jetpack_for_l4t(l4t) == jetpack


@pytest.mark.parametrize(("value", "sizes", "used"), [
    ("2097152", ["hugepages-2048kB"], True),  # 2 MiB in bytes, a size the kernel has: as =2 does
    ("1073741824", ["hugepages-2048kB", "hugepages-1048576kB"], True),  # 1 GiB pages
    ("1073741824", ["hugepages-2048kB"], False),  # a size the kernel lacks: glibc ignores it
    ("3", ["hugepages-2048kB"], False),  # no page size
    ("2", ["hugepages-2048kB"], True),  # the default size (/proc/meminfo Hugepagesize)
    ("2", [], False),  # no pool of the default size
    ("0", ["hugepages-2048kB"], False),
    ("yes", ["hugepages-2048kB"], False),
])
def test_a_huge_page_size_in_bytes_is_huge_pages_as_glibc_reads_it(tmp_path, value, sizes, used):
    """glibc manual, "Memory Allocation Tunables": glibc.malloc.hugetlb above 2 is a huge page size, matched
    against the sizes the kernel supports (/sys/kernel/mm/hugepages); `edgesdk env` said no huge pages for it."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("Hugepagesize:       2048 kB\n")
    for size in sizes:  # each pool with pages reserved (an empty pool is tests/unit/test_huge_pages53.py's)
        pool = tmp_path / "sys" / "kernel" / "mm" / "hugepages" / size
        pool.mkdir(parents=True)
        (pool / "free_hugepages").write_text("16\n")
    environ = {"GLIBC_TUNABLES": f"glibc.malloc.hugetlb={value}"}
    assert commands_use_huge_pages(environ, "madvise", GLIBC, root=tmp_path) is used


def test_the_thp_values_keep_their_meaning(tmp_path):
    for value, mode, used in (("1", "madvise", True), ("1", "always", True), ("1", "never", False)):
        environ = {"GLIBC_TUNABLES": f"glibc.malloc.hugetlb={value}"}
        assert commands_use_huge_pages(environ, mode, GLIBC, root=tmp_path) is used


def test_jetson_thor_s_core_is_named(tmp_path):
    """Linux arch/arm64/include/asm/cputype.h: ARM_CPU_PART_NEOVERSE_V3AE 0xD83, Jetson Thor's core (JetPack 7,
    whose L4T releases the table holds); it read as "CPU part 0xd83"."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd asimddp i8mm sve2\nCPU implementer\t: 0x41\n"
        "CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd83\nCPU revision\t: 1\n")
    assert detect_board(tmp_path).cpu_model_name == "Neoverse-V3AE"
