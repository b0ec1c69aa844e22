"""A prompt's prefill in steps the thermal guard can pace and pause between (review 50).

The thermal guard (``edgesdk run --watch-thermal``, serve's guard) could not act inside one prefill: generate() ran
the whole prompt as one backend pass, so a 4,000-token prompt (100 s on a simulated Raspberry Pi 5 at 40 tok/s) ran
the board past the hard limit into the emulated firmware throttle from 80 °C (Raspberry Pi documentation,
``frequency-management.adoc``) however the guard held it before: 429-515 s throttled in 30 simulated minutes at
30-45 °C ambient. llama.cpp prefills a prompt in micro-batches anyway (``n_ubatch``, 512 by default). Now a hook
that asks for it (``prefill_chunk``: the guard's steps, a few seconds of heat each) gets the prompt in steps, each
held back by ``before_step``; the answer, the prompt's log-probabilities, the prompt cache and the counters are as
with one pass.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.logprobs import LogprobRecorder
from edgesdk.runtime.prompt_cache import PromptCache
from edgesdk.serve.metrics import MetricsHook, ServeMetrics
from edgesdk.thermal import guard as guard_module
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.plan import Workload, _StubDecoder, simulate
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import ThermalHook

PROFILE = get_profile("rpi5")  # resume 70 °C, soft 75 °C, hard 78 °C, firmware throttle 80 °C; R 9.5, C 25
ZONE = PROFILE.thermal.zones[0]
MODEL = PROFILE.thermal_model


class Steps:
    """A StepHook that asks for prefill steps of ``size`` tokens and keeps what it is told."""

    def __init__(self, size: int | None, stop_at_step: int | None = None):
        self.size, self.stop_at_step = size, stop_at_step
        self.asked: list[int] = []  # prompt_left at each prefill_chunk
        self.steps: list[tuple[str, int, float]] = []
        self.prefills_begun = 0

    def begin(self, prompt_tokens, max_new_tokens):
        pass

    def prefill_chunk(self, prompt_left):
        self.asked.append(prompt_left)
        return self.size

    def before_step(self, kind):
        if kind == "prefill":
            self.prefills_begun += 1
            if self.prefills_begun == self.stop_at_step:
                raise KeyboardInterrupt  # the client left while the guard held this step back
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self.steps.append((kind, tokens, compute_s))

    def end(self, stats):
        pass


class CountedPrefills:
    """A real backend whose prefill passes are counted."""

    def __init__(self, inner):
        self.inner, self.prefills = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, token_ids, keep_logits=1):
        self.prefills.append(len(token_ids))
        return self.inner.prefill(token_ids, keep_logits)




@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    """The standard, fused and triton (CPU twin) backends of test_ort50's tiny model."""
    pytest.importorskip("torch")
    from tests._utils.tiny import on_sparse_grid, tiny_llama
    from tests.unit.test_ort50 import open_backends

    return open_backends(on_sparse_grid(tiny_llama(hidden=64, heads=4, kv_heads=2)), tmp_path_factory)

PROMPT = [int(token) for token in np.random.default_rng(7).integers(3, 300, 21)]
GREEDY = SamplingConfig(max_new_tokens=8)


@pytest.mark.parametrize("name", ["standard", "ort-fused", "triton"])
def test_a_prompt_in_steps_gives_the_answer_and_prompt_logprobs_of_one_pass(backends, name):
    backend = backends[name]
    alone_logprobs = LogprobRecorder(top=3, prompt=True)
    whole, whole_stats = generate(backend, PROMPT, GREEDY, set(), logprobs=alone_logprobs)
    hook, stepped_logprobs = Steps(5), LogprobRecorder(top=3, prompt=True)
    stepped, stats = generate(backend, PROMPT, GREEDY, set(), hook=hook, logprobs=stepped_logprobs)
    assert stepped == whole
    assert hook.asked == [21, 16, 11, 6, 1]  # before the fix: never asked, one prefill of 21 tokens
    prefills = [step for step in hook.steps if step[0] == "prefill"]
    assert [tokens for _, tokens, _ in prefills] == [0, 0, 0, 0, 1]  # the last step yields the first token
    assert stats.prefill_s == pytest.approx(sum(seconds for _, _, seconds in prefills))
    assert (stats.prompt_tokens, stats.cached_tokens, stats.new_tokens) == (whole_stats.prompt_tokens, 0, 8)
    assert [entry.token for entry in stepped_logprobs.prompt_entries] == PROMPT
    for ours, theirs in zip(stepped_logprobs.prompt_entries[1:] + stepped_logprobs.answer,
                            alone_logprobs.prompt_entries[1:] + alone_logprobs.answer, strict=True):
        assert ours.token == theirs.token
        assert ours.logprob == pytest.approx(theirs.logprob, abs=1e-4)


