"""Model sources, loading, LoRA adapters and the model's sampling defaults (review 56)."""

from __future__ import annotations

import pytest


# ------------------------------------------------------------------------------------------- sampling defaults
@pytest.mark.parametrize("read", ["gguf", "generation_config"])
def test_a_sampler_sequence_with_an_unknown_name_keeps_the_names_llama_cpp_knows(read):
    """llama.cpp's common_init_sampler_from_model splits general.sampling.sequence at ';' and its
    common_sampler_types_from_names skips a name it does not know ("unable to match sampler by name"), keeping the
    others in their order; the whole sequence was dropped, and the bundle ran edgesdk's default order."""
    from edgesdk.models.generation_defaults import from_generation_config, from_gguf_fields

    sequence = "top_k;min_p;mystery;temperature"
    sampling = from_gguf_fields({"sequence": sequence}) if read == "gguf" else \
        from_generation_config({"sequence": sequence})
    assert sampling.values == {"samplers": ["top_k", "min_p", "temperature"]}
    assert len(sampling.warnings) == 1
    assert "'mystery'" in sampling.warnings[0]
    assert "left out of the chain" in sampling.warnings[0]


def test_a_sampler_sequence_naming_a_sampler_edgesdk_cannot_run_is_still_left_out_whole():
    """adaptive_p is a llama.cpp sampler edgesdk does not carry: the sequence is not used, and the warning says so."""
    from edgesdk.models.generation_defaults import from_gguf_fields

    sampling = from_gguf_fields({"sequence": "adaptive_p;top_k"})
    assert sampling.values == {}
    assert "adaptive_p" in sampling.warnings[0]
    assert "is not used" in sampling.warnings[0]


# ------------------------------------------------------------------------------------------------ model sources
@pytest.mark.parametrize(("name", "renamed"), [("SmolLM2.Q8_0.gguf?download=true", "SmolLM2.Q8_0.gguf"),
                                               ("model", "model.gguf")])
def test_a_gguf_file_without_the_suffix_is_told_to_be_renamed(tmp_path, name, renamed):
    """wget of a Hugging Face link saves MODEL.gguf?download=true: the refusal told the user to "pass a .gguf file",
    which the file (GGUF inside) already is; it says the content is GGUF and names the file to rename it to."""
    import shlex

    from edgesdk.errors import ModelSourceError
    from edgesdk.models.sources import resolve_model

    file = tmp_path / name
    file.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(file))
    assert "its content is GGUF" in str(refused.value)
    assert f"mv {shlex.quote(str(file))} {shlex.quote(str(tmp_path / renamed))}" in refused.value.fix
    other = tmp_path / "weights.bin"
    other.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(other))
    assert "GGUF" not in str(refused.value).split("expected")[1]
    assert "mv " not in refused.value.fix


# -------------------------------------------------------------------------------------------------- model loading
@pytest.mark.parametrize("generation", ['{"num_return_sequences": 3}', '{"max_new_tokens": -1}', "[1, 2]"])
def test_a_generation_config_transformers_refuses_is_named_not_the_weights(tmp_path, generation):
    """transformers reads generation_config.json after the weights, and a value its GenerationConfig refuses (or a
    file that is no JSON object) failed the load as "cannot load the weights", with the fix to download the whole
    model again."""
    pytest.importorskip("torch")
    from edgesdk.errors import ModelSourceError
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.tiny import save_tiny_model_dir

    directory = save_tiny_model_dir(tmp_path / "tiny")
    (directory / "generation_config.json").write_text(generation, encoding="utf-8")
    with pytest.raises(ModelSourceError) as refused:
        load_model(resolve_model(str(directory)), progress=False)
    assert "transformers refuses its generation_config.json" in str(refused.value)
    assert "cannot load the weights" not in str(refused.value)
    assert "generation_config.json --local-dir" in refused.value.fix
