"""The measurement code the benchmarks rely on, run on the tiny model: which bundle the fp32
benchmarks build, and the helpers the speed benchmarks time their two sides with."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("onnxruntime")


def test_fp32_benchmarks_build_the_uncompressed_model(tmp_path):
    from edgesdk.build.recipes import load_recipe
    from tests.benchmarks.bench_bundles import fp32_build_config

    config = fp32_build_config(tmp_path / "b")
    recipe = load_recipe(config.recipe)
    assert config.target == "rpi5"
    assert recipe.validated() == []  # no stage changes the weights
    assert recipe.export.weights == "fp32"


def test_fp32_check_accepts_an_uncompressed_bundle_and_names_a_compressed_one(tiny_bundle):
    from tests.benchmarks.bench_bundles import fp32_problem

    assert fp32_problem(tiny_bundle.manifest) is None  # the host target's default: fp32-fused
    compressed = copy.deepcopy(tiny_bundle.manifest)
    compressed["recipe"]["name"] = "default"
    compressed["graph"]["dtype"] = "int4"
    compressed["stages"] = [{"stage": "qat"}]
    problem = fp32_problem(compressed)
    assert all(part in problem for part in ("'default'", "int4", "qat"))


def test_fresh_binding_side_of_the_binding_benchmark_binds_once_per_step(tiny_bundle):
    """The 'fresh binding per step' side gives the same logits as the kept binding, and never
    builds the reusable binding (which would double its binding work)."""
    import numpy as np

    from edgesdk.runtime.session import open_runtime
    from tests.benchmarks.test_decode_binding import fresh_binding_decode

    fresh, kept = (open_runtime(tiny_bundle.path).backend for _ in range(2))
    prompt = np.arange(3, 40)
    tokens = {}
    for name, backend in (("fresh", fresh), ("kept", kept)):
        backend.reset()
        tokens[name] = int(backend.prefill(prompt)[-1].argmax())
    for _ in range(24):
        a, b = fresh_binding_decode(fresh, tokens["fresh"]), kept.decode(tokens["kept"])
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        tokens = {"fresh": int(a.argmax()), "kept": int(b.argmax())}
    assert fresh.position == kept.position == len(prompt) + 24
    assert fresh._decode_step is None
    assert kept._decode_step is not None


class _SleepingHook:
    """A StepHook that holds every step back by ``seconds`` in ``before_step``."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Nothing to set up."""

    def before_step(self, kind: str) -> float:
        """Sleep, as a guard deciding would spend time."""
        import time

        time.sleep(self.seconds)
        return 0.0

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        """Nothing to account."""

    def end(self, stats) -> None:
        """Nothing to close."""


def test_guard_cost_benchmark_counts_the_hooks_time_per_decode_step(tiny_bundle):
    """generate() leaves the hook's before_step out of stats.decode_s; the whole-generation figure
    of the guard-cost benchmark must keep it (a sleep is a lower bound, never early)."""
    from edgesdk.runtime.generate import SamplingConfig
    from edgesdk.runtime.session import open_runtime
    from tests.benchmarks.test_thermal_guard_cost import decode_step_wall_us

    backend = open_runtime(tiny_bundle.path).backend
    tokens, step_us = decode_step_wall_us(backend, [5, 6, 7], SamplingConfig(max_new_tokens=6), _SleepingHook(0.02))
    assert len(tokens) == 6
    assert step_us >= 20_000


def test_ffn_skip_oracle_ranks_the_ffn_output_against_the_residual_stream():
    """‖FFN(h)‖ / ‖x‖ with x the residual the output is added to (a layer's output less its FFN
    output), not the FFN's normed input h."""
    torch = pytest.importorskip("torch")
    from tests._utils.tiny import tiny_llama
    from tests.benchmarks.test_ffn_skip_oracle import NormRatioOracle

    model = tiny_llama(layers=3)
    layers = model.model.layers
    oracle = NormRatioOracle(layers)
    outputs = []
    for layer in layers:
        layer.mlp.register_forward_hook(lambda module, args, out: outputs.append(out.detach()))
    ids = torch.arange(5, 29)[None]
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states  # (embeddings, layer 0, ..., final norm)
    for index in range(len(layers) - 1):  # the last entry is after the final norm
        residual = hidden[index + 1] - outputs[index]
        expected = outputs[index].norm(dim=-1) / residual.norm(dim=-1)
        torch.testing.assert_close(oracle.ratios[index], expected.flatten(), rtol=1e-4, atol=1e-6)


class _SlowAfterStepHook(_SleepingHook):
    """A StepHook whose work (telemetry, status, a clock cap) comes after each step."""

    def before_step(self, kind: str) -> float:
        """No wait."""
        return 0.0

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        """Sleep, as writing a telemetry record would take time."""
        import time

        time.sleep(self.seconds)


def test_decode_speed_leaves_out_the_hooks_after_step_as_its_before_step(tiny_bundle):
    """generate() keeps the hook's wall time out of the decode speed: the time after a step too."""
    import time

    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    backend = open_runtime(tiny_bundle.path).backend
    sleep, new = 0.05, 6
    start = time.perf_counter()
    tokens, stats = generate(backend, [5, 6, 7], SamplingConfig(max_new_tokens=new), stop_ids=set(),
                             hook=_SlowAfterStepHook(sleep))
    wall = time.perf_counter() - start
    assert len(stats.token_latencies_s) == new - 1
    # The sleeps lie inside the wall time; left out of decode_s, they bound it from above.
    assert stats.decode_s <= wall - stats.prefill_s - (new - 1) * sleep
