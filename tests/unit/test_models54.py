"""Model sources and loading (review 54): GGUF file names, download commands for paths with spaces."""

from __future__ import annotations

import json
import shlex

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import resolve_model


# ---------------------------------------------------------------------------------------------------- GGUF names
@pytest.mark.parametrize(("name", "bits"), [
    ("qwen2.5-0.5b-instruct-fp16.gguf", 16), ("Model-FP32.gguf", 32), ("model-bf16.gguf", 16),
    ("ggml-model-f16.gguf", 16), ("qwen2.5-0.5b-instruct-q8_0.gguf", 8)])
def test_fp16_and_fp32_in_a_gguf_name_are_read_as_their_bits(name, bits):
    from pathlib import Path

    from edgesdk.models.sources import gguf_name_bits

    assert gguf_name_bits(Path(name)) == bits


def test_a_directory_of_qwen_gguf_files_suggests_the_fp16_one(tmp_path):
    """Qwen's own GGUF repositories name their files qwen2.5-0.5b-instruct-fp16.gguf, -q8_0, -q4_k_m: "fp16" gave
    no bits, so the refusal suggested the Q8_0 file, which loses accuracy edgesdk's own compression then adds to."""
    directory = tmp_path / "Qwen2.5-0.5B-Instruct-GGUF"
    directory.mkdir()
    for quantization in ("fp16", "q4_k_m", "q8_0"):
        (directory / f"qwen2.5-0.5b-instruct-{quantization}.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory))
    assert refused.value.fix.endswith(f"--model {directory / 'qwen2.5-0.5b-instruct-fp16.gguf'}")


# ---------------------------------------------------------------------------------------------------- downloads
def test_the_download_command_for_a_directory_with_a_space_is_one_shell_argument(tmp_path):
    """A model directory whose path holds a space (~/my models/Qwen) was told to run 'hf download ORG/NAME
    model-00002-of-00002.safetensors --local-dir ~/my models/Qwen': the shell makes 'models/Qwen' one more file to
    download and writes into ~/my."""
    directory = tmp_path / "my models" / "Qwen"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    (directory / "model-00001-of-00002.safetensors").write_bytes(b"")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory))
    command = refused.value.fix.split("'", 1)[1].rsplit("' (it resumes", 1)[0]
    assert shlex.split(command) == ["hf", "download", "ORG/NAME", "model-00002-of-00002.safetensors",
                                    "--local-dir", str(directory)]


# ---------------------------------------------------------------------------------------------------- rotary scaling
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny random Llama's Hugging Face directory (weights and config.json, no tokenizer: the checks below come
    before it)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    directory = tmp_path_factory.mktemp("llama") / "model"
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def _with_rope_scaling(directory, tmp_path, scaling):
    """A copy of ``directory`` whose config.json gives ``scaling`` as rope_scaling, the older configs' form."""
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(directory, copy)
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    config.pop("rope_parameters", None)
    config.update(rope_theta=10000.0, rope_scaling=scaling)
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return copy


@pytest.mark.parametrize(("scaling", "missing"), [
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
     "high_freq_factor, low_freq_factor"),
    ({"type": "linear"}, "factor")])
def test_a_rope_scaling_without_a_setting_its_type_needs_names_it(tiny_llama, tmp_path, scaling, missing):
    """transformers' KeyError ("Missing required keys in `rope_parameters` ...") was reported as a model whose
    files are incomplete, with the fix to download the weights and tokenizer again."""
    from edgesdk.models.loader import load_model

    directory = _with_rope_scaling(tiny_llama, tmp_path, scaling)
    with pytest.raises(ModelSourceError) as refused:
        load_model(resolve_model(str(directory)), progress=False)
    message = str(refused.value)
    assert str(directory / "config.json") in message
    assert f"rope_type {scaling.get('rope_type', scaling.get('type'))!r} without {missing}" in message
    assert refused.value.fix.startswith(f"add {missing} to config.json's rope_scaling")


def test_a_rope_scaling_factor_given_as_text_names_the_field(tiny_llama, tmp_path):
    """A factor written as text ("4") failed while the weights loaded, reported as "cannot load the weights ...
    TypeError: '<=' not supported between instances of 'str' and 'int'" with the fix to download the files again."""
    from edgesdk.models.loader import load_model

    directory = _with_rope_scaling(tiny_llama, tmp_path, {"rope_type": "yarn", "factor": "4",
                                                          "original_max_position_embeddings": 32})
    with pytest.raises(ModelSourceError) as refused:
        load_model(resolve_model(str(directory)), progress=False)
    assert "factor '4', expected a number > 0" in str(refused.value)
    assert str(directory / "config.json") in str(refused.value)


# ---------------------------------------------------------------------------------------------------- aliases
def test_a_local_directory_named_as_an_alias_is_taken_before_the_alias(tmp_path, monkeypatch):
    """'hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir smollm2-135m', then --model smollm2-135m: the
    alias was taken (its Q4_1 GGUF fetched, or refused as not fetched yet) in place of the directory beside it,
    where transformers' from_pretrained takes the local directory before a Hub id of the same name."""
    from edgesdk.models.sources import DEFAULT_MODEL

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    directory = tmp_path / DEFAULT_MODEL
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    (directory / "model.safetensors").write_bytes(b"")
    source = resolve_model(DEFAULT_MODEL, fetch=False)
    assert (source.kind, source.name) == ("hf-dir", str(directory.resolve()))


def test_an_alias_without_a_path_of_its_name_is_still_the_alias(tmp_path, monkeypatch):
    from edgesdk.models.sources import DEFAULT_MODEL

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelSourceError, match=f"model alias '{DEFAULT_MODEL}' is not fetched yet"):
        resolve_model(DEFAULT_MODEL, fetch=False)
