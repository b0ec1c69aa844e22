"""Build (review 51): the recipe, stage-config and training-text refusals a build_bundle() caller meets name its
arguments (overrides=[...], recipe='...', data, data_skip_chars), not edgesdk build's flags, which keep their
wording; a standard INT8 export's INT8-head perplexity is measured once per stage, with the same figures."""

from __future__ import annotations

import pytest

from edgesdk.api import build_bundle
from edgesdk.build.pipeline import BuildConfig, build
from edgesdk.compress.data import DataConfig
from edgesdk.errors import BuildError


def _cli(**fields):
    """The build as ``edgesdk build`` runs it (a BuildConfig with the default terms)."""
    with pytest.raises(BuildError) as refused:
        build(BuildConfig(target="rpi5", progress=False, **fields))
    return refused.value


def _python(**arguments):
    with pytest.raises(BuildError) as refused:
        build_bundle("rpi5", progress=False, **arguments)
    return refused.value


# (build_bundle() arguments, BuildConfig fields, the CLI's fix as it was, the fix build_bundle() now gives)
CASES = {
    "override form": (
        {"overrides": ["nosuch"]}, {"overrides": ("nosuch",)},
        "write e.g. --set prune.ffn_ratio=0.4 or --set export.weights=int4",
        "write e.g. overrides=['prune.ffn_ratio=0.4'] or overrides=['export.weights=int4']"),
    "override not YAML": (
        {"overrides": ["qat.steps=[1"]}, {"overrides": ("qat.steps=[1",)},
        "quote it, e.g. --set 'stage.field=\"text\"'",
        "quote it, e.g. overrides=['stage.field=\"text\"']"),
    "override of a stage the recipe lacks": (
        {"recipe": "fp32-fused", "overrides": ["qat.steps=1"]}, {"recipe": "fp32-fused", "overrides": ("qat.steps=1",)},
        "override a stage it has, or pick a recipe with a qat stage: --recipe aggressive, --recipe default",
        "override a stage it has, or pick a recipe with a qat stage: recipe='aggressive', recipe='default'"),
    "override that makes the recipe invalid": (
        {"overrides": ["export.weights=int3"]}, {"overrides": ("export.weights=int3",)},
        "fix the --set values (export keys: form,", "fix those overrides (export keys: form,"),
    "unknown stage option": (
        {"overrides": ["qat.nosuch=1"]}, {"overrides": ("qat.nosuch=1",)},
        "fix the recipe or the --set override", "fix the recipe or the override in build_bundle()'s overrides"),
    "stage option of the wrong type": (
        {"overrides": ["qat.steps=abc"]}, {"overrides": ("qat.steps=abc",)},
        "fix the recipe or the override, e.g. --set qat.steps=<int>",
        "fix the recipe or the override, e.g. overrides=['qat.steps=<int>']"),
    "invalid stage config": (
        {"overrides": ["qat.weight_bits=3"]}, {"overrides": ("qat.weight_bits=3",)},
        "change qat.weight_bits where it is given: --set qat.weight_bits=..., or in the recipe",
        "change qat.weight_bits where it is given: overrides=['qat.weight_bits=...'], or in the recipe"),
    "power stage in the standard form": (
        {"recipe": "power", "overrides": ["export.form=standard"]},
        {"recipe": "power", "overrides": ("export.form=standard",)},
        "--set export.form=ort-fused, or pick a recipe without the power stage",
        "overrides=['export.form=ort-fused'], or pick a recipe without the power stage"),
    "QAT grid against the export": (
        {"recipe": "int8-qdq", "overrides": ["qat.granularity=block"]},
        {"recipe": "int8-qdq", "overrides": ("qat.granularity=block",)},
        "--set qat.granularity=channel, or pick a recipe whose export matches",
        "overrides=['qat.granularity=channel'], or pick a recipe whose export matches"),
    "QAT bits against a fused export": (
        {"recipe": "int4", "overrides": ["qat.weight_bits=8"]},
        {"recipe": "int4", "overrides": ("qat.weight_bits=8",)},
        "--weight-bits 8 sets both, or --set qat.weight_bits=4 to match the export",
        "weight_bits=8 sets both, or overrides=['qat.weight_bits=4'] to match the export"),
    "QAT block size against the export's": (
        {"recipe": "int4", "overrides": ["qat.block_size=64"]}, {"recipe": "int4", "overrides": ("qat.block_size=64",)},
        "set both to the same value, e.g. --set qat.block_size=32 --set export.block_size=32",
        "set both to the same value, e.g. overrides=['qat.block_size=32', 'export.block_size=32']"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_recipe_and_stage_refusals_name_the_callers_terms(case):
    python_arguments, cli_fields, cli_fix, python_fix = CASES[case]
    cli = _cli(**cli_fields)
    python = _python(**python_arguments)
    assert cli.problem == python.problem or "--set" in cli.problem
    assert cli.fix.startswith(cli_fix)
    assert python.fix.startswith(python_fix)
    assert "--" not in python.fix
    assert "--set" not in python.problem


def test_the_reorder_refusal_names_the_callers_terms():
    from edgesdk.build.recipes import load_recipe

    recipe = load_recipe("jetson-sparse").with_overrides(["qat.granularity=block", "sparsify.reorder=true",
                                                          "export.weights=fp32"])
    with pytest.raises(BuildError) as cli:
        recipe.validated()
    assert cli.value.fix == ("--set sparsify.reorder=false, or --set qat.granularity=channel --set "
                             "qat.embedding_bits=null (the jetson recipes' grid)")
    with pytest.raises(BuildError) as python:
        recipe.validated("python")
    assert python.value.fix == ("overrides=['sparsify.reorder=false'], or overrides=['qat.granularity=channel', "
                                "'qat.embedding_bits=null'] (the jetson recipes' grid)")


def test_an_override_of_max_context_names_the_callers_terms():
    cli = _cli(overrides=("export.max_context=2048",))
    assert cli.problem.endswith("it is the build's --max-context")
    assert cli.fix == "pass --max-context 2048 (build_bundle(max_context=2048) in Python) instead of this --set"
    python = _python(overrides={"export.max_context": 2048})
    assert python.problem.endswith("it is the build's max_context")
    assert python.fix == "pass max_context=2048 to build_bundle() instead of this override"


def test_an_invalid_override_is_quoted_as_the_callers_argument():
    python = _python(overrides=["export.weights=int3"])
    assert python.problem.startswith("overrides=['export.weights=int3'] makes recipe 'default' invalid: ")
    assert _cli(overrides=("export.weights=int3",)).problem.startswith(
        "--set export.weights=int3 makes recipe 'default' invalid: ")


@pytest.mark.parametrize("problem", ["missing", "directory", "empty"])
def test_training_text_refusals_name_the_callers_terms(tmp_path, problem):
    text = tmp_path / "train.txt"
    text.write_text("short text", encoding="utf-8")
    data, skip = {"missing": (tmp_path / "none.txt", 0), "directory": (tmp_path, 0), "empty": (text, 100)}[problem]
    cli = _cli(data=DataConfig(files=(str(data),), skip_chars=skip))
    python = _python(data=data, data_skip_chars=skip)
    assert cli.problem == python.problem
    wanted = {"missing": ("pass an existing plain-text file to --data", "pass an existing plain-text file to data"),
              "directory": ("pass a plain-text file to --data", "pass a plain-text file to data"),
              "empty": ("pass a longer file or a --data-skip-chars of at most 9",
                        "pass a longer file or a data_skip_chars of at most 9")}[problem]
    assert (cli.fix, python.fix) == wanted


def test_a_block_longer_than_the_training_text_names_the_callers_terms():
    torch = pytest.importorskip("torch")
    from edgesdk.compress.data import TokenData

    ids = torch.arange(40)
    with pytest.raises(BuildError) as cli:
        TokenData(ids, 0).batches(1, 1, 64, 0, "qat")
    assert cli.value.fix == ("pass more text with --data (or more teacher text, --generated-sequences), or "
                             "--set qat.sequence_length=40")
    with pytest.raises(BuildError) as python:
        TokenData(ids, 0, terms="python").batches(1, 1, 64, 0, "qat")
    assert python.value.fix == ("pass more text with data (or more teacher text, generated_sequences), or "
                                "overrides=['qat.sequence_length=40']")


def test_a_stage_without_training_text_names_the_callers_terms(tiny_model_dir, tmp_path):
    """build_bundle() with a training stage, no data and generated_sequences=0: the stage finds no text; the
    BuildContext the pipeline gives the stages carries the caller's terms to the refusal."""
    with pytest.raises(BuildError, match="the compression stages have no training text") as python:
        build_bundle("host", str(tiny_model_dir), out=tmp_path / "p", recipe="int8-qdq", max_context=32,
                     generated_sequences=0, progress=False)
    assert python.value.fix == ("pass data='FILE' (plain text), or generated_sequences=N with N > 0 for "
                                "teacher-generated text")
    with pytest.raises(BuildError, match="the compression stages have no training text") as cli:
        build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "c", recipe="int8-qdq",
                          data=DataConfig(generated_sequences=0), progress=False))
    assert cli.value.fix.startswith("pass --data FILE (plain text), or --generated-sequences N with N > 0")


