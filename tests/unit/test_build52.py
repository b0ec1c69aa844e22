"""Build (review 52): --weight-bits 4 on a recipe whose standard INT8 (QDQ) graph stores 8-bit weights only is refused
naming the option, with a fix that works; a profile check across keys names its values without the whole profile
after them; a --set key with spaces around its parts is the key; a build without --resume says which finished steps
of an earlier build it discards."""

from __future__ import annotations

from importlib import resources

import pytest

from edgesdk.api import build_bundle
from edgesdk.build.pipeline import BuildConfig, build
from edgesdk.build.recipes import load_recipe
from edgesdk.errors import BuildError, EdgeSDKError, ProfileError
from edgesdk.profile import parse_profile


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_weight_bits_4_on_a_qdq_recipe_names_the_option_and_a_fix_that_works(tmp_path, terms):
    """The Jetson targets' default recipe exports the standard INT8 (QDQ) graph. --weight-bits 4 there was refused
    as 'qat.weight_bits is 4', an override the user never gave, with the fix '--set qat.weight_bits=8', which with
    --weight-bits 4 is refused in turn (the two set one setting otherwise). It is refused naming --weight-bits, and
    the recipes the fix names take it."""
    missing = str(tmp_path / "no-model")  # refused before the model is looked for
    run = ((lambda: build(BuildConfig(target="orin-nx", model=missing, weight_bits=4, progress=False)))
           if terms == "cli" else (lambda: build_bundle("orin-nx", missing, weight_bits=4, progress=False)))
    with pytest.raises(BuildError) as refused:
        run()
    option, drop, recipe = {"cli": ("--weight-bits 4", "drop --weight-bits", "--recipe default"),
                            "python": ("weight_bits=4", "leave out weight_bits", "recipe='default'")}[terms]
    assert refused.value.problem.startswith(f"{option}: recipe 'jetson' exports the standard INT8 (QDQ) graph, which "
                                            "stores 8-bit weights only")
    assert refused.value.fix.startswith(f"{drop}, or pick a recipe that stores 4-bit weights (e.g. {recipe}")
    assert "qat.weight_bits=8" not in str(refused.value)
    for name in ("default", "int4"):  # the recipes the fix names learn and store 4-bit weights
        fitting = load_recipe(name)
        fitting.with_overrides(fitting.weight_bits_overrides(4)).validated()
    jetson = load_recipe("jetson")
    assert jetson.weight_bits_overrides(8) == ["qat.weight_bits=8"]  # its own bits are taken


def _rpi5(change: tuple[str, str]) -> str:
    text = (resources.files("edgesdk.targets") / "rpi5.yaml").read_text(encoding="utf-8")
    assert change[0] in text
    return text.replace(*change)


@pytest.mark.parametrize(("change", "line"), [
    (("threads: 4  #", "threads: 8  #"),
     "  - (top level): Value error, runtime.threads (8) exceeds cpu.cores (4)"),
    (("resume_c: 70", "resume_c: 90"),
     "  - thermal: Value error, thermal limits must rise strictly: resume_c < soft_limit_c < hard_limit_c < "
     "firmware_throttle_c < shutdown_c; got [90.0, 75.0, 78.0, 80.0, 110.0]"),
    (("  cores: 4  #", "  #"), "  - cpu.cores: Field required"),
], ids=["across-sections", "within-a-section", "missing-key"])
def test_a_profile_check_across_keys_names_its_values_without_the_whole_profile(change, line):
    """A check across keys (pydantic's model validators) was followed by '(got {...})' holding its whole input: for
    a check of the profile, every key of the file (name, description, cpu, memory ...), over a thousand characters
    after the message that names the values compared; a missing key by the section it is missing from."""
    with pytest.raises(ProfileError) as refused:
        parse_profile(_rpi5(change), "board.yaml")
    problem = refused.value.problem
    assert line in problem.splitlines()[1]
    assert "(got {" not in problem
    assert "Raspberry Pi 5" not in problem  # the description, one of the keys the dump repeated
    assert len(problem) < 400


def test_a_profile_value_of_the_wrong_kind_still_shows_the_value_given():
    with pytest.raises(ProfileError) as refused:
        parse_profile(_rpi5(("cores: 4  #", "cores: {n: 4}  #")), "board.yaml")
    assert "cpu.cores: Input should be a valid integer (got {'n': 4})" in refused.value.problem


@pytest.mark.parametrize("item", ["qat.steps = 5", " qat . steps=5", "qat.steps =5"])
def test_a_set_key_with_spaces_around_its_parts_is_that_key(item):
    """--set 'qat.steps = 5' was refused as "stage 'qat' has no option(s) ['steps ']", while the checks beside it
    (a shortcut option or --weight-bits against a --set of the same setting) read the key stripped."""
    stages = dict(load_recipe("int8-only").with_overrides((item,)).validated())
    assert stages["qat"].steps == 5
    recipe = load_recipe("int8-only").with_overrides(("export.weights = int4", "qat.weight_bits = 4"))
    assert recipe.export.weights == "int4"
    assert dict(recipe.validated())["qat"].weight_bits == 4


