"""The gated graph: equal to the PyTorch gated model, FFNs skipped inside an If, and the bundle
built through the ``power`` recipe runs with its controller (also without torch)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.power import adapter, train  # noqa: E402
from edgesdk.power.controller import ADAPTERS_OFF_TAU  # noqa: E402
from edgesdk.power.profiler import CostStats  # noqa: E402
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend  # noqa: E402
from tests._utils.tiny import CORPUS, tiny_llama  # noqa: E402
from tests.unit.test_lean_import import assert_ok, run_blocked  # noqa: E402

ARCHS = {"llama-gqa": {"heads": 4, "kv_heads": 2}, "qwen2-bias": {"heads": 4, "kv_heads": 2, "model_type": "qwen2"}}
TOKENS = 24


def _gated_model(arch: str, weights=(0.3, 0.5, 0.2)):
    model = tiny_llama(layers=3, **ARCHS[arch])
    state = adapter.install_adapters(model, 4, peak_layers=(1, 2))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".power_adapter." in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)
            if name.endswith("power_adapter.proj2.bias"):
                p[-1] = 0.0
    cost = CostStats(16, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], {}, 0.0125, 0.0)
    peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 32)))
    info = train.PowerModelInfo(weights, peak, ffn, 0.5, cost)
    model.config.edgesdk_power = {**model.config.edgesdk_power, "weights": list(weights), "peak_scale": peak,
                                  "ffn_scales": ffn, "cost_scale": 0.5, "cost": cost.to_json(), "tau_init": 0.5}
    return model, state, info


def _reference(model, state, info, ids: torch.Tensor, tau: float):
    state.clear()
    state.record, state.enabled, state.tau = True, True, tau
    with torch.no_grad():
        logits = model(ids[None], use_cache=False).logits[0].numpy()
    gates = torch.stack(state.gates, -1)[0].numpy()
    power = info.power(state, torch.arange(len(ids))[None])[0].numpy()
    state.clear()
    return logits, gates, power


@pytest.mark.parametrize("weights", ["fp32", "int8"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_exported_gated_graph_matches_the_pytorch_gated_model(arch, weights, tmp_path):
    model, state, info = _gated_model(arch)
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights=weights, max_context=128))
    assert spec.form == "ort-fused-gated"
    if weights == "int8":  # the graph must equal the model carrying the same quantized weights
        from edgesdk.export.validate import _exact_compute_copy, fake_quantized_copy

        model = fake_quantized_copy(model, 8, 32, 8)
        state = adapter.power_state(model)
        onnx_path = _exact_compute_copy(tmp_path / "model.onnx")
    else:
        onnx_path = tmp_path / "model.onnx"
    backend = OrtGatedBackend(onnx_path, spec.to_json(), threads=1)
    ids = torch.randint(0, 320, (TOKENS,), generator=torch.Generator().manual_seed(5))
    prompt = 10
    for tau in (ADAPTERS_OFF_TAU, 0.0, 0.5):
        logits, gates, power = _reference(model, state, info, ids, tau)
        assert tau <= 0 or 0 < (gates < tau).mean() < 1  # some FFN blocks skipped, not all
        backend.reset()
        backend.gating, backend.fixed_tau = True, tau
        got = backend.prefill(ids[:prompt].numpy(), keep_logits=prompt)
        np.testing.assert_allclose(got, logits[:prompt], atol=2e-4)
        np.testing.assert_allclose(backend.last_gates, gates[:prompt], atol=1e-5)
        np.testing.assert_allclose(backend.last_power, power[:prompt], atol=1e-4)
        for t in range(prompt, TOKENS):  # decode: each step's If decides for one token
            got = backend.decode(int(ids[t]))
            np.testing.assert_allclose(got, logits[t], atol=2e-4)
            np.testing.assert_allclose(backend.last_gates[0], gates[t], atol=1e-5)
            np.testing.assert_allclose(backend.last_power[0], power[t], atol=1e-4)


def test_gating_off_is_the_loaded_model_where_tau_0_still_has_the_adapters_scales(tmp_path):
    """Below 0 (the runtime's gating off) the graph computes the model without its adapters, as the PyTorch model
    with the adapters disabled; at tau 0 every FFN runs too, but the channel and query scales act."""
    model, state, _ = _gated_model("llama-gqa")
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=64))
    ids = torch.randint(0, 320, (TOKENS,), generator=torch.Generator().manual_seed(7))
    state.clear()
    state.enabled = False
    with torch.no_grad():
        loaded = model(ids[None], use_cache=False).logits[0].numpy()
    state.enabled = True
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    assert (backend.gating, backend.tau) == (False, ADAPTERS_OFF_TAU)  # off unless asked for
    off = backend.prefill(ids.numpy(), keep_logits=TOKENS)
    np.testing.assert_allclose(off, loaded, atol=2e-4)
    backend.reset()
    backend.gating, backend.fixed_tau = True, 0.0
    scaled = backend.prefill(ids.numpy(), keep_logits=TOKENS)
    assert np.abs(scaled - loaded).max() > 1e-2  # the adapters' scales (made far from 1 here) act at tau 0
    assert backend.stats()["blocks_skipped"] == 0


def test_skipped_ffn_weights_live_only_inside_the_if(tmp_path):
    model, state, _ = _gated_model("llama-gqa")
    export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="int8", max_context=64))
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    ifs = [node for node in graph.node if node.op_type == "If"]
    assert len(ifs) == 3
    outer_inputs = {name for node in graph.node for name in node.input}
    for node in ifs:
        branches = {a.name: a.g for a in node.attribute}
        assert [n.op_type for n in branches["then_branch"].node] == ["Mul"]  # zeros: nothing read
        ffn_weights = {name for n in branches["else_branch"].node if n.op_type == "MatMulNBits" for name in n.input[1:]}
        assert len(ffn_weights) == 4  # gate_up and down: packed weights and scales
        assert not ffn_weights & outer_inputs  # no node outside the If reads them
    assert {i.name for i in graph.input} >= {"tau"}
    assert {o.name for o in graph.output} >= {"gates", "power"}


def test_tau_above_every_gate_skips_every_ffn_at_decode(tmp_path):
    model, state, info = _gated_model("llama-gqa")
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", max_context=64))
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    ids = torch.randint(0, 320, (12,))
    logits, _, _ = _reference(model, state, info, ids, 1.01)
    backend.gating, backend.fixed_tau = True, 1.01
    backend.prefill(ids[:6].numpy())
    steps = np.stack([backend.decode(int(t)) for t in ids[6:]])
    np.testing.assert_allclose(steps, logits[6:], atol=2e-4)
    assert backend.stats()["blocks_skipped"] == backend.stats()["blocks_total"] == 6 * 3  # decode steps


# -- the power recipe end to end ------------------------------------------------------------------

TINY_POWER = ("power.rounds=2", "power.rollout=4", "power.prompt_tokens=8", "power.new_tokens=16",
              "power.sweep_tokens=24", "power.profile_up_to=128", "power.profile_buckets=3")


@pytest.fixture(scope="module")
def power_bundle(tiny_model_dir, tmp_path_factory):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig

    text = tmp_path_factory.mktemp("text") / "train.txt"
    text.write_text(" ".join(CORPUS), encoding="utf-8")
    out = tmp_path_factory.mktemp("bundles") / "tiny-power"
    return build(BuildConfig(target="rpi5", model=str(tiny_model_dir), out=out, recipe="power", progress=False,
                             export=ExportConfig(max_context=256), overrides=TINY_POWER,
                             data=DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=0)))


def test_power_bundle_records_the_stage_and_runs_with_its_controller(power_bundle):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    graph = power_bundle.manifest["graph"]
    assert graph["form"] == "ort-fused-gated"
    power = graph["power"]
    assert power["entropy_target"] == 1.5  # the rpi5 profile's
    assert len(power["ffn_scales"]) == graph["num_layers"]
    metrics = power_bundle.manifest["stages"][0]["metrics"]
    assert metrics["adapter_fraction"] <= 0.01
    assert len(metrics["train"]) == 2
    assert tuple(metrics["weights"]) in {tuple(p["weights"]) for p in metrics["sweep"][1:]}
    heldout = metrics["heldout"]  # the skipped head of the text, beside the manifest's baseline
    assert heldout["gating_off"]["executed_fraction"] == 1.0
    assert heldout["at_tau_train"]["tau"] == 0.5
    assert power_bundle.manifest["baseline"]["heldout_perplexity"] > 1
    report = (power_bundle.path / "report.md").read_text()  # the stage has its row, and its gated point a line
    assert f"| power | {metrics['parameters']:,} |" in report
    assert metrics["parameters"] > metrics["adapter_parameters"]  # the backbone and its adapters
    assert f"held-out perplexity {heldout['at_tau_train']['perplexity']:.3f}" in report
    runtime = open_runtime(power_bundle.path, ignore_target=True)
    backend = runtime.backend
    assert isinstance(backend, OrtGatedBackend)
    assert backend.gating is False  # off unless asked for, through the API as on the command line
    backend.gating = True
    ids = runtime.tokenizer.encode("The quick brown fox", add_special_tokens=False)
    _, stats = generate(backend, ids, SamplingConfig(max_new_tokens=24), set())
    summary = backend.stats()
    # Decode steps only: a prompt's FFNs run for every token unless all its gates are below tau.
    assert summary["blocks_total"] == (stats.new_tokens - 1) * graph["num_layers"]
    _, stats = generate(backend, ids[:1], SamplingConfig(max_new_tokens=5), set())  # a one-token prompt too
    assert backend.stats()["blocks_total"] == (stats.new_tokens - 1) * graph["num_layers"]
    assert summary["mean_entropy"] is not None
    backend.set_compute_budget(0.5)  # the thermal guard's call
    assert backend.controller.budget == 0.5


def test_cli_run_and_eval_on_a_gated_bundle_without_torch(power_bundle, tmp_path):
    bundle = Path(shutil.copytree(power_bundle.path, tmp_path / "bundle"))
    proc = run_blocked("run", bundle, "--prompt", "hello", "-n", 12, "--stats", "--ignore-target",
                       "--entropy-target", 1.2, "--compute-budget", 0.6, cwd=tmp_path)
    assert_ok(proc)
    assert "[power] realised entropy" in proc.stderr
    assert "target 1.2" in proc.stderr
    assert "compute budget 0.6" in proc.stderr
    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS), encoding="utf-8")
    proc = run_blocked("eval", bundle, "--text", text, "--context", 64, "--stride", 64, "--budgets", "1,0.5",
                       "--ignore-target", "--json", cwd=tmp_path)
    assert_ok(proc)
    import json

    result = json.loads(proc.stdout)
    curve = result["power"]["curve"]
    assert [p["budget"] for p in curve] == [1.0, 0.5]
    assert curve[0]["executed_fraction"] == 1.0
    assert curve[1]["executed_fraction"] < 1.0
    assert result["power"]["chosen"]["perplexity"] > 0
    assert "perplexity, gating off" in proc.stderr  # each pass's bar says which point it scores
    assert "perplexity, tau 0.000" in proc.stderr  # budget 1: every block runs
    bad = run_blocked("run", bundle, "--prompt", "x", "--compute-budget", 2, "--ignore-target", cwd=tmp_path)
    assert bad.returncode != 0
    assert "compute_budget" in bad.stderr


@pytest.mark.parametrize(("options", "message"), [
    (("--entropy-target", 5), "entropy_target must lie in (0.366, 2.079) nats"),
    (("--entropy-target", "nan"), "entropy_target must lie in (0.366, 2.079) nats"),
    (("--no-gating", "--compute-budget", 0.5), "which --no-gating turns off"),
], ids=["above-ln-window", "nan", "no-gating-with-budget"])
def test_gate_options_that_cannot_apply_are_refused(power_bundle, tmp_path, options, message):
    proc = run_blocked("run", power_bundle.path, "--prompt", "hello", "-n", 4, "--ignore-target", *options,
                       cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_gating_off_is_said_and_the_guard_does_not_claim_the_gate(power_bundle, tmp_path):
    proc = run_blocked("run", power_bundle.path, "--prompt", "hello there", "-n", 12, "--stats", "--raw",
                       "--simulate-thermal", "--ambient", 50, "--ignore-target", cwd=tmp_path)
    assert_ok(proc)
    assert "gating off (no adapter acts)" in proc.stderr
    assert "the bundle's power gates are off, so the guard paces" in proc.stderr
    assert "compute budget not adjustable (no power gate in use)" in proc.stderr
    gated = run_blocked("run", power_bundle.path, "--prompt", "hello there", "-n", 12, "--stats", "--raw",
                        "--simulate-thermal", "--ambient", 50, "--ignore-target", "--gating", cwd=tmp_path)
    assert_ok(gated)
    assert "compute budget via the power gate" in gated.stderr


def test_eval_budgets_are_checked_on_every_bundle(tiny_bundle, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS), encoding="utf-8")
    common = ("--text", text, "--context", 32, "--stride", 32, "--ignore-target")
    bad = run_blocked("eval", tiny_bundle.path, *common, "--budgets", "0.5,banana", cwd=tmp_path)
    assert bad.returncode == 2
    assert "--budgets" in bad.stderr
    assert "comma-separated numbers" in bad.stderr
    plain = run_blocked("eval", tiny_bundle.path, *common, "--budgets", "0.5", cwd=tmp_path)
    assert plain.returncode != 0
    assert "--budgets needs a bundle with power gates" in plain.stderr


def test_gated_evaluation_leaves_the_backends_settings_as_it_found_them(power_bundle):
    from edgesdk.evaluate import PerplexityConfig, gated_perplexity
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(power_bundle.path, ignore_target=True)
    gated_perplexity(runtime, " ".join(CORPUS), PerplexityConfig(context=32, stride=32, max_chars=400), (0.8,))
    assert (runtime.backend.gating, runtime.backend.fixed_tau) == (False, None)


def test_a_gated_bundle_on_an_onnxruntime_too_old_names_the_version_and_the_fix(power_bundle, monkeypatch):
    import onnxruntime

    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.session import open_runtime

    monkeypatch.setattr(onnxruntime, "__version__", "1.22.1")
    with pytest.raises(RuntimeBackendError) as info:
        open_runtime(power_bundle.path, ignore_target=True)
    assert "'ort-fused-gated' graph needs onnxruntime >= 1.23" in str(info.value)
    assert "this machine has 1.22.1" in str(info.value)
    assert "pip install 'onnxruntime>=1.23'" in info.value.fix
    assert "pass --backend ort-cpu" not in info.value.fix  # that is the backend which just failed


@pytest.mark.parametrize(("override", "message"), [
    ("power.sweep=[]", "sweep needs at least one"),
    ("power.weights=[1.0, -1.0, 0.5]", "power weights (alpha, beta, gamma) must be three finite numbers >= 0"),
    ("power.sweep=[[0, 0, 0]]", "with a positive sum"),
    ("power.entropy_target=2.5", "entropy_target must lie in (0.366, 2.079) nats"),
    ("power.bucket_size=0", "bucket_size=0: each must be at least 1"),
    ("power.profile_buckets=0", "profile_buckets=0: each must be at least 1"),
    ("power.prompt_tokens=0", "prompt_tokens=0: each must be at least 1"),
])
def test_power_settings_that_cannot_train_are_refused_before_the_build(override, message):
    from edgesdk.build.recipes import load_recipe
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError) as info:
        load_recipe("power").with_overrides([override]).validated()
    assert message in str(info.value)


def test_too_little_text_for_the_held_out_sweep_is_a_named_error(tiny_model_dir, tmp_path):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.errors import BuildError

    text = tmp_path / "train.txt"
    text.write_text("the cat sat on the mat and the dog ran far away.", encoding="utf-8")
    with pytest.raises(BuildError, match="held-out sweep of at least 10 tokens"):
        build(BuildConfig(target="rpi5", model=str(tiny_model_dir), out=tmp_path / "b", recipe="power",
                          progress=False, export=ExportConfig(max_context=64), overrides=TINY_POWER,
                          data=DataConfig(files=(str(text),), generated_sequences=0)))