def test_without_a_hook_asking_for_steps_the_prompt_is_one_pass(backends):
    backend = CountedPrefills(backends["standard"])
    generate(backend, PROMPT, GREEDY, set())
    generate(backend, PROMPT, GREEDY, set(), hook=Steps(None))  # asked, answers None: the whole prompt
    assert backend.prefills == [21, 21]


def test_a_step_the_answer_is_abandoned_before_leaves_the_steps_before_it_in_the_prompt_cache(backends):
    backend = backends["standard"]
    cache = PromptCache(backend)
    with pytest.raises(KeyboardInterrupt):
        generate(backend, PROMPT, GREEDY, set(), hook=Steps(8, stop_at_step=3), cache=cache)
    assert backend.position == 16
    assert cache.tokens == PROMPT[:16]
    hook = Steps(8)
    answer, stats = generate(backend, PROMPT, GREEDY, set(), hook=hook, cache=cache)
    assert stats.cached_tokens == 16  # before the fix: the request held before its one prefill kept nothing
    assert hook.asked == [5]
    assert answer == generate(backends["ort-fused"], PROMPT, GREEDY, set())[0]


def learned_guard(temp: float, ambient: float = 20.0) -> Guard:
    """A guard first read on a Pi 5 idle at ``ambient``, that has learned a 40 tok/s prefill and a 10 tok/s decode,
    now reading ``temp``."""
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], MODEL)
    idle = ambient + MODEL.resistance_c_per_w * MODEL.idle_w
    guard.observe(0.0, Reading(time=0.0, zones={ZONE: idle}))
    guard.begin(16, 400)
    guard.spend("prefill", 1, 10.0)
    guard.spend("decode", 1, 0.1)
    guard.observe(1.0, Reading(time=1.0, zones={ZONE: temp}))
    assert (guard.prefill_tok_s, guard.unpaced_tok_s) == (40.0, 10.0)
    return guard


def test_the_guards_steps_are_llama_cpps_ubatch_then_a_few_seconds_of_heat():
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], MODEL)
    guard.begin(16, 4000)
    assert guard_module.PREFILL_CHUNK_TOKENS == 512  # before the fix: no such constant
    assert guard.prefill_chunk(4000) == 512
    assert guard.prompt_tokens == 512
    assert guard.prefill_chunk(100) == 100
    for ambient in (20.0, 45.0):
        guard = learned_guard(60.0, ambient)
        heating_w = MODEL.active_w - (78.0 - ambient) / MODEL.resistance_c_per_w  # at the hard limit, full power
        seconds = 0.5 * (80.0 - 78.0) * MODEL.capacity_j_per_c / heating_w  # half the way to the throttle point
        assert guard.prefill_chunk(4000) == int(seconds * 40.0)
        assert 3.0 < seconds < 10.0


def test_the_hold_predicts_the_coming_step_not_the_whole_prompt():
    guard = learned_guard(69.9)
    guard.begin(16, 4000)  # 100 s from 69.9 °C ends near 82 °C: held whole
    assert guard.prefill_held
    step = guard.prefill_chunk(4000)  # about 8.6 s: ends near 71 °C
    assert step < 4000
    assert not guard.prefill_held
    assert guard.wait_s("prefill") == 0.0


def thermal_hook(prefill_tok_s: float = 40.0, telemetry: Telemetry | None = None) -> ThermalHook:
    board = SimulatedBoard.from_profile(PROFILE, 30.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=prefill_tok_s))
    sensor = SimulatedSensor(board, ZONE)
    limits, _ = Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, ZONE))
    return ThermalHook(board, sensor.read, Guard(limits, MODEL), board, telemetry)


