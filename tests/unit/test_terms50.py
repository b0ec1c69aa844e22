"""The build's messages name its options as the caller gave them: ``edgesdk build``'s flags for the CLI
(BuildConfig.terms "cli", the default), build_bundle()'s arguments for the Python API (terms "python"): a Python
caller has no --max-context to pass."""

from __future__ import annotations

import pytest

from edgesdk.api import build_bundle
from edgesdk.build.pipeline import BuildConfig, build
from edgesdk.errors import BuildError
from edgesdk.export.onnx_export import ExportConfig


def _cli(**fields):
    """The build as ``edgesdk build`` runs it (edgesdk/cli_build.py makes a BuildConfig with the default terms)."""
    with pytest.raises(BuildError) as refused:
        build(BuildConfig(target="rpi5", progress=False, **fields))
    return refused.value


def _python(**arguments):
    with pytest.raises(BuildError) as refused:
        build_bundle("rpi5", progress=False, **arguments)
    return refused.value


def test_max_context_is_named_in_the_callers_terms():
    cli = _cli(export=ExportConfig(max_context=8))
    assert cli.problem.startswith("--max-context is 8, but a bundle needs a context of at least 16")
    assert cli.fix == ("pass --max-context 16 or more (the default is 4096), or --max-context 0 for the model's own "
                       "context (its max_position_embeddings)")
    python = _python(max_context=8)
    assert python.problem.startswith("max_context is 8, but a bundle needs a context of at least 16")
    assert python.fix == ("pass max_context=16 or more (the default is 4096), or max_context=0 for the model's own "
                          "context (its max_position_embeddings)")
    assert "--" not in str(python)


def test_weight_bits_with_a_recipe_without_qat_is_named_in_the_callers_terms():
    cli = _cli(weight_bits=4, recipe="fp32-fused")
    assert cli.problem.startswith("--weight-bits 4: recipe 'fp32-fused' has no qat stage")
    assert cli.fix.startswith("drop --weight-bits, or pick a recipe with a qat stage (e.g. --recipe default")
    python = _python(weight_bits=4, recipe="fp32-fused")
    assert python.problem.startswith("weight_bits=4: recipe 'fp32-fused' has no qat stage to learn 4-bit weights")
    assert python.fix == ("leave out weight_bits, or pick a recipe with a qat stage (e.g. recipe='default' or "
                          "recipe='int8-only')")
    assert "--" not in str(python)


def test_weight_bits_against_an_override_is_named_in_the_callers_terms():
    cli = _cli(weight_bits=4, recipe="default", overrides=("qat.weight_bits=8",))
    assert cli.problem.startswith("--weight-bits 4 sets qat.weight_bits=4, and --set qat.weight_bits=8 sets it "
                                  "otherwise (the --set would win, silently)")
    assert cli.fix.endswith("or --set without --weight-bits")
    python = _python(weight_bits=4, recipe="default", overrides={"qat.weight_bits": 8})
    assert python.problem.startswith("weight_bits=4 sets qat.weight_bits=4, and overrides=['qat.weight_bits=8'] "
                                     "sets it otherwise (the overrides would win, silently)")
    assert python.fix.startswith("give one of them: weight_bits alone (it sets qat.weight_bits=4")
    assert python.fix.endswith("or overrides without weight_bits")
    assert "--" not in str(python)


