"""PEFT LoRA adapters merged into a loaded model (edgesdk/models/lora.py): the merged model computes what the
unmerged adapter does (base layer plus scale * alpha / r * B (A x)), with PEFT's options, and what is not merged
is refused naming the adapter, the key, the value and the fix."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, merge_adapters  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit._lora_files41 import lora_forward_logits, random_factors, write_peft  # noqa: E402

IDS = torch.tensor([[5, 17, 101, 3, 250, 42, 7, 99, 12, 1]])


def _max_diff(a, b) -> float:
    return float((a - b).abs().max())


def _merged_logits(model, adapters, base="llama"):
    merge_adapters(model, adapters, base)
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("user_scale", [1.0, 0.5, -2.0])
def test_a_peft_adapter_merged_computes_its_unmerged_forward(tmp_path, user_scale):
    model = tiny_llama(seed=3)
    factors = random_factors(model, rank=4)
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 4, "lora_alpha": 16})
    with torch.no_grad():
        base = model(IDS).logits
    expected = lora_forward_logits(model, IDS, factors, {name: user_scale * 16 / 4 for name in factors})
    records = merge_adapters(model, [LoraAdapter(str(adapter), user_scale)], "llama")
    with torch.no_grad():
        merged = model(IDS).logits
    assert _max_diff(expected, base) > 1.0  # the adapter moves the logits far
    assert _max_diff(merged, expected) < 1e-3
    assert records[0]["form"] == "peft"
    assert records[0]["rank"] == 4
    assert records[0]["scale"] == user_scale
    assert records[0]["modules"] == len(factors) == 14
    assert records[0]["file"] == "adapter_model.safetensors"
    assert len(records[0]["sha256"]) == 64


def test_rslora_rank_and_alpha_patterns_scale_each_module_as_peft(tmp_path):
    """use_rslora: alpha / sqrt(r); rank_pattern / alpha_pattern: per module, by PEFT's get_pattern_key (a regular
    expression the module name ends with after a dot, first key in order wins)."""
    model = tiny_llama(seed=4)
    factors = random_factors(model, rank=4, ranks={"layers.1.self_attn.q_proj": 2, "v_proj": 6})
    config = {"r": 4, "lora_alpha": 8, "use_rslora": True,
              "rank_pattern": {"model.layers.1.self_attn.q_proj": 2, "v_proj": 6},
              "alpha_pattern": {r"layers\.0\..*_proj": 3, "down_proj": 32}}

    def scaling(name):
        rank = 2 if name.endswith("layers.1.self_attn.q_proj") else 6 if name.endswith("v_proj") else 4
        alpha = 3 if name.startswith("model.layers.0.") else 32 if name.endswith("down_proj") else 8
        return alpha / math.sqrt(rank)

    adapter = write_peft(tmp_path / "adapter", factors, config)
    expected = lora_forward_logits(model, IDS, factors, {name: scaling(name) for name in factors})
    assert _max_diff(_merged_logits(model, [LoraAdapter(str(adapter))]), expected) < 1e-3


def test_adapter_named_keys_a_bin_file_and_fan_in_fan_out_merge_alike(tmp_path):
    """``.lora_A.default.weight`` keys and adapter_model.bin read as the plain ones; fan_in_fan_out does not
    transpose an nn.Linear's factors (PEFT sets it to False for nn.Linear targets)."""
    reference = tiny_llama(seed=5)
    factors = random_factors(reference, rank=3)
    expected = lora_forward_logits(reference, IDS, factors, {name: 8 / 3 for name in factors})
    for index, (kwargs, config) in enumerate([({"adapter_name": "default"}, {}), ({"file": "bin"}, {}),
                                              ({}, {"fan_in_fan_out": True})]):
        model = tiny_llama(seed=5)
        adapter = write_peft(tmp_path / f"adapter{index}", factors, {"r": 3, **config}, **kwargs)
        assert _max_diff(_merged_logits(model, [LoraAdapter(str(adapter))]), expected) < 1e-3