def test_a_standard_export_with_an_int8_head_measures_each_stages_perplexity_once(tiny_model_dir, tmp_path,
                                                                                    monkeypatch):
    """A standard-form INT8 export with embedding_bits 8: each stage's held-out perplexity was measured by the stage
    with QAT's float head, then measured again by the pipeline with the INT8 head that replaced it. It is measured
    once, with the INT8 head (the figure tests/unit/test_build50.py checks against the export's reference)."""
    torch = pytest.importorskip("torch")
    from edgesdk.compress import measure
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.export.validate import ValidationConfig
    from tests._utils.tiny import CORPUS

    windows = []
    real = measure.heldout_perplexity

    def counted(model, ids, *args, **kwargs):  # the real measurement, counted
        windows.append(int(ids.numel()))
        return real(model, ids, *args, **kwargs)

    monkeypatch.setattr(measure, "heldout_perplexity", counted)
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    recipe = tmp_path / "qdq.yaml"
    recipe.write_text("name: qdq\nstages:\n  - stage: qat\n    config: {weight_bits: 8, granularity: channel, "
                      "activations: none, embedding_bits: null, steps: 1, batch_size: 1, sequence_length: 32, "
                      "grad_accumulation: 1}\nexport: {form: standard, weights: int8}\n", encoding="utf-8")
    bundle = build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "b", recipe=str(recipe),
                               overrides=("export.embedding_bits=8",),
                               data=DataConfig(files=(str(text),), skip_chars=1200, generated_sequences=0),
                               export=ExportConfig(max_context=64),
                               validation=ValidationConfig(prompts=1, decode_steps=1), progress=False))
    assert len(windows) == 2  # the loaded model's row, and the qat stage's: once each
    row = bundle.manifest["stages"][-1]["metrics"]
    assert torch.isfinite(torch.tensor(row["heldout_perplexity"]))


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_an_output_directory_that_is_not_a_bundle_names_the_callers_terms(tmp_path, terms):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine", encoding="utf-8")
    from edgesdk.errors import BundleError

    run = ((lambda: build(BuildConfig(target="rpi5", out=tmp_path / "mine", progress=False))) if terms == "cli" else
           (lambda: build_bundle("rpi5", out=tmp_path / "mine", progress=False)))
    with pytest.raises(BundleError) as raised:
        run()
    refused = raised.value
    assert "holds files and is not a bundle" in refused.problem
    assert refused.fix == {"cli": "pass --out a new directory (or an earlier bundle to replace)",
                           "python": "pass out a new directory (or an earlier bundle to replace)"}[terms]


