"""Power distillation against its contract (seed 000 §2.2, §3.3, §5.2): padding changes nothing in
the training terms, the terms are never negative, and the gated ONNX graph equals the PyTorch gated
model at thresholds that change every step, skipping a block without reading its weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

torch = pytest.importorskip("torch")

from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.power import adapter, distribution, losses, train, vector  # noqa: E402
from edgesdk.power.controller import ControllerConfig  # noqa: E402
from edgesdk.power.profiler import CostStats  # noqa: E402
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit.test_power_export import _gated_model  # noqa: E402

# -- padding: a batch with a padded row against the same row alone ---------------------------------


def _trained_like_model():
    """Two layers with adapters moved off their start, so gates differ between tokens and layers."""
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4, peak_layers=(0, 1))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".power_adapter." in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 16), generator=generator))
    info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(16, [0.0, 0.2, 0.4], {}, 0.0125, 0.0))
    state.tau = 0.5
    return model, state, info


def _terms(model, state, info, ids, valid, loss_mask, prompt):
    """What train_adapters computes from one micro-batch, up to the losses."""
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        teacher = train._forward(model, state, ids, valid, gated=False)
        p_student = info.power(state, positions)
        student = train._forward(model, state, ids, valid, gated=True)
        p_proxy = info.power(state, positions)
    state.clear()
    pred_mask = loss_mask[:, 1:]
    P_proxy, P_student, wm = train.power_windows(p_proxy, p_student, loss_mask, prompt, info)
    kl_pow, h = train.window_terms(P_proxy, P_student, wm)
    return {"p_student": p_student, "p_proxy": p_proxy, "token_kl": losses.token_kl(teacher[:, :-1], student[:, :-1]),
            "weights": losses.power_weights(p_student[:, :-1], pred_mask), "power_kl": kl_pow, "entropy": h}


def test_a_rollout_padded_after_its_eos_trains_the_power_terms_of_the_same_rollout_alone():
    """Row 1 ends (EOS) after 14 of 20 generated tokens and is padded to row 0's length, as generate pads
    it. Its second window then held 6 tokens and went into the power KL; the same rollout alone (or
    one that ran to the end, whose last 4 tokens fill no window) had no such window: a row's power
    KL depended on the rows beside it."""
    model, state, info = _trained_like_model()
    prompt, generated, eos_at = 5, 20, 13
    ids = torch.randint(3, 320, (2, prompt + generated), generator=torch.Generator().manual_seed(2))
    ids[1, prompt + eos_at] = 2
    ids[1, prompt + eos_at + 1:] = 0  # the pad id
    loss_mask = torch.cat([torch.zeros(2, prompt), torch.ones(2, generated)], 1)
    loss_mask[1, prompt + eos_at + 1:] = 0
    valid = torch.cat([torch.ones(2, prompt), loss_mask[:, prompt:]], 1)
    batch = _terms(model, state, info, ids, valid, loss_mask, prompt)
    n = prompt + eos_at + 1
    alone = _terms(model, state, info, ids[1:, :n], valid[1:, :n], loss_mask[1:, :n], prompt)
    rows = _terms(model, state, info, ids[:1], valid[:1], loss_mask[:1], prompt)
    for key in ("p_student", "p_proxy"):
        torch.testing.assert_close(batch[key][1, :n], alone[key][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch["token_kl"][1, : n - 1], alone["token_kl"][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(batch["weights"][1, : n - 1], alone["weights"][0])
    assert batch["weights"][1, n - 1:].abs().sum() == 0  # padding: no weight
    # each row's whole windows, in order: row 0 has 2, row 1 (14 tokens) 1, whether padded or not
    assert batch["power_kl"].shape == (3,)
    assert rows["power_kl"].shape == (2,)
    assert alone["power_kl"].shape == (1,)
    torch.testing.assert_close(batch["power_kl"], torch.cat([rows["power_kl"], alone["power_kl"]]), atol=1e-5,
                               rtol=1e-4)
    torch.testing.assert_close(batch["entropy"], torch.cat([rows["entropy"], alone["entropy"]]), atol=1e-5,
                               rtol=1e-4)


def test_the_distribution_of_a_padded_row_is_that_of_the_row_alone_at_either_edge():
    """Left or right padding: the row's windows, smoothing at the first real token and P are unchanged."""
    rng = np.random.default_rng(0)
    row = rng.gamma(2.0, 1.0, 16)
    for pad in ("left", "right"):
        garbage = np.full(8, np.nan)
        p = np.concatenate([garbage, row]) if pad == "left" else np.concatenate([row, garbage])
        mask = np.concatenate([np.zeros(8), np.ones(16)]) if pad == "left" else np.concatenate([np.ones(16), np.zeros(8)])
        P, m = distribution.windowed(p[None], mask[None])
        alone, _ = distribution.windowed(row[None], np.ones((1, 16)))
        real = P[m > 0].reshape(1, 2, 8)
        np.testing.assert_allclose(real, alone, atol=1e-12)
        assert np.all(P[m == 0] == 0)
        torch_P, _ = vector.windowed(torch.from_numpy(p[None]), torch.from_numpy(mask[None]))
        np.testing.assert_allclose(torch_P.numpy(), P, atol=1e-12)
    smoothed = distribution.smooth(row[None], np.ones((1, 16)))[0]
    assert smoothed[0] == row[0]  # the first token has no predecessor: averaged with itself, not with a 0
    np.testing.assert_allclose(smoothed[1:], (row[1:] + row[:-1]) / 2)


