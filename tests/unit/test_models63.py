"""Refusals of architectures edgesdk cannot export name what it does read, in the terms of the source given: a GGUF
file's llama.cpp architectures (general.architecture), and for a Hugging Face directory of Gemma 3 with its vision
encoder (model_type gemma3), the text decoder edgesdk builds and the GGUF route to it."""

from __future__ import annotations

import json

import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.gguf_files import one_layer_llama_gguf, rewrite_gguf

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

TOKENS = ["<unk>", "<s>", "</s>"] + [chr(code) for code in range(97, 123)]


def _load(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False)


@pytest.mark.parametrize("arch", ["mamba", "gpt2", "gemma2"])
def test_a_gguf_of_another_architecture_is_refused_naming_the_gguf_architectures_edgesdk_reads(tmp_path, arch):
    """It listed transformers' model types ('gemma3_text', 'mistral', 'granite'), which are not the names a GGUF
    file carries (llama.cpp writes Gemma 3 as gemma3 and Mistral as llama) and include Granite, whose GGUF files
    are refused."""
    source = one_layer_llama_gguf(tmp_path / "llama.gguf", "llama", TOKENS, [2, 3, 3] + [1] * 26,
                                  scores=[0.0] * len(TOKENS))
    path = rewrite_gguf(source, tmp_path / f"{arch}.gguf", architecture=arch)
    with pytest.raises(ModelSourceError) as refused:
        _load(path)
    message = str(refused.value)
    assert f"{arch}.gguf holds architecture '{arch}' (general.architecture), which edgesdk cannot build from" in message
    for name in ("gemma3 (", "llama (", "phi3 (", "qwen2 (", "qwen3 (", "smollm3 ("):
        assert name in message, name
    assert "gemma3_text" not in message
    assert "Granite 3 builds from its Hugging Face directory only" in message
    assert "GGUF file" in refused.value.fix


def test_a_gguf_of_a_supported_architecture_still_loads(tmp_path):
    path = one_layer_llama_gguf(tmp_path / "llama.gguf", "llama", TOKENS, [2, 3, 3] + [1] * 26,
                                scores=[0.0] * len(TOKENS))
    assert _load(path).model.config.model_type == "llama"


def test_gemma3_with_its_vision_encoder_is_refused_naming_its_text_decoder_and_the_gguf_route(tmp_path):
    """gemma-3-4b and larger are model_type gemma3 (Gemma3ForConditionalGeneration); the refusal only said to use 'a
    Gemma 3 text model', which such a user believes they have."""
    model_dir = tmp_path / "gemma-3-4b-it"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {"model_type": "gemma3_text", "hidden_size": 64}}))
    with pytest.raises(ModelSourceError) as refused:
        _load(model_dir)
    message = str(refused.value)
    assert "has architecture 'gemma3', which edgesdk cannot build from; supported: gemma3_text" in message
    assert "Gemma3ForConditionalGeneration" in message
    assert "gemma-3-1b" in message
    assert "gemma3_text model" in refused.value.fix
    assert "GGUF file" in refused.value.fix
    assert "general.architecture gemma3" in refused.value.fix


def test_another_unsupported_directory_keeps_the_plain_refusal(tmp_path):
    model_dir = tmp_path / "mamba"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    with pytest.raises(ModelSourceError, match="architecture 'mamba', which edgesdk cannot build from; supported: ") as refused:
        _load(model_dir)
    assert "vision encoder" not in str(refused.value)
    assert "Llama-family decoder" in refused.value.fix
