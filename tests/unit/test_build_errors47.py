"""Bad user input to a build (a model directory, a GGUF file, a LoRA adapter, a recipe setting) refused with an
EdgeSDKError that names the thing, the value, what was expected and the fix, not a bare Python or torch exception
(review 47). Messages are matched on their parts that hold no path."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import BuildContext, make_config  # noqa: E402
from edgesdk.errors import BuildError, ModelSourceError  # noqa: E402


@pytest.fixture
def model_dir(tiny_model_dir, tmp_path):
    """A copy of the tiny model directory that a test may damage."""
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def _load(directory):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(directory), fetch=False, progress=False), progress=False)


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            config.pop(key)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def test_weights_of_other_shapes_than_config_json_makes_name_the_tensor_both_shapes_and_the_sizes(model_dir):
    """intermediate_size 999 over weights of 112: transformers' error was "You set `ignore_mismatched_sizes` to
    `False`, thus raising an error. For details look at the above report!", naming no tensor and no size."""
    _edit_config(model_dir, intermediate_size=999)
    with pytest.raises(ModelSourceError) as refused:
        _load(model_dir)
    message = refused.value.problem
    assert "ignore_mismatched_sizes" not in message
    assert "do not fit its config.json" in message
    assert "mlp.down_proj.weight is [64, 112] in model.safetensors, but config.json makes it [64, 999]" in message
    assert "intermediate_size 999" in message
    assert "use the config.json that came with these weights" in refused.value.fix


def test_a_size_missing_from_config_json_is_named_as_the_default_taken(model_dir):
    _edit_config(model_dir, hidden_size=...)  # LlamaConfig's default, 4096, stands
    with pytest.raises(ModelSourceError) as refused:
        _load(model_dir)
    assert "hidden_size 4096 (not in config.json: the default)" in refused.value.problem
    assert "model.embed_tokens.weight is [320, 64] in model.safetensors, but config.json makes it [320, 4096]" \
        in refused.value.problem


def test_a_config_json_size_of_the_wrong_type_names_the_field_value_and_type(model_dir):
    _edit_config(model_dir, hidden_size="64")
    with pytest.raises(ModelSourceError) as refused:
        _load(model_dir)
    assert "gives hidden_size '64' (a str), expected int" in refused.value.problem
    assert "StrictDataclassFieldValidationError" not in str(refused.value)
    assert refused.value.fix.startswith("set hidden_size in config.json to a value of type int")


def test_a_config_json_that_is_no_object_says_what_it_holds(model_dir):
    """It was transformers' "Unrecognized model in DIR. Should have a `model_type` key in its config.json"."""
    (model_dir / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelSourceError) as refused:
        _load(model_dir)
    assert "config.json holds a JSON list, expected an object of the model's settings" in refused.value.problem
    assert "Unrecognized model" not in refused.value.problem


@pytest.mark.parametrize(("rope", "said"), [
    ({"rope_theta": "abc"}, "gives rope_parameters.rope_theta 'abc', expected a number > 0"),  # was a TypeError
    ({"rope_type": "weird"}, "gives rope_parameters.rope_type 'weird', which transformers does not know; expected "
                             "one of default, linear"),  # was "KeyError: 'weird'"
])
def test_rotary_settings_transformers_cannot_build_are_named_not_blamed_on_the_weights(model_dir, rope, said):
    """Both failed while the weights loaded and were reported as "cannot load the weights of ..." with the fix
    "download them again"."""
    config = json.loads((model_dir / "config.json").read_text())
    _edit_config(model_dir, rope_parameters={**config["rope_parameters"], **rope})
    with pytest.raises(ModelSourceError) as refused:
        _load(model_dir)
    assert said in refused.value.problem
    assert "cannot load the weights" not in refused.value.problem
    assert "use the config.json that came with the model" in refused.value.fix


@pytest.mark.parametrize(("content", "said"), [
    ('{"version": "1.0"}', "its tokenizer.json lacks the key(s) model, added_tokens"),  # was KeyError: 'added_tokens'
    ("[1]", "its tokenizer.json holds a JSON list, expected an object of keys"),  # was a TypeError
    ('{"model": {', "its tokenizer.json is not readable JSON"),  # a truncated file: which file was not said
])
def test_a_damaged_tokenizer_json_is_named(model_dir, content, said):
    (model_dir / "tokenizer.json").write_text(content)
    with pytest.raises(ModelSourceError) as refused:
        _load(model_dir)
    assert said in refused.value.problem
    assert "tokenizer.json" in refused.value.fix


