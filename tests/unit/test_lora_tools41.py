"""LoRA adapters as the fine-tuning tools write them, merged by edgesdk/models/lora.py: PEFT's bias "all" keys
(get_peft_model_state_dict), a bfloat16 / float16 base merged in float32, GGUF adapters of convert_lora_to_gguf.py's
other --outtype values, and directories that are no adapter edgesdk reads (mlx-lm's, a parent of adapters)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, merge_adapters  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit._lora_files41 import (  # noqa: E402
    llama_cpp_permute,
    lora_forward_logits,
    random_factors,
    write_gguf_adapter,
    write_peft,
)

IDS = torch.tensor([[5, 17, 101, 3, 250, 42, 7, 99, 12, 1]])
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def test_bias_all_replaces_the_biases_peft_saves_under_the_adapted_layers_base_layer(tmp_path):
    """bias "all": PEFT trains every bias, and get_peft_model_state_dict saves the bias of a layer LoRA wraps as
    ``<module>.base_layer.bias`` (a bias of a layer it does not wrap as ``<module>.bias``); loading the adapter puts
    those biases in the model. They were skipped as frozen base weights, so the merged Qwen2 kept its base q/k/v
    biases."""
    model = tiny_llama(seed=11, model_type="qwen2")
    factors = random_factors(model, targets=("q_proj", "v_proj"), rank=4)
    generator = torch.Generator().manual_seed(5)
    biases = {f"model.layers.{layer}.self_attn.{kind}": torch.randn(
        getattr(model.model.layers[layer].self_attn, kind).out_features, generator=generator) * 2
        for layer in range(2) for kind in ("q_proj", "k_proj", "v_proj")}
    reference = tiny_llama(seed=11, model_type="qwen2")
    modules = dict(reference.named_modules())
    with torch.no_grad():
        for name, bias in biases.items():
            modules[name].bias.copy_(bias)
    expected = lora_forward_logits(reference, IDS, factors, {name: 2.0 for name in factors})
    extra = {f"base_model.model.{name}{'.base_layer' if name in factors else ''}.bias": bias
             for name, bias in biases.items()}
    adapter = write_peft(tmp_path / "adapter", factors, {"bias": "all"}, extra=extra)
    records = merge_adapters(model, [LoraAdapter(str(adapter))], "qwen2")
    with torch.no_grad():
        merged = model(IDS).logits
    assert float((merged - expected).abs().max()) < 1e-3
    assert records[0]["replaced"] == sorted(f"{name}.bias" for name in biases)
    # bias "none": a base_layer bias in the file is the frozen base's own, not merged
    plain = tiny_llama(seed=11, model_type="qwen2")
    kept = plain.model.layers[0].self_attn.q_proj.bias.detach().clone()
    frozen = {key: value for key, value in extra.items() if ".base_layer." in key}
    none = write_peft(tmp_path / "none", factors, {"bias": "none"}, extra=frozen)
    assert "replaced" not in merge_adapters(plain, [LoraAdapter(str(none))], "qwen2")[0]
    assert torch.equal(plain.model.layers[0].self_attn.q_proj.bias, kept)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_base_is_merged_in_float32_and_rounded_once(tmp_path, dtype):
    """A base loaded in bfloat16 / float16: W + s * B A is summed in float32 and rounded once to the weight's dtype.
    The delta was rounded to the weight's dtype before the sum (and the product rounded again), which moved weights
    off the nearest representable value of the exact merge."""
    model = tiny_llama(seed=12).to(dtype)
    float_model = tiny_llama(seed=12).to(dtype).to(torch.float32)  # the same half-precision weights, widened
    factors = random_factors(model, targets=("q_proj", "down_proj"), rank=8)
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 8, "lora_alpha": 24})
    merge_adapters(model, [LoraAdapter(str(adapter), 0.7)], "llama")
    merge_adapters(float_model, [LoraAdapter(str(adapter), 0.7)], "llama")
    exact, merged = dict(float_model.named_parameters()), dict(model.named_parameters())
    for name in factors:
        weight = merged[f"{name}.weight"]
        assert weight.dtype == dtype
        nearest = exact[f"{name}.weight"].to(dtype)
        off = int((weight != nearest).sum())
        assert off <= weight.numel() // 1000, (name, off, weight.numel())


def _gguf_pairs(model, factors: dict) -> dict:
    """The factors as convert_lora_to_gguf.py writes them for a llama base (attn_q / attn_k lora_b permuted)."""
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    pairs = {}
    for name, (a, b) in factors.items():
        layer, kind = name.split(".")[2], name.rsplit(".", 1)[-1]
        b = b.numpy()
        if kind in ("q_proj", "k_proj"):
            b = llama_cpp_permute(b, heads, heads if kind == "q_proj" else kv_heads)
        pairs[f"blk.{layer}.{GGUF_NAMES[kind]}.weight"] = (a.numpy(), b)
    return pairs


# the largest error each format allows the change to make, relative to that change: float16 and bfloat16 round each
# factor to 11 and 8 significant bits (2**-9, 2**-6 for the product), q8_0 to 1/127 of each 32-value block's largest
@pytest.mark.parametrize(("outtype", "precision"), [("f16", 2 ** -9), ("bf16", 2 ** -6), ("q8_0", 2 / 127)])
def test_gguf_adapters_of_every_converter_outtype_merge_as_the_float32_one(tmp_path, outtype, precision):
    """convert_lora_to_gguf.py writes f16 by default, and bf16 or q8_0 on request: their tensors are de-quantized
    (gguf-py's dequantize) and merged as the float32 adapter of the same factors, within the format's precision
    (relative to the largest change the adapter makes)."""
    pytest.importorskip("gguf")
    reference = tiny_llama(seed=13, intermediate=128)
    factors = random_factors(reference, rank=32)  # rank 32 and widths of 64, 128: every row fills q8_0 blocks
    pairs = _gguf_pairs(reference, factors)
    base = {name: value.detach().clone() for name, value in reference.state_dict().items()}
    merge_adapters(reference, [LoraAdapter(str(write_gguf_adapter(tmp_path / "f32.gguf", "llama", pairs, 64)))],
                   "llama")
    model = tiny_llama(seed=13, intermediate=128)
    path = write_gguf_adapter(tmp_path / f"{outtype}.gguf", "llama", pairs, 64, outtype=outtype)
    from gguf import GGUFReader

    kinds = {tensor.tensor_type.name for tensor in GGUFReader(str(path)).tensors}
    assert kinds == {outtype.upper()}
    records = merge_adapters(model, [LoraAdapter(str(path))], "llama")
    assert records[0]["rank"] == 32
    assert records[0]["modules"] == len(factors)
    expected, merged = reference.state_dict(), model.state_dict()
    for name in factors:
        change = (expected[f"{name}.weight"] - base[f"{name}.weight"]).abs().max()
        error = (merged[f"{name}.weight"] - expected[f"{name}.weight"]).abs().max()
        assert float(change) > 1.0
        assert float(error) <= precision * float(change), (name, float(error), float(change))


def test_an_mlx_lm_adapter_directory_is_refused_naming_mlx_lm_and_its_fuse(tmp_path):
    """mlx_lm.lora writes adapters.safetensors and an adapter_config.json of its own fields (fine_tune_type,
    lora_parameters): it was told to have PEFT's adapter_model.safetensors copied beside it."""
    model = tiny_llama(seed=14)
    directory = tmp_path / "mlx"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": 16, "model": "mlx-community/SmolLM2-135M-Instruct",
        "lora_parameters": {"rank": 8, "scale": 20.0, "dropout": 0.0, "keys": ["self_attn.q_proj"]}}))
    from safetensors.numpy import save_file

    save_file({"model.layers.0.self_attn.q_proj.lora_a": np.zeros((64, 8), np.float32),
               "model.layers.0.self_attn.q_proj.lora_b": np.zeros((8, 64), np.float32)},
              str(directory / "adapters.safetensors"))
    for present in ("both", "config alone"):
        if present == "config alone":
            (directory / "adapters.safetensors").unlink()
        with pytest.raises(ModelSourceError) as refused:
            merge_adapters(model, [LoraAdapter(str(directory))], "llama")
        assert f"--lora {directory}: {directory} is an mlx-lm adapter" in refused.value.problem
        assert f"mlx_lm.fuse --model BASE --adapter-path {directory}" in refused.value.fix
        assert "--model" in refused.value.fix


