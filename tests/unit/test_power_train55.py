"""Power distillation: the compute-budget hinge is on the executed FFN fraction of the whole round, whatever the
micro-batch split."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.power import adapter, losses, train  # noqa: E402
from edgesdk.power.profiler import CostStats  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _budget_round(micro_batch: int, gate_seed: int, temperature: float, budget: float = 0.5):
    """One round of a tiny model whose gates straddle tau_train from token to token, with only the budget term in
    the loss; returns the round's log and the adapters' parameters before and after."""
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4, gate_init=0.0)
    with torch.no_grad():  # gate logits that vary around 0 (gate 0.5) with the token
        for name, p in model.named_parameters():
            if ".power_adapter.proj2.weight" in name:
                p[-1].copy_(torch.randn(p.shape[1], generator=torch.Generator().manual_seed(gate_seed)) * 8)
                p[-1] -= p[-1].mean()
    peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 16),
                                                                    generator=torch.Generator().manual_seed(1)))
    info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(16, [0.0, 0.2], {}, 0.0125, 0.0))
    config = train.PowerTrainConfig(rounds=1, rollout=4, micro_batch=micro_batch, prompt_tokens=8, new_tokens=8,
                                    temperature=temperature, tau_train=0.5, budget=budget, zscore=False,
                                    weight_token_kl=0.0, weight_power_kl=0.0, weight_budget=1.0, entropy_start=0.0,
                                    entropy_end=0.0)
    pool = torch.randint(0, 320, (200,), generator=torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in adapter.adapter_parameters(model)]
    log = train.train_adapters(model, state, info, pool, config, eos_ids=[], pad_id=0).rounds[0]
    return log, before, adapter.adapter_parameters(model)


def test_the_budget_term_is_the_hinge_on_the_rounds_executed_fraction_whatever_the_split():
    """Sequences running 62.5 %, 50 %, 31.25 % and 62.5 % of their FFN blocks against a budget of 50 %: the round
    runs 51.6 %, 1.6 points over. The hinge taken per micro-batch cost 0.0625 in micro-batches of one sequence (each
    sequence's excess, averaged) and 0.016 in one micro-batch: the budget enforced moved with the accumulation
    setting."""
    rounds = {micro: _budget_round(micro, gate_seed=40, temperature=1.0)[0] for micro in (1, 2, 4)}
    executed = rounds[4]["executed"]
    assert executed > 0.5
    for log in rounds.values():
        assert log["executed"] == pytest.approx(executed, abs=1e-5)
        assert log["loss"] == pytest.approx(executed - 0.5, abs=1e-4)


def test_a_round_within_its_budget_leaves_the_gates_alone_though_one_sequence_is_over():
    """Sequences at 31 %, 19 %, 62.5 % and 38 %: the round runs 37.5 %, within a budget of 50 %. In micro-batches
    of one, the sequence at 62.5 % alone was over its own hinge and pushed the gates down all the same."""
    log, before, after = _budget_round(1, gate_seed=0, temperature=4.0)
    assert log["executed"] < 0.5
    assert log["loss"] == 0.0
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old, new)


def test_the_budget_shares_sum_to_the_hinge_and_carry_its_gradient_only_over_the_budget():
    run = [torch.tensor(3.0, requires_grad=True), torch.tensor(5.0, requires_grad=True)]  # of 8 blocks each
    shares = [losses.budget_share(r, 8, 0.5, 16.0, 0.25) for r in run]
    assert sum(shares).item() == pytest.approx(float(losses.budget_term(torch.tensor(0.5), 0.25)))
    sum(shares).backward()
    assert [float(r.grad) for r in run] == [pytest.approx(1 / 16)] * 2
    within = losses.budget_share(torch.tensor(3.0, requires_grad=True), 8, 0.5, 16.0, 0.5)
    assert within.item() == 0.0
    assert within.requires_grad  # a loss of only this term still backpropagates


@pytest.mark.parametrize("prompt", [5, 8])
def test_the_training_windows_hold_the_entropy_the_runtime_controller_reads(prompt):
    """The runtime's controller smooths the whole stream it observes, the prompt's powers included, so the first
    generated token is averaged with the prompt's last. Training smoothed after cutting the prompt off: that token
    stood alone, and after a prompt ending on a power spike the first window read 1.62 nats where the runtime
    reads 1.02."""
    from edgesdk.power.distribution import window_entropy
    from edgesdk.power.vector import entropy

    info = train.PowerModelInfo((0.25, 0.5, 0.25), 1.0, [1.0, 1.0], 0.5, CostStats(16, [0.0, 0.2], {}, 0.0125, 0.0))
    generated = 16
    p = torch.rand(1, prompt + generated, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p[0, prompt - 1] = 5.0  # the prompt's last token spends much more than the others
    loss_mask = torch.cat([torch.zeros(1, prompt), torch.ones(1, generated)], 1)
    P_proxy, _, _ = train.power_windows(p, p, loss_mask, prompt, info)
    trained = entropy(P_proxy)[0]  # (2,): the two windows of generated tokens
    for index in range(2):
        end = prompt + info.window * (index + 1)  # the runtime's window ends on that window's last token
        assert float(trained[index]) == pytest.approx(window_entropy(p[0, :end].numpy()), abs=1e-9)
