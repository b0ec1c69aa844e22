"""Power adapters and their training: the straight-through gate's forward value, the
refusal of a model too small for rank-1 adapters."""

import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.power import adapter, train  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def test_the_straight_through_mask_is_the_hard_decision_bit_for_bit():
    """Forward, the training pass's mask is the runtime's 1[gate >= tau] exactly: 1 + gate - gate rounded in
    float32 read 0.99999994 for open gates, scaling every executed FFN output and the executed count."""
    torch.manual_seed(0)
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4, gate_init=0.5)
    with torch.no_grad():  # gates that differ between tokens, on both sides of tau
        for name, p in model.named_parameters():
            if name.endswith("power_adapter.proj2.weight"):
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 320, (2, 24), generator=torch.Generator().manual_seed(2))
    state.tau = 0.6
    train._forward(model, state, ids, torch.ones(2, 24), gated=True)
    gates, masks = torch.stack(state.gates), torch.stack(state.masks)  # (L, B, T)
    assert bool((gates >= 0.6).any())
    assert bool((gates < 0.6).any())
    assert torch.equal(masks.detach(), (gates >= 0.6).float())
    state.clear()


def test_a_model_too_small_for_rank_1_adapters_is_told_the_fraction_they_need():
    model = tiny_llama(layers=1, hidden=64)
    with pytest.raises(BuildError) as info:
        adapter.adapter_rank(model, 8, 1e-3)
    need = float(str(info.value.fix).split("to ")[1].split(" ")[0])
    assert "max_fraction=0.001" in str(info.value)
    assert adapter.adapter_rank(model, 8, need) == 1  # the fraction named is enough
    with pytest.raises(BuildError):
        adapter.adapter_rank(model, 8, need - 1e-4)  # and no more than needed (to its 4 decimals)
    assert info.value.fix.startswith("set power.max_fraction to ")
