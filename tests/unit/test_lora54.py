"""What --lora is told about a file that is no LoRA adapter, and what the weights file's check says of a stream
longer than the manifest's: each names the thing given, what it is, and the fix that fits it."""

from __future__ import annotations

import hashlib
import zlib

import pytest

from edgesdk.errors import BundleError, ModelSourceError
from edgesdk.models.lora import LoraAdapter, check_adapter
from edgesdk.weights_file import inflate_weights

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")


def _write_control_vector(path, layers: int = 2, width: int = 64):
    """A control vector as llama.cpp's cvector-generator (and repeng's export_gguf) writes one: general.architecture
    controlvector, its model hint and layer count, one direction.<layer> per layer, no general.type."""
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_uint32("controlvector.layer_count", layers)
    for layer in range(1, layers + 1):
        writer.add_tensor(f"direction.{layer}", np.full(width, 0.1 * layer, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_control_vector_given_with_lora_is_named_a_control_vector_not_a_model(tmp_path):
    """llama.cpp's --control-vector file was called a whole model ("it holds a model") and the user told to pass it
    with --model, which fails again; it is a run-time steering vector with no factors to merge."""
    vector = _write_control_vector(tmp_path / "happy.gguf")
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(vector)))
    assert f"--lora {vector}: the GGUF file is a control vector" in refused.value.problem
    assert "--control-vector" in refused.value.problem
    assert "holds a model" not in refused.value.problem
    assert "--model" not in refused.value.fix
    assert "--lora" in refused.value.fix


def test_a_peft_weights_file_without_its_config_names_the_missing_config(tmp_path):
    """A PEFT adapter copied without adapter_config.json was called "no PEFT LoRA adapter" and the user told to pass
    one; the directory is one, lacking the file that gives its rank and alpha."""
    from safetensors.torch import save_file

    directory = tmp_path / "adapter"
    directory.mkdir()
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(64, 4)},
              str(directory / "adapter_model.safetensors"))
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(directory)))
    assert "holds the PEFT adapter weights adapter_model.safetensors but no adapter_config.json" in \
        refused.value.problem
    assert "no PEFT LoRA adapter" not in refused.value.problem
    assert "copy the adapter's adapter_config.json" in refused.value.fix
    assert str(directory) in refused.value.fix


def test_a_stream_longer_than_the_manifest_is_not_given_a_made_up_length(tmp_path):
    """Inflating stops one byte past the manifest's length; the refusal named that stopping point (1,001) as the
    stream's length, where the stream inflates to 10,240 bytes."""
    data = bytes(range(256)) * 40  # 10,240 bytes
    (tmp_path / "w.zlib").write_bytes(zlib.compress(data))
    record = {"file": "w.zlib", "codec": "zlib", "external_name": "w", "bytes": 1000,
              "sha256": hashlib.sha256(data[:1000]).hexdigest()}
    with pytest.raises(BundleError) as refused:
        inflate_weights(tmp_path, record)
    assert "length more than 1,000, expected 1,000" in refused.value.problem
    assert "1,001" not in refused.value.problem
    (tmp_path / "w.zlib").write_bytes(zlib.compress(data[:600]))  # a shorter stream's length is known: named
    with pytest.raises(BundleError, match="length 600, expected 1,000"):
        inflate_weights(tmp_path, record)
