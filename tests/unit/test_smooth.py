"""SmoothQuant (stage ``smooth``): the transform leaves the model's function unchanged, shrinks the outlier
channels that per-tensor INT8 activations suffer from, and orders itself before QAT."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import check_order, make_config  # noqa: E402
from edgesdk.compress import fake_quant, smooth  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def outlier_model():
    """A tiny GQA model (4 query heads on 2 KV heads) whose residual stream has two channels ~60x the rest,
    planted through the embedding as in SmolLM2's massive activations."""
    model = tiny_llama(seed=3, heads=4, kv_heads=2, hidden=64)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, [5, 40]] *= 60.0
        for layer in model.model.layers:  # outliers in up too, so down's input has them
            layer.mlp.up_proj.weight[[3, 17]] *= 30.0
    return model


def batches(count=3):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 320, (2, 24), generator=gen) for _ in range(count)]


@torch.no_grad()
def test_smoothing_leaves_the_logits_unchanged():
    model = outlier_model()
    before = [model(batch).logits for batch in batches()]
    config = smooth.SmoothConfig(alpha=0.85)
    largest = smooth.smooth_model(model, smooth.input_peaks(model, batches()), config)
    assert set(largest) == set(smooth.SITES)
    for batch, expected in zip(batches(), before, strict=True):
        torch.testing.assert_close(model(batch).logits, expected, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_smoothing_flattens_the_input_peaks():
    model = outlier_model()
    peaks = smooth.input_peaks(model, batches())
    smooth.smooth_model(model, peaks, smooth.SmoothConfig(alpha=0.85))
    after = smooth.input_peaks(model, batches())
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        spread_before = float(peaks[name].max() / peaks[name].median())
        spread_after = float(after[name].max() / after[name].median())
        assert spread_after < spread_before / 4, (name, spread_before, spread_after)


@torch.no_grad()
def test_per_tensor_int8_error_drops_after_smoothing():
    def qdq_error(model):
        reference = [model(batch).logits for batch in batches()]
        quantized = copy.deepcopy(model)
        fake_quant.attach(quantized, fake_quant.QuantScheme(weight_bits=8, granularity="channel",
                                                            activations="tensor", embedding_bits=None))
        fake_quant.set_observing(quantized, True)
        for batch in batches():
            quantized(batch)
        fake_quant.set_observing(quantized, False)
        return sum(float((quantized(b).logits - r).pow(2).mean()) for b, r in zip(batches(), reference, strict=True))

    model = outlier_model()
    plain = qdq_error(model)
    smooth.smooth_model(model, smooth.input_peaks(model, batches()), smooth.SmoothConfig(alpha=0.85))
    assert qdq_error(model) < plain / 3


def test_smooth_comes_before_qat_and_refuses_bad_settings():
    check_order(["smooth", "qat"])
    with pytest.raises(BuildError, match="'qat' must come after 'smooth'"):
        check_order(["qat", "smooth"])
    with pytest.raises(BuildError, match="alpha"):
        make_config("smooth", {"alpha": 1.5})
    with pytest.raises(BuildError, match="sites"):
        make_config("smooth", {"sites": ["qkv", "lm_head"]})


def biased_models():
    """Tiny models whose linears carry non-zero biases: Qwen2 (q/k/v biases) and Llama with attention_bias and
    mlp_bias (every linear biased)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    qwen = tiny_llama(seed=3, heads=4, kv_heads=2, hidden=64, model_type="qwen2")
    torch.manual_seed(1)
    config = AutoConfig.for_model("llama", vocab_size=320, hidden_size=64, intermediate_size=112,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  attention_bias=True, mlp_bias=True)
    llama = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for model in (qwen, llama):
            for name, parameter in model.named_parameters():
                if name.endswith("proj.bias"):
                    parameter.normal_(0, 1.0)
    return {"qwen2": qwen, "llama-bias": llama}


@pytest.mark.parametrize("site", smooth.SITES)
@pytest.mark.parametrize("kind", ["qwen2", "llama-bias"])
@torch.no_grad()
def test_smoothing_is_exact_with_biases(kind, site):
    """V's bias feeds O's input and up's bias feeds down's input: they are divided with their rows."""
    model = biased_models()[kind]
    before = [model(batch).logits for batch in batches()]
    smooth.smooth_model(model, smooth.input_peaks(model, batches()), smooth.SmoothConfig(alpha=0.85, sites=(site,)))
    for batch, expected in zip(batches(), before, strict=True):
        torch.testing.assert_close(model(batch).logits, expected, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_smoothing_is_exact_with_power_adapters():
    """A power adapter reads the FFN input the post-attention norm produces: smoothing gate|up divides that
    input by s, so the adapter's first projection takes s into its columns and the gates stay as they were."""
    from edgesdk.power import adapter

    model = outlier_model()
    state = adapter.install_adapters(model, 4, 0.5)
    torch.manual_seed(1)
    for name, parameter in model.named_parameters():
        if name.endswith("power_adapter.proj2.weight"):
            parameter.normal_(0, 0.5)  # a trained adapter: its output depends on its input
    state.tau = 0.5
    before = [model(batch).logits for batch in batches()]
    smooth.smooth_model(model, smooth.input_peaks(model, batches()), smooth.SmoothConfig(alpha=0.85))
    for batch, expected in zip(batches(), before, strict=True):
        torch.testing.assert_close(model(batch).logits, expected, rtol=1e-4, atol=1e-4)
