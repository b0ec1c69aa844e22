"""Review 46, quantisation-aware training: the per-stage held-out perplexity of a quantized model is that of the
model the export computes (its activations quantized too), and attaching fake quantization twice still detaches
back to plain modules."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from edgesdk.compress import fake_quant  # noqa: E402
from edgesdk.compress.measure import heldout_perplexity, stage_metrics  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _observed(scheme: fake_quant.QuantScheme, ids: torch.Tensor):
    """A tiny model as the qat stage leaves it (steps 0): observed per-tensor scales, weights baked, detached."""
    model = tiny_llama(seed=3)
    fake_quant.attach(model, scheme)
    fake_quant.set_observing(model, True)
    with torch.no_grad():
        model(ids[None, :256])
    fake_quant.set_observing(model, False)
    fake_quant.detach(model, bake=True)
    return model


@pytest.mark.parametrize(("granularity", "activations", "embedding_bits"), [
    ("channel", "tensor", None),  # the QDQ / TensorRT form: static per-tensor input scales
    ("block", "block", 8),  # the MatMulNBits form: inputs quantized per block at run time (accuracy level 4)
])
def test_stage_perplexity_of_a_quantized_model_quantizes_its_activations(granularity, activations, embedding_bits):
    # Text on which the activations' rounding moves the perplexity well past the 1e-6 the measurement is held to
    # (2.7e-4 at per-block inputs): on seed 0's text the per-token changes (logits moved by 6e-3 on average)
    # happened to cancel to 1.2e-7 of it.
    ids = torch.randint(0, 320, (1024,), generator=torch.Generator().manual_seed(1))
    scheme = fake_quant.QuantScheme(weight_bits=8, granularity=granularity, activations=activations,
                                    embedding_bits=embedding_bits)
    model = _observed(scheme, ids)
    if activations == "tensor":  # coarse input scales, so that quantizing the activations clearly shows
        recorded = fake_quant.QuantScheme.of(model)
        coarse = {name: 8 * scale for name, scale in recorded.activation_scales.items()}
        setattr(model.config, fake_quant.CONFIG_KEY, {**recorded.to_json(), "activation_scales": coarse})
    stored = copy.deepcopy(getattr(model.config, fake_quant.CONFIG_KEY))
    weights = {name: p.detach().clone() for name, p in model.state_dict().items()}

    reference = copy.deepcopy(model)  # what the export computes: the recorded fake quantization on
    fake_quant.reattach(reference)
    exported = heldout_perplexity(reference, ids)
    weight_only = heldout_perplexity(model, ids)
    assert exported != pytest.approx(weight_only, rel=1e-5)  # the activations' rounding does show

    measured = stage_metrics(model, ids)["heldout_perplexity"]
    assert measured == pytest.approx(exported, rel=1e-6, abs=1e-4)
    # the model is left as it was: plain modules, the same weights and the same recorded scheme
    assert not any(isinstance(m, (fake_quant.QuantLinear, fake_quant.QuantEmbedding)) for m in model.modules())
    assert all(torch.equal(weights[name], p) for name, p in model.state_dict().items())
    assert getattr(model.config, fake_quant.CONFIG_KEY) == stored


def test_stage_perplexity_of_a_float_model_is_unchanged():
    ids = torch.randint(0, 320, (1024,), generator=torch.Generator().manual_seed(1))
    model = tiny_llama(seed=4)
    assert stage_metrics(model, ids)["heldout_perplexity"] == round(heldout_perplexity(model, ids), 4)


@pytest.mark.parametrize("tie", [True, False])
def test_attaching_twice_still_detaches_to_plain_modules(tie):
    """``attach`` keeps a linear's plain class when it is attached already; the embedding too, or ``detach``
    would put back QuantEmbedding and the 'plain' model would go on fake-quantizing its looked-up rows."""
    model = tiny_llama(tie=tie)
    scheme = fake_quant.QuantScheme(weight_bits=4, embedding_bits=4)
    fake_quant.attach(model, scheme)
    fake_quant.attach(model, scheme)
    fake_quant.detach(model, bake=False)
    assert type(model.model.embed_tokens) is nn.Embedding
    assert type(model.lm_head) is nn.Linear
    assert all(type(linear) is nn.Linear for linear in fake_quant.decoder_linears(model).values())
    ids = torch.arange(40)[None]
    with torch.no_grad():
        rows = model.model.embed_tokens(ids)
    assert torch.equal(rows, model.model.embed_tokens.weight[ids])  # float rows, not re-quantized ones
