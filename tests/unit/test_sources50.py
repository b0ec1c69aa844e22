"""Model sources refused where they are told, with the fix that leads somewhere (review 50)."""

from __future__ import annotations

import json
import shlex

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.lora import LoraAdapter, check_adapter
from edgesdk.models.sources import resolve_model


def _axolotl_output(directory, weights: str = "adapter_model.safetensors"):
    """What Axolotl leaves in its output_dir after a LoRA run: the base model's config.json and tokenizer, saved there
    before training ("presave the tokenizer and model configs"), beside PEFT's adapter_config.json and weights (and
    the Trainer's training_args.bin)."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                       "hidden_size": 64, "num_hidden_layers": 2}))
    (directory / "tokenizer_config.json").write_text("{}")
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                               "base_model_name_or_path": "org/base"}))
    (directory / weights).write_bytes(b"\0" * 16)
    (directory / "training_args.bin").write_bytes(b"\0" * 16)
    return directory


@pytest.mark.parametrize("weights", ["adapter_model.safetensors", "adapter_model.bin"])
def test_a_lora_adapter_beside_its_bases_config_json_is_refused_as_an_adapter(tmp_path, weights):
    """A directory with config.json was taken as a whole model, though the config.json beside a PEFT adapter in
    Axolotl's output directory is its base's and no model weights are there: the load then failed with transformers'
    'no file named model.safetensors' and a fix to download the model again. It is now named a LoRA adapter and sent
    to --lora, which takes it."""
    directory = _axolotl_output(tmp_path / "out", weights)
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory))
    problem, fix = refused.value.problem, refused.value.fix
    assert f"model directory {directory} is a PEFT LoRA adapter (adapter_config.json, {weights}, a config.json " \
           "but no model weights" in problem
    assert "made for the base model org/base" in problem
    assert f"--model org/base --lora {shlex.quote(str(directory))}" in fix
    assert check_adapter(LoraAdapter(str(directory))) == "peft"  # where the fix sends it


@pytest.mark.parametrize("name", ["model.safetensors", "model-00001-of-00002.safetensors", "pytorch_model.bin"])
def test_a_whole_model_with_adapter_files_beside_it_is_still_a_model(tmp_path, name):
    directory = _axolotl_output(tmp_path / "merged")
    (directory / name).write_bytes(b"\0" * 16)
    if "-of-" in name:  # a sharded model's index beside its shards (shards without it are refused by name)
        (directory / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    source = resolve_model(str(directory))
    assert source.kind == "hf-dir"


def _lfs_pointer(path, size: int = 98_362_432):
    """The pointer file a clone made without Git LFS holds in place of a large file (git-lfs docs/spec.md)."""
    path.write_text("version https://git-lfs.github.com/spec/v1\n"
                    "oid sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53\n"
                    f"size {size}\n")
    return path


def test_a_gguf_model_that_is_a_git_lfs_pointer_is_named_as_one(tmp_path):
    """A .gguf of a repository cloned without Git LFS was 'not a GGUF file (first bytes b'vers')', with the fix to
    pass a file written by llama.cpp's converter, which it is."""
    pointer = _lfs_pointer(tmp_path / "SmolLM2-135M-Instruct-Q8_0.gguf")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(pointer))
    assert ("SmolLM2-135M-Instruct-Q8_0.gguf is a Git LFS pointer file standing for the 98,362,432-byte file, oid "
            "sha256:b179c9523d0e..., not the file itself: the repository was cloned without Git LFS") \
        in refused.value.problem
    assert "git lfs pull" in refused.value.fix


def test_a_model_directory_whose_weights_are_git_lfs_pointers_is_refused_before_the_load(tmp_path):
    directory = tmp_path / "SmolLM2-135M"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _lfs_pointer(directory / "model.safetensors", 269_060_552)
    _lfs_pointer(directory / "tokenizer.json", 2_104_556)
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory))
    problem = refused.value.problem
    assert "model.safetensors is a Git LFS pointer file standing for the 269,060,552-byte file" in problem
    assert "tokenizer.json is a Git LFS pointer file standing for the 2,104,556-byte file" in problem
    assert "not the files themselves (2 files)" in problem
    assert "git lfs pull" in refused.value.fix


