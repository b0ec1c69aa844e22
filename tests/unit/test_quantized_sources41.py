"""Quantized Hugging Face checkpoints (config.json's quantization_config, mlx-lm's quantization): the forms edgesdk
cannot de-quantize are refused when the model is resolved, before any weights load, naming the directory, the
quant_method, why and the unquantized checkpoint to use instead; an FP8 checkpoint loads de-quantized to float32."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import resolve_model
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")

# quantization_config as each tool writes it (transformers' *Config.to_dict(), llm-compressor, mlx-lm)
QUANTIZATION_CONFIGS = {
    "AWQ": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
    "GPTQ-Int4": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "bnb-4bit": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "AQLM-2Bit-1x16": {"quant_method": "aqlm", "in_group_size": 8, "out_group_size": 1, "num_codebooks": 1,
                       "nbits_per_codebook": 16},
    "EETQ": {"quant_method": "eetq", "weights": "int8"},
    "HQQ": {"quant_method": "hqq", "quant_config": {}},
    "quantized.w4a16": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}},
    "int4": {"quant_method": "torchao", "quant_type": {"default": {"_type": "Int4WeightOnlyConfig", "_data": {}}}},
}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("quantized") / "base", hidden=64, heads=4, kv_heads=2)


def _quantized_copy(base_dir, where, settings: dict, key: str = "quantization_config"):
    shutil.copytree(base_dir, where)
    config = json.loads((where / "config.json").read_text())
    config[key] = settings
    (where / "config.json").write_text(json.dumps(config))
    return where


@pytest.mark.parametrize("suffix", sorted(QUANTIZATION_CONFIGS))
def test_a_checkpoint_edgesdk_cannot_dequantize_is_refused_naming_its_method_and_its_base(base_dir, tmp_path, suffix):
    settings = QUANTIZATION_CONFIGS[suffix]
    model = _quantized_copy(base_dir, tmp_path / f"Tiny-0.5B-Instruct-{suffix}", settings)
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(model))
    problem, fix = caught.value.problem, caught.value.fix
    assert f"model directory {model} holds a checkpoint quantized with " in problem
    assert f"quantization_config.quant_method {settings['quant_method']!r}" in problem
    assert "cannot turn them back into the float weights" in problem
    assert f"likely Tiny-0.5B-Instruct (the name Tiny-0.5B-Instruct-{suffix} without '-{suffix}')" in fix
    assert "hf download ORG/Tiny-0.5B-Instruct" in fix
    assert "GGUF file of the model" in fix


def test_an_older_bitsandbytes_config_without_quant_method_is_refused(base_dir, tmp_path):
    model = _quantized_copy(base_dir, tmp_path / "Tiny-bnb-8bit", {"load_in_8bit": True, "llm_int8_threshold": 6.0})
    with pytest.raises(ModelSourceError, match=r"quantized with bitsandbytes \(config.json "
                                               r"quantization_config.load_in_8bit\)") as caught:
        resolve_model(str(model))
    assert "likely Tiny " in caught.value.fix


def test_an_unknown_quant_method_is_refused_and_a_name_without_suffix_names_no_base(base_dir, tmp_path):
    model = _quantized_copy(base_dir, tmp_path / "my-model", {"quant_method": "newquant", "bits": 3})
    with pytest.raises(ModelSourceError, match="quantized with a method edgesdk does not know .*'newquant'") as caught:
        resolve_model(str(model))
    assert "likely" not in caught.value.fix
    assert caught.value.fix.startswith("build from the unquantized checkpoint this one was made from (pass its "
                                       "directory with --model), or pass a GGUF file")


def _awq_pack(model_dir):
    """model.safetensors in AutoAWQ's GEMM layout: each projection's weight as 4-bit integers packed 8 to an int32
    in AWQ's order 0 2 4 6 1 3 5 7 (qweight (in, out/8)), qzeros (in/group, out/8) and scales (in/group, out) in
    float16."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    packed, group, order = {}, 16, [0, 2, 4, 6, 1, 3, 5, 7]
    for name, weight in tensors.items():
        if not name.endswith("proj.weight"):
            packed[name] = weight
            continue
        rows, cols = weight.shape  # (out, in)
        prefix = name[:-len(".weight")]
        grouped = weight.T.reshape(cols // group, group, rows)
        low, high = grouped.amin(1), grouped.amax(1)
        scale = ((high - low) / 15).clamp(min=1e-6)
        zero = (-low / scale).round().clamp(0, 15)
        levels = (grouped / scale[:, None] + zero[:, None]).round().clamp(0, 15).to(torch.int32).reshape(cols, rows)
        shifts = torch.arange(8, dtype=torch.int32) * 4
        packed[f"{prefix}.qweight"] = (levels.reshape(cols, rows // 8, 8)[..., order] << shifts).sum(
            -1, dtype=torch.int32)
        packed[f"{prefix}.qzeros"] = (zero.to(torch.int32).reshape(cols // group, rows // 8, 8)[..., order] << shifts).sum(
            -1, dtype=torch.int32)
        packed[f"{prefix}.scales"] = scale.half()
    save_file(packed, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def test_edgesdk_build_refuses_a_real_awq_checkpoint_before_it_loads_or_makes_a_work_directory(base_dir, tmp_path):
    from edgesdk.cli import main

    model = _quantized_copy(base_dir, tmp_path / "Qwen2.5-0.5B-Instruct-AWQ",
                            {"quant_method": "awq", "bits": 4, "group_size": 16, "zero_point": True,
                             "version": "gemm", "modules_to_not_convert": None})
    _awq_pack(model)
    out = tmp_path / "bundle"
    result = CliRunner().invoke(main, ["build", "--target", "host", "--model", str(model), "--out", str(out),
                                       "--recipe", "fp32-standard", "--max-context", "64", "--no-progress"],
                                prog_name="edgesdk")
    assert result.exit_code == ModelSourceError.exit_code, result.output
    assert f"model directory {model} holds a checkpoint quantized with AWQ" in result.stderr
    assert "likely Qwen2.5-0.5B-Instruct (the name Qwen2.5-0.5B-Instruct-AWQ without '-AWQ')" in result.stderr
    assert "loading" not in result.stderr  # the load step never started
    assert not out.exists()
    assert not out.with_name("bundle.build").exists()


def test_an_mlx_checkpoint_is_refused(base_dir, tmp_path):
    """mlx-lm's layout: quantization {group_size, bits} in config.json, each projection as uint32 words of packed
    4-bit integers with per-group scales and biases."""
    from safetensors.torch import load_file, save_file

    model = _quantized_copy(base_dir, tmp_path / "SmolLM2-135M-Instruct-4bit", {"group_size": 16, "bits": 4},
                            key="quantization")
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"group_size": 16, "bits": 4}  # newer mlx-lm writes both
    (model / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(model / "model.safetensors"))
    for name in [name for name in tensors if name.endswith("proj.weight")]:
        rows, cols = tensors[name].shape
        prefix = name[:-len(".weight")]
        tensors[name] = torch.randint(0, 2**31 - 1, (rows, cols // 8), dtype=torch.int32).view(torch.uint32)
        tensors[f"{prefix}.scales"] = torch.rand(rows, cols // 16, dtype=torch.float16)
        tensors[f"{prefix}.biases"] = torch.rand(rows, cols // 16, dtype=torch.float16)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "mlx"})
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(model))
    assert caught.value.problem.startswith(f"model directory {model} holds an MLX checkpoint quantized to 4 bits "
                                           "(config.json quantization: group_size 16, bits 4, as mlx-lm writes it)")
    assert "likely SmolLM2-135M-Instruct (the name SmolLM2-135M-Instruct-4bit without '-4bit')" in caught.value.fix


def test_the_model_cards_base_model_is_the_named_fix(base_dir, tmp_path):
    model = _quantized_copy(base_dir, tmp_path / "some-quant", QUANTIZATION_CONFIGS["GPTQ-Int4"])
    (model / "README.md").write_text("---\nlicense: apache-2.0\nbase_model:\n- Org/Tiny-Base-Instruct\n"
                                     "base_model_relation: quantized\n---\n# some-quant\n")
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(model))
    assert ("likely Org/Tiny-Base-Instruct (its model card's base_model): download it (hf download "
            "Org/Tiny-Base-Instruct)") in caught.value.fix


def test_a_hub_cache_entry_names_the_base_with_its_organisation(base_dir, tmp_path):
    entry = tmp_path / "models--Qwen--Qwen2.5-0.5B-Instruct-GPTQ-Int4"
    _quantized_copy(base_dir, entry / "snapshots" / "abc123", QUANTIZATION_CONFIGS["GPTQ-Int4"])
    (entry / "blobs").mkdir()
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("abc123")
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(entry))
    assert "likely Qwen/Qwen2.5-0.5B-Instruct (the name Qwen/Qwen2.5-0.5B-Instruct-GPTQ-Int4 without '-GPTQ-Int4')" \
        in caught.value.fix
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct)" in caught.value.fix


def test_an_fp8_checkpoint_loads_dequantized_to_float32(base_dir, tmp_path):
    """transformers' FineGrainedFP8 form: float8_e4m3fn weights with a float32 weight_scale_inv per 16x16 block;
    loaded, each weight is the FP8 value times its block's scale, in plain float32 nn.Linear layers, and the model
    saves as a float checkpoint (the build's stage checkpoints)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from edgesdk.models.loader import load_model

    block = 16
    model_dir = _quantized_copy(base_dir, tmp_path / "Tiny-FP8", {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                                "weight_block_size": [block, block], "fmt": "e4m3"})
    tensors = load_file(str(model_dir / "model.safetensors"))
    expected = dict(tensors)
    for name in [name for name in tensors if name.endswith("proj.weight")]:
        rows, cols = tensors[name].shape
        blocks = tensors[name].reshape(rows // block, block, cols // block, block)
        scale = blocks.abs().amax(dim=(1, 3)) / 448.0  # float8_e4m3fn's largest value
        quantized = (blocks / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
        tensors[name] = quantized
        tensors[name.replace(".weight", ".weight_scale_inv")] = scale
        expected[name] = (quantized.float().reshape(rows // block, block, cols // block, block)
                          * scale[:, None, :, None]).reshape(rows, cols)
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})

    loaded = load_model(resolve_model(str(model_dir)), progress=False).model
    assert type(loaded.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert getattr(loaded.config, "quantization_config", None) is None
    state = loaded.state_dict()
    for name, value in expected.items():
        assert state[name].dtype == torch.float32, name
        assert torch.equal(state[name], value), name
    assert not torch.equal(expected["model.layers.0.self_attn.q_proj.weight"],
                           load_file(str(base_dir / "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"])
    loaded.save_pretrained(tmp_path / "saved")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float32)
    assert torch.equal(again.state_dict()["model.layers.1.mlp.down_proj.weight"],
                       expected["model.layers.1.mlp.down_proj.weight"])
