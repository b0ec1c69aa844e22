"""Thermal review 49: the CPU clock cap is given back however its pass is cut short.

Real cpufreq trees under tmp_path (an Orin's three policies, kernel ``Documentation/admin-guide/pm/cpufreq.rst``),
real signals (SIGINT as Ctrl-C sends it, SIGKILL) and a real closed pipe as stderr.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgesdk.thermal.cpufreq import CpuFreqCap, recover
from edgesdk.thermal.telemetry import StatusLine
from tests._utils.sysfs import make_cpufreq_policy

REPO = Path(__file__).resolve().parents[2]
TABLE = [729600, 1190400, 1497600, 1728000, 2201600]  # kHz, an Orin-like table
CEILING = 2201600
CAP = 1497600  # the lowest offered at or above 0.625 x the ceiling


def orin(root: Path) -> list[Path]:
    """policy0, policy4 and policy8 (four CPUs each), all at their ceiling."""
    policies = []
    for first in (0, 4, 8):
        policy = make_cpufreq_policy(root, first, CEILING, TABLE[0], TABLE)
        (policy / "affected_cpus").write_text(" ".join(str(first + k) for k in range(4)) + "\n")
        policies.append(policy)
    return policies


def ceilings(policies: list[Path]) -> list[int]:
    return [int((p / "scaling_max_freq").read_text()) for p in policies]


@pytest.fixture
def ctrl_c_after_write(monkeypatch):
    """Ctrl-C (a real SIGINT through Python's own handler) landing right after the write to one file took."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a test worker may ignore SIGINT

    def arm(target: Path, value: int) -> None:
        real = Path.write_text

        def write_text(self, data, *args, **kwargs):
            written = real(self, data, *args, **kwargs)
            if self == target and data.strip() == str(value):
                monkeypatch.setattr(Path, "write_text", real)
                signal.raise_signal(signal.SIGINT)
            return written

        monkeypatch.setattr(Path, "write_text", write_text)

    yield arm
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_just_after_a_cap_write_is_still_given_back(tmp_path, ctrl_c_after_write):
    policies = orin(tmp_path)
    cap = CpuFreqCap(tmp_path, tmp_path / "clock-cap.json")
    ctrl_c_after_write(policies[1] / "scaling_max_freq", CAP)
    with pytest.raises(KeyboardInterrupt):
        cap.set_ratio(0.625)
    assert ceilings(policies) == [CAP, CAP, CEILING]  # policy4's write took; policy8 was not reached
    cap.close()  # edgesdk run's finally
    assert ceilings(policies) == [CEILING] * 3
    assert not (tmp_path / "clock-cap.json").exists()


def test_ctrl_c_during_the_restore_is_finished_by_close(tmp_path, ctrl_c_after_write):
    policies = orin(tmp_path)
    cap = CpuFreqCap(tmp_path, tmp_path / "clock-cap.json")
    cap.set_ratio(0.625)
    assert ceilings(policies) == [CAP] * 3
    ctrl_c_after_write(policies[0] / "scaling_max_freq", CEILING)
    with pytest.raises(KeyboardInterrupt):
        cap.set_ratio(None)  # the answer's end gives the clock back; Ctrl-C lands in it
    assert ceilings(policies) == [CEILING, CAP, CAP]
    cap.close()
    assert ceilings(policies) == [CEILING] * 3  # was [CEILING, CAP, CAP]: close took the restore for done
    assert not (tmp_path / "clock-cap.json").exists()


def test_a_warning_that_cannot_be_written_does_not_leave_the_other_policies_capped(tmp_path):
    """stderr a pipe whose reader is gone (``edgesdk serve 2>&1 | tee log`` after tee died): the warning that
    nvpmodel changed policy0's ceiling cannot be written (the status line turns itself off rather than raise), and
    the other policies still get theirs back."""
    policies = orin(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    stderr = os.fdopen(write_end, "w")
    try:
        with open(os.devnull, "w") as devnull:
            status = StatusLine(stream=stderr, stdout=devnull)
            cap = CpuFreqCap(tmp_path, tmp_path / "clock-cap.json", warn=status.warn)
            cap.set_ratio(0.625)
            (policies[0] / "scaling_max_freq").write_text("1728000\n")  # sudo nvpmodel -m N while capped
            cap.set_ratio(None)
            cap.close()
    finally:
        try:
            stderr.close()  # flushes the warning again: the pipe is still broken
        except BrokenPipeError:
            pass
    assert ceilings(policies) == [1728000, CEILING, CEILING]  # nvpmodel's value kept, the others given back
    assert not (tmp_path / "clock-cap.json").exists()


def test_a_run_killed_just_after_a_cap_write_leaves_a_record_the_next_run_gives_back(tmp_path):
    policies = orin(tmp_path)
    state = tmp_path / "clock-cap.json"
    child = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from edgesdk.thermal.cpufreq import CpuFreqCap

        real = Path.write_text
        def write_text(self, data, *args, **kwargs):
            written = real(self, data, *args, **kwargs)
            if self.name == "scaling_max_freq" and data.strip() == "{CAP}":
                os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, kill -9
            return written
        Path.write_text = write_text
        CpuFreqCap({str(tmp_path)!r}, {str(state)!r}).set_ratio(0.625)
        """)
    done = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert ceilings(policies) == [CAP, CEILING, CEILING]
    assert json.loads(state.read_text())  # was missing: the state was written only after every policy
    notes = recover(state)
    assert ceilings(policies) == [CEILING] * 3
    assert any("restored policy0 scaling_max_freq to 2201600 kHz" in note for note in notes)


# -- board.py: a Jetson inside jetson-containers' container ----------------------------------------------------------

TEGRA_R36_4_3 = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 2025\n"
A78AE_CPUINFO = "\n".join(
    f"processor\t: {i}\nFeatures\t: fp asimd asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
    f"CPU variant\t: 0x1\nCPU part\t: 0xd42\nCPU revision\t: 1\n" for i in range(6))


@pytest.mark.parametrize(("mem_kb", "model", "expected"), [
    (7_620_000, "NVIDIA Jetson Orin Nano Developer Kit", "orin-nano-8gb"),
    (64_300_000, "NVIDIA Jetson AGX Orin Developer Kit", "agx-orin-64gb"),
])
def test_a_jetson_in_a_jetson_containers_container_is_named_by_the_model_it_mounts(tmp_path, mem_kb, model, expected):
    """Docker masks /sys/firmware, so /proc/device-tree is empty, and a Jetson kernel's cpuinfo has no Model line;
    jetson-containers' run.sh mounts the host's model at /tmp/nv_jetson_model, with /etc/nv_tegra_release."""
    from edgesdk.board import detect_board
    from edgesdk.runtime.tensorrt_engine import engine_module

    files = {"etc/nv_tegra_release": TEGRA_R36_4_3, "proc/cpuinfo": A78AE_CPUINFO,
             "proc/meminfo": f"MemTotal:       {mem_kb} kB\n", "tmp/nv_jetson_model": model + "\x00"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "proc/device-tree").mkdir()  # masked: present, but empty
    board = detect_board(tmp_path)
    assert board.family == "jetson"
    assert board.model == model  # was None
    assert board.suggested_target == expected  # was None: 'thermal sensors' fell back to the host profile
    assert engine_module(board) == expected  # TensorRT engines tied to the module, as on the host


def test_the_device_tree_and_a_pi_s_cpuinfo_model_still_come_first(tmp_path):
    from edgesdk.board import read_device_tree_model

    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp/nv_jetson_model").write_text("NVIDIA Jetson AGX Orin Developer Kit\x00")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nv_tegra_release").write_text(TEGRA_R36_4_3)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n")
    assert read_device_tree_model(tmp_path) == "Raspberry Pi 5 Model B Rev 1.0"
    (tmp_path / "proc/device-tree").mkdir()
    (tmp_path / "proc/device-tree/model").write_bytes(b"Raspberry Pi 4 Model B Rev 1.5\x00")
    assert read_device_tree_model(tmp_path) == "Raspberry Pi 4 Model B Rev 1.5"
    (tmp_path / "tmp/nv_jetson_model").write_text("")
    (tmp_path / "proc/device-tree/model").unlink()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\n")
    assert read_device_tree_model(tmp_path) is None  # an empty copy (run.sh on a board without a device tree)


def test_the_mounted_model_file_is_read_only_in_a_jetson_userland(tmp_path):
    """/tmp is anyone's to write, and scripts outside jetson-containers write "Not a Jetson device" to
    /tmp/nv_jetson_model: on an x86 host without /etc/nv_tegra_release it was the host's model."""
    from edgesdk.board import detect_board, read_device_tree_model

    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp/nv_jetson_model").write_text("Not a Jetson device\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\n")
    assert read_device_tree_model(tmp_path) is None
    assert detect_board(tmp_path).family == "host"