def test_the_telemetry_and_serve_metrics_count_a_prompt_in_steps_once():
    telemetry = Telemetry(None, {"profile": PROFILE.name})
    metrics = ServeMetrics()
    hook = MetricsHook(metrics, thermal_hook(telemetry=telemetry))
    for _ in range(2):
        generate(_StubDecoder(), [2] * 1500, SamplingConfig(max_new_tokens=4), set(), hook=hook)
    prefills = [record for record in telemetry.records if record.get("kind") == "prefill"]
    # 512 (llama.cpp's n_ubatch) until a prefill rate is learned, then 6.3 s at 40 tok/s: at 30 °C ambient the board
    # at full power heats 0.16 °C/s at the hard limit, 12.7 s to the throttle point
    steps = [record["prompt_tokens"] for record in prefills]
    assert steps == [512, 253, 253, 253, 229] + [253] * 5 + [235]  # before the fix: [1500, 1500]
    assert [record["prompt_left"] for record in prefills[:5]] == [988, 735, 482, 229, 0]
    ends = [record for record in prefills if record["prompt_left"] == 0]
    assert len(ends) == 2
    assert all(record["tokens"] == 1 for record in ends)
    assert all(record["tokens"] == 0 for record in prefills if record["prompt_left"])
    assert (metrics.prompt_tokens, metrics.predicted_tokens) == (3000, 8)
    assert metrics.decodes == len(prefills) + 6
    assert "edgesdk_prompt_tokens_total 3000" in metrics.render(0, 0, None)


def test_the_serve_wrappers_pass_the_guards_steps_through_and_count_cached_tokens_once(backends):
    from edgesdk.serve.completion import _HeldTime

    backend, metrics = backends["standard"], ServeMetrics()
    cache = PromptCache(backend)
    inner = Steps(4)
    hook = _HeldTime(MetricsHook(metrics, inner, backend, cache))
    generate(backend, PROMPT[:10], GREEDY, set(), hook=hook, cache=cache)
    answer, stats = generate(backend, PROMPT, GREEDY, set(), hook=hook, cache=cache)
    assert stats.cached_tokens == 10
    assert inner.asked == [10, 6, 2, 11, 7, 3]  # before the fix: the wrappers hid prefill_chunk
    assert (metrics.prompt_tokens, metrics.prompt_cached_tokens) == (21, 10)
    assert metrics.decodes == 3 + 7 + 3 + 7
    assert answer == generate(backend, PROMPT, GREEDY, set())[0]


@pytest.mark.parametrize("ambient", [30.0, 35.0, 40.0, 45.0])
def test_long_prompts_no_longer_reach_the_firmware_throttle_in_simulation(ambient):
    """4,000-token prompts, 64 new tokens, 30 simulated minutes on a bare Pi 5 (40 tok/s prefill, 10 tok/s decode).
    Before the fix: 429 / 502 / 447 / 515 s in the emulated firmware throttle at 30 / 35 / 40 / 45 °C, peaks of
    83.8-87.3 °C, 506-1068 s paused at the hard limit."""
    run = simulate(PROFILE, 30, ambient, True, 10.0, workload=Workload(prompt_tokens=4000, new_tokens=64))
    assert run.board.throttled_s == 0.0
    assert run.summary.max_temp_c < PROFILE.thermal.hard_limit_c
    prompt = sum(record.get("prompt_tokens", 0) for record in run.telemetry.records if record.get("kind") == "prefill")
    assert prompt > 3000  # the board did work: at 45 °C it holds about 5 % duty under the soft limit


def test_a_prompt_prefilled_in_steps_counts_as_one_request_in_the_run_summary():
    """thermal plan / report counted every prefill record as a request and a time-to-first-token sample, so a
    prompt the guard prefilled in steps read as several requests with short first-token times each."""
    run = simulate(PROFILE, 30, 30.0, True, 10.0, workload=Workload(prompt_tokens=4000, new_tokens=64))
    prefills = [record for record in run.telemetry.records if record.get("kind") == "prefill"]
    finished = [record for record in prefills if not record.get("prompt_left")]
    assert len(prefills) > 2 * len(finished) > 0  # the prompts ran in steps
    assert run.summary.requests in (len(finished), len(finished) + 1)  # + a request cut inside its steps
    last = max(index for index, record in enumerate(prefills) if not record.get("prompt_left"))
    whole = sum(record["duration_s"] + record["wait_s"] for record in prefills[:last + 1])
    assert run.summary.mean_ttft_s * len(finished) == pytest.approx(whole)  # a request cut inside its steps: none
