"""Build configuration (review 59): a shipped target's name in another case (--target RPI5, Orin-NX) is that target,
and a misspelled target, recipe, stage, stage option or export key is refused naming the one closest to it, with an
override's fix the override it meant."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.api import build_bundle
from edgesdk.build.pipeline import BuildConfig, build
from edgesdk.build.recipes import load_recipe
from edgesdk.build.registry import check_order, make_config
from edgesdk.cli import main
from edgesdk.errors import BuildError, ProfileError
from edgesdk.profile import get_profile


@pytest.mark.parametrize(("given", "canonical"), [("RPI5", "rpi5"), ("Orin-NX", get_profile("orin-nx").name),
                                                  ("AGX-Orin-64GB", "agx-orin-64gb")])
def test_a_target_name_in_another_case_is_that_target(given, canonical):
    """NVIDIA and the Raspberry Pi foundation write the boards 'Orin NX' and 'Pi 5'; --target RPI5 was refused as an
    unknown target, listing rpi5 among the known ones. Each shipped name and alias is matched in any case."""
    assert get_profile(given).name == canonical
    assert get_profile(given, "python").name == canonical


def test_targets_show_takes_a_name_in_another_case():
    result = CliRunner().invoke(main, ["targets", "show", "RPI5"])
    assert result.exit_code == 0, result.output
    assert "name: rpi5" in result.output


def test_an_unknown_target_names_the_closest_one():
    with pytest.raises(ProfileError, match=r"unknown target 'rpi6'; known targets: .*; did you mean 'rpi5'\?"):
        get_profile("rpi6")
    with pytest.raises(ProfileError) as refused:  # nothing close: no guess
        get_profile("jetson-tx2")
    assert "did you mean" not in refused.value.problem


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_a_build_for_a_target_in_another_case_reaches_its_recipe(tmp_path, terms):
    """End to end, before any model is looked for: --target RPI5 resolves to rpi5 and its default recipe, whose
    misspelled stage in an override is then refused with the override it meant."""
    missing = str(tmp_path / "no-model")
    run = ((lambda: build(BuildConfig(target="RPI5", model=missing, overrides=("qatt.steps=5",), progress=False)))
           if terms == "cli" else
           (lambda: build_bundle("RPI5", missing, overrides=["qatt.steps=5"], progress=False)))
    with pytest.raises(BuildError) as refused:
        run()
    assert "has no stage 'qatt' (stages: qat); did you mean 'qat'?" in refused.value.problem
    meant = "--set qat.steps=5" if terms == "cli" else "qat.steps=5"
    assert meant in refused.value.fix
    assert "override a stage it has" not in refused.value.fix


@pytest.mark.parametrize(("override", "meant"), [("QAT.steps=5", "qat.steps=5"),
                                                  ("exports.weights=int4", "export.weights=int4")])
def test_a_misspelled_override_section_is_told_the_override_it_meant(override, meant):
    """An override of a section the recipe lacks was told to "override a stage it has", whatever the spelling: a
    misspelling of one of its stages or of export is told the override to write instead, and that one applies."""
    recipe = load_recipe("default")
    with pytest.raises(BuildError) as refused:
        recipe.with_overrides([override])
    assert f"write --set {meant}" in refused.value.fix
    recipe.with_overrides([meant]).validated()


def test_an_override_of_a_stage_the_recipe_does_not_run_still_names_the_recipes_that_do():
    with pytest.raises(BuildError) as refused:
        load_recipe("default").with_overrides(["prune.ffn_ratio=0.3"])
    assert "did you mean" not in refused.value.problem
    assert "pick a recipe with a prune stage" in refused.value.fix


def test_a_misspelled_stage_names_the_closest_stage():
    with pytest.raises(BuildError, match=r"unknown build stage 'qatt'; known stages: .*; did you mean 'qat'\?"):
        check_order(["qatt"])
    with pytest.raises(BuildError, match=r"unknown build stage 'Distill'; .*did you mean 'distill'\?"):
        check_order(["qat", "Distill"])


def test_a_misspelled_stage_option_names_the_closest_option():
    with pytest.raises(BuildError, match=r"has no option\(s\) \['stepz'\]; allowed: .*; did you mean 'steps'\?\n"):
        make_config("qat", {"stepz": 5})
    with pytest.raises(BuildError, match=r"did you mean 'lr' for 'LR', 'steps' for 'stepz'\?\n"):
        make_config("qat", {"stepz": 5, "LR": 1e-4, "zzz": 1})


def test_a_misspelled_export_key_names_the_closest_key(tmp_path):
    with pytest.raises(BuildError, match=r"export\.weight is not a known key \(allowed keys: .*\); did you mean "
                                         r"'weights'\?"):
        load_recipe("default").with_overrides(["export.weight=int4"])
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("name: mine\nstages:\n  - stage: qat\n    confg: {steps: 5}\n", encoding="utf-8")
    with pytest.raises(BuildError, match=r"stages\.0\.confg is not a known key .*; did you mean 'config'\?"):
        load_recipe(str(recipe))


def test_a_misspelled_recipe_names_the_closest_shipped_recipe():
    with pytest.raises(BuildError, match=r"unknown recipe 'int4prune'; shipped: .*; did you mean 'int4-prune'\?"):
        load_recipe("int4prune")
    with pytest.raises(BuildError, match=r"unknown recipe 'Default'; .*did you mean 'default'\?"):
        load_recipe("Default")