def test_modules_to_save_replace_the_output_layer_alone_of_a_tied_model(tmp_path):
    """modules_to_save: lm_head, in a model whose lm_head shares the embedding's weight: the fine-tuned model reads
    the saved head and keeps its embedding (PEFT wraps the module), so the two are untied, not both replaced."""
    for index, key in enumerate(["base_model.model.lm_head.modules_to_save.default.weight",
                                 "base_model.model.lm_head.weight"]):
        model = tiny_llama(seed=6)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        embedding = model.model.embed_tokens.weight.detach().clone()
        head = torch.randn_like(embedding)
        factors = random_factors(model, targets=("q_proj",), rank=2)
        reference = tiny_llama(seed=6)
        reference.lm_head.weight = torch.nn.Parameter(head.clone())
        expected = lora_forward_logits(reference, IDS, factors, {name: 4.0 for name in factors})
        adapter = write_peft(tmp_path / f"adapter{index}", factors, {"r": 2, "modules_to_save": ["lm_head"]},
                             extra={key: head})
        records = merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
        assert records[0]["replaced"] == ["lm_head.weight"]
        assert model.lm_head.weight is not model.model.embed_tokens.weight
        assert not model.config.tie_word_embeddings
        assert torch.equal(model.model.embed_tokens.weight, embedding)
        with torch.no_grad():
            assert _max_diff(model(IDS).logits, expected) < 1e-3


def test_an_embedding_lora_changes_the_embedding_and_not_the_tied_output_layer(tmp_path):
    model = tiny_llama(seed=7)
    generator = torch.Generator().manual_seed(2)
    embedding = {"model.embed_tokens": (torch.randn(3, 320, generator=generator),
                                        torch.randn(64, 3, generator=generator))}
    expected = lora_forward_logits(model, IDS, {}, {"model.embed_tokens": 2.0}, embedding=embedding)
    head = model.lm_head.weight.detach().clone()
    adapter = write_peft(tmp_path / "adapter", {}, {"r": 3, "lora_alpha": 6}, embedding=embedding)
    assert _max_diff(_merged_logits(model, [LoraAdapter(str(adapter))]), expected) < 1e-3
    assert torch.equal(model.lm_head.weight, head)


def test_two_adapters_add_their_products_in_turn(tmp_path):
    model = tiny_llama(seed=8)
    first, second = random_factors(model, rank=2, seed=1), random_factors(model, targets=("q_proj", "up_proj"), seed=9)
    one = write_peft(tmp_path / "one", first, {"r": 2, "lora_alpha": 2})
    two = write_peft(tmp_path / "two", second, {"r": 4, "lora_alpha": 8})
    expected_one = lora_forward_logits(model, IDS, first, {name: 0.5 for name in first})
    model_one = tiny_llama(seed=8)
    merge_adapters(model_one, [LoraAdapter(str(one), 0.5)], "llama")
    expected = lora_forward_logits(model_one, IDS, second, {name: 2.0 for name in second})
    assert _max_diff(expected, expected_one) > 0.1
    assert _max_diff(_merged_logits(model, [LoraAdapter(str(one), 0.5), LoraAdapter(str(two))]), expected) < 1e-3


def test_a_qwen2_adapter_with_saved_biases_merges(tmp_path):
    """A Qwen2-style model (q/k/v biases): LoRA on its projections, and bias 'all' saving the trained biases,
    which replace the base biases."""
    model = tiny_llama(seed=9, model_type="qwen2")
    factors = random_factors(model, rank=4)
    bias = torch.randn(model.model.layers[0].self_attn.q_proj.out_features)
    reference = tiny_llama(seed=9, model_type="qwen2")
    with torch.no_grad():
        reference.model.layers[0].self_attn.q_proj.bias.copy_(bias)
    expected = lora_forward_logits(reference, IDS, factors, {name: 2.0 for name in factors})
    adapter = write_peft(tmp_path / "adapter", factors, {"bias": "all"},
                         extra={"base_model.model.model.layers.0.self_attn.q_proj.bias": bias})
    assert _max_diff(_merged_logits(model, [LoraAdapter(str(adapter))], "qwen2"), expected) < 1e-3


def _refused(tmp_path, factors=None, config=None, extra=None, model=None, embedding=None) -> ModelSourceError:
    model = model or tiny_llama(seed=10)
    factors = random_factors(model, targets=("q_proj",), rank=4) if factors is None else factors
    adapter = write_peft(tmp_path / "adapter", factors, config, extra=extra, embedding=embedding)
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert f"--lora {adapter}" in refused.value.problem
    assert refused.value.fix
    return refused.value


