"""Model sources and loading (review 55): the GGUF files beside a model (mmproj, imatrix), tensor types newer than
gguf-py, a config.json without model_type."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import resolve_model


def _write_gguf(path, arch: str, file_type: str | None = None, tensors: dict | None = None, **fields) -> None:
    """A small GGUF file: ``arch``, ``general.type`` ``file_type``, uint32 ``fields`` and float32 ``tensors``."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    if file_type:
        writer.add_type(file_type)
    for key, value in fields.items():
        writer.add_uint32(key.replace("__", "."), value)
    for name, values in (tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _gguf_directory(tmp_path, names):
    directory = tmp_path / "model-GGUF"
    directory.mkdir()
    for name in names:
        (directory / name).write_bytes(b"GGUF" + bytes(60))
    return directory


# ------------------------------------------------------------------------------------- a directory of GGUF files
def test_a_gguf_repository_with_projectors_suggests_the_language_model_not_the_mmproj(tmp_path):
    """unsloth's and ggml-org's GGUF repositories of vision models hold mmproj-F16.gguf / mmproj-F32.gguf beside the
    model's quantizations: the F32 name gave the most bits, so the refusal told the user to build the projector."""
    directory = _gguf_directory(tmp_path, ["gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-4b-it-Q8_0.gguf",
                                           "mmproj-F16.gguf", "mmproj-F32.gguf"])
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(directory))
    assert caught.value.fix.endswith(f"--model {directory / 'gemma-3-4b-it-Q8_0.gguf'}")
    assert "mmproj" not in caught.value.fix


def test_a_split_model_beside_a_projector_is_told_to_merge_its_first_part(tmp_path):
    """With the parts of a split model and an mmproj file, the projector was the one "whole" file, and was named."""
    directory = _gguf_directory(tmp_path, ["model-Q8_0-00001-of-00002.gguf", "model-Q8_0-00002-of-00002.gguf",
                                           "mmproj-model-f16.gguf", "imatrix.gguf"])
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(directory))
    assert f"llama-gguf-split --merge {directory / 'model-Q8_0-00001-of-00002.gguf'} merged.gguf" in caught.value.fix


def test_a_directory_of_projectors_only_says_they_hold_no_language_model(tmp_path):
    directory = _gguf_directory(tmp_path, ["mmproj-F16.gguf", "mmproj-F32.gguf"])
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(directory))
    assert "multimodal projectors (mmproj)" in caught.value.fix
    assert "--model" in caught.value.fix
    assert "mmproj-F32.gguf" not in caught.value.fix


# ------------------------------------------------------------------------------------------ a GGUF file given
@pytest.mark.parametrize(("file_type", "arch", "named"), [("mmproj", "clip", "a multimodal projector"),
                                                          ("imatrix", "llama", "an importance matrix")])
def test_a_projector_or_importance_matrix_file_is_named_as_such(tmp_path, file_type, arch, named):
    """An mmproj file (general.type mmproj, architecture clip) was refused as "no whole model (architecture 'clip',
    ..., no clip.block_count ...)", with the fix "pass the GGUF of a whole model"."""
    from edgesdk.models.loader import check_gguf_model

    path = tmp_path / f"{file_type}-F16.gguf"
    _write_gguf(path, arch, file_type, {"v.blk.0.attn_q.weight": np.zeros((4, 4), dtype=np.float32)},
                clip__vision__block_count=2)
    with pytest.raises(ModelSourceError) as caught:
        check_gguf_model(resolve_model(str(path)).path)
    assert f"holds {named} (general.type {file_type}, architecture {arch!r})" in caught.value.problem
    assert "not a language model" in caught.value.problem
    assert "language model itself" in caught.value.fix


def test_a_tensor_type_newer_than_gguf_py_is_not_called_a_damaged_download(tmp_path):
    """A file whose tensors have a type id the installed gguf package lacks (a newer llama.cpp's quantization) was
    refused as "a truncated or damaged download", with the fix to download it again, which changes nothing."""
    from edgesdk.models.loader import check_gguf_model

    path = tmp_path / "model.gguf"
    _write_gguf(path, "llama", tensors={"token_embd.weight": np.zeros((8, 4), dtype=np.float32)},
                llama__block_count=1, llama__embedding_length=4)
    data = bytearray(path.read_bytes())
    name = b"token_embd.weight"
    at = data.index(name) + len(name)  # then n_dims (uint32), the dims (uint64 each), the type (uint32)
    dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * dims
    assert struct.unpack_from("<I", data, type_at)[0] == 0  # F32
    struct.pack_into("<I", data, type_at, 250)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelSourceError) as caught:
        check_gguf_model(path)
    assert "type id 250" in caught.value.problem
    assert "damaged download" not in caught.value.problem
    assert "pip install -U gguf" in caught.value.fix


# ---------------------------------------------------------------------------------------- a Hugging Face directory
def test_a_config_without_model_type_is_told_which_model_type_to_add(tmp_path):
    """transformers' "Should have a `model_type` key in its config.json" was reported as an incomplete download
    ("check that DIR holds the model's complete files ... download them again")."""
    from edgesdk.models.loader import load_model

    directory = tmp_path / "handmade"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100}))
    (directory / "model.safetensors").write_bytes(b"unused: the config is read first")
    with pytest.raises(ModelSourceError) as caught:
        load_model(resolve_model(str(directory)), progress=False)
    assert "has no model_type" in caught.value.problem
    assert "Qwen2ForCausalLM" in caught.value.problem
    assert caught.value.fix.startswith('add "model_type": "qwen2" to config.json')


def test_weight_shards_without_their_index_are_named(tmp_path):
    """Shards whose model.safetensors.index.json is missing were refused with transformers' "no file named
    model.safetensors, or pytorch_model.bin, found", and a fix that named neither the index nor the shards."""
    directory = tmp_path / "sharded"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for part in (1, 2, 3):
        (directory / f"model-{part:05d}-of-00003.safetensors").write_bytes(b"{}")
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(directory))
    assert "3 weight shard(s) (model-00001-of-00003.safetensors" in caught.value.problem
    assert "not their index model.safetensors.index.json" in caught.value.problem
    assert "hf download ORG/NAME model.safetensors.index.json --local-dir" in caught.value.fix


def test_a_model_quantized_with_an_importance_matrix_is_still_suggested(tmp_path):
    """Only the importance matrix itself is passed over, not a model file whose name says it was quantized with one."""
    directory = _gguf_directory(tmp_path, ["Model.imatrix.gguf", "Model-Q4_K_M-imatrix.gguf", "mmproj-Model-f16.gguf"])
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(directory))
    assert caught.value.fix.endswith(f"--model {directory / 'Model-Q4_K_M-imatrix.gguf'}")
