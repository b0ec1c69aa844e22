"""Export settings that cannot apply are refused when the config is made, naming the setting and the fix."""

from __future__ import annotations

import pytest

from edgesdk.errors import ExportError
from edgesdk.export.onnx_export import ExportConfig


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
@pytest.mark.parametrize("bits", [4, 8])
def test_embedding_bits_with_float32_weights_is_refused(form, bits):
    """float32 graphs store the embedding / LM head in float32 whatever embedding_bits says: the setting
    used to be dropped without a word (a float head shipped where an 8- or 4-bit one was asked for)."""
    with pytest.raises(ExportError, match=f"embedding_bits={bits}") as caught:
        ExportConfig(form=form, weights="fp32", embedding_bits=bits)
    assert "fp32" in caught.value.problem
    assert "embedding_bits" in caught.value.fix


@pytest.mark.parametrize("bits", [2, 16])
def test_embedding_bits_other_than_4_or_8_is_refused_before_the_build(bits):
    """The fused form takes 4 or 8 (FusedConfig raised a bare ValueError only at export, after every stage)."""
    with pytest.raises(ExportError, match=f"embedding_bits={bits}"):
        ExportConfig(form="ort-fused", weights="int4", embedding_bits=bits)


@pytest.mark.parametrize(("form", "weights", "bits"), [
    ("standard", "fp32", None), ("ort-fused", "fp32", None), ("standard", "int8", 8), ("ort-fused", "int4", 8),
    ("ort-fused", "int8", 4), ("ort-fused", "int4", None),
])
def test_settings_that_apply_are_accepted(form, weights, bits):
    config = ExportConfig(form=form, weights=weights, embedding_bits=bits)
    if form == "ort-fused":
        assert config.fused().head_bits == (None if weights == "fp32" else bits or config.fused().bits)
