"""The guard inside the real generation loop (tiny bundle): pauses and pacing lose no token.
Its per-step cost against a real decode step is a benchmark (tests/benchmarks/test_thermal_guard_cost.py)."""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.thermal.guard import Guard, GuardConfig, Limits
from edgesdk.thermal.sensors import Reading, SysfsThermal
from edgesdk.thermal.simulator import RealClock, SimulatedBoard, WorkModel
from edgesdk.thermal.telemetry import Telemetry, summarize
from edgesdk.thermal.watch import ThermalHook
from tests._utils.sysfs import make_zone

PROFILE = get_profile("rpi5")
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path)


@pytest.fixture(scope="module")
def prompt(runtime):
    return runtime.tokenizer.encode("The board heats up while it writes")


@pytest.fixture(scope="module")
def reference(runtime, prompt):
    tokens, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW_TOKENS), stop_ids=set())
    return tokens


class SysfsBoard:
    """A simulated rpi5 whose temperature is written to a temporary sysfs tree and read back from it."""

    def __init__(self, root, ambient_c: float, start_c: float):
        self.temp_file = make_zone(root, 0, "cpu-thermal", None) / "temp"
        # 1 tok/s at full clock: every token heats the bare board by ~0.2 °C near 77 °C
        self.board = SimulatedBoard.from_profile(PROFILE, ambient_c, work=WorkModel(decode_tok_s=1.0, prefill_tok_s=4.0),
                                                 start_c=start_c)
        self.sysfs = SysfsThermal(root, ["cpu-thermal"], clock=self.board.now)

    def read(self) -> Reading:
        self.temp_file.write_text(f"{round(self.board.temp_c * 1000)}\n")
        return self.sysfs.read()


class ScriptedBoard:
    """A crude heater for the pause test: +1 °C per decoded token, -0.1 °C per second of waiting,
    written to a temporary sysfs tree and read back through :class:`SysfsThermal`."""

    clock = 1.0

    def __init__(self, root, start_c: float):
        self.temp_file = make_zone(root, 0, "cpu-thermal", None) / "temp"
        self.temp_c, self.t = start_c, 0.0
        self.sysfs = SysfsThermal(root, ["cpu-thermal"], clock=self.now)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.temp_c = max(60.0, self.temp_c - 0.1 * seconds)

    def compute(self, kind: str, tokens: int, measured_s: float = 0.0) -> float:
        self.t += 0.05
        self.temp_c += 1.0 if kind == "decode" else 0.0
        return 0.05

    def read(self) -> Reading:
        self.temp_file.write_text(f"{round(self.temp_c * 1000)}\n")
        return self.sysfs.read()


def test_pause_and_resume_lose_no_token(runtime, prompt, reference, tmp_path):
    """Past the hard limit the guard pauses mid-request, waits until the board is below resume_c and
    resumes, again and again: the greedy output is token for token the unguarded one."""
    board = ScriptedBoard(tmp_path, start_c=66.0)
    limits, _ = Limits.resolve(PROFILE.thermal, board.sysfs.trips())
    guard = Guard(limits, PROFILE.thermal_model, GuardConfig(min_dwell_s=0.0))
    telemetry = Telemetry()
    hook = ThermalHook(board, board.read, guard, board, telemetry)
    streamed = []
    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW_TOKENS), stop_ids=set(),
                             on_token=streamed.append, hook=hook)
    assert tokens == reference
    assert streamed == reference
    steps = [r for r in telemetry.records if r["kind"] in ("prefill", "decode")]
    assert sum(r["tokens"] for r in steps) == NEW_TOKENS
    levels = [r["level"] for r in telemetry.records]
    assert levels[0] != "critical"
    assert "critical" in levels
    resumed = [r for r in steps if r["wait_s"] > 50]  # a pause is >= 80 s: from >= 78 to < 70 at 0.1 °C/s
    assert len(resumed) >= 2  # paused and resumed more than once inside one request
    assert all(r["temp_c"] < limits.resume_c + 1.5 for r in resumed)  # resumed only once cool (+1 °C: its token)
    assert stats.waited_s > 160


def test_fixed_rate_without_a_sensor_loses_no_token(runtime, prompt, reference):
    warnings = []
    limits, _ = Limits.resolve(PROFILE.thermal)
    guard = Guard(limits, PROFILE.thermal_model, GuardConfig(fallback_fraction=0.5), warn=warnings.append)
    hook = ThermalHook(RealClock(), lambda: None, guard)
    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW_TOKENS), stop_ids=set(),
                             hook=hook)
    assert tokens == reference
    assert len(warnings) == 1
    assert "sensor failed" in warnings[0]
    assert stats.waited_s > 0  # paced (how much is a timing, which a loaded host skews: no ratio asserted here)
    assert guard.state()["rate_limit_tok_s"] is not None


def test_generate_without_hook_is_unchanged(runtime, prompt, reference):
    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW_TOKENS), stop_ids=set())
    assert tokens == reference
    assert stats.waited_s == 0.0
    assert stats.to_json()["waited_ms"] == 0.0


def test_telemetry_summary_of_a_guarded_run(runtime, prompt, tmp_path):
    sim = SysfsBoard(tmp_path, ambient_c=25, start_c=60.0)
    path = tmp_path / "run.jsonl"
    telemetry = Telemetry(path, {"profile": "rpi5"})
    hook = ThermalHook(sim.board, sim.read, None, sim.board, telemetry)
    generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW_TOKENS), stop_ids=set(), hook=hook)
    telemetry.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + NEW_TOKENS  # meta + prefill + 39 decode steps
    summary = summarize(telemetry.records)
    assert summary.tokens == NEW_TOKENS
    assert summary.requests == 1
    assert summary.p95_inter_token_ms == pytest.approx(1000.0, rel=0.01)  # 1 tok/s board, not throttled
    assert summary.levels_s == {"unguarded": pytest.approx(summary.seconds)}
