"""GGUF LoRA adapters in llama.cpp's convert_lora_to_gguf.py layout merged into a GGUF base model: the merge equals
the PEFT merge of the same factors (attn_q / attn_k lora_b rows put back from llama.cpp's rotary order, the
embedding's flipped A and B read as llm_build_inp_embd reads them, alpha / r as llama.cpp scales), and adapters
llama.cpp refuses are refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, gguf_architecture, merge_adapters  # noqa: E402
from tests._utils.builds import build_tiny_bundle  # noqa: E402
from tests._utils.tiny import save_tiny_model_dir  # noqa: E402
from tests.unit._lora_files41 import (  # noqa: E402
    llama_cpp_permute,
    random_factors,
    write_gguf_adapter,
    write_peft,
)

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
IDS = torch.tensor([[5, 17, 101, 3, 250, 42, 7, 99]])
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory):
    """A tiny Llama (4 query heads, 2 KV heads of 16) as a float32 GGUF file, written by edgesdk's GGUF export."""
    from edgesdk.export.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("lora-base")
    model_dir = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2, intermediate=128)
    bundle = build_tiny_bundle(root, FUSED_FP32, "host", model_dir=model_dir)
    return export_gguf(bundle.path, root / "base.gguf").path


def _load(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    source = resolve_model(str(path))
    return load_model(source, progress=False).model, source


def _gguf_pairs(model, factors: dict, embedding=None) -> dict:
    """The factors as convert_lora_to_gguf.py writes them for a llama base: blk.N.<tensor>.weight, lora_b of attn_q
    and attn_k permuted as LlamaModel.permute permutes the base weights, token_embd's lora_a transposed."""
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    pairs = {}
    for name, (a, b) in factors.items():
        layer, kind = name.split(".")[2], name.rsplit(".", 1)[-1]
        b = b.numpy()
        if kind == "q_proj":
            b = llama_cpp_permute(b, heads, heads)
        elif kind == "k_proj":
            b = llama_cpp_permute(b, heads, kv_heads)
        pairs[f"blk.{layer}.{GGUF_NAMES[kind]}.weight"] = (a.numpy(), b)
    if embedding is not None:
        a, b = embedding
        pairs["token_embd.weight"] = (a.numpy().T, b.numpy())
    return pairs


def test_a_gguf_adapter_merges_as_the_peft_adapter_of_the_same_factors(base_gguf, tmp_path):
    model, source = _load(base_gguf)
    assert gguf_architecture(source, model) == "llama"
    factors = random_factors(model, rank=4)
    generator = torch.Generator().manual_seed(3)
    embedding = (torch.randn(4, 320, generator=generator), torch.randn(64, 4, generator=generator))
    peft = write_peft(tmp_path / "peft", factors, {"r": 4, "lora_alpha": 8},
                      embedding={"model.embed_tokens": embedding})
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "llama", _gguf_pairs(model, factors, embedding), alpha=8)
    with torch.no_grad():
        base_logits = model(IDS).logits
    records = merge_adapters(model, [LoraAdapter(str(adapter), 0.75)], "llama")
    reference, _ = _load(base_gguf)
    merge_adapters(reference, [LoraAdapter(str(peft), 0.75)], "llama")
    with torch.no_grad():
        merged, expected = model(IDS).logits, reference(IDS).logits
    assert float((expected - base_logits).abs().max()) > 1.0
    assert float((merged - expected).abs().max()) < 1e-3
    for name, parameter in reference.state_dict().items():
        assert torch.allclose(model.state_dict()[name], parameter, atol=1e-5), name
    assert records[0]["form"] == "gguf"
    assert records[0]["alpha"] == 8.0
    assert records[0]["rank"] == 4
    assert records[0]["modules"] == 15


def test_a_gguf_adapter_without_alpha_is_scaled_by_the_user_scale_alone(base_gguf, tmp_path):
    """llama.cpp: adapter.lora.alpha absent (read as 0) scales B A by the user's scale only, not alpha / r."""
    model, _ = _load(base_gguf)
    factors = random_factors(model, targets=("q_proj", "k_proj", "down_proj"), rank=2)
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "llama", _gguf_pairs(model, factors), alpha=None)
    peft = write_peft(tmp_path / "peft", factors, {"r": 2, "lora_alpha": 2})  # alpha / r = 1
    merge_adapters(model, [LoraAdapter(str(adapter), 1.5)], "llama")
    reference, _ = _load(base_gguf)
    merge_adapters(reference, [LoraAdapter(str(peft), 1.5)], "llama")
    with torch.no_grad():
        assert float((model(IDS).logits - reference(IDS).logits).abs().max()) < 1e-3


def _refusal(base_gguf, path, arch_model=None) -> ModelSourceError:
    model = arch_model
    if model is None:
        model, _ = _load(base_gguf)
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(path))], "llama")
    assert f"--lora {path}" in refused.value.problem
    assert refused.value.fix
    return refused.value


def test_gguf_adapters_llama_cpp_refuses_are_refused_by_name(base_gguf, tmp_path):
    model, _ = _load(base_gguf)
    factors = random_factors(model, targets=("q_proj",), rank=2)
    pairs = _gguf_pairs(model, factors)
    other = write_gguf_adapter(tmp_path / "qwen2.gguf", "qwen2", pairs, alpha=4)
    refused = _refusal(base_gguf, other, model)
    assert "architecture is 'qwen2'" in refused.problem
    assert "base model's is 'llama'" in refused.problem
    a, b = pairs["blk.0.attn_q.weight"]
    wrong = write_gguf_adapter(tmp_path / "shape.gguf", "llama", {"blk.0.attn_q.weight": (a[:, :32], b)}, alpha=4)
    assert "blk.0.attn_q.weight.lora_a has shape (2, 32)" in _refusal(base_gguf, wrong, model).problem
    absent = write_gguf_adapter(tmp_path / "absent.gguf", "llama", {"blk.9.attn_q.weight": (a, b)}, alpha=4)
    assert "adapts blk.9.attn_q.weight, which the base model does not have" in _refusal(base_gguf, absent, model).problem
    import numpy as np

    norm = tmp_path / "norm.gguf"
    writer = gguf.GGUFWriter(str(norm), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "a norm weight" in _refusal(base_gguf, norm, model).problem
    whole = _refusal(base_gguf, base_gguf, model)
    assert "the GGUF file has no general.type, not 'adapter': it holds a model" in whole.problem
    assert "--model" in whole.fix


def test_a_gguf_adapter_given_as_the_model_is_told_to_go_with_lora(base_gguf, tmp_path):
    model, _ = _load(base_gguf)
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "llama",
                                 _gguf_pairs(model, random_factors(model, targets=("q_proj",), rank=2)), alpha=4)
    with pytest.raises(ModelSourceError) as refused:
        _load(adapter)
    assert "holds a LoRA adapter" in refused.value.problem
    assert f"--lora {adapter}" in refused.value.fix
    assert "--model BASE" in refused.value.fix
