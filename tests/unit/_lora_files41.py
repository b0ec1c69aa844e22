"""LoRA adapters written as PEFT and llama.cpp's convert_lora_to_gguf.py write them (peft itself is not needed),
and the fine-tuned model's forward computed the unmerged way: base layers plus scale * B (A x) from hooks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def random_factors(model, targets=LINEAR_TARGETS, rank: int = 4, seed: int = 1, ranks: dict | None = None) -> dict:
    """module name -> (A (r, in), B (out, r)) for every ``targets`` linear of the model, large enough to move the
    logits (B is zero when PEFT starts training; a trained one is not). ``ranks``: module suffix -> rank."""
    generator = torch.Generator().manual_seed(seed)
    factors = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            r = next((value for suffix, value in (ranks or {}).items() if name.endswith(suffix)), rank)
            a = torch.randn(r, module.in_features, generator=generator) * 0.3
            b = torch.randn(module.out_features, r, generator=generator) * 0.3
            factors[name] = (a, b)
    return factors


def write_peft(directory: Path, factors: dict, config: dict | None = None, extra: dict | None = None,
               adapter_name: str | None = None, embedding: dict | None = None, file: str = "safetensors") -> Path:
    """A PEFT adapter directory: adapter_config.json (LoraConfig's fields, ``config`` over them; target_modules the
    last names of the modules of ``factors`` and ``embedding``, as PEFT saves them) and the factors as
    ``base_model.model.<module>.lora_A[.<adapter_name>].weight``; ``embedding``: module -> (A (r, V), B (D, r)) as
    lora_embedding_A / B; ``extra``: more tensors under their own keys."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    settings = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
                "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
                "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None, "init_lora_weights": True,
                "target_modules": sorted({name.rsplit(".", 1)[-1] for name in [*factors, *(embedding or {})]}),
                "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M"}
    settings.update(config or {})
    (directory / "adapter_config.json").write_text(json.dumps(settings))
    middle = f".{adapter_name}" if adapter_name else ""
    tensors = {}
    for name, (a, b) in factors.items():
        tensors[f"base_model.model.{name}.lora_A{middle}.weight"] = a.contiguous()
        tensors[f"base_model.model.{name}.lora_B{middle}.weight"] = b.contiguous()
    for name, (a, b) in (embedding or {}).items():
        tensors[f"base_model.model.{name}.lora_embedding_A{middle}"] = a.contiguous()
        tensors[f"base_model.model.{name}.lora_embedding_B{middle}"] = b.contiguous()
    tensors.update({key: value.contiguous() for key, value in (extra or {}).items()})
    if file == "safetensors":
        save_file(tensors, str(directory / "adapter_model.safetensors"))
    else:
        torch.save(tensors, directory / "adapter_model.bin")
    return directory


def lora_forward_logits(model, ids, factors: dict, scaling: dict, embedding: dict | None = None) -> torch.Tensor:
    """The unmerged fine-tuned model's logits: each adapted linear's output plus scaling[name] * B (A x), and the
    embedding's output plus scaling[name] * (B A)^T[ids] (PEFT's Embedding forward), computed with hooks on the
    unchanged base ``model``."""
    handles = []
    modules = dict(model.named_modules())
    for name, (a, b) in factors.items():
        def hook(module, inputs, output, a=a, b=b, s=scaling[name]):
            return output + s * ((inputs[0] @ a.T) @ b.T)
        handles.append(modules[name].register_forward_hook(hook))
    for name, (a, b) in (embedding or {}).items():
        def embed_hook(module, inputs, output, a=a, b=b, s=scaling[name]):
            return output + s * (torch.nn.functional.embedding(inputs[0], a.T) @ b.T)
        handles.append(modules[name].register_forward_hook(embed_hook))
    try:
        with torch.no_grad():
            return model(ids).logits
    finally:
        for handle in handles:
            handle.remove()


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute``: the rows of a q / k weight (or a LoRA B) reordered for
    llama.cpp's rotary layout."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf_adapter(path: Path, arch: str, pairs: dict, alpha: float | None, fields: dict | None = None,
                       outtype: str = "f32") -> Path:
    """A GGUF LoRA adapter in convert_lora_to_gguf.py's layout: general.type adapter, adapter.type lora,
    adapter.lora.alpha (left out for None), tensors ``<gguf name>.lora_a`` / ``.lora_b`` from ``pairs``
    (gguf tensor name -> (lora_a, lora_b) as numpy arrays, already in the file's layout) of ``outtype`` (the
    converter's --outtype: f32, f16, bf16 or q8_0, quantized with gguf-py's quants.quantize as the converter
    does; a tensor whose rows q8_0's 32-value blocks do not divide is written f16, as the converter falls back)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    if alpha is not None:
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    for key, (value, kind) in (fields or {}).items():
        writer.add_key_value(key, value, kind)
    kinds = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
    for name, factors in pairs.items():
        for part, value in zip(("lora_a", "lora_b"), factors, strict=True):
            value = np.ascontiguousarray(value, dtype=np.float32)
            kind = kinds[outtype]
            if kind == gguf.GGMLQuantizationType.Q8_0 and value.shape[-1] % 32:
                kind = gguf.GGMLQuantizationType.F16
            if kind == gguf.GGMLQuantizationType.F32:
                writer.add_tensor(f"{name}.{part}", value)
            elif kind == gguf.GGMLQuantizationType.F16:
                writer.add_tensor(f"{name}.{part}", value.astype(np.float16))
            else:
                writer.add_tensor(f"{name}.{part}", gguf.quants.quantize(value, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
