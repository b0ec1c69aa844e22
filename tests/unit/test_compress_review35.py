"""Compression stages, review 35: fake quantization on a power-gated model."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def gated_model():
    """A tiny model with power adapters whose head scales differ between heads (trained ones do)."""
    from edgesdk.power import adapter

    model = tiny_llama(seed=3, layers=3, heads=6, kv_heads=3, hidden=96)
    adapter.install_adapters(model, 4, 0.5)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("power_adapter.proj2.weight"):
                parameter.normal_(0, 0.5)
    return model


def test_fake_quantization_keeps_the_power_adapters_query_head_scales():
    """The power stage swaps q_proj of every layer after the first to ScaledQueryProjection, which scales
    each query head by the previous layer's adapter. attach swapped it to QuantLinear, so QAT (and the
    fake-quantized passes of prune, sparsify and distill) ran without the head scales, and detach left a
    plain nn.Linear: the model went on without them, until a resumed build reinstalled the adapters."""
    from edgesdk.power.adapter import ScaledQueryProjection

    model = gated_model()
    scheme = fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="none", embedding_bits=None)
    reference = copy.deepcopy(model)  # the gated model with the weights on the grid the bake puts them on
    with torch.no_grad():
        for linear in fake_quant.decoder_linears(reference).values():
            linear.weight.copy_(fake_quant.quantize_weight(linear.weight, 8, "channel", scheme.block_size))
    ids = torch.randint(0, model.config.vocab_size, (1, 14))
    with torch.no_grad():
        expected = reference(ids).logits
        fake_quant.attach(model, scheme)
        torch.testing.assert_close(model(ids).logits, expected, atol=1e-5, rtol=1e-5)
        fake_quant.detach(model, bake=True)
        torch.testing.assert_close(model(ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert [type(layer.self_attn.q_proj) for layer in model.model.layers] == \
        [torch.nn.Linear, ScaledQueryProjection, ScaledQueryProjection]
    assert all(type(linear) is torch.nn.Linear for name, linear in fake_quant.decoder_linears(model).items()
               if not name.endswith("q_proj"))


def test_fisher_block_importance_on_one_token_sequences_is_refused_naming_the_option():
    """One token has no next-token target: the Fisher scores of every block were 0, so the blocks dropped were
    an arbitrary choice (prune refuses sequence_length 1 for the same reason). Wanda needs no target."""
    from edgesdk.build.registry import make_config
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match="importance fisher needs sequence_length >= 2") as error:
        make_config("sparsify", {"importance": "fisher", "sequence_length": 1})
    assert "--set" in str(error.value)
    assert make_config("sparsify", {"importance": "wanda", "sequence_length": 1}).sequence_length == 1


def test_a_pruned_power_gated_checkpoint_loads_back_with_its_adapters(tmp_path):
    """A build of power then prune, killed after prune, could not resume: the pruned checkpoint is rebuilt
    from its records and loaded strictly, and the adapters' weights (which the power stage's load hook
    reinstalls afterwards) were 'unexpected', a ValueError at every --resume."""
    from edgesdk.build.checkpoint import load_checkpoint, save_checkpoint
    from edgesdk.compress.prune import apply_plans
    from edgesdk.power import stage  # noqa: F401  (registers the hook that reinstalls the adapters)
    from edgesdk.power.adapter import ScaledQueryProjection, power_state
    from tests._utils.tiny import tiny_tokenizer

    model = gated_model()
    ffn = [list(range(0, layer.mlp.gate_proj.out_features, 2)) for layer in model.model.layers]
    apply_plans(model, ffn, [[0, 1, 2], [0, 2], [1]])
    save_checkpoint(model, tiny_tokenizer(), tmp_path / "prune")
    loaded = load_checkpoint(tmp_path / "prune")
    assert power_state(loaded) is not None
    assert isinstance(loaded.model.layers[2].self_attn.q_proj, ScaledQueryProjection)
    assert [layer.mlp.power_adapter.next_heads for layer in loaded.model.layers] == [4, 2, 0]
    ids = torch.randint(0, model.config.vocab_size, (1, 14))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_every_weight_loses_a_block_in_its_sensitivity_probe():
    """At probe_fraction 0.1 a weight of up to 5 blocks dropped round(0.1 n) = 0 of them: its cost was 0, so the
    allocation took it as free and cut it to min_density without a measurement (every attention weight of
    this model), leaving the FFN weights that were measured whole."""
    from edgesdk.compress import sparsify

    model = tiny_llama(seed=4)
    batches = [torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    config = sparsify.SparsifyConfig(density=0.8, probe_fraction=0.1)
    scores = sparsify.block_importance(model, batches, config, 32)
    assert min(score.numel() for score in scores.values()) == 2  # k_proj and v_proj: 32 x 64
    costs = sparsify.weight_sensitivity(model, scores, batches, 32, config.probe_fraction)
    assert all(cost > 0 for cost in costs.values()), costs
    densities = sparsify.density_summary(sparsify.plan(model, scores, batches, 32, config))["per_weight"]
    costliest = max(costs, key=costs.get)
    assert densities[costliest] == 1.0, (costliest, densities)
