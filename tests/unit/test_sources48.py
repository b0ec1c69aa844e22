"""Model sources and LoRA adapters refused where they are told, with a fix that leads somewhere: a GGUF model given
with --lora is refused before the base model is fetched or loaded (as a whole-model directory is), and an mlx-lm
adapter directory given with --model is named as mlx-lm's and told to be fused, not sent to --lora (which refuses
it too); the router adapter of PEFT's Arrow is refused, as PEFT refuses to merge it, not merged as a no-op."""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, check_adapter  # noqa: E402
from edgesdk.models.sources import resolve_model  # noqa: E402


def _write_gguf_model(path, general_type: str | None = "model"):
    """A minimal GGUF holding a model as llama.cpp's convert_hf_to_gguf.py writes one (general.type model; older
    converters wrote no general.type): an architecture, its sizes and a token embedding."""
    writer = gguf.GGUFWriter(str(path), "llama")
    if general_type is not None:
        writer.add_type(general_type)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("general_type", ["model", None])
def test_a_gguf_model_given_with_lora_is_refused_by_the_early_check(tmp_path, general_type):
    """check_adapter runs before the model is fetched or loaded (pipeline.build, api): it refused a whole-model
    directory there, but took any file starting with b'GGUF' as an adapter, so a model GGUF given with --lora was
    refused only after the base model had been fetched and loaded (llama.cpp's adapter loader refuses a file whose
    general.type is not 'adapter')."""
    model = _write_gguf_model(tmp_path / "model.gguf", general_type)
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(model)))
    told = f"general.type is {general_type!r}" if general_type else "has no general.type"
    assert f"--lora {model}: the GGUF file {told}, not 'adapter': it holds a model" in refused.value.problem
    assert "--model" in refused.value.fix


def test_a_damaged_gguf_given_with_lora_is_refused_by_the_early_check(tmp_path):
    damaged = tmp_path / "cut.gguf"
    damaged.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 7)  # the header cut short
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(damaged)))
    assert "cannot read the GGUF file" in refused.value.problem
    assert "complete" in refused.value.fix


def test_a_gguf_lora_adapter_still_passes_the_early_check(tmp_path):
    from tests.unit._lora_files41 import write_gguf_adapter

    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "llama",
                                 {"blk.0.attn_q.weight": (np.ones((2, 8), np.float32), np.ones((8, 2), np.float32))},
                                 alpha=4)
    assert check_adapter(LoraAdapter(str(adapter))) == "gguf"


def _mlx_adapter(directory, config: bool = True, weights: bool = True):
    """What mlx_lm.lora --adapter-path DIR writes: adapters.safetensors and an adapter_config.json of its own fields."""
    directory.mkdir()
    if config:
        (directory / "adapter_config.json").write_text(json.dumps({
            "fine_tune_type": "lora", "num_layers": 16, "model": "mlx-community/SmolLM2-135M-Instruct",
            "lora_parameters": {"rank": 8, "scale": 20.0, "dropout": 0.0, "keys": ["self_attn.q_proj"]}}))
    if weights:
        from safetensors.numpy import save_file

        save_file({"model.layers.0.self_attn.q_proj.lora_a": np.zeros((8, 8), np.float32)},
                  str(directory / "adapters.safetensors"))
    return directory


@pytest.mark.parametrize("present", ["both", "weights alone", "config alone"])
def test_an_mlx_lm_adapter_given_as_the_model_is_told_to_fuse_it_not_to_pass_it_with_lora(tmp_path, present):
    """An mlx-lm adapter directory given with --model was called a PEFT adapter and sent to --lora, which refuses
    mlx-lm adapters (check_adapter: fuse it with mlx_lm.fuse); with adapters.safetensors alone it was called a
    directory without config.json. Both now name it mlx-lm's and give the fix --lora gives."""
    directory = _mlx_adapter(tmp_path / "mlx", config=present != "weights alone", weights=present != "config alone")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory))
    problem, fix = refused.value.problem, refused.value.fix
    assert f"model directory {directory} is an mlx-lm LoRA adapter" in problem
    assert "PEFT" not in problem
    assert "mlx_lm.fuse --model" in fix
    assert "--adapter-path" in fix
    assert "--save-path fused" in fix
    assert "--lora" not in fix
    if present != "weights alone":  # the base model its adapter_config.json names
        assert "made for the base model mlx-community/SmolLM2-135M-Instruct" in problem
        assert "mlx_lm.fuse --model mlx-community/SmolLM2-135M-Instruct" in fix
    # and --lora, which the fix does not send it to, refuses it with the same remedy
    with pytest.raises(ModelSourceError) as lora:
        check_adapter(LoraAdapter(str(directory)))
    assert "mlx-lm adapter" in lora.value.problem
    assert "mlx_lm.fuse" in lora.value.fix


def test_a_peft_adapter_given_as_the_model_is_still_sent_to_lora(tmp_path):
    directory = tmp_path / "peft"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                               "base_model_name_or_path": "org/base"}))
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory))
    assert "is a PEFT LoRA adapter" in refused.value.problem
    assert "made for the base model org/base" in refused.value.problem
    assert "--lora" in refused.value.fix


def test_the_router_of_peft_arrow_is_refused_not_merged_as_the_base_model(tmp_path):
    """PEFT's create_arrow_model adds an adapter "arrow_router" (arrow_config naming the task adapters) whose
    lora_A is random and lora_B zero: its forward routes each token among the task adapters, and PEFT refuses to
    merge it. save_pretrained writes it to <dir>/arrow_router beside <dir>/task_0 ...; given with --lora it was
    merged as a plain LoRA, which left the base model unchanged and recorded an adapter as merged."""
    torch = pytest.importorskip("torch")
    from edgesdk.models.lora import merge_adapters
    from tests._utils.tiny import tiny_llama
    from tests.unit._lora_files41 import random_factors, write_peft

    model = tiny_llama(seed=3)
    factors = random_factors(model, targets=("q_proj", "v_proj"))
    write_peft(tmp_path / "saved" / "task_0", factors)
    router = {name: (a, torch.zeros_like(b)) for name, (a, b) in factors.items()}  # as LoraLayer initialises them
    arrow = {"gks_adapter_names": [], "rng_seed": None, "router_temperature": 1.0, "task_adapter_names": ["task_0"],
             "top_k": 1, "use_gks": False}  # what PEFT 0.21 saves
    directory = write_peft(tmp_path / "saved" / "arrow_router", router, config={"arrow_config": arrow})
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(directory))], "llama")
    problem, fix = refused.value.problem, refused.value.fix
    assert f"--lora {directory}: the adapter sets arrow_config" in problem
    assert "router of PEFT's Arrow" in problem
    assert "(task_0)" in problem
    assert f"--lora {tmp_path / 'saved' / 'task_0'}" in fix
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
