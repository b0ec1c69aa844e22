"""Deploy's probe and run's target refusals know the Jetson module from the device tree's ``compatible``: on a
third-party carrier board (a reComputer's model names the carrier, not the module) deploy refused the module's
bundle, and run's refusals named only the carrier."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgesdk.bundle import Bundle
from edgesdk.deploy.probe import BoardFacts, check_target
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport
from edgesdk.errors import BundleError
from tests.unit.test_board61 import board_tree, module_compatible

GIB_KB = 1024 * 1024

# The board's Python for the deploy helper, as on a Jetson: the device tree, meminfo, cpuinfo and nv_tegra_release
# the helper reads are the board tree's under ROOT, and uname's machine is aarch64. The helper, sshd and the
# host's reading of the probe are the real ones.
BOARD_PYTHON = """#!{python}
import builtins, os, platform, sys
if len(sys.argv) > 2 and sys.argv[1] == "-c" and "BOARD_BUNDLED" in sys.argv[2]:
    _open = builtins.open
    _board = ("/proc/device-tree/", "/sys/firmware/devicetree/", "/proc/meminfo", "/proc/cpuinfo",
              "/etc/nv_tegra_release")

    def _board_open(path, *args, **kwargs):
        if isinstance(path, str) and path.startswith(_board):
            path = {root!r} + path
        return _open(path, *args, **kwargs)

    builtins.open = _board_open
    platform.machine = lambda: "aarch64"
    code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
    exec(compile(code, "<string>", "exec"), {{"__name__": "__main__"}})
else:
    os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


def board_python(tmp_path: Path, root: Path) -> str:
    python = tmp_path / "board-python"
    python.write_text(BOARD_PYTHON.format(python=sys.executable, root=str(root)))
    python.chmod(0o755)
    return str(python)


