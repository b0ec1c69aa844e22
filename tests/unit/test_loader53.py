"""Review of model loading (edgesdk/models/loader.py, edgesdk/models/generation_defaults.py), round 53: the fix a
damaged model directory's error gives, for a Hugging Face Hub cache snapshot too, and a GGUF file's
general.sampling keys at the values llama.cpp's samplers read as off."""

from __future__ import annotations

import json
import re
import shlex
import warnings

import pytest

from edgesdk.errors import ModelSourceError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _tiny_llama(directory, shard_format: str):
    """A two-layer random Llama with its tokenizer in ``directory``, its weights as two shards with their index:
    ``shard_format`` "safetensors" (model-0000N-of-00002.safetensors) or "bin" (pytorch_model-0000N-of-00002.bin).
    Returns the shard file names."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.config.save_pretrained(directory)
    state = model.state_dict()
    names = list(state)
    prefix, suffix = ("model", "safetensors") if shard_format == "safetensors" else ("pytorch_model", "bin")
    shards, weight_map = [], {}
    for number, part in enumerate((names[: len(names) // 2], names[len(names) // 2:]), 1):
        shard = f"{prefix}-0000{number}-of-00002.{suffix}"
        tensors = {name: state[name].clone().contiguous() for name in part}
        if shard_format == "safetensors":
            save_file(tensors, str(directory / shard), metadata={"format": "pt"})
        else:
            torch.save(tensors, directory / shard)
        shards.append(shard)
        weight_map.update(dict.fromkeys(part, shard))
    (directory / f"{prefix}.{suffix}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    vocabulary = {f"t{index}": index for index in range(32)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocabulary, unk_token="t0")))
    tokenizer.save_pretrained(directory)
    return shards


def _cut_short(file):
    """``file`` cut to half its size, as an interrupted download leaves it."""
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _download_command(shown: str) -> list[str]:
    """The words of the 'hf download ...' command an error's fix names."""
    return shlex.split(re.search(r"'(hf download [^']*)'", shown).group(1))


def _load_error(directory) -> ModelSourceError:
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ModelSourceError) as caught:
            load_model(resolve_model(str(directory)), progress=False)
    return caught.value


@pytest.mark.parametrize("shard_format", ["safetensors", "bin"])
def test_a_damaged_shard_in_a_hub_cache_snapshot_is_fetched_again_into_the_cache_not_with_local_dir(
        shard_format, tmp_path):
    """huggingface_hub's cache keeps a file it holds, complete or not (hf download returns the snapshot's link
    without fetching), and --local-dir pointed at a snapshot writes plain files among the cache's links: the fix
    names the repository, the snapshot's commit and --force-download."""
    snapshot = tmp_path / "models--acme--tiny-chat" / "snapshots" / COMMIT
    shards = _tiny_llama(snapshot, shard_format)
    _cut_short(snapshot / shards[1])
    error = _load_error(snapshot)
    shown = str(error)
    assert "--local-dir" not in shown
    command = _download_command(shown)
    assert command[:3] == ["hf", "download", "acme/tiny-chat"]
    assert command[command.index("--revision") + 1] == COMMIT
    assert "--force-download" in command
    if shard_format == "safetensors":  # the damaged file is named, and fetched alone
        assert command[3] == shards[1]


def test_a_damaged_shard_in_a_plain_directory_is_fetched_again_with_local_dir(tmp_path):
    directory = tmp_path / "tiny-chat"
    shards = _tiny_llama(directory, "bin")
    _cut_short(directory / shards[1])
    shown = str(_load_error(directory))
    command = _download_command(shown)
    assert command == ["hf", "download", "ORG/NAME", "--local-dir", str(directory)]


def _gguf_with_sampling(path, keys: dict):
    """A GGUF file holding only the general.sampling keys ``keys`` (name -> (value, GGUFValueType))."""
    gguf = pytest.importorskip("gguf")

    writer = gguf.GGUFWriter(str(path), "llama")
    for name, (value, value_type) in keys.items():
        writer.add_key_value(f"general.sampling.{name}", value, value_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("top_k", [-1, 0])
def test_a_gguf_top_k_llama_cpp_reads_as_off_is_read_as_off_without_a_warning(top_k, tmp_path):
    """llama.cpp's top-k sampler (src/llama-sampling.cpp) is off at any k <= 0: a file whose general.sampling.top_k
    is -1 (off, as vLLM and others write it) samples from every token there; it is top_k 0 in the bundle, not a
    damaged value."""
    gguf = pytest.importorskip("gguf")
    from edgesdk.models.generation_defaults import read_model_sampling

    int32, float32 = gguf.GGUFValueType.INT32, gguf.GGUFValueType.FLOAT32
    path = _gguf_with_sampling(tmp_path / "s.gguf", {"top_k": (top_k, int32), "top_p": (0.95, float32),
                                                     "temp": (0.7, float32)})
    read = read_model_sampling("gguf", path)
    assert read.warnings == ()
    assert read.values == {"temperature": 0.7, "top_p": 0.95, "top_k": 0}


def test_gguf_sampling_values_llama_cpp_cannot_use_are_still_warnings(tmp_path):
    """Only a top_k below 0 reads as off: a NaN temperature and a min_p below 0 stay warnings, left out."""
    gguf = pytest.importorskip("gguf")
    from edgesdk.models.generation_defaults import read_model_sampling

    float32 = gguf.GGUFValueType.FLOAT32
    path = _gguf_with_sampling(tmp_path / "n.gguf", {"temp": (float("nan"), float32), "min_p": (-0.5, float32),
                                                     "top_k": (20, gguf.GGUFValueType.INT32)})
    read = read_model_sampling("gguf", path)
    assert read.values == {"top_k": 20}
    shown = "\n".join(read.warnings)
    assert "general.sampling.temp nan is not used" in shown
    assert "general.sampling.min_p -0.5 is not used" in shown
