"""What ``edgesdk env --json`` and a thermal telemetry file report: the env report's ``package_conflicts`` key is
there with nothing clashing too, and a step record's ``budget`` is the compute budget in force (the lower of the one
set with --compute-budget and the guard's; 1.0 with no power gate in use), read from real runs of a tiny gated bundle
on a simulated board."""

from __future__ import annotations

import json
import re

import pytest

from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_power_export import power_bundle  # noqa: F401  (the fixture: a tiny power-gated bundle)

# The guard's budget at each level (GuardConfig's warm_budget and hot_budget)
GUARD_BUDGET = {"normal": 1.0, "warm": 0.75, "hot": 0.5, "critical": 0.5}


def test_env_json_always_holds_package_conflicts():
    """The key was written only when distributions clashed, so a script reading it had to special-case its absence;
    it is now an empty list when nothing clashes, and the printed report still has no conflict row."""
    from edgesdk.envinfo import NOT_INSTALLED, package_version

    if package_version("onnxruntime-gpu") != NOT_INSTALLED:
        pytest.skip("a real onnxruntime-gpu distribution is installed")
    shown = invoke("env", "--json")
    assert_ok(shown)
    assert json.loads(shown.output)["package_conflicts"] == []
    printed = invoke("env")
    assert_ok(printed)
    assert "conflict" not in printed.output


def _run_steps(bundle, tmp_path, *options) -> tuple[list[dict], str]:
    """The step records of one short run with ``options``, and its stderr."""
    telemetry = tmp_path / "run.jsonl"
    result = invoke("run", bundle.path, "-p", "hello there", "-n", 8, "--threads", 1, "--ignore-target", "--stats",
                    "--telemetry", telemetry, *options)
    assert_ok(result)
    records = [json.loads(line) for line in telemetry.read_text(encoding="utf-8").splitlines()]
    steps = [record for record in records if record["type"] == "step"]
    assert steps
    return steps, result.stderr


@pytest.mark.parametrize(("options", "first_level", "user_budget"), [
    (("--compute-budget", 0.6, "--ambient", 20), "normal", 0.6),  # the user's alone: the guard's is 1
    (("--compute-budget", 0.6, "--ambient", 45), "hot", 0.6),  # the guard's 0.5 is lower
    (("--compute-budget", 0.4, "--ambient", 45), "hot", 0.4),  # the user's 0.4 is lower than the guard's 0.5
    (("--gating", "--ambient", 45), "hot", 1.0),  # the gate at the guard's budget alone
], ids=["user-normal", "guard-lower", "user-lower-while-hot", "gating-no-budget"])
def test_a_step_records_the_compute_budget_in_force(power_bundle, tmp_path, options, first_level,  # noqa: F811
                                                    user_budget):
    """The record held the guard's budget alone: 1.0 at a normal level under --compute-budget 0.6, and 0.5 while
    hot under --compute-budget 0.4, where the gate ran at 0.6 and 0.4."""
    steps, stderr = _run_steps(power_bundle, tmp_path, "--simulate-thermal", *options)
    assert steps[0]["level"] == first_level  # the board's first reading, before any step heated it
    for step in steps:
        assert step["budget"] == min(user_budget, GUARD_BUDGET[step["level"]]), step
    if first_level == "normal":  # the status line shows the budget in force too
        budgets = set(re.findall(r"edgesdk thermal: .*\bbudget (\d\.\d\d)", stderr))
        assert budgets == {"0.60"}, stderr


def test_a_step_records_budget_1_where_no_power_gate_is_in_use(power_bundle, tmp_path):  # noqa: F811
    """With the gates off, a hot guard's budget moves nothing (the run says "compute budget not adjustable"), but
    the record said 0.5."""
    steps, stderr = _run_steps(power_bundle, tmp_path, "--simulate-thermal", "--ambient", 45)
    assert "compute budget not adjustable (no power gate in use)" in stderr
    assert steps[0]["level"] == "hot"
    assert {step["budget"] for step in steps} == {1.0}


def test_an_unguarded_step_records_the_compute_budget_set(power_bundle, tmp_path):  # noqa: F811
    """--telemetry without the guard: the record said 1.0 under --compute-budget 0.6."""
    steps, stderr = _run_steps(power_bundle, tmp_path, "--compute-budget", 0.6)
    assert {step["level"] for step in steps} == {"unguarded"}
    assert {step["budget"] for step in steps} == {0.6}
    assert "compute budget 0.6" in stderr  # the gate controller's own figure (--stats)