@pytest.mark.parametrize(("config", "named"), [
    ({"use_dora": True}, "use_dora: true"),
    ({"peft_type": "IA3"}, "peft_type 'IA3'"),
    ({"lora_bias": True}, "lora_bias: true"),
    ({"init_lora_weights": "pissa_niter_4"}, "init_lora_weights 'pissa_niter_4'"),
    ({"layer_replication": [[0, 2], [1, 2]]}, "layer_replication"),
    ({"r": 0}, "r 0"),
])
def test_options_edgesdk_does_not_merge_are_refused_by_name(tmp_path, config, named):
    refused = _refused(tmp_path, config=config)
    assert named in refused.problem
    assert "merge_and_unload" in refused.fix or "positive number" in refused.problem


def test_a_factor_of_another_shape_is_refused_naming_key_shapes_and_base(tmp_path):
    model = tiny_llama(seed=10)
    wide = {"model.layers.0.self_attn.q_proj": (torch.randn(4, 96), torch.randn(64, 4))}  # a model 96 wide
    refused = _refused(tmp_path, factors=wide, model=model)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has shape (4, 96)" in refused.problem
    assert "takes (4, 64)" in refused.problem
    assert "HuggingFaceTB/SmolLM2-135M" in refused.fix


def test_a_rank_other_than_the_config_gives_is_refused(tmp_path):
    refused = _refused(tmp_path, config={"r": 8})
    assert "with rank 8" in refused.problem
    assert "has shape (4, 64)" in refused.problem


def test_factors_on_a_module_that_is_no_linear_or_absent_or_unpaired_are_refused(tmp_path):
    norm = {"model.layers.0.input_layernorm": (torch.randn(4, 64), torch.randn(64, 4))}
    assert "LlamaRMSNorm" in _refused(tmp_path / "a", factors=norm).problem
    absent = {"model.layers.7.self_attn.q_proj": (torch.randn(4, 64), torch.randn(64, 4))}
    assert "module 'model.layers.7.self_attn.q_proj' the model has not" in _refused(tmp_path / "b", factors=absent).problem
    model = tiny_llama(seed=10)
    lone = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 64)}
    refused = _refused(tmp_path / "c", factors={}, extra=lone, model=model)
    assert "but not base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight" in refused.problem
    stray = {"base_model.model.model.norm.weight": torch.ones(64)}
    refused = _refused(tmp_path / "d", extra=stray)
    assert "base_model.model.model.norm.weight, which is neither a LoRA factor" in refused.problem


def test_a_scale_that_is_not_finite_and_paths_that_are_no_adapter_are_refused(tmp_path, tiny_model_dir):
    model = tiny_llama(seed=10)
    adapter = write_peft(tmp_path / "adapter", random_factors(model, targets=("q_proj",)))
    cases = [(LoraAdapter(str(adapter), float("nan")), "the scale is not a finite number"),
             (LoraAdapter(str(tmp_path / "none")), "no such file or directory"),
             (LoraAdapter(str(tiny_model_dir)), "is a whole model (config.json), not a LoRA adapter"),
             (LoraAdapter(str(adapter / "adapter_config.json")), "the file is the adapter_config.json of the PEFT "
              f"adapter directory {adapter}"),
             (LoraAdapter(str(tmp_path / "adapter.txt")), "the file is not GGUF")]
    (tmp_path / "adapter.txt").write_text("not an adapter")
    for spec, named in cases:
        with pytest.raises(ModelSourceError, match="--lora") as refused:
            merge_adapters(model, [spec], "llama")
        assert named in refused.value.problem


def test_a_peft_adapter_directory_given_as_the_model_names_its_base_and_lora(tmp_path):
    from edgesdk.models.sources import resolve_model

    adapter = write_peft(tmp_path / "adapter", random_factors(tiny_llama(), targets=("q_proj",)))
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(adapter))
    assert "is a PEFT LoRA adapter" in refused.value.problem
    assert "HuggingFaceTB/SmolLM2-135M" in refused.value.problem
    assert f"--model HuggingFaceTB/SmolLM2-135M --lora {adapter}" in refused.value.fix
