"""edgesdk bench's readout of other work on the cores: the machine's and this process's CPU time over the run."""

from __future__ import annotations

import json
import os

import pytest

from edgesdk.runtime.bench_conditions import other_cores, read_cpu_seconds, snapshot, summary, warnings
from tests.unit.test_cli import assert_ok, invoke

HZ = os.sysconf("SC_CLK_TCK")
QUIET = {"load_1min": 0.2, "clocks": [], "temperatures_c": {}, "throttled": None, "nvpmodel": None}


def _proc(root, busy: str, own: str):
    (root / "self").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy}\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 12345\n")
    # the name in brackets may hold spaces and brackets; utime and stime are fields 14 and 15 (proc(5))
    (root / "self" / "stat").write_text(f"4242 (edgesdk ) x) R 1 4242 4242 0 -1 4194304 10 0 0 0 {own} 0 0 20 0 "
                                        "5 0 3154 31334 362 18446744073709551615\n")
    return root


def test_cpu_seconds_come_from_proc_stat_and_self_stat(tmp_path):
    root = _proc(tmp_path, "100 50 30 1000 20 5 5 10 7 0", f"{3 * HZ} {HZ}")
    machine, own = read_cpu_seconds(root)
    assert machine == pytest.approx(200 / HZ)  # user, nice, system, irq, softirq, steal; not idle, iowait, guest
    assert own == pytest.approx(4.0)
    for text in ("", "cpu  garbage 1 2 3 4 5 6 7\n", "\x00\x01"):
        (root / "stat").write_text(text)
        (root / "self" / "stat").write_text(text)
        assert read_cpu_seconds(root) == (None, None)
    assert read_cpu_seconds(tmp_path / "none") == (None, None)
    taken = snapshot([], tmp_path / "none", tmp_path / "none", use_jtop=False, proc_root=tmp_path / "none")
    assert (taken["cpu_busy_s"], taken["own_cpu_s"]) == (None, None)
    assert "other processes" not in summary(taken, taken)


def test_other_work_during_the_run_is_a_warning_a_finished_one_is_not():
    """The load average before the run counts a previous bench that has ended and misses work that starts during
    this one; the CPU time the machine spent beyond this process's own is what shared the cores."""
    before = {**QUIET, "monotonic_s": 100.0, "cpu_busy_s": 5000.0, "own_cpu_s": 10.0}
    shared = {**QUIET, "monotonic_s": 110.0, "cpu_busy_s": 5040.0, "own_cpu_s": 30.0}  # 20 s of others' work in 10 s
    assert other_cores(before, shared) == pytest.approx(2.0)
    found = warnings(before, shared, cores=4)
    assert any("other processes kept 2.0 cores busy on average while the tests ran" in w for w in found)
    assert "other processes 2.00 cores during the run" in summary(before, shared)
    alone = {**QUIET, "monotonic_s": 110.0, "cpu_busy_s": 5039.0, "own_cpu_s": 48.9}
    assert warnings(before, alone, cores=4) == []
    # a previous run's load still in the 1-minute average: no warning where the run itself had the cores
    assert warnings({**before, "load_1min": 3.4}, alone, cores=4) == []
    assert any("load average was 3.4" in w for w in warnings({**QUIET, "load_1min": 3.4}, QUIET, cores=4))
    assert other_cores(QUIET, QUIET) is None  # nothing read: unknown, no warning


def test_bench_records_the_cpu_time_around_its_tests(tiny_bundle):
    if read_cpu_seconds() == (None, None):
        pytest.skip("no /proc here")
    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 2, "-r", 1, "--json", "--threads", 1)
    assert_ok(result)
    conditions = json.loads(result.stdout)["conditions"]
    before, after = conditions["before"], conditions["after"]
    assert after["own_cpu_s"] >= before["own_cpu_s"] > 0
    assert after["cpu_busy_s"] >= before["cpu_busy_s"] > 0
    assert other_cores(before, after) >= 0
