"""Review of 55 (a): the model_type named for a config.json without one where transformers maps several model types
to its class, the ``gpu.sm`` suggestion for small or negative values and a whole float, the memory-budget words for
a board whose profile could not be loaded."""

from __future__ import annotations

import json

import pytest
import yaml

from edgesdk.errors import ModelSourceError, ProfileError
from edgesdk.profile import get_profile, parse_profile

NO_MODEL_TYPE = ValueError("Unrecognized model in DIR. Should have a `model_type` key in its config.json")


def _refusal(tmp_path, architectures: list[str]) -> ModelSourceError:
    from edgesdk.models.loader import _explain_missing_model_type

    (tmp_path / "config.json").write_text(json.dumps({"architectures": architectures}))
    with pytest.raises(ModelSourceError) as caught:
        _explain_missing_model_type(tmp_path, NO_MODEL_TYPE)
    return caught.value


# ---------------------------------------------------------------------------------------- config.json: model_type
@pytest.mark.parametrize(("architecture", "model_type"), [
    ("DeepseekV3ForCausalLM", "deepseek_v3"),  # sarvam_mla maps to it as well (transformers 5.25)
    ("Llama4ForCausalLM", "llama4_text"),  # its own config, not the multimodal llama4 its Config prefix names
    ("Glm4MoeForCausalLM", "glm4_moe"),  # param2moe, sarvam_moe as well
    ("LlamaForCausalLM", "llama"),  # exaone, internlm3, iquestcoder as well
    ("GPT2LMHeadModel", "gpt2"),  # gpt-sw3 as well, whose config class is GPT2Config too
    ("Qwen2ForCausalLM", "qwen2"),  # the only one
])
def test_a_class_several_model_types_share_is_told_its_own_model_type(tmp_path, architecture, model_type):
    """The model type kept was the last one transformers maps to the class: 'add "model_type": "sarvam_mla"' for a
    DeepSeek-V3 config, "sarvam_moe" for a GLM-4 MoE one."""
    refusal = _refusal(tmp_path, [architecture])
    assert refusal.fix.startswith(f'add "model_type": "{model_type}" to config.json (the model_type of '
                                  f"{architecture},")


def test_a_class_shared_by_model_types_none_of_them_its_own_gets_the_generic_fix(tmp_path, monkeypatch):
    from transformers.models.auto import modeling_auto

    monkeypatch.setitem(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "acme_one", "ZorbForCausalLM")
    monkeypatch.setitem(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "acme_two", "ZorbForCausalLM")
    refusal = _refusal(tmp_path, ["ZorbForCausalLM"])
    assert "ZorbForCausalLM" in refusal.problem
    assert refusal.fix.startswith('add the model\'s "model_type" to config.json')
    assert "acme" not in refusal.fix


def test_a_deepseek_v3_config_without_model_type_is_told_deepseek_v3_on_load(tmp_path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    directory = tmp_path / "handmade"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    (directory / "model.safetensors").write_bytes(b"unused: the config is read first")
    with pytest.raises(ModelSourceError) as caught:
        load_model(resolve_model(str(directory)), progress=False)
    assert caught.value.fix.startswith('add "model_type": "deepseek_v3" to config.json')
    assert "sarvam" not in caught.value.fix


# ---------------------------------------------------------------------------------------------------- gpu.sm
def _with_sm(sm) -> str:
    data = get_profile("orin-nano-8gb").summary()
    data["gpu"]["sm"] = sm
    return yaml.safe_dump(data)


@pytest.mark.parametrize("written", [0, -1, 2, 2.5, 0.5, 29, 30.5, 12.99, float("nan"), float("inf")])
def test_sm_whose_tenfold_is_no_compute_capability_is_told_the_range_not_a_number(written):
    """``sm: 0`` was told to write 0, ``-1`` -10, ``2`` 20 (then refused as below 30), ``2.5`` 25, ``0.5`` 5."""
    with pytest.raises(ProfileError) as info:
        parse_profile(_with_sm(written), "sm.yaml")
    assert f"got {written!r}; write a whole number of at least 30 (" in str(info.value)


@pytest.mark.parametrize(("written", "fix"), [(8.7, "write 87 ("), (8, "write 80 ("), (8.0, "write 80 ("),
                                              (3, "write 30 ("), (12.0, "write 120 (")])
def test_sm_written_as_the_version_is_still_told_the_integer(written, fix: str):
    with pytest.raises(ProfileError) as info:
        parse_profile(_with_sm(written), "sm.yaml")
    assert f"got {written!r}; {fix}" in str(info.value)


@pytest.mark.parametrize("written", [87.0, 80.0, 110.0])
def test_sm_written_as_a_whole_float_loads_as_that_integer(written):
    """``sm: 87.0`` loaded as 87 before the check of the version form, which then refused it."""
    profile = parse_profile(_with_sm(written), "sm.yaml")
    assert profile.gpu.sm == int(written)
    assert type(profile.gpu.sm) is int


# ------------------------------------------------------------------------------------------ memory budget words
def test_a_board_whose_profile_cannot_be_loaded_is_not_told_it_matches_none(monkeypatch):
    """The board matches orin-nx-16gb, but get_profile raised ProfileError (suppressed): the budget falls back to the
    bundle's profile's, and the words said "the board matches no shipped profile"."""
    from edgesdk.deploy import orchestrate
    from edgesdk.deploy.probe import BoardFacts
    from tests.unit.test_deploy_checks import ORIN

    manifest = {"target": get_profile("rpi5").summary()}
    orin = BoardFacts.from_probe(ORIN)
    assert orin.board.suggested_target == "orin-nx-16gb"

    def unloadable(name: str):
        raise ProfileError(f"profile {name!r} does not match the schema")

    monkeypatch.setattr("edgesdk.profile.get_profile", unloadable)
    budget, basis = orchestrate._budget_mb(manifest, orin)
    assert budget == manifest["target"]["memory_budget_mb"]
    assert basis == (f"the {budget} MB memory budget of the bundle's target profile 'rpi5' (the board's profile "
                     "'orin-nx-16gb' could not be loaded)")
    assert "matches no shipped profile" not in basis
