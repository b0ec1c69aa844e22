"""The gate rows' learning-rate gain (power/adapter.py gate_gain): the gates learn to differ between tokens faster,
and training ends with the gain folded into proj2, so the exported graph (proj2 alone) computes the same gates."""

import pytest

torch = pytest.importorskip("torch")

from edgesdk.power import adapter, train  # noqa: E402
from edgesdk.power.profiler import CostStats  # noqa: E402
from edgesdk.power.stage import PowerConfig  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _trained(gain: float, rounds: int = 4):
    """A tiny Llama's adapters after ``rounds`` rounds at ``gain``; its gates over a fixed text (T, L)."""
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4)
    ids = torch.randint(0, 320, (1, 32), generator=torch.Generator().manual_seed(5))
    peak, ffn = train.calibrate_scales(model, state, ids)
    info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(16, [0.0, 0.2], {}, 0.0125, 0.0))
    config = train.PowerTrainConfig(rounds=rounds, rollout=2, micro_batch=2, prompt_tokens=8, new_tokens=8,
                                    gate_gain=gain)
    pool = torch.randint(0, 320, (200,), generator=torch.Generator().manual_seed(0))
    train.train_adapters(model, state, info, pool, config, eos_ids=[], pad_id=0)
    return model, state, ids


def _gates(model, state, ids) -> torch.Tensor:
    state.record, state.tau = True, 0.0
    state.clear()
    with torch.no_grad():
        model(ids)
    gates = torch.stack(state.gates, -1)[0]  # (T, L)
    state.record = False
    state.clear()
    return gates


def test_training_folds_the_gain_into_proj2_so_the_gates_are_proj2_s_own():
    model, state, ids = _trained(10.0)
    adapters = [m for m in model.modules() if isinstance(m, adapter.PowerAdapter)]
    assert adapters
    assert all(m.gate_gain == 1.0 for m in adapters)
    gates = _gates(model, state, ids)
    for layer, module in enumerate(adapters):  # what the exported graph computes: proj2's gate row alone
        h = torch.randn(3, 64, generator=torch.Generator().manual_seed(layer))
        z = torch.sigmoid(module.proj1(h))
        plain = torch.sigmoid(z @ module.proj2.weight[-1] + module.proj2.bias[-1])
        torch.testing.assert_close(module(h)[0], plain)
    assert torch.isfinite(gates).all()


def test_a_gain_moves_the_gates_apart_between_tokens_faster_than_lr_alone():
    """At gain 1 each gate-row weight moves about lr a round (Adam), so the gates' spread across tokens grows by
    little more than that; at gain 10 by about ten times as much."""
    spreads = {}
    for gain in (1.0, 10.0):
        model, state, ids = _trained(gain)
        spreads[gain] = float(_gates(model, state, ids).std(dim=0).mean())  # mean over layers of the std over tokens
    assert spreads[10.0] > 3 * spreads[1.0]


@pytest.mark.parametrize("gain", [0, -1.0, float("nan"), True])
def test_a_gate_gain_that_is_no_positive_number_is_refused_by_name(gain):
    with pytest.raises(ValueError, match="gate_gain"):
        PowerConfig(gate_gain=gain)


def test_setting_a_gain_on_a_trained_row_keeps_its_gates():
    """set_gate_gain divides the stored row by the gain, so adapters trained before (a nonzero row) give the same
    gates under the gain and after the fold; it used to multiply the row by the gain at every training call."""
    model = tiny_llama(layers=2)
    adapter.install_adapters(model, 4)
    modules = [m for m in model.modules() if isinstance(m, adapter.PowerAdapter)]
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for module in modules:
            module.proj2.weight[-1] = torch.randn(module.rank, generator=torch.Generator().manual_seed(1))
        before = [module(h)[0] for module in modules]
        adapter.set_gate_gain(model, 10.0)
        under = [module(h)[0] for module in modules]
        adapter.fold_gate_gain(model)
        after = [module(h)[0] for module in modules]
    for b, u, a in zip(before, under, after, strict=True):
        torch.testing.assert_close(u, b)
        torch.testing.assert_close(a, b)