def test_lora_adapters_that_are_git_lfs_pointers_are_named_as_such(tmp_path):
    """A PEFT adapter cloned without Git LFS passed check_adapter and failed after the base model loaded, with
    safetensors' 'header too large' and a fix to save the adapter again; a GGUF adapter was 'not GGUF'."""
    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16}))
    _lfs_pointer(peft / "adapter_model.safetensors", 4_899_752)
    gguf_adapter = _lfs_pointer(tmp_path / "adapter.gguf", 4_899_900)
    for path, name in ((peft, "adapter_model.safetensors"), (gguf_adapter, "adapter.gguf")):
        with pytest.raises(ModelSourceError) as refused:
            check_adapter(LoraAdapter(str(path)))
        assert refused.value.problem.startswith(f"--lora {path}: {name} is a Git LFS pointer file standing for the ")
        assert "git lfs pull" in refused.value.fix


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "model-00001-of-00002.safetensors"])
def test_a_file_of_a_model_directory_given_as_the_model_is_told_to_pass_the_directory(tmp_path, name):
    """llama.cpp's -m takes the model file; a user who passes the safetensors file of a Hugging Face directory the
    same way was told to pass 'a .gguf file or a Hugging Face model directory', not which directory."""
    directory = tmp_path / "SmolLM2-135M"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (directory / name).write_bytes(b"{}")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory / name))
    assert f"it is one file of the Hugging Face model directory {directory}" in refused.value.problem
    assert refused.value.fix == f"pass the directory: --model {shlex.quote(str(directory))}"


def test_a_lone_file_of_another_kind_keeps_the_general_fix(tmp_path):
    lone = tmp_path / "weights.safetensors"
    lone.write_bytes(b"{}")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(lone))
    assert refused.value.fix == "pass a .gguf file or a Hugging Face model directory"


def test_modules_to_save_names_match_every_module_ending_with_them_as_peft_matches_them(tmp_path):
    """PEFT's _set_trainable wraps every module whose name ends with a modules_to_save entry (key.endswith(name)): with
    modules_to_save ["norm"] it trains and saves model.norm and every layer's input_layernorm and
    post_attention_layernorm (PEFT 0.21 writes base_model.model.model.layers.0.input_layernorm.weight ...). Such an
    adapter was refused as holding 'neither a LoRA factor nor a module its adapter_config.json saves whole'; it now
    merges as PEFT's merge_and_unload does (checked against PEFT 0.21.2: logits equal)."""
    torch = pytest.importorskip("torch")
    from edgesdk.models.lora import merge_adapters
    from tests._utils.tiny import tiny_llama
    from tests.unit._lora_files41 import random_factors, write_peft

    model = tiny_llama(seed=3)
    factors = random_factors(model, targets=("q_proj",))
    generator = torch.Generator().manual_seed(5)
    norms = {name: torch.rand(module.weight.shape, generator=generator) + 0.5
             for name, module in model.named_modules() if name.endswith("norm")}
    assert {"model.norm", "model.layers.0.input_layernorm", "model.layers.1.post_attention_layernorm"} <= set(norms)
    directory = write_peft(tmp_path / "adapter", factors, config={"modules_to_save": ["norm"]},
                           extra={f"base_model.model.{name}.weight": value for name, value in norms.items()})
    before = {name: value.clone() for name, value in model.state_dict().items()}
    records = merge_adapters(model, [LoraAdapter(str(directory))], "llama")
    state = model.state_dict()
    for name, value in norms.items():
        assert torch.equal(state[f"{name}.weight"], value), name
    for name, (a, b) in factors.items():
        expected = before[f"{name}.weight"] + 8 / 4 * (b @ a)
        assert torch.allclose(state[f"{name}.weight"], expected, atol=1e-5), name
    assert records[0]["replaced"] == sorted(f"{name}.weight" for name in norms)


def _hub_cache_entry(root, files: dict):
    """A huggingface_hub cache entry models--org--name: refs/main naming the snapshot whose files link into blobs/."""
    entry = root / "models--org--smollm2-lora"
    snapshot = entry / "snapshots" / "0123abcd"
    (entry / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("0123abcd")
    for index, (name, data) in enumerate(files.items()):
        blob = entry / "blobs" / f"blob{index}"
        blob.write_bytes(data)
        (snapshot / name).symlink_to(blob)
    return entry, snapshot


def test_a_lora_adapters_hub_cache_entry_is_told_its_snapshot(tmp_path):
    """--model reads a Hub cache entry (models--org--name) at the snapshot refs/main names; --lora said of one that it
    'has no adapter_config.json, so it is no PEFT LoRA adapter'. It now names the snapshot to pass, which it takes."""
    config = json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}).encode()
    entry, snapshot = _hub_cache_entry(tmp_path, {"adapter_config.json": config,
                                                  "adapter_model.safetensors": b"\0" * 16})
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(entry)))
    assert f"--lora {entry}: the directory is a Hugging Face Hub cache entry" in refused.value.problem
    assert "snapshot 0123abcd" in refused.value.problem
    assert refused.value.fix == f"pass the snapshot: --lora {shlex.quote(str(snapshot))}"
    assert check_adapter(LoraAdapter(str(snapshot))) == "peft"


def test_a_gguf_lora_adapters_hub_cache_entry_is_told_its_file(tmp_path):
    entry, snapshot = _hub_cache_entry(tmp_path, {"smollm2-lora-f16.gguf": b"GGUF"})
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(entry)))
    assert refused.value.fix == f"pass the snapshot's GGUF adapter: --lora {shlex.quote(str(snapshot / 'smollm2-lora-f16.gguf'))}"