def test_an_out_under_a_file_is_named_in_the_callers_terms(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    out = notes / "b"
    cli = _cli(out=out, recipe="fp32-fused")
    assert cli.problem == f"--out {out}: {notes} is a file, so no bundle directory can be made under it"
    assert cli.fix.startswith("pass --out a path")
    python = _python(out=out, recipe="fp32-fused")
    assert python.problem == f"out={str(out)!r}: {notes} is a file, so no bundle directory can be made under it"
    assert python.fix.startswith("pass out a path")
    assert "--" not in str(python)


def test_no_recipe_with_a_broken_default_is_named_in_the_callers_terms(tmp_path):
    from edgesdk.build.pipeline import recipe_for
    from edgesdk.profile import get_profile

    profile = get_profile("rpi5").model_copy(update={"default_recipe": "no-such-recipe"})
    with pytest.raises(BuildError, match="^no --recipe given") as cli:
        recipe_for(None, profile)
    assert cli.value.fix.startswith("pass --recipe NAME, or fix default_recipe")
    with pytest.raises(BuildError, match="^no recipe given") as python:
        recipe_for(None, profile, "python")
    assert python.value.fix.startswith("pass recipe='NAME', or fix default_recipe")


def test_checks_before_the_stages_name_overrides_and_recipe_in_the_callers_terms():
    from edgesdk.build.pipeline import check_depth_pruning, check_target_support
    from edgesdk.build.recipes import load_recipe
    from edgesdk.compress.prune import PruneConfig
    from edgesdk.profile import get_profile

    stages = [("prune", PruneConfig(layers_removed=4))]
    with pytest.raises(BuildError) as cli:
        check_depth_pruning(stages, 4)
    assert cli.value.fix == "remove at most 3 (--prune-layers 3, or --set prune.layers_removed=3)"
    with pytest.raises(BuildError) as python:
        check_depth_pruning(stages, 4, "python")
    assert python.value.fix == "remove at most 3 (overrides=['prune.layers_removed=3'])"

    recipe = load_recipe("fp32-fused")
    int8 = ExportConfig(weights="int8")
    fp32_only = get_profile("rpi5").model_copy(update={"precisions": ["fp32"]})
    with pytest.raises(BuildError) as cli:
        check_target_support(recipe, [], int8, fp32_only)
    assert "(--recipe; the target's default is" in cli.value.fix
    assert "(--set export.weights=...)" in cli.value.fix
    with pytest.raises(BuildError) as python:
        check_target_support(recipe, [], int8, fp32_only, "python")
    assert "(recipe; the target's default is" in python.value.fix
    assert "(overrides=['export.weights=...'])" in python.value.fix
    assert "--" not in str(python.value)


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_a_resume_of_another_build_is_named_in_the_callers_terms(tmp_path, terms):
    from edgesdk.build.checkpoint import WorkDir

    WorkDir(tmp_path / "b.build", {"recipe": 1, "export": 1}, resume=False).release()
    with pytest.raises(BuildError) as refused:
        WorkDir(tmp_path / "b.build", {"recipe": 2, "export": 1}, resume=True, terms=terms)
    changed = refused.value.problem.split("belongs to a different build: ", 1)[1]
    if terms == "cli":
        assert refused.value.problem.startswith("--resume: the work directory")
        assert changed.startswith("the recipe's stages (--recipe or its file) changed")
        assert refused.value.fix.startswith("drop --resume to start over")
    else:
        assert refused.value.problem.startswith("resume=True: the work directory")
        assert changed.startswith("the recipe's stages (recipe or its file) changed")
        assert refused.value.fix.startswith("pass resume=False to start over")
        assert "--" not in changed
        assert "--" not in refused.value.fix


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_a_taken_work_directory_is_named_in_the_callers_terms(tmp_path, terms):
    from edgesdk.build.checkpoint import check_work_dir

    (tmp_path / "b.build").mkdir()
    (tmp_path / "b.build" / "mine.txt").write_text("mine")
    with pytest.raises(BuildError, match="is taken") as refused:
        check_work_dir(tmp_path / "b.build", terms)
    assert ("pass --out another path" if terms == "cli" else "pass out another path") in refused.value.fix


def test_a_resumed_build_logs_in_the_callers_terms(tiny_model_dir, tmp_path, capsys):
    """build_bundle(resume=True) with no earlier step says so as build_bundle's argument, not as --resume."""
    build_bundle("host", str(tiny_model_dir), out=tmp_path / "b", recipe="fp32-fused", max_context=32,
                 resume=True, progress=False)
    err = capsys.readouterr().err
    assert f"resume=True: no finished step of this build in {tmp_path / 'b.build'}; starting from the beginning" \
        in err
    assert "--resume" not in err


def test_an_unknown_terms_is_refused():
    with pytest.raises(BuildError, match="BuildConfig terms is 'py'; expected one of 'cli', 'python'"):
        BuildConfig(target="rpi5", terms="py")


def test_the_cli_terms_are_the_default():
    assert BuildConfig(target="rpi5").terms == "cli"