def test_a_set_of_max_context_with_spaces_is_named_as_the_max_context_option():
    with pytest.raises(BuildError, match="the bundle's context is not a recipe setting"):
        load_recipe("int8-only").with_overrides(("export . max_context=64",))


def test_a_build_without_resume_says_which_finished_steps_of_an_earlier_build_it_discards(tiny_model_dir, tmp_path,
                                                                                          capsys):
    """A killed build's work directory, and the same command again without --resume: the finished steps (hours of
    QAT) were deleted without a word. The build says which steps it discards, and that --resume goes on from them."""
    from edgesdk.build.checkpoint import WorkDir
    from edgesdk.export.onnx_export import ExportConfig

    out = tmp_path / "b"
    killed = WorkDir(tmp_path / "b.build", {"recipe": 1}, resume=False)
    killed.mark_done("baseline", {"parameters": 1})
    killed.mark_done("stage:qat", {"stage": "qat"})
    killed.release()
    build(BuildConfig(target="host", model=str(tiny_model_dir), out=out, recipe="fp32-fused",
                      export=ExportConfig(max_context=64), progress=False))
    err = capsys.readouterr().err
    assert (f"starting over: the finished steps (baseline, stage:qat) an earlier build left in {tmp_path / 'b.build'} "
            "are discarded (a build without --resume starts from the beginning; they belong to a build with other "
            "arguments, which --resume would refuse)") in err  # the killed build's key is not this build's
    build(BuildConfig(target="host", model=str(tiny_model_dir), out=out, recipe="fp32-fused",
                      export=ExportConfig(max_context=64), progress=False))
    assert "starting over" not in capsys.readouterr().err  # the first build left no work directory behind


def test_a_work_directory_started_over_records_what_it_discarded(tmp_path):
    from edgesdk.build.checkpoint import WorkDir

    WorkDir(tmp_path / "b.build", {"recipe": 1}, resume=False).release()  # an empty one: nothing finished
    empty = WorkDir(tmp_path / "b.build", {"recipe": 1}, resume=False)
    assert empty.discarded == []
    empty.mark_done("baseline", {"parameters": 1})
    empty.release()
    again = WorkDir(tmp_path / "b.build", {"recipe": 2}, resume=False)
    assert again.discarded == ["baseline"]
    assert not again.discarded_resumable  # another build's: --resume would have refused it
    assert again.done("baseline") is None
    again.mark_done("baseline", {"parameters": 1})
    again.release()
    same = WorkDir(tmp_path / "b.build", {"recipe": 2}, resume=False)
    assert same.discarded == ["baseline"]
    assert same.discarded_resumable  # this build's: --resume would have gone on from it
    same.release()
    (tmp_path / "b.build" / "state.json").write_text("{not json", encoding="utf-8")  # a damaged state: nothing named
    damaged = WorkDir(tmp_path / "b.build", {"recipe": 2}, resume=False)
    assert damaged.discarded == []
    damaged.release()


def test_the_checks_beside_the_overrides_read_a_key_spaced_inside_as_the_recipe_does():
    """'qat . weight_bits=8' is applied as qat.weight_bits=8; --weight-bits 4 against it, and --density against
    'sparsify . density=0.5', were not refused: the checks stripped only the key's ends."""
    from edgesdk.build.pipeline import check_weight_bits_sets, shortcut_overrides

    with pytest.raises(BuildError, match="sets qat.weight_bits=4"):
        check_weight_bits_sets(4, ["qat.weight_bits=4"], ("qat . weight_bits=8",))
    with pytest.raises(BuildError, match="both set sparsify.density"):
        shortcut_overrides("orin-nx", "jetson-sparse", {"--density": 0.3}, ("sparsify . density=0.5",))


def test_weight_bits_4_is_read_on_the_export_the_set_leaves(tmp_path):
    """--recipe int8-qdq --weight-bits 4 --set export.form=ort-fused --set export.weights=int4: the --set makes the
    recipe one that stores 4-bit weights, but the QDQ refusal was decided on the recipe before it. It goes on to
    the model (missing here), past the recipe's checks."""
    sets = ("export.form=ort-fused", "export.weights=int4", "qat.granularity=block",
            "qat.activations=block", "qat.embedding_bits=4")
    with pytest.raises(EdgeSDKError) as refused:
        build(BuildConfig(target="host", recipe="int8-qdq", model=str(tmp_path / "no-model"), weight_bits=4,
                          overrides=sets, progress=False))
    assert "no-model" in str(refused.value)
    assert "QDQ" not in refused.value.problem