def test_a_directory_holding_adapters_in_subdirectories_names_them(tmp_path):
    """PeftModel.save_pretrained writes an adapter not named "default" to <dir>/<name>/, and a Trainer its
    checkpoints to <dir>/checkpoint-<step>/: the parent directory is refused naming the adapters it holds."""
    model = tiny_llama(seed=15)
    factors = random_factors(model, targets=("q_proj",), rank=2)
    write_peft(tmp_path / "out" / "checkpoint-500", factors, {"r": 2})
    write_peft(tmp_path / "out" / "checkpoint-1000", factors, {"r": 2})
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(tmp_path / "out"))], "llama")
    assert "its subdirectories checkpoint-500, checkpoint-1000 hold PEFT adapters" in refused.value.problem
    assert f"--lora {tmp_path / 'out' / 'checkpoint-1000'}" in refused.value.fix
    merge_adapters(model, [LoraAdapter(str(tmp_path / "out" / "checkpoint-500"))], "llama")


def test_embedding_layers_peft_saves_whole_are_merged_or_their_resized_vocabulary_named(tmp_path):
    """save_embedding_layers (PEFT's "auto" where the vocabulary was resized, or True) saves the input and output
    embeddings under their own names; loading the adapter puts them in the model. They were refused as "neither a
    LoRA factor nor a module saved whole" with the fix to save the adapter as PeftModel.save_pretrained does, which
    had written them: now a weight of the model's shape replaces the base's (one equal to the base's changes nothing,
    so a tied output layer stays tied), and one of another vocabulary names the resize."""
    model = tiny_llama(seed=16, tie=False)
    factors = random_factors(model, targets=("q_proj",), rank=2)
    head = torch.randn_like(model.lm_head.weight)
    reference = tiny_llama(seed=16, tie=False)
    reference.lm_head.weight = torch.nn.Parameter(head.clone())
    expected = lora_forward_logits(reference, IDS, factors, {name: 4.0 for name in factors})
    saved = {"base_model.model.model.embed_tokens.weight": model.model.embed_tokens.weight.detach().clone(),
             "base_model.model.lm_head.weight": head}
    adapter = write_peft(tmp_path / "whole", factors, {"r": 2}, extra=saved)
    records = merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert records[0]["replaced"] == ["lm_head.weight"]
    with torch.no_grad():
        assert float((model(IDS).logits - expected).abs().max()) < 1e-3

    tied = tiny_llama(seed=16)
    same = {"base_model.model.model.embed_tokens.weight": tied.model.embed_tokens.weight.detach().clone(),
            "base_model.model.lm_head.weight": tied.lm_head.weight.detach().clone()}
    merge_adapters(tied, [LoraAdapter(str(write_peft(tmp_path / "same", factors, {"r": 2}, extra=same)))], "llama")
    assert tied.lm_head.weight is tied.model.embed_tokens.weight

    resized = torch.randn(322, 64)
    for index, (extra, embedding, key) in enumerate([
            ({"base_model.model.model.embed_tokens.weight": resized}, None, "model.embed_tokens.weight"),
            ({"base_model.model.model.embed_tokens.base_layer.weight": resized},
             {"model.embed_tokens": (torch.randn(2, 322), torch.randn(64, 2))}, "model.embed_tokens.base_layer.weight"),
            ({}, {"model.embed_tokens": (torch.randn(2, 322), torch.randn(64, 2))},
             "model.embed_tokens.lora_embedding_A")]):
        path = write_peft(tmp_path / f"resized{index}", factors, {"r": 2}, extra=extra, embedding=embedding)
        with pytest.raises(ModelSourceError) as refused:
            merge_adapters(tiny_llama(seed=16), [LoraAdapter(str(path))], "llama")
        assert f"base_model.model.{key} has 322 token rows, but 'model.embed_tokens' of the model has 320" \
            in refused.value.problem
        assert "vocabulary resized" in refused.value.problem
        assert "base.resize_token_embeddings(322)" in refused.value.fix


