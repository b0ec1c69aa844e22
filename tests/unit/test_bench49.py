"""edgesdk bench and eval, review 49: a pinned bench's load check, the budgets' thresholds of a gated eval."""

from __future__ import annotations

import os

import pytest

from edgesdk.runtime.bench_conditions import other_cores, read_cpu_seconds, snapshot, warnings

HZ = os.sysconf("SC_CLK_TCK")


def _stat(root, per_cpu: dict[int, int]):
    """A /proc/stat whose cpuN lines spend ``per_cpu[N]`` ticks in user time, its cpu line their sum, and a
    self/stat of this process with 1 tick (proc(5))."""
    (root / "self").mkdir(parents=True, exist_ok=True)
    lines = [f"cpu  {sum(per_cpu.values())} 0 0 1000 0 0 0 0 0 0"]
    lines += [f"cpu{cpu} {ticks} 0 0 1000 0 0 0 0 0 0" for cpu, ticks in sorted(per_cpu.items())]
    (root / "stat").write_text("\n".join(lines) + "\nintr 1\n")
    (root / "self" / "stat").write_text("4242 (python) R 1 4242 4242 0 -1 4194304 10 0 0 0 1 0 0 0 20 0 "
                                        "5 0 3154 31334 362\n")


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no sched_getaffinity here")
def test_a_pinned_bench_counts_only_the_work_on_its_own_cores(tmp_path):
    """'taskset -c 0 edgesdk bench' beside a job on the other cores warned that other processes shared the cores:
    the CPU time came from /proc/stat's aggregate cpu line, every core of the machine. Only the cores of the
    process's affinity are counted now; work on them still warns."""
    mine = sorted(os.sched_getaffinity(0))
    elsewhere = max(mine) + 1  # a core this process may not run on
    none = tmp_path / "none"
    ticks = {cpu: 100 for cpu in mine} | {elsewhere: 100}
    _stat(tmp_path, ticks)
    before = snapshot([], none, none, use_jtop=False, proc_root=tmp_path)
    _stat(tmp_path, {**ticks, elsewhere: 100 + 1000 * HZ})  # 1000 s of work on the other core
    after = snapshot([], none, none, use_jtop=False, proc_root=tmp_path)
    assert other_cores(before, after) == pytest.approx(0.0)
    assert warnings(before, after, cores=len(mine) + 1) == []
    _stat(tmp_path, {**ticks, mine[0]: 100 + 1000 * HZ})  # and on one of its own
    after = snapshot([], none, none, use_jtop=False, proc_root=tmp_path)
    found = warnings(before, after, cores=len(mine) + 1)
    assert any(f"cores of the {len(mine)} this bench may run on busy" in warning for warning in found), found
    assert other_cores(before, {**after, "cpus": [elsewhere]}) is None  # the affinity changed: not comparable
    assert before["cpus"] == mine  # recorded in --json's conditions
    _stat(tmp_path, ticks)
    assert read_cpu_seconds(tmp_path, mine)[0] == pytest.approx(100 * len(mine) / HZ)
    assert read_cpu_seconds(tmp_path)[0] == pytest.approx(100 * (len(mine) + 1) / HZ)  # no affinity: the cpu line
    assert read_cpu_seconds(tmp_path, [elsewhere + 1])[0] is None  # no line for any of them: unknown


@pytest.fixture(scope="module")
def power_runtime(tiny_model_dir, tmp_path_factory):
    """A power-gated bundle of the tiny Llama (the power stage, as tests/unit/test_power_export.py builds it)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import CORPUS
    from tests.unit.test_power_export import TINY_POWER

    text = tmp_path_factory.mktemp("text49") / "train.txt"
    text.write_text(" ".join(CORPUS), encoding="utf-8")
    bundle = build(BuildConfig(target="rpi5", model=str(tiny_model_dir), out=tmp_path_factory.mktemp("b49") / "power",
                               recipe="power", progress=False, export=ExportConfig(max_context=256),
                               overrides=TINY_POWER,
                               data=DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=0)))
    return open_runtime(bundle.path, threads=1, ignore_target=True)


def test_each_budget_runs_its_share_of_the_ffn_blocks(power_runtime):
    """'eval --budgets' took a budget's tau from the first window's gates read with gating off, while the gated
    passes run with the adapters' scales on (and skipped blocks change the layers after them), over every window:
    budget 0.7 ran 74 % of the blocks here (0.9 ran 93.8 % on SmolLM2). The tau is now taken from the gates as the
    gated passes read them, pass after pass, until the share run is the budget's."""
    from edgesdk.evaluate import PerplexityConfig, gated_perplexity
    from tests._utils.tiny import CORPUS

    backend = power_runtime.backend
    result = gated_perplexity(power_runtime, " ".join(CORPUS), PerplexityConfig(context=64, max_chars=2000),
                              (1.0, 0.7, 0.5, 0.3))
    curve = result["curve"]
    assert [point["budget"] for point in curve] == [1.0, 0.7, 0.5, 0.3]
    assert curve[0]["tau"] == 0.0
    assert curve[0]["executed_fraction"] == 1.0
    for point in curve[1:]:
        assert abs(point["executed_fraction"] - point["budget"]) <= 0.0051, point  # evaluate.BUDGET_TOLERANCE
        assert 1 <= point.get("passes", 1) <= 3
    assert (backend.gating, backend.fixed_tau) == (False, None)  # left as it was found
