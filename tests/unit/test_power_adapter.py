"""Power adapters in the PyTorch model: size, identity at start, gating semantics, checkpoints."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.power import adapter  # noqa: E402
from edgesdk.power import stage as _stage  # noqa: E402, F401  (registers the checkpoint hook)
from tests._utils.tiny import tiny_llama, tiny_tokenizer  # noqa: E402


def _randomise(model, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".power_adapter." in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)
            if name.endswith("power_adapter.proj2.bias"):
                p[-1] = 0.0  # gates spread around 0.5


def test_adapters_fit_in_one_percent_of_the_model():
    model = tiny_llama(layers=3, hidden=64)
    backbone = sum(p.numel() for p in model.parameters())
    rank = adapter.adapter_rank(model, 32, 0.01)
    assert rank < 32  # the tiny model forces a smaller rank
    adapter.install_adapters(model, rank)
    assert adapter.adapter_count(model) <= 0.01 * backbone
    bigger = tiny_llama(layers=3, hidden=64)
    adapter.install_adapters(bigger, rank + 1)
    assert adapter.adapter_count(bigger) > 0.01 * backbone  # the rank is the largest that fits
    with pytest.raises(BuildError, match="cannot fit"):
        adapter.adapter_rank(tiny_llama(layers=1, hidden=64), 8, 1e-6)


def test_fresh_adapters_leave_the_model_unchanged():
    ids = torch.randint(0, 320, (2, 12))
    plain = tiny_llama(layers=3)
    with torch.no_grad():
        expected = plain(ids).logits
    gated = tiny_llama(layers=3)
    adapter.install_adapters(gated, 4)
    with torch.no_grad():
        got = gated(ids).logits
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_gates_below_tau_zero_the_ffn_and_the_straight_through_gradient_reaches_them():
    model = tiny_llama(layers=3)
    state = adapter.install_adapters(model, 4)
    _randomise(model)
    ids = torch.randint(0, 320, (1, 10))
    state.record, state.tau = True, 0.5
    with torch.no_grad():
        model(ids)
    gates, norms = torch.stack(state.gates), torch.stack(state.ffn_norms)  # (L, B, T)
    assert ((gates < 0.5) & (norms > 0)).sum() == 0  # a skipped FFN contributes nothing
    assert ((gates >= 0.5) & (norms > 0)).sum() > 0
    assert 0 < (gates < 0.5).float().mean() < 1  # the random adapters skip some blocks, not all
    state.clear()
    state.tau = 1.01  # above every gate: every FFN skipped
    with torch.no_grad():
        model(ids)
    assert all(float(n.abs().max()) == 0 for n in state.ffn_norms)
    state.clear()
    state.tau, state.straight_through = 0.5, True
    model(ids).logits.square().mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if n.endswith("power_adapter.proj2.bias")]
    assert all(g is not None and float(g[-1].abs()) > 0 for g in grads)  # the gate logit learns



def test_a_skipped_ffns_output_norm_carries_the_straight_through_gradient_to_its_gate():
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4)
    _randomise(model)
    ids = torch.randint(0, 320, (1, 16), generator=torch.Generator().manual_seed(0))
    state.record, state.tau = True, 0.0
    with torch.no_grad():
        model(ids)
    unmasked = state.ffn_norms[0][0]  # ||FFN(h) * scales|| of layer 0, every block run
    state.clear()
    state.tau, state.straight_through = 0.5, True
    model(ids)
    gate, norm = state.gates[0], state.ffn_norms[0]
    gate.retain_grad()
    norm.sum().backward()
    skipped = gate[0] < 0.5
    assert 0 < skipped.sum() < skipped.numel()
    assert float(norm[0][skipped].detach().abs().max()) == 0  # the forward value: a skipped block has no output
    # d f / d gate = ||FFN(h) * scales|| for run and skipped blocks alike (d m / d gate = 1)
    torch.testing.assert_close(gate.grad[0], unmasked)

def test_query_scales_change_the_next_layers_attention():
    model = tiny_llama(layers=3)
    state = adapter.install_adapters(model, 4)
    ids = torch.randint(0, 320, (1, 10))
    with torch.no_grad():
        before = model(ids).logits
        model.model.layers[0].mlp.power_adapter.proj2.bias[64:68] = 3.0  # layer 1's four query heads x3
        after = model(ids).logits
        state.enabled = False  # the ungated path ignores every adapter output
        bypass = model(ids).logits
    assert not torch.allclose(before, after, atol=1e-4)
    torch.testing.assert_close(bypass, before, atol=2e-5, rtol=1e-5)


def test_adapters_survive_the_checkpoint_round_trip(tmp_path):
    model = tiny_llama(layers=3)
    adapter.install_adapters(model, 4, peak_layers=(1,))
    _randomise(model, 3)
    ids = torch.randint(0, 320, (1, 9))
    model._power_state.tau = 0.5
    with torch.no_grad():
        expected = model(ids).logits
    save_checkpoint(model, tiny_tokenizer(), tmp_path / "ckpt")
    restored = load_checkpoint(tmp_path / "ckpt")
    state = adapter.power_state(restored)
    assert state is not None
    assert state.peak_layers == (1,)
    state.tau = 0.5
    with torch.no_grad():
        got = restored(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_installing_twice_is_refused():
    model = tiny_llama(layers=2)
    adapter.install_adapters(model, 2)
    with pytest.raises(BuildError, match="already installed"):
        adapter.install_adapters(model, 2)


def test_gated_heldout_reports_the_blocks_run_and_leaves_gating_off():
    """The power stage's held-out figures: tau 0 runs every FFN, a tau at the median gate about
    half, a tau above every gate none; the state is back to "gating off" afterwards."""
    from edgesdk.compress.measure import heldout_perplexity
    from edgesdk.power.train import gated_heldout

    model = tiny_llama(layers=3)
    state = adapter.install_adapters(model, 4)
    _randomise(model)
    ids = torch.randint(0, 320, (3 * 256,), generator=torch.Generator().manual_seed(0))
    off = gated_heldout(model, state, ids, 0.0)
    assert off["executed_fraction"] == 1.0
    assert off["perplexity"] == pytest.approx(heldout_perplexity(model, ids), rel=1e-6)
    state.record = True
    with torch.no_grad():
        model(ids[:256][None])
    median = float(torch.stack(state.gates).median())
    state.clear()
    half = gated_heldout(model, state, ids, median)
    assert 0.3 < half["executed_fraction"] < 0.7
    none = gated_heldout(model, state, ids, 1.0)
    assert none["executed_fraction"] == 0.0
    assert none["perplexity"] != pytest.approx(off["perplexity"], rel=1e-3)
    assert (state.tau, state.record, state.masks) == (0.0, False, [])
