"""Board facts as real boards write them, and the verified, resumable copy over a real sshd."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest

from edgesdk.board import detect_board
from edgesdk.deploy.probe import BoardFacts, check_target
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transfer import bundle_files, make_plan, send
from edgesdk.deploy.transport import DeployError, HostSpec, LocalTransport, SshOptions, SshTransport
from tests._utils.deploy import faulty_ssh_command
from tests.unit.test_deploy_checks import GB, raw_probe
from tests.unit.test_deploy_helper import frame, make_bundle

PI5 = "Raspberry Pi 5 Model B Rev 1.0\x00"


def test_a_32_bit_userland_on_a_64_bit_kernel_is_no_pi_profile():
    """32-bit Raspberry Pi OS boots a 64-bit kernel on the Pi 4 and 5, so uname (and platform.machine()) says
    aarch64 while every program, the board's Python among them, is 32-bit. The probe called the board aarch64
    and 'rpi5' matched; the runtime install then failed in pip (no ONNX Runtime wheel for 32-bit Arm)."""
    raw = raw_probe(PI5, mem=8 * GB)
    raw["python"]["bits"] = 32
    facts = BoardFacts.from_probe(raw)
    assert facts.board.architecture == "armv7l"
    assert facts.board.suggested_target is None
    with pytest.raises(DeployError) as refused:
        check_target("rpi5", facts, "pi@pi5", ignore=False)
    assert "pi@pi5 (Raspberry Pi 5 Model B Rev 1.0) runs an armv7l userland (its Python 3.10.12 is 32-bit)" \
        in refused.value.problem
    assert "64-bit Raspberry Pi OS" in refused.value.fix
    assert "--ignore-target" in refused.value.fix
    assert "skipped" in check_target("rpi5", facts, "pi@pi5", ignore=True)
    raw["python"]["bits"] = 64
    sixty_four = BoardFacts.from_probe(raw)
    assert (sixty_four.board.architecture, sixty_four.board.suggested_target) == ("aarch64", "rpi5")
    assert "matches" in check_target("rpi5", sixty_four, "pi@pi5", ignore=False)


def test_the_board_helper_reports_its_python_s_pointer_size(tmp_path):
    root = str(tmp_path / "board")
    facts = Board(LocalTransport(root), sys.executable, root).call("probe")
    assert facts["python"]["bits"] == struct.calcsize("P") * 8
    assert BoardFacts.from_probe(facts).board.architecture in ("x86_64", "aarch64")


def _cpuinfo(model_name: str | None, implementer: str | None, part: str | None, cores: int = 4) -> str:
    blocks = []
    for i in range(cores):
        lines = [f"processor\t: {i}"]
        if model_name:
            lines.append(f"model name\t: {model_name}")
        lines.append("BogoMIPS\t: 38.40")
        if part:
            lines += [f"CPU implementer\t: {implementer}", "CPU architecture: 8", "CPU variant\t: 0x1",
                      f"CPU part\t: {part}", "CPU revision\t: 1"]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


@pytest.mark.parametrize(("model_name", "implementer", "part", "expected"), [
    ("ARMv8 Processor rev 1 (v8l)", "0x41", "0xd07", "Cortex-A57"),  # Jetson Nano, L4T R32 kernel
    ("ARMv8 Processor rev 0 (v8l)", "0x4e", "0x004", "NVIDIA Carmel"),  # Xavier NX
    ("ARMv8 Processor rev 1 (v8l)", "0x41", "0xd42", "Cortex-A78AE"),  # Orin
    ("ARMv7 Processor rev 3 (v7l)", "0x41", "0xd08", "Cortex-A72"),  # a 32-bit view of a Pi 4
    ("ARMv8 Processor rev 1 (v8l)", None, None, "ARMv8 Processor rev 1 (v8l)"),  # nothing better to say
    ("Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz", None, None, "Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz"),
    (None, "0x41", "0xd0b", "Cortex-A76"),  # Pi 5: no model name line at all
])
def test_a_generic_arm_model_name_gives_way_to_the_cpu_part(tmp_path, model_name, implementer, part, expected):
    """Vendor arm64 kernels print 'model name : ARMv8 Processor rev 1 (v8l)' beside the MIDR fields; the CPU
    name was that generic line, not the core the part number names."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(_cpuinfo(model_name, implementer, part))
    assert detect_board(tmp_path).cpu_model_name == expected


