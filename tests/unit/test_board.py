"""Board detection on fake root trees, and the ``edgesdk env`` report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.board import BoardInfo, detect_board, jetpack_for_l4t, read_l4t_release
from edgesdk.envinfo import collect_env, format_env

REPO = Path(__file__).resolve().parents[2]

ORIN_FEATURES = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
    "asimddp uscat ilrcpc flagm paca pacg"
)
PI5_FEATURES = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
)
PI4_FEATURES = "fp asimd evtstrm crc32 cpuid"
TEGRA_R36_4_3 = (
    "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
    "DATE: Wed Jan  8 01:49:37 UTC 2025\n"
    "# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n"
)


def arm_cpuinfo(cores: int, features: str, part: str, model: str | None = None) -> str:
    blocks = [
        f"processor\t: {i}\nBogoMIPS\t: 62.50\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
        f"CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: {part}\nCPU revision\t: 1\n"
        for i in range(cores)
    ]
    if model:
        blocks.append(f"Revision\t: d04170\nModel\t\t: {model}\n")
    return "\n".join(blocks)


def make_tree(
    root: Path,
    model: bytes | None = None,
    tegra: str | None = None,
    mem_kb: int | None = None,
    cpuinfo: str | None = None,
) -> Path:
    files = {
        "proc/device-tree/model": model,
        "etc/nv_tegra_release": tegra.encode() if tegra is not None else None,
        "proc/meminfo": f"MemTotal:       {mem_kb} kB\nMemFree:  1000 kB\n".encode() if mem_kb else None,
        "proc/cpuinfo": cpuinfo.encode() if cpuinfo is not None else None,
    }
    for rel, data in files.items():
        if data is not None:
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return root


def test_jetson_orin_nx_16gb(tmp_path):
    make_tree(
        tmp_path,
        model=b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00",
        tegra=TEGRA_R36_4_3,
        mem_kb=16_013_896,  # ~15.3 GiB
        cpuinfo=arm_cpuinfo(8, ORIN_FEATURES, "0xd42"),
    )
    board = detect_board(tmp_path)
    assert isinstance(board, BoardInfo)
    assert board.model == "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
    assert board.family == "jetson"
    assert board.l4t == "36.4.3"
    assert board.jetpack == "6.2"
    assert board.suggested_target == "orin-nx-16gb"
    assert board.architecture == "aarch64"
    assert board.cpu_count == 8
    assert board.memory_gib == pytest.approx(15.27, abs=0.01)
    assert board.cpu_model_name == "Cortex-A78AE"
    assert "asimddp" in board.cpu_features


def test_orin_nx_size_from_model_string_wins(tmp_path):
    make_tree(tmp_path, model=b"Jetson Orin NX 16GB\x00", mem_kb=7_000_000)
    assert detect_board(tmp_path).suggested_target == "orin-nx-16gb"


def test_orin_nano_4gb_by_memory(tmp_path):
    make_tree(
        tmp_path,
        model=b"NVIDIA Jetson Orin Nano Developer Kit\x00",
        tegra="# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64\n",
        mem_kb=3_600_000,  # ~3.4 GiB
        cpuinfo=arm_cpuinfo(6, ORIN_FEATURES, "0xd42"),
    )
    board = detect_board(tmp_path)
    assert board.family == "jetson"
    assert board.l4t == "36.4.0"
    assert board.jetpack == "6.1"
    assert board.suggested_target == "orin-nano-4gb"


@pytest.mark.parametrize(
    ("model", "mem_kb", "expected"),
    [
        (b"NVIDIA Jetson Orin Nano Developer Kit\x00", 7_800_000, "orin-nano-8gb"),
        (b"NVIDIA Jetson AGX Orin Developer Kit\x00", 64_300_000, "agx-orin-64gb"),
        (b"NVIDIA Jetson AGX Orin\x00", 31_300_000, "agx-orin-32gb"),
        (b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00", 7_600_000, "orin-nx-8gb"),
        (b"NVIDIA Jetson Xavier NX Developer Kit\x00", 7_600_000, "xavier-nx"),
        (b"NVIDIA Jetson Nano Developer Kit\x00", 4_000_000, None),
    ],
)
def test_jetson_suggested_target(tmp_path, model, mem_kb, expected):
    make_tree(tmp_path, model=model, mem_kb=mem_kb)
    board = detect_board(tmp_path)
    assert board.family == "jetson"
    assert board.suggested_target == expected


def test_raspberry_pi_5(tmp_path):
    make_tree(
        tmp_path,
        model=b"Raspberry Pi 5 Model B Rev 1.0\x00",
        mem_kb=8_245_000,
        cpuinfo=arm_cpuinfo(4, PI5_FEATURES, "0xd0b", model="Raspberry Pi 5 Model B Rev 1.0"),
    )
    board = detect_board(tmp_path)
    assert board.family == "rpi"
    assert board.suggested_target == "rpi5"
    assert "asimddp" in board.cpu_features
    assert "i8mm" not in board.cpu_features
    assert board.l4t is None
    assert board.jetpack is None
    assert board.cpu_count == 4
    assert board.cpu_model_name == "Cortex-A76"


def test_raspberry_pi_4(tmp_path):
    make_tree(
        tmp_path,
        model=b"Raspberry Pi 4 Model B Rev 1.4\x00",
        mem_kb=3_880_000,
        cpuinfo=arm_cpuinfo(4, PI4_FEATURES, "0xd08", model="Raspberry Pi 4 Model B Rev 1.4"),
    )
    board = detect_board(tmp_path)
    assert board.family == "rpi"
    assert board.suggested_target == "rpi4"
    assert "asimddp" not in board.cpu_features
    assert board.cpu_model_name == "Cortex-A72"


@pytest.mark.parametrize(("model", "part", "features", "expected"), [
    ("Raspberry Pi 5 Model B Rev 1.0", "0xd0b", PI5_FEATURES, "rpi5"),
    ("Raspberry Pi 4 Model B Rev 1.4", "0xd08", PI4_FEATURES, "rpi4"),
])
def test_raspberry_pi_in_a_container_is_named_by_its_cpuinfo_model(tmp_path, model, part, features, expected):
    """A container hides the device tree (Docker masks /sys/firmware); the Pi kernel's cpuinfo
    Model line still names the board, so the bundle check and 'edgesdk env' see a Pi, not a host."""
    make_tree(tmp_path, mem_kb=8_245_000, cpuinfo=arm_cpuinfo(4, features, part, model=model))
    (tmp_path / "proc/device-tree").mkdir()  # present, but empty
    board = detect_board(tmp_path)
    assert board.model == model
    assert board.family == "rpi"
    assert board.suggested_target == expected


def test_empty_tree_is_host_without_crash(tmp_path):
    board = detect_board(tmp_path)
    assert board.family == "host"
    assert board.model is None
    assert board.l4t is None
    assert board.jetpack is None
    assert board.memory_gib is None
    assert board.cpu_features == frozenset()
    assert board.architecture is None
    assert board.suggested_target is None


def test_x86_tree_suggests_host(tmp_path):
    cpuinfo = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: fpu sse avx2\n"
    )
    make_tree(tmp_path, cpuinfo=cpuinfo, mem_kb=32_000_000)
    board = detect_board(tmp_path)
    assert board.architecture == "x86_64"
    assert board.suggested_target == "host"
    assert board.cpu_model_name == "Intel(R) Xeon(R)"
    assert "avx2" in board.cpu_features


@pytest.mark.parametrize(
    "content",
    ["", "garbage\n", "# R36 (release)\n", "# Rxx (release), REVISION: a.b\n", "\x00\xff\xfe"],
)
def test_garbage_nv_tegra_release(tmp_path, content):
    path = tmp_path / "etc/nv_tegra_release"
    path.parent.mkdir(parents=True)
    path.write_bytes(content.encode("latin-1"))
    assert read_l4t_release(tmp_path) is None
    board = detect_board(tmp_path)
    assert board.l4t is None
    assert board.jetpack is None
    assert board.family == "jetson"


def test_unreadable_files_do_not_raise(tmp_path):
    # directories where files are expected: reading them fails with an OSError
    for rel in ("proc/device-tree/model", "etc/nv_tegra_release", "proc/meminfo", "proc/cpuinfo"):
        (tmp_path / rel).mkdir(parents=True)
    board = detect_board(tmp_path)
    assert board.model is None
    assert board.l4t is None
    assert board.memory_gib is None


def test_jetpack_table():
    assert jetpack_for_l4t("35.4.1") == "5.1.2"
    assert jetpack_for_l4t("36.4.3") == "6.2"
    assert jetpack_for_l4t("36.4.7") == "6.2.1"
    assert jetpack_for_l4t("38.4.0") == "7.1"
    assert jetpack_for_l4t("99.0.0") is None
    assert jetpack_for_l4t(None) is None


ENV_KEYS = {
    "edgesdk",
    "python",
    "platform",
    "packages",
    "package_conflicts",
    "onnxruntime_providers",
    "onnxruntime_error",
    "gpu",
    "board",
    "memory",
    "cpufreq",
    "thermal_zones",
}


def test_collect_and_format_env(tmp_path):
    make_tree(
        tmp_path,
        model=b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00",
        tegra=TEGRA_R36_4_3,
        mem_kb=16_013_896,
        cpuinfo=arm_cpuinfo(8, ORIN_FEATURES, "0xd42"),
    )
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvhost-ctrl-gpu").touch()
    info = collect_env(root=tmp_path)
    assert set(info) == ENV_KEYS
    assert set(info["packages"]) == {
        "numpy",
        "onnxruntime",
        "tokenizers",
        "torch",
        "transformers",
        "onnx",
        "triton",
        "tensorrt",
    }
    assert info["gpu"]["device_nodes"] == ["/dev/nvhost-ctrl-gpu"]
    assert info["gpu"]["cuda_device"] is True
    assert info["board"]["suggested_target"] == "orin-nx-16gb"
    assert isinstance(info["board"]["cpu_features"], list)
    text = format_env(info)
    assert "onnxruntime" in text
    assert "NVIDIA Jetson Orin NX Engineering Reference Developer Kit" in text
    assert "36.4.3" in text
    assert set(info["memory"]) == {"transparent_huge_pages", "c_library", "run_eval_use_huge_pages"}
    assert "run_eval_use_huge_pages" in text


def test_import_stays_lean():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    code = (
        "import edgesdk.board, edgesdk.envinfo, sys; "
        "print([m for m in ('torch', 'transformers', 'onnxruntime') if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    assert result.stdout.strip() == "[]"