def test_the_record_of_a_peft_adapter_names_its_config_too(tmp_path):
    """The merge reads lora_alpha, use_rslora and the rank / alpha patterns from adapter_config.json: the manifest's
    record carries its sha256 beside the weights', so an adapter whose config was edited is told apart."""
    from edgesdk.hashing import sha256_file

    factors = random_factors(tiny_llama(seed=17), targets=("q_proj",), rank=2)
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 2, "lora_alpha": 4})
    first = merge_adapters(tiny_llama(seed=17), [LoraAdapter(str(adapter))], "llama")[0]
    assert first["config_sha256"] == sha256_file(adapter / "adapter_config.json")
    write_peft(adapter, factors, {"r": 2, "lora_alpha": 16})  # same weights, four times the scale
    second = merge_adapters(tiny_llama(seed=17), [LoraAdapter(str(adapter))], "llama")[0]
    assert second["sha256"] == first["sha256"]
    assert second["config_sha256"] != first["config_sha256"]
    gguf_record = merge_adapters(tiny_llama(seed=17), [LoraAdapter(str(write_gguf_adapter(
        tmp_path / "a.gguf", "llama", _gguf_pairs(tiny_llama(seed=17), factors), 4)))], "llama")[0]
    assert "config_sha256" not in gguf_record
