"""Clock cap, review 58: a capped cluster that goes offline mid-run (an nvpmodel mode with fewer cores); sensors: a
target that names no thermal zones."""

from __future__ import annotations

import errno
import itertools
import json
from pathlib import Path

import pytest

from edgesdk.thermal.cpufreq import RETRY_INTERVAL_S, CpuFreqCap
from edgesdk.thermal.sensors import SysfsThermal, detect_sensors
from tests._utils.sysfs import make_cpufreq_policy, make_zone

TABLE = [1_500_000, 1_800_000, 2_100_000, 2_400_000]


def max_khz(policy: Path) -> int:
    return int((policy / "scaling_max_freq").read_text())


@pytest.fixture
def kernel_before_5_19(monkeypatch):
    """The kernel's ``store()`` before Linux 5.19: a write to the files of a policy with no CPU online (its
    ``affected_cpus`` empty) fails with EINVAL, while its files still read."""
    write_text = Path.write_text

    def store(path: Path, text: str, *args, **kwargs):
        cpus = path.parent / "affected_cpus"
        if path.name == "scaling_max_freq" and cpus.exists() and not cpus.read_text().split():
            raise OSError(errno.EINVAL, "Invalid argument")
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", store)


def test_a_capped_cluster_offline_for_a_while_gets_its_ceiling_back_once_it_is_online(tmp_path, kernel_before_5_19):
    """The guard gave the ceilings back while a capped cluster was down: the write failed (EINVAL), the policy was let
    go as a failed write, and its cap stayed for the rest of the run, and after close(), though the cluster came back."""
    first = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, TABLE)
    second = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, TABLE)
    (first / "affected_cpus").write_text("0 1 2 3\n")
    (second / "affected_cpus").write_text("4 5 6 7\n")
    warnings: list[str] = []
    state = tmp_path / "cache" / "clock-cap.json"
    cap = CpuFreqCap(tmp_path, state, warn=warnings.append, clock=itertools.count(0.0, RETRY_INTERVAL_S).__next__)
    cap.set_ratio(0.625)
    assert (max_khz(first), max_khz(second)) == (1_500_000, 1_500_000)

    (second / "affected_cpus").write_text("\n")  # the mode switch: CPUs 4-7 offline
    cap.set_ratio(None)
    assert (max_khz(first), max_khz(second)) == (2_400_000, 1_500_000)
    assert json.loads(state.read_text()) == {str(second / "scaling_max_freq"): {"original": 2_400_000,
                                                                                 "written": 1_500_000}}
    assert len(warnings) == 1, warnings
    assert "policy4 has no CPU online now" in warnings[0]

    (second / "affected_cpus").write_text("4 5 6 7\n")  # back to the mode with every core
    cap.set_ratio(None)
    assert max_khz(second) == 2_400_000
    cap.close()
    assert not state.exists()
    assert len(warnings) == 1, warnings


def test_a_capped_cluster_offline_at_close_stays_recorded_and_is_said(tmp_path, kernel_before_5_19):
    """Still down when the run ends: nothing is written, the cap stays recorded for the next run, and the warning names
    the cluster being offline, not a failed write of 'Invalid argument'."""
    policy = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, TABLE)
    (policy / "affected_cpus").write_text("4 5 6 7\n")
    warnings: list[str] = []
    state = tmp_path / "cache" / "clock-cap.json"
    cap = CpuFreqCap(tmp_path, state, warn=warnings.append, clock=itertools.count(0.0, RETRY_INTERVAL_S).__next__)
    cap.set_ratio(0.625)
    (policy / "affected_cpus").write_text("\n")
    cap.close()
    assert max_khz(policy) == 1_500_000
    assert json.loads(state.read_text())[str(policy / "scaling_max_freq")]["written"] == 1_500_000
    assert len(warnings) == 1, warnings
    assert "no CPU online" in warnings[0]
    assert "Invalid argument" not in warnings[0]


def test_describe_says_a_cluster_offline_at_the_start_whose_files_still_read(tmp_path):
    """Before Linux 5.19 an inactive policy's scaling_max_freq still reads: describe() gave it as "policy4 2.4 GHz",
    as if capped with the others, where the same cluster on a later kernel was said offline, capped once back."""
    make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, TABLE)
    second = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, TABLE)
    (second / "affected_cpus").write_text("\n")
    described = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json").describe()
    assert "policy0 2.4 GHz" in described
    assert "policy4 offline (affected_cpus is empty): capped once it is back" in described


def test_close_gives_back_a_restore_put_off_moments_ago(tmp_path, kernel_before_5_19):
    """A restore put off (the capped cluster offline) is retried at most once a second at the guard's readings, but
    close() is the run's last chance: it tries again at once, and the cluster back by then gets its ceiling."""
    policy = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, TABLE)
    (policy / "affected_cpus").write_text("4 5 6 7\n")
    state = tmp_path / "cache" / "clock-cap.json"
    cap = CpuFreqCap(tmp_path, state, warn=lambda message: None, clock=lambda: 0.0)  # no time passes
    cap.set_ratio(0.625)
    (policy / "affected_cpus").write_text("\n")
    cap.set_ratio(None)
    (policy / "affected_cpus").write_text("4 5 6 7\n")
    cap.set_ratio(None)  # within the second: not retried yet
    assert max_khz(policy) == 1_500_000
    cap.close()
    assert max_khz(policy) == 2_400_000
    assert not state.exists()


def test_no_zone_types_asked_for_watches_every_zone_but_a_pmic(tmp_path):
    """A bundle whose target names no zones benches with ``snapshot(())``: with nothing asked for no zone was watched,
    and detect_sensors said "no thermal zones under" a directory that has them, where a list naming none that exist
    watches every zone but a PMIC's."""
    make_zone(tmp_path, 0, "cpu-thermal", "48312\n")
    make_zone(tmp_path, 1, "PMIC-Die", "100000\n")
    sysfs = SysfsThermal(tmp_path, ())
    assert sysfs.read().zones == {"cpu-thermal": 48.312}
    assert sysfs.notes == [f"no zone types were asked for under {tmp_path}; watching all of ['cpu-thermal'] "
                           "(not PMIC-Die: a PMIC zone reads a fixed value, not a temperature)"]
    sensor, _, notes = detect_sensors((), tmp_path, which=lambda name: None, use_jtop=False)
    assert sensor is not None
    assert sensor.read().zones == {"cpu-thermal": 48.312}
    assert not any("no thermal zones under" in note for note in notes)
