"""On-policy training of the power adapters: which tokens the power terms see."""

import pytest

torch = pytest.importorskip("torch")

from edgesdk.power import adapter, train  # noqa: E402
from edgesdk.power.profiler import CostStats  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _info() -> train.PowerModelInfo:
    cost = CostStats(16, [0.0, 0.2, 0.4], {}, 0.0125, 0.0)
    return train.PowerModelInfo((0.25, 0.5, 0.25), 1.0, [1.0, 1.0], 0.5, cost)


@pytest.mark.parametrize("prompt", [30, 32, 5])
def test_power_windows_cover_the_generated_tokens_whatever_the_prompt_length(prompt):
    generated = 16
    loss_mask = torch.cat([torch.zeros(2, prompt), torch.ones(2, generated)], 1)
    p = torch.rand(2, prompt + generated, generator=torch.Generator().manual_seed(0))
    P_proxy, P_student, wm = train.power_windows(p, p.flip(-1), loss_mask, prompt, _info())
    assert wm.shape == (2, 2, 8)
    assert wm.sum().item() == 2 * generated  # every generated token, in whole windows
    torch.testing.assert_close(P_proxy.sum(-1), torch.ones(2, 2))
    torch.testing.assert_close(P_student.sum(-1), torch.ones(2, 2))


def test_a_round_with_a_prompt_off_the_window_grid_trains_the_entropy_on_whole_windows():
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4)
    peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 16)))
    info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(16, [0.0, 0.2], {}, 0.0125, 0.0))
    config = train.PowerTrainConfig(rounds=1, rollout=2, micro_batch=2, prompt_tokens=5, new_tokens=8)
    pool = torch.randint(0, 320, (200,), generator=torch.Generator().manual_seed(0))
    log = train.train_adapters(model, state, info, pool, config, eos_ids=[], pad_id=0)
    # 8 generated tokens make one whole window; cut at position 0 they gave a window of 3 (H <= ln 3).
    assert log.rounds[0]["entropy"] > float(torch.log(torch.tensor(3.0)))


def test_the_weight_sweep_measures_its_points_against_the_loaded_model():
    """The sweep's reference is gating off (the loaded model, as the runtime runs it), not tau 0,
    where the adapters' channel and head scales act and already cost quality."""
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4)
    with torch.no_grad():  # adapters that change the model at tau 0: scales away from 1
        for name, p in model.named_parameters():
            if ".power_adapter." in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    ids = torch.randint(0, 320, (24,), generator=torch.Generator().manual_seed(0))
    peak, ffn = train.calibrate_scales(model, state, ids[None])
    info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(16, [0.0, 0.2], {}, 0.0125, 0.0))
    state.enabled = False
    with torch.no_grad():
        logits = model(ids[None]).logits[0, :-1].float()  # (T-1, V)
    loaded = float(torch.nn.functional.cross_entropy(logits, ids[1:]))
    state.enabled = True
    _, points = train.sweep_weights(model, state, info, ids, lambda: _fixed_tau(0.0),
                                    [(0.25, 0.5, 0.25)], 0.049)
    assert points[0]["ungated_nll"] == pytest.approx(loaded, abs=1e-4)
    at_zero = train.controlled_decode(model, state, info, ids, _fixed_tau(0.0))
    assert abs(at_zero["nll"] - loaded) > 1e-3  # the scales act at tau 0: a different reference


def _fixed_tau(tau: float):
    from edgesdk.power.controller import ControllerConfig, TauController

    return TauController(ControllerConfig(tau_init=tau, tau_min=tau, tau_max=tau))