def ssh_board(server, root: Path, ssh_command: str | None = None) -> Board:
    opts = SshOptions(identity=str(server.user_key), ssh_config="/dev/null", ssh_command=ssh_command,
                      options=(f"UserKnownHostsFile={server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
    return Board(SshTransport(HostSpec.parse(server.destination), opts), sys.executable, str(root))


def planned(board: Board, bundle):
    files = bundle_files(bundle)
    raw = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                               "manifest_sha256": files["manifest.json"]["sha256"]})
    return files, make_plan(files, raw["plan"])


def quiet() -> Reporter:
    return Reporter(1, write=lambda line: None)


@pytest.mark.parametrize("change", ["grown", "shrunk", "rewritten", "unreadable"])
def test_a_bundle_file_that_changes_during_the_copy_is_named(ssh_server, tmp_path, change):
    """The host sent a file to its end, whatever the manifest said: a longer one put its extra bytes where the
    board reads the next header, a shorter one made the next header part of the file. The board failed with
    JSONDecodeError or a UnicodeDecodeError quoting the raw bytes, and 'report this'; a rewrite of the same size
    was blamed on the board's storage. The host sends exactly the manifest's bytes and names the changed file."""
    root = tmp_path / "board"
    board = ssh_board(ssh_server, root)
    data = os.urandom(5000)
    bundle = make_bundle(tmp_path / "b", {"a.bin": data, "b.bin": os.urandom(3000)})
    files, plan = planned(board, bundle)
    path = bundle.path / "a.bin"
    if change == "unreadable":  # a read that fails with EIO, as a failing disk's: /proc/self/mem at address 0
        path.unlink()
        path.symlink_to("/proc/self/mem")
    else:
        path.write_bytes({"grown": data + b"x" * 100, "shrunk": data[:4000], "rewritten": os.urandom(5000)}[change])
    with pytest.raises(DeployError) as failed:
        send(board, bundle, files, plan, quiet())
    problem = failed.value.problem
    assert problem.startswith(f"a.bin in the bundle {bundle.path} changed on this machine while deploy sent it: ")
    assert {"grown": "it is 5100 bytes now, the bundle's manifest says 5000",
            "shrunk": "it is 4000 bytes now, the bundle's manifest says 5000",
            "rewritten": "its sha256 no longer matches the bundle's manifest",
            "unreadable": "reading it failed (Input/output error)"}[change] in problem
    assert "leave the bundle alone while it deploys" in failed.value.fix
    # Put back, the same bundle goes through: what arrived intact stays, the rest follows.
    path.unlink()
    path.write_bytes(data)
    files, plan = planned(board, bundle)
    send(board, bundle, files, plan, quiet())
    assert board.call("commit", {"bundle_id": bundle.bundle_id,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})["problems"] == []
    assert (root / "releases" / bundle.bundle_id / "a.bin").read_bytes() == data


def test_a_stream_out_of_step_is_refused_by_name(tmp_path):
    """Bytes where a header belongs ended the helper with a JSONDecodeError (or a UnicodeDecodeError quoting
    hundreds of raw bytes) and 'report this'; the board says the stream is out of step and keeps what arrived."""
    root = str(tmp_path / "board")
    board = Board(LocalTransport(root), sys.executable, root)
    bundle = make_bundle(tmp_path / "b", {"a.bin": os.urandom(100)})
    files = bundle_files(bundle)
    data = (bundle.path / "a.bin").read_bytes()
    stream = frame("a.bin", data, sha=files["a.bin"]["sha256"]) + b"\xa0\xfa]garbage" * 50 + b"\n"
    with pytest.raises(DeployError) as refused:
        board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=stream)
    assert refused.value.problem.startswith("the upload stream is out of step after 1 file(s): the board expected "
                                            "a file header (one JSON line) and read b'\\xa0\\xfa]garbage")
    assert len(refused.value.problem) < 250
    assert "run the deploy again" in refused.value.fix
    assert (Path(root) / "staging" / bundle.bundle_id / "a.bin").read_bytes() == data
    with pytest.raises(DeployError, match="out of step after 0 file"):
        board.call("receive", {"bundle_id": bundle.bundle_id},
                   stdin=json.dumps({"name": "a.bin", "offset": 9, "size": 5, "sha256": "0"}).encode() + b"\n")


