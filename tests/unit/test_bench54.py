"""``edgesdk bench``, review 54: the other processes' work counted over the tests alone (not over a ``--delay``
cool-off between them), a platform without a load average, and the refusal of a bench whose every test is off."""

from __future__ import annotations

import json
import os

import pytest

from edgesdk.runtime.bench_conditions import during_tests, other_cores, snapshot, warnings
from tests.unit.test_cli import invoke


def _times(monotonic_s: float, busy_s: float, own_s: float) -> dict:
    return {"monotonic_s": monotonic_s, "cpus": [0, 1], "cpu_busy_s": busy_s, "own_cpu_s": own_s}


def test_work_during_a_cool_off_is_not_counted_as_work_while_the_tests_ran():
    """Two 1-second tests with a 10-second --delay before the second: another process kept both cores busy during the
    cool-off alone, and the tests had the cores to themselves. Between the two snapshots that is 20 CPU seconds over
    12 s, and the old count warned of 1.7 cores of other work "while the tests ran"."""
    before, first_end = _times(100.0, 1000.0, 5.0), _times(101.0, 1001.0, 6.0)
    second_start = _times(111.0, 1021.0, 6.0)  # the cool-off: 20 CPU seconds of others' work, none of this process
    after = {**_times(112.0, 1022.0, 7.0), "load_1min": None}
    after["during_tests"] = during_tests([(before, first_end), (second_start, after)])
    assert after["during_tests"] == {"windows": 2, "cpus": [0, 1], "wall_s": 2.0, "cpu_busy_s": 2.0, "own_cpu_s": 2.0}
    assert other_cores(before, after) == 0.0
    assert warnings(before, after, cores=2) == []
    # Work inside a test's window is still counted, over the tests' wall time only: 1.5 CPU seconds in 2 s
    busy_end = _times(112.0, 1023.5, 7.0)
    busy = {**busy_end, "during_tests": during_tests([(before, first_end), (second_start, busy_end)])}
    assert other_cores(before, busy) == pytest.approx(0.75)


def test_the_readings_of_the_tests_are_unknown_where_the_affinity_changed_or_a_file_was_unreadable():
    start, end = _times(0.0, 10.0, 1.0), _times(1.0, 12.0, 2.0)
    assert during_tests([]) is None
    assert during_tests([(start, {**end, "cpus": [0]})]) is None
    assert during_tests([(start, {**end, "cpu_busy_s": None})]) is None


def test_bench_counts_the_other_work_over_the_tests_and_not_over_the_delay(tiny_bundle):
    """bench's --delay sleeps before each test; the old window ran from before the first delay to after the last test,
    so the other processes' work during the cool-offs was reported as work while the tests ran."""
    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 2, "-r", 1, "-t", 1, "--no-warmup", "--delay", 1,
                    "--json")
    assert result.exit_code == 0, result.output
    conditions = json.loads(result.output)["conditions"]
    before, after = conditions["before"], conditions["after"]
    during = after["during_tests"]
    assert during["windows"] == 2  # pp4, then tg2
    # each test waited a whole second before it began, outside its window
    assert after["monotonic_s"] - before["monotonic_s"] - during["wall_s"] >= 2.0
    assert during["cpus"] == after["cpus"]


def test_a_platform_without_a_load_average_records_it_as_unknown(monkeypatch, tmp_path):
    """``os.getloadavg`` is Unix-only: elsewhere it does not exist, and the AttributeError ended the bench after every
    test had run, where the module says a machine without these readings records them as unknown."""
    monkeypatch.delattr(os, "getloadavg")
    reading = snapshot((), thermal_root=tmp_path, cpufreq_root_dir=tmp_path, use_jtop=False)
    assert reading["load_1min"] is None


def test_a_bench_whose_every_test_is_off_names_the_values_and_the_fix(tiny_bundle):
    """-p 0 -n 0 -pg 0,0 was refused as "both tests are off" under -p/-n: neither the -pg test nor the values given."""
    result = invoke("bench", tiny_bundle.path, "-p", 0, "-n", "0,0", "-pg", "0,0")
    assert result.exit_code == 2
    assert "every test is off (-p 0 -n 0,0 -pg 0,0: a 0 skips its test)" in result.output
    assert "give -p or -n a count above 0, e.g. -p 512 -n 128" in result.output
