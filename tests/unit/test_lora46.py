"""PEFT adapter options checked against PEFT 0.21 (peft/tuners/lora): LoRA-GA's changed base refused, the factors of
two adapters in one file refused, block-diagonal LoRA (use_bdlora) merged with its blocks put on the diagonal,
VeLoRA / MonteCLoRA's training-only state left out of the merge, KaSA refused by name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, merge_adapters  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit._lora_files41 import lora_forward_logits, random_factors, write_peft  # noqa: E402

IDS = torch.tensor([[5, 17, 101, 3, 250, 42, 7, 99, 12, 1]])


def _merged_logits(model, adapter):
    merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    with torch.no_grad():
        return model(IDS).logits


def _refused(model, adapter) -> ModelSourceError:
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert f"--lora {adapter}" in refused.value.problem
    return refused.value


def test_a_lora_ga_adapter_is_refused_and_told_to_convert(tmp_path):
    """PEFT's LoRA-GA (init_lora_weights "lora_ga") subtracts scaling * B0 @ A0 from the base weights when the adapter
    is made (LoraLayer.lora_ga_init), so the saved factors are relative to that changed base: merged into the base
    they give another model. PEFT's save_pretrained(path_initial_model_for_weight_conversion=...) converts it."""
    model = tiny_llama(seed=21)
    weights = {name: value.detach().clone() for name, value in model.state_dict().items()}
    adapter = write_peft(tmp_path / "adapter", random_factors(model, targets=("q_proj",), rank=2),
                         {"r": 2, "init_lora_weights": "lora_ga", "lora_ga_config": {"direction": "ArB2r"}})
    refused = _refused(model, adapter)
    assert "init_lora_weights 'lora_ga'" in refused.problem
    assert "path_initial_model_for_weight_conversion" in refused.fix
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())


def test_the_factors_of_two_adapters_in_one_file_are_refused_not_one_dropped(tmp_path):
    """A state dict holding ``lora_A.<name>.weight`` of two adapters for one module (a PeftModel's whole state_dict
    with two adapters loaded) gave each module the factors read last: one adapter was dropped without a word."""
    model = tiny_llama(seed=22)
    first = random_factors(model, targets=("q_proj",), rank=2, seed=1)
    second = random_factors(model, targets=("q_proj",), rank=2, seed=2)
    extra = {}
    for name, (a, b) in second.items():
        extra[f"base_model.model.{name}.lora_A.other.weight"] = a
        extra[f"base_model.model.{name}.lora_B.other.weight"] = b
    adapter = write_peft(tmp_path / "adapter", first, {"r": 2}, adapter_name="default", extra=extra)
    refused = _refused(model, adapter)
    assert "two lora_A factors of 'model.layers.0.self_attn.q_proj'" in refused.problem
    assert "lora_A.default.weight" in refused.problem
    assert "lora_A.other.weight" in refused.problem
    assert "selected_adapters" in refused.fix


def test_a_block_diagonal_lora_merges_with_its_blocks_on_the_diagonal(tmp_path):
    """use_bdlora (PEFT's BdLoraLinearVariant): a module matching target_modules_bd_a stores A's nblocks diagonal
    blocks stacked, (r, in / nblocks), one matching target_modules_bd_b B's, (out, r / nblocks); PEFT merges
    block_diag of their row chunks. They were refused as factors of the wrong shape, naming the base model."""
    model = tiny_llama(seed=23)
    blocks, rank = 2, 4
    generator = torch.Generator().manual_seed(5)
    stored, full = {}, {}
    for name, module in model.named_modules():
        if name.endswith(("q_proj", "o_proj")):
            if name.endswith("q_proj"):  # A block-diagonal, B dense
                a = torch.randn(rank, module.in_features // blocks, generator=generator) * 0.3
                b = torch.randn(module.out_features, rank, generator=generator) * 0.3
                full[name] = (torch.block_diag(*torch.chunk(a, blocks, dim=0)), b)
            else:  # A dense, B block-diagonal
                a = torch.randn(rank, module.in_features, generator=generator) * 0.3
                b = torch.randn(module.out_features, rank // blocks, generator=generator) * 0.3
                full[name] = (a, torch.block_diag(*torch.chunk(b, blocks, dim=0)))
            stored[name] = (a, b)
    assert full["model.layers.0.self_attn.q_proj"][0].shape == (rank, 64)
    assert full["model.layers.0.self_attn.o_proj"][1].shape == (64, rank)
    settings = {"target_modules_bd_a": ["q_proj"], "target_modules_bd_b": ["o_proj"], "nblocks": blocks,
                "match_strict": True}
    adapter = write_peft(tmp_path / "adapter", stored, {"r": rank, "lora_alpha": 8, "use_bdlora": settings})
    with torch.no_grad():
        base = model(IDS).logits
    expected = lora_forward_logits(model, IDS, full, {name: 8 / rank for name in full})
    merged = _merged_logits(model, adapter)
    assert float((expected - base).abs().max()) > 1.0
    assert float((merged - expected).abs().max()) < 1e-3


def test_velora_and_monteclora_training_state_is_left_out_and_the_factors_merge(tmp_path):
    """VeLoRA's lora_velora_embed buffer and MonteCLoRA's lora_monteclora_sampler parameters are read only while
    training (their inference forward and merge are B @ A * scaling); the adapters were refused for holding them."""
    reference = tiny_llama(seed=24)
    factors = random_factors(reference, targets=("q_proj", "v_proj"), rank=2)
    expected = lora_forward_logits(reference, IDS, factors, {name: 8 / 2 for name in factors})
    cases = [({"velora_config": {"num_groups": 64, "scale": 1.0, "init_type": "batch_average"}},
              {".lora_velora_embed": torch.zeros(1)}),
             ({"monteclora_config": {"num_samples": 8, "use_entropy": False}},
              {".lora_monteclora_sampler.expert_weights": torch.ones(8),
               ".lora_monteclora_sampler.gaussian_var_prior": torch.ones(2, 2)})]
    for index, (config, state) in enumerate(cases):
        extra = {f"base_model.model.{name}{suffix}": value.clone() for name in factors
                 for suffix, value in state.items()}
        adapter = write_peft(tmp_path / f"adapter{index}", factors, {"r": 2, **config}, extra=extra)
        merged = _merged_logits(tiny_llama(seed=24), adapter)
        assert float((merged - expected).abs().max()) < 1e-3
        # the same state without the option that adds it is no part of a LoRA adapter: still refused
        bare = write_peft(tmp_path / f"bare{index}", factors, {"r": 2}, extra=extra)
        assert "neither a LoRA factor" in _refused(tiny_llama(seed=24), bare).problem


def test_a_kasa_adapter_is_refused_by_its_option(tmp_path):
    """KaSA (kasa_config) truncates the base weight's smallest singular components and puts a learned diagonal
    between B and A: it was refused only for its lora_diag key, as if the file were no PEFT adapter."""
    model = tiny_llama(seed=25)
    factors = random_factors(model, targets=("q_proj",), rank=2)
    extra = {f"base_model.model.{name}.lora_diag": torch.ones(2) for name in factors}
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 2, "kasa_config": {"beta": 1e-4, "gamma": 1e-3}},
                         extra=extra)
    refused = _refused(model, adapter)
    assert "kasa_config" in refused.problem
    assert "KaSA" in refused.problem
    assert "merge_and_unload" in refused.fix