def test_odd_names_an_empty_file_and_a_partial_longer_than_the_file(ssh_server, tmp_path):
    """Names with spaces and non-ASCII letters, a zero-byte file, and a leftover .partial longer than the file it
    stands for (another bundle's under the same id): all arrive whole and verified over ssh."""
    root = tmp_path / "board root é"
    board = ssh_board(ssh_server, root)
    bundle = make_bundle(tmp_path / "b", {"wei ghts é.bin": os.urandom(5000), "empty": b"",
                                          "dossier ü/x y.json": b"{}"})
    stale = root / "staging" / bundle.bundle_id / "wei ghts é.bin.partial"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(os.urandom(9000))
    files, plan = planned(board, bundle)
    assert dict(plan.send)["wei ghts é.bin"] == 0
    sent = send(board, bundle, files, plan, quiet())
    assert sent.bytes == sum(f["size"] for f in files.values())
    assert board.call("commit", {"bundle_id": bundle.bundle_id,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})["problems"] == []
    release = root / "releases" / bundle.bundle_id
    for name in ("wei ghts é.bin", "empty", "dossier ü/x y.json"):
        assert (release / name).read_bytes() == (bundle.path / name).read_bytes()


def test_a_killed_transfer_resumes_without_sending_again_what_arrived(ssh_server, tmp_path):
    """The sshd serving the upload is killed mid-file: the next transfer starts at the byte the board holds."""
    from edgesdk.deploy.board_common import Lock

    root = tmp_path / "board"
    bundle = make_bundle(tmp_path / "b", {"w.bin": os.urandom(12_000_000)})
    files, plan = planned(ssh_board(ssh_server, root), bundle)
    # past ssh's channel window (2 MiB), so the board's helper has started and read most of it
    cut = ssh_board(ssh_server, root, faulty_ssh_command("server:8000000", ssh_server.process.pid))
    with pytest.raises(DeployError) as failed:
        send(cut, bundle, files, plan, quiet())
    assert "run the same deploy again: it resumes" in failed.value.fix
    with Lock(str(root)):  # the board's helper, on its own after the cut, has written what it read
        arrived = (root / "staging" / bundle.bundle_id / "w.bin.partial").stat().st_size
    assert 0 < arrived <= 8_000_000
    board = ssh_board(ssh_server, root)
    files, plan = planned(board, bundle)
    assert dict(plan.send)["w.bin"] == arrived
    sent = send(board, bundle, files, plan, quiet())
    assert sent.bytes == files["w.bin"]["size"] - arrived  # the manifest and its digest arrived whole before
    assert board.call("commit", {"bundle_id": bundle.bundle_id,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})["problems"] == []


DPKG_ENTRY = """Package: tensorrt
Status: {status}
Priority: optional
Section: multiverse/devel
Installed-Size: 21
Maintainer: NVIDIA Corporation
Architecture: arm64
Version: 10.3.0.30-1+cuda12.5
Description: Meta package for TensorRT

"""


@pytest.mark.parametrize(("status", "expected"), [
    ("install ok installed", {"version": "10.3.0.30-1+cuda12.5", "python": False}),
    ("deinstall ok config-files", None),  # apt remove: dpkg-query -W still prints its Version
    ("install reinstreq half-installed", None),
])
def test_tensorrt_counts_only_when_dpkg_has_it_installed(tmp_path, monkeypatch, status, expected):
    """The real dpkg-query on a dpkg database (DPKG_ADMINDIR) holding the tensorrt package in each state."""
    import importlib.util
    import shutil

    from edgesdk.deploy import board_transfer

    if shutil.which("dpkg-query") is None:
        pytest.skip("dpkg-query not installed")
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("this Python imports tensorrt, which the helper asks first")
    admin = tmp_path / "dpkg"
    (admin / "info").mkdir(parents=True)
    (admin / "updates").mkdir()
    (admin / "status").write_text(DPKG_ENTRY.format(status=status))
    monkeypatch.setenv("DPKG_ADMINDIR", str(admin))
    assert board_transfer.tensorrt_version() == expected