# -- the loss terms --------------------------------------------------------------------------------


def test_the_power_kl_of_nearly_equal_distributions_is_not_negative():
    """The float sum of P ln(P/Q) came out at down to -2e-7 for P and Q a rounding apart."""
    generator = torch.Generator().manual_seed(0)
    p = torch.rand(64, 64, generator=generator) + 0.1
    q = p * (1 + 1e-4 * torch.randn(p.shape, generator=generator))
    mask = torch.ones_like(p)
    P, wm = vector.windowed(p, mask)
    Q, _ = vector.windowed(q, mask)
    kl = vector.power_kl(P, Q, wm)
    assert kl.min() >= 0
    assert torch.all(losses.sqrt_clip(kl) >= 0)
    assert torch.all(vector.power_kl(P, P, wm) == 0)


@pytest.mark.parametrize("held", [float("nan"), float("inf"), 1e9])
def test_the_low_power_weights_ignore_what_the_padding_holds(held):
    """The mean was taken of p * mask: a NaN or inf on padding made it NaN, and every valid token,
    the peak at 5 too, was weighted as a low-power one."""
    p = torch.tensor([[1.0, 5.0, 1.0, 5.0, held]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    expected = losses.power_weights(p[:, :4], mask[:, :4])
    assert expected.tolist() == [[pytest.approx(0.3), 1.0, pytest.approx(0.3), 1.0]]
    torch.testing.assert_close(losses.power_weights(p, mask)[:, :4], expected)
    assert losses.power_weights(p, mask)[0, 4] == 0


# -- the gated graph against the PyTorch gated model -----------------------------------------------

PROMPT, TOKENS = 6, 24


def _export(tmp_path: Path):
    model, state, info = _gated_model("llama-gqa")
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=64))
    return model, state, info, spec


@torch.no_grad()
def _reference_steps(model, state, info, ids: torch.Tensor, taus: list[float]) -> list[tuple]:
    """Prefill at taus[0], then one token per step at taus[1:], with a KV cache: (logits, gates, power)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    kwarg = {"cache": cache} if train._takes_cache(model) else {"past_key_values": cache}
    state.enabled, state.straight_through, state.record = True, False, True
    steps = []
    spans = [(0, PROMPT)] + [(t, t + 1) for t in range(PROMPT, len(ids))]
    for tau, (start, end) in zip(taus, spans, strict=True):
        state.clear()
        state.tau = tau
        logits = model(ids[None, start:end], use_cache=True, **kwarg).logits[0].numpy()
        power = info.power(state, torch.arange(start, end)[None])[0].numpy()
        steps.append((logits, torch.stack(state.gates, -1)[0].numpy(), power))
    state.clear()
    state.record, state.tau = False, 0.0
    return steps


def test_the_gated_graph_follows_the_pytorch_model_while_the_controller_moves_tau_every_step(tmp_path):
    """Decode steps reuse one IO binding; the threshold the controller sets each step is the one the
    graph compares the gates with, and graph and model agree on logits, gates and p_t throughout."""
    model, state, info, spec = _export(tmp_path)
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    backend.configure(ControllerConfig(entropy_target=1.6, gain_entropy=0.05, min_compute=0.0))
    backend.gating = True
    ids = torch.randint(0, 320, (TOKENS,), generator=torch.Generator().manual_seed(5))
    taus, outputs = [backend.tau], []
    backend.prefill(ids[:PROMPT].numpy(), keep_logits=PROMPT)
    outputs.append((backend.last_gates, backend.last_power))
    for t in range(PROMPT, TOKENS):
        taus.append(backend.tau)
        outputs.append((backend.decode(int(ids[t])), backend.last_gates, backend.last_power))
    assert len({round(tau, 6) for tau in taus}) > 5  # tau moved
    reference = _reference_steps(model, state, info, ids, taus)
    np.testing.assert_allclose(outputs[0][0], reference[0][1], atol=1e-5)
    np.testing.assert_allclose(outputs[0][1], reference[0][2], atol=1e-4)
    partly = 0
    for (logits, gates, power), (want_logits, want_gates, want_power), tau in zip(outputs[1:], reference[1:],
                                                                                  taus[1:], strict=True):
        np.testing.assert_allclose(logits, want_logits[0], atol=2e-4)
        np.testing.assert_allclose(gates, want_gates, atol=1e-5)
        np.testing.assert_allclose(power, want_power, atol=1e-4)
        partly += 0 < (want_gates < tau).sum() < want_gates.size
    assert partly >= 3  # steps where some layers' FFN ran and others' did not


def _poisoned(tmp_path: Path, layer: int) -> Path:
    """The graph with layer ``layer``'s FFN weights set to NaN: any read of them turns the logits NaN."""
    model = onnx.load(str(tmp_path / "model.onnx"))
    poisoned = 0
    for init in model.graph.initializer:
        if init.name.startswith(f"layers.{layer}.mlp."):
            values = numpy_helper.to_array(init).copy()
            values[...] = np.nan
            init.CopyFrom(numpy_helper.from_array(values, init.name))
            poisoned += 1
    assert poisoned == 2  # gate_up and down
    out = tmp_path / "poisoned"
    out.mkdir()
    onnx.save(model, str(out / "model.onnx"))
    return out / "model.onnx"