def ssh_probe(server, tmp_path: Path, board_root: Path) -> dict:
    opts = SshOptions(identity=str(server.user_key), ssh_config="/dev/null",
                      options=(f"UserKnownHostsFile={server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
    board = Board(SshTransport(HostSpec.parse(server.destination), opts), board_python(tmp_path, board_root),
                  str(tmp_path / "deploy-root"))
    return board.call("probe")


@pytest.mark.parametrize("dt_dir", ["proc/device-tree", "sys/firmware/devicetree/base"])
def test_deploy_takes_the_module_s_bundle_to_a_third_party_carrier(ssh_server, tmp_path, dt_dir):
    """The probe sent the model string alone ("reComputer J4011"), so deploy found no target and refused an
    orin-nx-8gb bundle without --ignore-target; the compatible names the module, p3767-0001."""
    tree = board_tree(tmp_path / "board", "reComputer J4011", module_compatible("p3768-0000", "p3767-0001"),
                      7_620_000, dt_dir=dt_dir)
    raw = ssh_probe(ssh_server, tmp_path, tree)
    assert raw["device_tree_compatible"] == "nvidia,p3768-0000+p3767-0001\x00nvidia,p3767-0001\x00nvidia,tegra234\x00"
    facts = BoardFacts.from_probe(raw)
    b = facts.board
    assert (b.family, b.architecture, b.l4t) == ("jetson", "aarch64", "36.4.3")
    assert (b.suggested_target, b.module, b.detection_note) == ("orin-nx-8gb", "Orin NX 8GB (p3767-0001)", None)
    assert check_target("orin-nx-8gb", facts, "nvidia@recomputer", ignore=False) == "target 'orin-nx-8gb' matches " \
                                                                                   "the board"
    with pytest.raises(DeployError) as refused:
        check_target("orin-nano-4gb", facts, "nvidia@recomputer", ignore=False)
    assert refused.value.problem == ("the bundle was built for target 'orin-nano-4gb', but nvidia@recomputer is "
                                     "'orin-nx-8gb' (reComputer J4011, module Orin NX 8GB (p3767-0001))")
    assert "edgesdk build --target orin-nx-8gb" in refused.value.fix


def test_the_note_is_the_board_s_as_its_python_sees_it(ssh_server, tmp_path):
    """The model names the line without its size and MemTotal points to the other SKU: the part number picks the
    target, the note says so, over ssh as in `edgesdk env` on the board."""
    tree = board_tree(tmp_path / "board", "NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
                      module_compatible("p3768-0000", "p3767-0001"), 15_655_000)
    raw = ssh_probe(ssh_server, tmp_path, tree)
    facts = BoardFacts.from_probe(raw)
    assert facts.board.suggested_target == "orin-nx-8gb"
    assert "MemTotal 14.93 GiB is that of orin-nx-16gb" in facts.board.detection_note
    # a 32-bit userland runs no Jetson profile: no target, and no note about which one
    raw["python"]["bits"] = 32
    thirty_two = BoardFacts.from_probe(raw).board
    assert (thirty_two.architecture, thirty_two.suggested_target, thirty_two.detection_note) == ("armv7l", None, None)


def test_a_helper_that_sends_no_compatible_is_read_as_before(ssh_server, tmp_path):
    """A probe without device_tree_compatible (a helper older than it) tells the board by its model alone."""
    tree = board_tree(tmp_path / "board", "reComputer J4011", module_compatible("p3768-0000", "p3767-0001"),
                      7_620_000)
    raw = ssh_probe(ssh_server, tmp_path, tree)
    del raw["device_tree_compatible"]
    facts = BoardFacts.from_probe(raw)
    assert (facts.board.family, facts.board.suggested_target, facts.board.module) == ("jetson", None, None)
    with pytest.raises(DeployError) as refused:
        check_target("orin-nx-8gb", facts, "nvidia@recomputer", ignore=False)
    assert refused.value.problem.startswith("cannot tell which target profile matches nvidia@recomputer (model "
                                            "'reComputer J4011', aarch64, ")
    devkit = dict(raw, device_tree_model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00",
                  memory={"MemTotal": 7_620_000 * 1024, "MemAvailable": 4 * GIB_KB * 1024})
    assert BoardFacts.from_probe(devkit).board.suggested_target == "orin-nx-8gb"


def test_deploy_names_the_module_when_the_compatible_names_one_without_a_profile(tmp_path):
    """The AGX Orin Industrial has no shipped profile: the refusal says which module the board holds."""
    from tests.unit.test_deploy_checks import raw_probe

    raw = dict(raw_probe("Custom carrier\x00", "# R36 (release), REVISION: 4.3\n", mem=60 * 2**30),
               device_tree_compatible="nvidia,p3737-0000+p3701-0008\x00nvidia,p3701-0008\x00nvidia,tegra234\x00")
    facts = BoardFacts.from_probe(raw)
    assert (facts.board.suggested_target, facts.board.module) == (None, "AGX Orin Industrial (p3701-0008)")
    with pytest.raises(DeployError) as refused:
        check_target("agx-orin-64gb", facts, "nvidia@agx", ignore=False)
    assert ("(model 'Custom carrier', module AGX Orin Industrial (p3701-0008), aarch64, 60.0 GiB)"
            in refused.value.problem)


def seen_as(monkeypatch, root: Path) -> None:
    """This machine detected as the board under ``root`` (the real detection on those files)."""
    import edgesdk.board

    real_detect = edgesdk.board.detect_board
    monkeypatch.setattr(edgesdk.board, "detect_board", lambda root_="/": real_detect(root))


def test_run_s_refusal_names_the_module_on_a_carrier(tmp_path, monkeypatch):
    from edgesdk.runtime.session import check_target as run_check

    seen_as(monkeypatch, board_tree(tmp_path, "reComputer J4011", module_compatible("p3768-0000", "p3767-0001"),
                                    7_620_000))
    with pytest.raises(BundleError) as caught:
        run_check(Bundle(Path("bundles/nano"), {"target": {"name": "orin-nano-4gb"}}), None, False)
    assert caught.value.problem == ("bundle bundles/nano was built for 'orin-nano-4gb' but this board is "
                                    "'orin-nx-8gb' (reComputer J4011, module Orin NX 8GB (p3767-0001))")


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_run_s_refusal_says_where_the_model_and_the_module_disagree(tmp_path, monkeypatch, terms):
    """The model string wins (orin-nano-8gb), the compatible names an Orin NX 16GB: a bundle for the module was
    refused as built for another board, with nothing about the module."""
    from edgesdk.runtime.session import check_target as run_check

    seen_as(monkeypatch, board_tree(tmp_path, "NVIDIA Jetson Orin Nano Developer Kit",
                                    module_compatible("p3768-0000", "p3767-0000"), 7_620_000))
    with pytest.raises(BundleError) as caught:
        run_check(Bundle(Path("bundles/nx"), {"target": {"name": "orin-nx-16gb"}}), None, False, terms)
    problem = caught.value.problem
    assert problem.startswith("bundle bundles/nx was built for 'orin-nx-16gb' but this board is 'orin-nano-8gb' "
                              "(NVIDIA Jetson Orin Nano Developer Kit, module Orin NX 16GB (p3767-0000)); ")
    assert "name different modules" in problem
    assert "pass --target orin-nx-16gb (target= in Python)" in problem


def test_run_s_refusal_says_why_no_target_was_suggested(tmp_path, monkeypatch):
    from edgesdk.runtime.session import check_target as run_check

    seen_as(monkeypatch, board_tree(tmp_path, "Custom carrier",
                                    ("nvidia,p3768-0000+p3767-0000", "nvidia,p3768-0000+p3767-0004")))
    with pytest.raises(BundleError) as caught:
        run_check(Bundle(Path("bundles/nx"), {"target": {"name": "orin-nx-16gb"}}), None, False)
    problem = caught.value.problem
    assert problem.startswith("cannot tell which target profile matches this jetson board (model 'Custom carrier', "
                              "module Orin NX 16GB (p3767-0000) or Orin Nano 4GB (p3767-0004), aarch64), so bundle "
                              "bundles/nx, built for 'orin-nx-16gb', is refused; ")
    assert "the device tree's compatible names more than one module" in problem
    assert "--target orin-nx-16gb" in caught.value.fix
