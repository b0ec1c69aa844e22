"""An empty sampler sequence is no setting: llama.cpp keeps its own chain for it."""

from __future__ import annotations

from edgesdk.models.generation_defaults import from_generation_config, from_gguf_fields


def test_empty_gguf_sequence_keeps_the_default_chain():
    # common_init_sampler_from_model applies general.sampling.sequence only where llama_model_meta_val_str gives
    # more than 0 characters: an empty one leaves llama.cpp's default chain, not an empty one
    read = from_gguf_fields({"sequence": "", "top_k": 20})
    assert read.values == {"top_k": 20}
    assert read.warnings == ()


def test_empty_generation_config_sequence_keeps_the_default_chain():
    read = from_generation_config({"sequence": "", "temperature": 0.6})
    assert read.values == {"temperature": 0.6}
    assert "samplers" not in read.values


def test_a_named_sequence_is_still_read():
    assert from_gguf_fields({"sequence": "top_k;temperature"}).values == {"samplers": ["top_k", "temperature"]}