def test_a_skipped_ffns_weights_are_not_read_at_decode(tmp_path):
    """The last layer's FFN weights are NaN. A step whose last-layer gate is below tau gives finite
    logits, equal to the intact graph's: the If did not take the branch that reads them."""
    model, state, info, spec = _export(tmp_path)
    taus = [0.99] + list(np.random.default_rng(0).uniform(0.35, 0.65, TOKENS - PROMPT))
    ids = torch.randint(0, 320, (TOKENS,), generator=torch.Generator().manual_seed(5))
    runs = {}
    for name, path in (("intact", tmp_path / "model.onnx"), ("poisoned", _poisoned(tmp_path, 2))):
        backend = OrtGatedBackend(path, spec.to_json(), threads=1)
        backend.gating, backend.fixed_tau = True, taus[0]
        prefill = backend.prefill(ids[:PROMPT].numpy(), keep_logits=PROMPT)  # tau above every gate: all skipped
        steps = []
        for t, tau in zip(range(PROMPT, TOKENS), taus[1:], strict=True):
            backend.fixed_tau = float(tau)
            steps.append((backend.decode(int(ids[t])), backend.last_gates[0].copy()))
        runs[name] = prefill, steps
    assert np.isfinite(runs["poisoned"][0]).all()
    np.testing.assert_array_equal(runs["poisoned"][0], runs["intact"][0])
    skipped_alone = 0
    for (logits, gates), (intact, _), tau in zip(runs["poisoned"][1], runs["intact"][1], taus[1:], strict=True):
        skipped = gates[2] < tau
        assert np.isfinite(logits).all() == skipped
        if skipped:
            np.testing.assert_array_equal(logits, intact)
            skipped_alone += bool((gates[:2] >= tau).any())
    assert skipped_alone >= 2  # the last layer skipped while an earlier one ran
    assert not all(gates[2] < tau for (_, gates), tau in zip(runs["poisoned"][1], taus[1:], strict=True))  # ran too


def test_the_blocks_counted_are_those_the_graph_ran_when_tau_lies_within_a_float32_step_of_a_gate(tmp_path):
    """The graph compares float32 gates with tau fed as float32; the block counts make the same comparison
    (numpy casts the Python float to the gates' float32), so a tau a fraction of a float32 step above a gate
    counts the block the graph ran as run."""
    _, _, _, spec = _export(tmp_path)
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    ids = torch.randint(0, 320, (PROMPT + 1,), generator=torch.Generator().manual_seed(5)).numpy()
    backend.gating = True

    def step(tau: float) -> tuple[np.ndarray, np.ndarray, int]:
        backend.reset()
        backend.fixed_tau = 0.0
        backend.prefill(ids[:PROMPT])
        backend.fixed_tau = tau
        logits = backend.decode(int(ids[PROMPT]))
        return logits, backend.last_gates[0].copy(), backend.stats()["blocks_total"] - backend.stats()["blocks_skipped"]

    _, gates, _ = step(0.0)
    gate = gates[0]  # layer 0's gate reads no FFN output: the same at every tau
    above = float(gate) + float(np.spacing(gate)) / 4  # above the gate in float64, equal to it in float32
    assert np.float32(above) == gate
    assert above > float(gate)
    on_gate, gates_on, run_on = step(float(gate))
    just_above, gates_above, run_above = step(above)
    np.testing.assert_array_equal(gates_on, gates_above)
    np.testing.assert_array_equal(just_above, on_gate)  # the graph ran layer 0's FFN in both
    assert run_above == run_on == int((gates_on >= gate).sum())
