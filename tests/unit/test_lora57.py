"""Review 57: an adapter given with --lora-scaled is named by that option in errors; recipe and profile files read
numbers as --set reads them (YAML 1.2's core schema)."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from edgesdk.build.recipes import _override_value, load_recipe
from edgesdk.cli import main
from edgesdk.errors import ModelSourceError
from edgesdk.models.lora import LoraAdapter, check_adapter
from edgesdk.profile import load_yaml_unique


def _peft_files(directory):
    """An adapter directory's two files as PEFT writes them (the weights' content is never read by the checks)."""
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    (directory / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return directory


def test_a_scaled_adapter_is_named_by_lora_scaled_with_its_scale(tmp_path):
    """`edgesdk build --lora-scaled MISSING 0.5` was refused as '--lora MISSING: no such file or directory', an option
    the user never typed; the refusal now names the option, the path and the scale as given."""
    missing = tmp_path / "no-adapter"
    result = CliRunner().invoke(main, ["build", "--target", "host", "--lora-scaled", str(missing), "0.5",
                                       "--out", str(tmp_path / "bundle")])
    assert result.exit_code != 0
    assert f"--lora-scaled {missing} 0.5: no such file or directory" in result.output
    assert f"--lora {missing}" not in result.output


def test_a_lora_adapter_is_still_named_by_lora(tmp_path):
    missing = tmp_path / "no-adapter"
    result = CliRunner().invoke(main, ["build", "--target", "host", "--lora", str(missing),
                                       "--out", str(tmp_path / "bundle")])
    assert result.exit_code != 0
    assert f"--lora {missing}: no such file or directory" in result.output


def test_the_fix_for_a_scaled_peft_weights_file_keeps_the_option_and_scale(tmp_path):
    """--lora-scaled DIR/adapter_model.safetensors 0.25 was told to pass the directory 'with --lora', which drops the
    scale the user chose; the fix now passes the directory with --lora-scaled and that scale."""
    adapter = _peft_files(tmp_path / "my adapter")
    given = LoraAdapter(str(adapter / "adapter_model.safetensors"), 0.25, option="--lora-scaled")
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(given)
    assert refused.value.problem.startswith(f"--lora-scaled {adapter / 'adapter_model.safetensors'} 0.25: ")
    assert refused.value.fix == f"pass the adapter's directory: --lora-scaled {shlex.quote(str(adapter))} 0.25"
    assert check_adapter(LoraAdapter(str(adapter), 0.25, option="--lora-scaled")) == "peft"


def test_the_option_is_not_part_of_the_adapters_identity():
    """The build key and the manifest compare adapters by path and scale: --lora-scaled A 1 is --lora A."""
    assert LoraAdapter("a", 1.0, option="--lora-scaled") == LoraAdapter("a")
    assert LoraAdapter("a").named == "--lora a"
    assert LoraAdapter("a", 2.0, option="--lora-scaled").named == "--lora-scaled a 2"


@pytest.mark.parametrize("text", ["1e3", "2e-4", "+1e3", "1.5e3", "-.5", ".5e3", "010", "-010", "019", "0o17",
                                  "1:00", "12:30:00", "0x1F", "0b11", "1_000", "10", "1.0", ".inf", "1e"])
def test_a_file_reads_a_number_as_set_reads_it(text):
    """PyYAML's YAML 1.1 read `steps: 1e3` in a recipe file as the text '1e3' (refused), 010 as octal 8 and 1:00 as
    60, where `--set qat.steps=1e3` (YAML 1.2's core schema) gave 1000.0, 10 and '1:00'."""
    read = load_yaml_unique(f"value: {text}\n")["value"]
    expected = _override_value(text)
    assert (type(read), read) == (type(expected), expected)


def test_a_recipe_file_takes_steps_in_exponent_form(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nstages:\n  - stage: qat\n    config: {weight_bits: 8, steps: 1e3}\n"
                      "export:\n  form: ort-fused\n  weights: int8\n  block_size: 32\n")
    loaded = load_recipe(str(recipe))
    assert loaded.stages[0].config["steps"] == 1000
    recipe.write_text(recipe.read_text().replace("steps: 1e3", "steps: 010"))
    assert load_recipe(str(recipe)).stages[0].config["steps"] == 10


def test_a_scaled_hub_cache_entry_with_several_snapshots_is_told_to_pass_one_with_its_scale(tmp_path):
    """--lora-scaled ENTRY 0.5 of a cache entry with two snapshots and no refs/main was told 'pass one snapshot
    directory with --lora, e.g. --lora .../snapshots/aaa', which drops the scale."""
    entry = tmp_path / "models--org--adapter"
    for name in ("aaa", "bbb"):
        (entry / "snapshots" / name).mkdir(parents=True)
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(entry), 0.5, option="--lora-scaled"))
    assert refused.value.fix == (f"pass one snapshot directory with --lora-scaled, e.g. --lora-scaled "
                                 f"{entry / 'snapshots' / 'aaa'} 0.5")
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(entry)))
    assert refused.value.fix == f"pass one snapshot directory with --lora, e.g. --lora {entry / 'snapshots' / 'aaa'}"


def test_a_whole_model_given_with_lora_scaled_is_told_to_pass_the_adapter_with_lora_scaled(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(model), 0.5, option="--lora-scaled"))
    assert refused.value.fix.endswith("with --lora-scaled")
    assert "--lora " not in refused.value.fix


def test_the_arrow_router_given_with_lora_scaled_names_its_task_adapter_with_the_scale(tmp_path):
    from edgesdk.models.lora import _peft_config

    task = _peft_files(tmp_path / "task_0")
    router = tmp_path / "arrow_router"
    router.mkdir()
    (router / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "arrow_config": {"task_adapter_names": ["task_0"]}}))
    with pytest.raises(ModelSourceError) as refused:
        _peft_config(LoraAdapter(str(router), 0.5, option="--lora-scaled"), router)
    assert refused.value.fix == ("pass the task adapter of the task the bundle is for with --lora-scaled, e.g. "
                                 f"--lora-scaled {task} 0.5")