def test_a_truncated_gguf_file_says_its_size_and_that_it_is_cut_short(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    from edgesdk.models.loader import check_gguf_model

    whole = tmp_path / "whole.gguf"
    writer = GGUFWriter(str(whole), "llama")
    writer.add_tensor("token_embd.weight", np.ones((64, 112), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ModelSourceError) as refused:
        check_gguf_model(cut)
    size = f"({cut.stat().st_size:,} bytes)"
    assert size in refused.value.problem
    assert "truncated or damaged download" in refused.value.problem
    assert "download it again" in refused.value.fix


def _context(tmp_path, teacher, block: int = 32):
    profile = SimpleNamespace(name="myboard", sparsity_block=block)
    return BuildContext(profile=profile, work_dir=tmp_path, teacher=teacher, progress=False)


def test_a_soft_prompt_past_the_models_positions_is_refused_before_training(tmp_path):
    """distill.soft_prompt_tokens=100000: the teacher's attention mask asked for 40 GB and torch failed with
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] ... can't allocate memory", a traceback."""
    from edgesdk.compress.distill import distill_stage
    from tests._utils.tiny import tiny_llama

    teacher, student = tiny_llama(max_positions=512), tiny_llama(max_positions=512)
    config = make_config("distill", {"soft_prompt_tokens": 100000, "sequence_length": 32, "steps": 1})
    with pytest.raises(BuildError) as refused:
        distill_stage(student, config, _context(tmp_path, teacher))
    assert "distill.soft_prompt_tokens is 100000" in refused.value.problem
    assert "100032 positions, more than the model's max_position_embeddings 512" in refused.value.problem
    assert "--set distill.soft_prompt_tokens=480 or less" in refused.value.fix


@pytest.mark.parametrize(("setting", "block", "said"), [
    ({"block_size": 100000}, 32, "sparsify.block_size is 100000"),
    ({}, 4096, "the target profile myboard's sparsity_block is 4096 (no sparsify.block_size set)"),
])
def test_a_sparsity_block_larger_than_a_weight_is_refused_before_calibration(tmp_path, setting, block, said):
    """sparsify.block_size=100000 padded every weight to 100,000 x 100,000: a torch out-of-memory RuntimeError."""
    from edgesdk.compress.sparsify import sparsify_stage
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(hidden=64, heads=4, kv_heads=2)  # q_proj 64 x 64: the first weight of the shortest long side
    config = make_config("sparsify", {**setting, "calibration_batches": 1, "sequence_length": 16})
    with pytest.raises(BuildError) as refused:
        sparsify_stage(model, config, _context(tmp_path, None, block))
    assert said in refused.value.problem
    assert "decoder weight model.layers.0.self_attn.q_proj is 64x64, so one block" in refused.value.problem
    assert "the block edge must be below 64" in refused.value.problem
    assert "--set sparsify.block_size=32 or less" in refused.value.fix


def _peft(tmp_path, config: dict | None = None, nan: bool = False):
    from tests._utils.tiny import tiny_llama
    from tests.unit._lora_files41 import random_factors, write_peft

    model = tiny_llama()
    factors = random_factors(model, rank=4)
    if nan:
        factors = {name: (a * float("nan"), b) for name, (a, b) in factors.items()}
    return model, write_peft(tmp_path / "adapter", factors, config=config)


@pytest.mark.parametrize(("config", "said"), [
    ({"rank_pattern": {"q_proj": "abc"}}, "gives rank_pattern['q_proj'] \"abc\", expected a whole number >= 1"),
    ({"alpha_pattern": {"q_proj": None}}, "gives alpha_pattern['q_proj'] null, expected a finite number > 0"),
    ({"rank_pattern": [1, 2]}, "gives rank_pattern [1, 2], expected a JSON object of module name patterns"),
    ({"rank_pattern": {"q_proj": 0}}, "gives rank_pattern['q_proj'] 0, expected a whole number >= 1"),
    ({"alpha_pattern": {"q_proj": -3}}, "gives alpha_pattern['q_proj'] -3, expected a finite number > 0"),
    ({"r": 4.5}, "gives r 4.5, expected a whole number >= 1"),
])
def test_a_lora_config_pattern_of_the_wrong_type_is_named(tmp_path, config, said):
    """A text rank_pattern value was a bare ValueError from int(), a null alpha a TypeError from float(), a list
    an AttributeError; a rank of 0 blamed the base model, a negative alpha merged the update negated."""
    from edgesdk.models.lora import LoraAdapter, merge_adapters

    model, adapter = _peft(tmp_path, config)
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert said in refused.value.problem
    assert "adapter_config.json PEFT wrote" in refused.value.fix


def test_lora_factors_holding_nan_are_refused_naming_the_tensor(tmp_path):
    """Merged, they made the logits NaN, which the export's check blamed on a compression stage."""
    from edgesdk.models.lora import LoraAdapter, merge_adapters

    model, adapter = _peft(tmp_path, nan=True)
    before = model.model.layers[0].mlp.down_proj.weight.clone()
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert "lora_A.weight holds 448 NaN or infinite value(s) of 448" in refused.value.problem
    assert "did not diverge" in refused.value.fix
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, before)  # nothing merged


@pytest.mark.parametrize(("option", "value", "said"), [
    ("rank", 0, "rank=0: the adapters' bottleneck width must be at least 1; set power.rank to 1 or more"),
    ("max_fraction", 1, "max_fraction=1.0: the adapters' largest share of the model must be in (0, 0.05]"),
    ("tau_train", 2, "tau_train=2.0: the gates' threshold must be in (0, 1)"),
    ("budget", 0, "budget=0.0: the executed-FFN fraction allowed must be in (0, 1]"),
    ("rollout", 0, "rollout=0: the continuations sampled per round must be at least 1"),
    ("new_tokens", 1, "new_tokens=1: the tokens per continuation must be at least 8 (one entropy window)"),
])
def test_power_settings_out_of_range_name_the_setting_and_value(option, value, said):
    """These said "rank >= 1 and 0 < max_fraction <= 0.05 are required" whichever of the two was wrong."""
    with pytest.raises(BuildError) as refused:
        make_config("power", {option: value})
    assert said in refused.value.problem


def test_a_list_setting_of_the_wrong_type_names_the_item_type_and_the_yaml_list_form():
    """smooth.sites=qkv said "not a valid tuple", the fix "--set smooth.sites=<tuple>"."""
    with pytest.raises(BuildError) as refused:
        make_config("smooth", {"sites": "qkv"})
    assert "sites='qkv' is not a valid tuple[str, ...]" in refused.value.problem
    assert "--set 'smooth.sites=[...]'" in refused.value.fix


@pytest.mark.parametrize(("alpha", "fields", "nan", "said"), [
    (None, {"adapter.lora.alpha": ("8", "STRING")}, False, "adapter.lora.alpha is '8', expected a finite number >= 0"),
    (8, None, True, "blk.0.ffn_down.weight.lora_a holds 448 NaN or infinite value(s) of 448"),
])
def test_a_gguf_lora_adapter_with_a_text_alpha_or_nan_factors_is_named(tmp_path, alpha, fields, nan, said):
    """A text adapter.lora.alpha was a bare ValueError from float(); NaN factors made the merged model's logits NaN."""
    import gguf
    import numpy as np

    from edgesdk.models.lora import LoraAdapter, merge_adapters
    from tests._utils.tiny import tiny_llama
    from tests.unit._lora_files41 import write_gguf_adapter

    model = tiny_llama()
    down = model.model.layers[0].mlp.down_proj
    a = np.full((4, down.in_features), float("nan") if nan else 0.1, dtype=np.float32)
    b = np.full((down.out_features, 4), 0.1, dtype=np.float32)
    typed = {key: (value, getattr(gguf.GGUFValueType, kind)) for key, (value, kind) in (fields or {}).items()}
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "llama", {"blk.0.ffn_down.weight": (a, b)}, alpha, typed)
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert said in refused.value.problem