STATE_DAMAGE = {
    "files not a mapping": (lambda state: state.__setitem__("files", []), "'files' is '[]', not a mapping of steps"),
    "a step's files not a mapping": (lambda state: state["files"].__setitem__("stage:qat", "x"),
                                     "the files of step 'stage:qat' are 'x', not a mapping of file names"),
    "a file's record not a pair": (lambda state: state["files"]["stage:qat"].__setitem__("model.safetensors", 5),
                                   "the file 'model.safetensors' of step 'stage:qat' is recorded as '5', "
                                   "not [size, sha256]"),
    "a step's record not a mapping": (lambda state: state["done"].__setitem__("export", "x"),
                                      "the record of step 'export' is 'x', not a mapping"),
}


@pytest.mark.parametrize("damage", list(STATE_DAMAGE))
def test_a_damaged_state_file_is_refused_when_resumed_not_a_traceback_later(tmp_path, damage):
    """A state file whose parts are not what WorkDir writes (an edit, a disk error that leaves valid JSON) was
    taken, and the build failed part-way with AttributeError / TypeError where it read that part (a stage's
    files when checking its checkpoint, the export's record); it is refused when resumed, naming the part."""
    import json

    from edgesdk.build.checkpoint import WorkDir

    key = {"recipe": 1}
    work = WorkDir(tmp_path / "b.build", key, resume=False)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"weights")
    work.record_files("stage:qat", tmp_path / "ckpt")
    work.mark_done("stage:qat", {"stage": "qat"})
    work.mark_done("export", {"graph": {}})
    work.release()
    state_file = tmp_path / "b.build" / "state.json"
    state = json.loads(state_file.read_text(encoding="utf-8"))
    change, said = STATE_DAMAGE[damage]
    change(state)
    state_file.write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(BuildError) as refused:
        WorkDir(tmp_path / "b.build", key, resume=True)
    assert f"cannot be read ({said}), so the steps it finished are not known" in refused.value.problem
    assert refused.value.fix.startswith("drop --resume to start over")
    WorkDir(tmp_path / "b.build", key, resume=False).release()  # the lock was given up: starting over works


def test_a_sound_state_file_is_taken_when_resumed(tmp_path):
    from edgesdk.build.checkpoint import WorkDir

    work = WorkDir(tmp_path / "b.build", {"recipe": 1}, resume=False)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"weights")
    work.record_files("stage:qat", tmp_path / "ckpt")
    work.mark_done("stage:qat", {"stage": "qat"})
    work.release()
    resumed = WorkDir(tmp_path / "b.build", {"recipe": 1}, resume=True)
    assert resumed.done("stage:qat") == {"stage": "qat"}
    assert resumed.damaged("stage:qat", tmp_path / "ckpt") is None
    resumed.release()
