"""Pause and resume inside the real generation loop with sampled output: a request paused before its
first token (the board is past the hard limit when it arrives) and one paused before its last token
keep every token, and a seeded sampled answer equals the unguarded one token for token.

The board is a scripted heater whose temperature is written to a temporary sysfs tree and read back
through :class:`SysfsThermal`, on a simulated clock (a pause of minutes takes no wall time).
"""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.thermal.guard import Guard, GuardConfig, Limits
from edgesdk.thermal.sensors import Reading, SysfsThermal
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import ThermalHook
from tests._utils.sysfs import make_zone

PROFILE = get_profile("rpi5")  # resume 70, hard 78 °C
NEW_TOKENS = 24
# hot enough that the tiny random model's draw differs from its greedy answer and between seeds
SAMPLED = SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=3.0, top_k=200, top_p=0.98, seed=1234)
GREEDY = SamplingConfig(max_new_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path)


@pytest.fixture(scope="module")
def prompt(runtime):
    return runtime.tokenizer.encode("A fanless board in a warm cabinet")


class Heater:
    """Cools 0.1 °C per simulated second of waiting; jumps to ``hot_c`` after decode step ``heat_after``
    (0: already hot when the request arrives)."""

    clock = 1.0

    def __init__(self, root, heat_after: int, cool_c: float = 60.0, hot_c: float = 79.0):
        self.temp_file = make_zone(root, 0, "cpu-thermal", None, [("critical", 110000, 0)]) / "temp"
        self.t, self.decodes, self.heat_after, self.hot_c = 0.0, 0, heat_after, hot_c
        self.temp_c = hot_c if heat_after == 0 else cool_c
        self.sysfs = SysfsThermal(root, ["cpu-thermal"], clock=self.now)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.temp_c = max(60.0, self.temp_c - 0.1 * seconds)

    def compute(self, kind: str, tokens: int, measured_s: float = 0.0) -> float:
        self.t += 0.05
        if kind == "decode":
            self.decodes += 1
            if self.decodes == self.heat_after:
                self.temp_c = self.hot_c
        return 0.05

    def read(self) -> Reading:
        self.temp_file.write_text(f"{round(self.temp_c * 1000)}\n")
        return self.sysfs.read()


def guarded_run(runtime, prompt, sampling, board):
    limits, _ = Limits.resolve(PROFILE.thermal, board.sysfs.trips())
    guard = Guard(limits, PROFILE.thermal_model, GuardConfig(min_dwell_s=0.0))
    telemetry = Telemetry()
    streamed = []
    tokens, stats = generate(runtime.backend, prompt, sampling, stop_ids=set(), on_token=streamed.append,
                             hook=ThermalHook(board, board.read, guard, board, telemetry))
    return tokens, streamed, stats, telemetry.records, limits


@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_a_request_paused_before_its_first_token_keeps_every_token(runtime, prompt, tmp_path, sampling):
    reference, _ = generate(runtime.backend, prompt, sampling, stop_ids=set())
    tokens, streamed, stats, records, limits = guarded_run(runtime, prompt, sampling, Heater(tmp_path, heat_after=0))
    assert tokens == reference
    assert streamed == reference
    prefill = next(r for r in records if r["kind"] == "prefill")
    assert records[0]["kind"] == "wait"  # paused before the prompt ran
    assert records[0]["level"] == "critical"
    assert prefill["wait_s"] > 80  # from 79 °C to below the 70 °C resume point at 0.1 °C/s
    assert prefill["temp_c"] < limits.resume_c
    assert sum(r["tokens"] for r in records if r["kind"] in ("prefill", "decode")) == NEW_TOKENS
    assert stats.waited_s == pytest.approx(prefill["wait_s"])


@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_a_request_paused_before_its_last_token_keeps_every_token(runtime, prompt, tmp_path, sampling):
    reference, _ = generate(runtime.backend, prompt, sampling, stop_ids=set())
    # NEW_TOKENS - 1 decode steps; the board is past the hard limit after the one before the last
    board = Heater(tmp_path, heat_after=NEW_TOKENS - 2)
    tokens, streamed, stats, records, limits = guarded_run(runtime, prompt, sampling, board)
    assert tokens == reference
    assert streamed == reference
    decodes = [r for r in records if r["kind"] == "decode"]
    assert len(decodes) == NEW_TOKENS - 1
    assert [r["wait_s"] > 80 for r in decodes] == [False] * (NEW_TOKENS - 2) + [True]  # only the last one waited
    assert "critical" in [r["level"] for r in records if r["kind"] == "wait"]
    assert sum(r["tokens"] for r in records if r["kind"] in ("prefill", "decode")) == NEW_TOKENS
    assert stats.new_tokens == NEW_TOKENS


def test_sampled_output_is_the_seeds_own(runtime, prompt):
    """The sampled reference is a real draw: another seed gives another answer (else the tests above would
    only show greedy output again)."""
    first, _ = generate(runtime.backend, prompt, SAMPLED, stop_ids=set())
    again, _ = generate(runtime.backend, prompt, SAMPLED, stop_ids=set())
    other, _ = generate(runtime.backend, prompt, SamplingConfig(**{**SAMPLED.__dict__, "seed": 99}), stop_ids=set())
    greedy, _ = generate(runtime.backend, prompt, GREEDY, stop_ids=set())
    assert first == again
    assert first != other
    assert first != greedy
