"""Jetson modules on carrier boards whose device-tree model names no module: the module's part number in the
device tree's ``compatible`` picks the target profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.board import detect_board, jetson_modules, read_device_tree_compatible
from edgesdk.bundle import Bundle
from edgesdk.envinfo import collect_env, format_env
from edgesdk.errors import BundleError

TEGRA_R36_4_3 = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n"
TEGRA_R35_6_0 = "# R35 (release), REVISION: 6.0, GCID: 37391689, BOARD: t186ref, EABI: aarch64\n"
CPUINFO = "processor\t: 0\nFeatures\t: fp asimd asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\n"


def dt_strings(*strings: str) -> bytes:
    """A device-tree string-list property as the kernel shows it: each string NUL-terminated."""
    return b"".join(s.encode() + b"\x00" for s in strings)


def board_tree(root: Path, model: str | None, compatible: tuple[str, ...] | None, mem_kb: int | None = None,
               tegra: str | None = TEGRA_R36_4_3, dt_dir: str = "proc/device-tree") -> Path:
    files = {
        f"{dt_dir}/model": dt_strings(model) if model is not None else None,
        f"{dt_dir}/compatible": dt_strings(*compatible) if compatible is not None else None,
        "etc/nv_tegra_release": tegra.encode() if tegra is not None else None,
        "proc/meminfo": f"MemTotal:       {mem_kb} kB\n".encode() if mem_kb else None,
        "proc/cpuinfo": CPUINFO.encode(),
    }
    for rel, data in files.items():
        if data is not None:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
    return root


def module_compatible(carrier: str, module: str, soc: str = "nvidia,tegra234") -> tuple[str, ...]:
    return (f"nvidia,{carrier}+{module}", f"nvidia,{module}", soc)


@pytest.mark.parametrize(("carrier", "module", "tegra", "mem_kb", "target", "shown"), [
    ("p3509-0000", "p3767-0000", TEGRA_R36_4_3, 15_655_000, "orin-nx-16gb", "Orin NX 16GB (p3767-0000)"),
    ("p3768-0000", "p3767-0001", TEGRA_R36_4_3, 7_620_000, "orin-nx-8gb", "Orin NX 8GB (p3767-0001)"),
    ("p3768-0000", "p3767-0003", TEGRA_R36_4_3, 7_620_000, "orin-nano-8gb", "Orin Nano 8GB (p3767-0003)"),
    ("p3768-0000", "p3767-0004", TEGRA_R36_4_3, 3_650_000, "orin-nano-4gb", "Orin Nano 4GB (p3767-0004)"),
    ("p3768-0000", "p3767-0005", TEGRA_R36_4_3, 7_620_000, "orin-nano-8gb", "(p3767-0005)"),
    ("p3737-0000", "p3701-0004", TEGRA_R36_4_3, 30_600_000, "agx-orin-32gb", "AGX Orin 32GB (p3701-0004)"),
    ("p3737-0000", "p3701-0005", TEGRA_R36_4_3, 62_800_000, "agx-orin-64gb", "AGX Orin 64GB (p3701-0005)"),
    ("p3509-0000", "p3668-0001", TEGRA_R35_6_0, 7_600_000, "xavier-nx", "Xavier NX (p3668-0001)"),
], ids=["nx16", "nx8", "nano8", "nano4", "nano8-devkit-module", "agx32", "agx64", "xavier-nx"])
def test_a_module_on_a_third_party_carrier_is_told_by_its_part_number(tmp_path, carrier, module, tegra, mem_kb,
                                                                      target, shown):
    """A carrier board's model string ("reComputer J4012") names no module: no target was suggested, and a bundle
    for the module was refused without --ignore-target."""
    soc = "nvidia,tegra194" if module.startswith("p3668") else "nvidia,tegra234"
    root = board_tree(tmp_path, "Seeed reComputer J4012 carrier", module_compatible(carrier, module, soc), mem_kb,
                      tegra)
    board = detect_board(root)
    assert (board.family, board.suggested_target) == ("jetson", target)
    assert shown in board.module
    assert board.detection_note is None


def test_the_compatible_is_read_as_the_kernel_writes_it(tmp_path):
    """NUL-separated strings with a trailing NUL; the carrier's part number (p3768-0000) is no module's."""
    root = board_tree(tmp_path, "Auvidea X230D", ("nvidia,p3768-0000+p3767-0001", "nvidia,tegra234"))
    assert (root / "proc/device-tree/compatible").read_bytes().endswith(b"tegra234\x00")
    assert read_device_tree_compatible(root) == ("nvidia,p3768-0000+p3767-0001", "nvidia,tegra234")
    assert jetson_modules(read_device_tree_compatible(root)) == ("p3767-0001",)
    assert jetson_modules(("raspberrypi,5-model-b", "brcm,bcm2712")) == ()
    assert read_device_tree_compatible(tmp_path / "nothing") == ()


def test_the_sysfs_device_tree_is_read_where_proc_has_none(tmp_path):
    root = board_tree(tmp_path, "Waveshare JETSON-IO-BASE-B", module_compatible("p3509-0000", "p3767-0004"),
                      dt_dir="sys/firmware/devicetree/base")
    assert detect_board(root).suggested_target == "orin-nano-4gb"


def test_a_module_without_a_shipped_profile_is_named_and_gets_no_target(tmp_path):
    for module, shown in (("p3701-0008", "AGX Orin Industrial (p3701-0008)"),
                          ("p3668-0003", "Xavier NX 16GB (p3668-0003)")):
        root = board_tree(tmp_path / module, "Connect Tech Rudi carrier", module_compatible("p3737-0000", module))
        board = detect_board(root)
        assert (board.family, board.suggested_target, board.module) == ("jetson", None, shown)


def test_a_jetson_without_l4t_is_a_jetson_by_its_module(tmp_path):
    """A distribution other than L4T (no /etc/nv_tegra_release) on a carrier board: the family was "host"."""
    root = board_tree(tmp_path, "Connect Tech Boson", module_compatible("p3768-0000", "p3767-0000"), tegra=None)
    board = detect_board(root)
    assert (board.family, board.suggested_target) == ("jetson", "orin-nx-16gb")


def test_the_model_string_wins_and_the_disagreement_is_said(tmp_path):
    """An Orin Nano developer kit's model with an Orin NX module in the compatible: the model string decides, and
    detection says the two name different modules, with the other target to pass."""
    root = board_tree(tmp_path, "NVIDIA Jetson Orin Nano Developer Kit",
                      module_compatible("p3768-0000", "p3767-0000"), 7_620_000)
    board = detect_board(root)
    assert board.suggested_target == "orin-nano-8gb"
    assert "Orin NX 16GB (p3767-0000)" in board.detection_note
    assert "orin-nano-8gb is suggested, from the model string" in board.detection_note
    assert "--target orin-nx-16gb" in board.detection_note


def test_a_size_in_the_model_string_wins_over_the_sku_with_a_note(tmp_path):
    root = board_tree(tmp_path, "NVIDIA Jetson Orin NX 16GB", module_compatible("p3768-0000", "p3767-0001"),
                      7_620_000)
    board = detect_board(root)
    assert board.suggested_target == "orin-nx-16gb"
    assert "--target orin-nx-8gb" in board.detection_note


def test_the_sku_sizes_a_module_the_model_string_names_without_a_size(tmp_path):
    """MemTotal only estimates the module's size; the SKU is the module's own. Where the two disagree the note
    says so."""
    model = "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
    agree = detect_board(board_tree(tmp_path / "a", model, module_compatible("p3768-0000", "p3767-0001"), 7_620_000))
    assert (agree.suggested_target, agree.detection_note) == ("orin-nx-8gb", None)
    differ = detect_board(board_tree(tmp_path / "b", model, module_compatible("p3768-0000", "p3767-0001"),
                                     15_655_000))
    assert differ.suggested_target == "orin-nx-8gb"
    assert "MemTotal 14.93 GiB is that of orin-nx-16gb" in differ.detection_note
    assert "--target orin-nx-16gb" in differ.detection_note


def test_a_compatible_naming_two_modules_suggests_none_and_says_why(tmp_path):
    root = board_tree(tmp_path, "Custom carrier", ("nvidia,p3768-0000+p3767-0000", "nvidia,p3768-0000+p3767-0004"))
    board = detect_board(root)
    assert board.suggested_target is None
    assert "more than one module" in board.detection_note
    # SKUs of one profile are one module (a device tree made for two developer-kit SKUs)
    same = detect_board(board_tree(tmp_path / "same", "Custom carrier",
                                   ("nvidia,p3449-0000+p3668-0000", "nvidia,p3449-0000+p3668-0001")))
    assert (same.suggested_target, same.detection_note) == ("xavier-nx", None)


def test_env_shows_the_module_and_the_note(tmp_path):
    root = board_tree(tmp_path, "NVIDIA Jetson Orin Nano Developer Kit",
                      module_compatible("p3768-0000", "p3767-0000"), 7_620_000)
    info = collect_env(root=root)
    assert info["board"]["module"] == "Orin NX 16GB (p3767-0000)"
    assert "name different modules" in info["board"]["detection_note"]
    text = format_env(info)
    assert "Orin NX 16GB (p3767-0000)" in text
    assert "detection_note" in text


@pytest.fixture
def carrier_board(tmp_path, monkeypatch):
    """This machine seen as an Orin NX 8GB on a third-party carrier board."""
    import edgesdk.board

    root = board_tree(tmp_path / "board", "reComputer J4011", module_compatible("p3768-0000", "p3767-0001"),
                      7_620_000)
    real_detect = edgesdk.board.detect_board
    monkeypatch.setattr(edgesdk.board, "detect_board", lambda root_="/": real_detect(root))
    return real_detect(root)


def test_run_opens_the_modules_bundle_on_a_third_party_carrier(carrier_board):
    """`edgesdk run` refused an orin-nx-8gb bundle here ("cannot tell which target profile matches") unless
    --ignore-target; a bundle for another module is refused as on NVIDIA's carrier."""
    from edgesdk.runtime.session import check_target

    assert check_target(Bundle(Path("bundles/nx"), {"target": {"name": "orin-nx-8gb"}}), None, False) is None
    with pytest.raises(BundleError) as caught:
        check_target(Bundle(Path("bundles/nano"), {"target": {"name": "orin-nano-4gb"}}), None, False)
    assert "this board is 'orin-nx-8gb'" in caught.value.problem
