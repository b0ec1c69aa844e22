"""Review fixes of the four-stage compression (edgesdk/compress)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant  # noqa: E402


def test_straight_through_forward_is_the_saturated_code_bit_for_bit():
    """A static per-tensor scale saturates outliers at 127 * scale; the fake-quantized forward must give exactly
    that value (the QDQ graph's), not ``x + (q - x)``, which rounds twice and missed it by an ulp of x."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=generator) * 3
    x[::8] *= 100.0  # outliers far past the range the scale covers
    scale = 0.05
    quantized, inside = fake_quant.quantize_activation_tensor_and_range(x, scale)
    assert (~inside).sum() > 100  # the case under test: many saturated values
    leaf = x.clone().requires_grad_(True)
    out = fake_quant.straight_through(leaf, quantized, inside)
    assert torch.equal(out, quantized)
    out.sum().backward()
    assert torch.equal(leaf.grad, inside.float())  # identity inside the range, zero where clamped


def test_quant_linear_with_static_scale_computes_the_qdq_product_exactly():
    generator = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(64, 32, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(32, 64, generator=generator) * 0.05)
    scheme = fake_quant.QuantScheme(granularity="channel", activations="tensor", embedding_bits=None,
                                    activation_scales={"probe": 0.02})
    fake_quant._make_quant_linear(linear, scheme, 8, "probe")
    x = torch.randn(16, 64, generator=generator)
    x[:, 5] *= 200.0  # an outlier channel past the static range
    expected = torch.nn.functional.linear(fake_quant.quantize_activation_tensor(x, 0.02),
                                          fake_quant.quantize_weight(linear.weight, 8, "channel", 32))
    with torch.no_grad():
        assert torch.equal(linear(x), expected)
