"""Build (review 54): the build key holds what each step reads, so a resumed build with another --max-context keeps
the finished stages and exports again, one with other settings of a stage keeps the stages before it, and one whose
target YAML changed only where no step reads it takes them all; a build starting over does not delete a work
directory another build made and locked meanwhile."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

RECIPE = ("name: r\nstages:\n  - stage: qat\n    config: {steps: 0, activations: none, granularity: channel, "
          "embedding_bits: null}\nexport: {form: standard, weights: int8}\n")


def _tiny_build(tmp_path):
    """build(**changes) of a tiny model with a one-stage recipe to tmp_path/b, its work directory kept."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model = save_tiny_model_dir(tmp_path / "model")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")

    def run(max_context=64, target="host", **changes):
        return build(BuildConfig(target=target, model=str(model), out=tmp_path / "b", recipe=str(recipe),
                                 data=DataConfig(generated_sequences=0), export=ExportConfig(max_context=max_context),
                                 keep_work=True, progress=False, **changes))
    return run


def test_a_resume_with_another_max_context_keeps_the_stages_and_exports_again(tmp_path, capsys, monkeypatch):
    """The bundle's context changes the export only (the rotary table's length), yet it was part of the one build
    key digest: --resume with another --max-context was refused as "a different build", and without --resume every
    stage trained again. The stages are taken; the export is made again, with the new context."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from edgesdk.build.registry import STAGES, stage_spec

    run = _tiny_build(tmp_path)
    first = run(max_context=64)
    assert first.manifest["graph"]["max_context"] == 64
    capsys.readouterr()

    def no_stage_runs(*args, **kwargs):
        raise AssertionError("a finished stage ran again")

    monkeypatch.setitem(STAGES, "qat", replace(stage_spec("qat"), run=no_stage_runs))
    second = run(max_context=128, resume=True)
    err = capsys.readouterr().err
    assert second.manifest["graph"]["max_context"] == 128
    assert "reusing the loaded model's figures (baseline), stage 'qat'" in err
    assert ("--resume: the bundle's context (--max-context) changed since the earlier build: the steps that depend on "
            "what changed are made again, the others taken") in err
    assert "export: done in an earlier run" not in err
    assert second.manifest["stages"] == first.manifest["stages"]


def test_a_resume_with_other_export_settings_is_still_refused_naming_them(tmp_path):
    """Only the context is taken as a change of the export alone: the other export settings are another build (the
    stages' figures are those of the exported layout), and the refusal names both."""
    pytest.importorskip("torch")
    from edgesdk.build.checkpoint import KEY_PARTS
    from edgesdk.errors import BuildError

    run = _tiny_build(tmp_path)
    run()
    with pytest.raises(BuildError, match="belongs to a different build: ") as refused:
        run(max_context=128, resume=True, overrides=("export.weights=fp32",))
    assert refused.value.problem.endswith(f"belongs to a different build: {KEY_PARTS['export']} and "
                                          f"{KEY_PARTS['context']} changed since it was written")


def _target_yaml(tmp_path, old: str, new: str):
    """A copy of the host profile with ``old`` replaced by ``new``, at tmp_path/board.yaml."""
    from importlib import resources

    text = (resources.files("edgesdk.targets") / "host.yaml").read_text(encoding="utf-8")
    assert text.count(old) == 1
    path = tmp_path / "board.yaml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    return str(path)


def test_a_resume_with_other_thermal_limits_in_the_target_keeps_the_stages(tmp_path, capsys, monkeypatch):
    """The whole target profile was in the build key: a custom board YAML whose thermal limits (or description,
    memory budget, runtime threads) were corrected after the build was killed refused --resume, and every stage
    trained again, though no step reads them (the bundle copies the profile when it is written, after the steps).
    The key holds what the steps read: sparsity_block, gpu and power."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from edgesdk.build.registry import STAGES, stage_spec

    run = _tiny_build(tmp_path)
    run(target=_target_yaml(tmp_path, "soft_limit_c: 80", "soft_limit_c: 80"))
    monkeypatch.setitem(STAGES, "qat", replace(stage_spec("qat"), run=lambda *a, **k: pytest.fail("a stage ran")))
    resumed = run(target=_target_yaml(tmp_path, "soft_limit_c: 80", "soft_limit_c: 79"), resume=True)
    assert resumed.manifest["target"]["thermal"]["soft_limit_c"] == 79  # the bundle's copy is the new profile's
    assert "export: done in an earlier run" in capsys.readouterr().err


def test_a_resume_with_another_sparsity_block_in_the_target_is_refused(tmp_path):
    """What a step reads from the profile is still the build's: another sparsity_block is another build."""
    pytest.importorskip("torch")
    from edgesdk.build.checkpoint import KEY_PARTS
    from edgesdk.errors import BuildError

    run = _tiny_build(tmp_path)
    run(target=_target_yaml(tmp_path, "sparsity_block: 32", "sparsity_block: 32"))
    with pytest.raises(BuildError, match="belongs to a different build: ") as refused:
        run(target=_target_yaml(tmp_path, "sparsity_block: 32", "sparsity_block: 16"), resume=True)
    assert refused.value.problem.endswith(f"{KEY_PARTS['target']} changed since it was written")


# A second build, in its own process: it takes the work directory given as argv[1] when told ("go"), says "ready"
# and holds it until its stdin closes.
OTHER_BUILD = """
import sys
from pathlib import Path
from edgesdk.build.checkpoint import WorkDir
sys.stdin.readline()
work = WorkDir(Path(sys.argv[1]), {"recipe": 1}, resume=False)
print("ready", flush=True)
sys.stdin.read()
work.release()
"""


def test_a_build_starting_over_does_not_delete_a_work_directory_another_build_made_meanwhile(tmp_path, monkeypatch):
    """A build that found no work directory took no lock, and when it started over it deleted whatever was there by
    then: another build's work directory, made and locked meanwhile (two builds to the same --out started
    together). The second build went on writing its state into the first one's new directory. A work directory
    found when starting over is locked before it is removed: the build held there is named instead."""
    import subprocess
    import sys

    from edgesdk.build import checkpoint
    from edgesdk.errors import BuildError

    path = tmp_path / "b.build"
    other = subprocess.Popen([sys.executable, "-c", OTHER_BUILD, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    check_work_dir = checkpoint.check_work_dir

    def the_other_build_starts_meanwhile(work_path, terms="cli"):
        if not path.exists():  # this build saw no work directory; the other one makes and locks it now
            other.stdin.write("go\n")
            other.stdin.flush()
            assert other.stdout.readline() == "ready\n"
        check_work_dir(work_path, terms)

    monkeypatch.setattr(checkpoint, "check_work_dir", the_other_build_starts_meanwhile)
    try:
        with pytest.raises(BuildError, match="another edgesdk build is using the work directory"):
            checkpoint.WorkDir(path, {"recipe": 2}, resume=False)
        state = json.loads((path / checkpoint.STATE).read_text(encoding="utf-8"))
        assert state["build_key"] == checkpoint._digest({"recipe": 1})  # the other build's, in place
    finally:
        other.stdin.close()
        assert other.wait(timeout=60) == 0


@dataclass(frozen=True)
class ScaleConfig:
    factor: float = 1.0  # multiplies the final norm weight (a visible, checkable change)


@pytest.fixture
def scale_stages():
    """Two stages, 'scale54a' then 'scale54b', each multiplying the final norm by its factor; the names of the
    stages that ran, in order."""
    from edgesdk.build import registry

    ran = []

    def stage(name):
        def run(model, config, ctx):
            ran.append(name)
            model.model.norm.weight.data.mul_(config.factor)
            return model
        return run

    registry.register_stage("scale54a", ScaleConfig, description="scale the final norm")(stage("scale54a"))
    registry.register_stage("scale54b", ScaleConfig, after=("scale54a",), description="scale again")(stage("scale54b"))
    yield ran
    registry.STAGES.pop("scale54a")
    registry.STAGES.pop("scale54b")


def test_a_resume_with_other_settings_of_a_later_stage_keeps_the_stages_before_it(tmp_path, scale_stages, capsys):
    """The whole recipe was one part of the build key: a build killed in its second stage, resumed with that stage's
    settings changed (fewer distillation steps, to finish sooner), was refused, and without --resume the first stage
    (hours of QAT) trained again. The stages before the changed one are taken; it and the ones after it run again,
    and the bundle is the one a straight build with the new settings writes."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model = save_tiny_model_dir(tmp_path / "model")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nstages:\n  - stage: scale54a\n    config: {factor: 2.0}\n  - stage: scale54b\n",
                      encoding="utf-8")

    def run(out, second, resume=False):
        return build(BuildConfig(target="host", model=str(model), out=tmp_path / out, recipe=str(recipe),
                                 overrides=(f"scale54b.factor={second}",), data=DataConfig(generated_sequences=0),
                                 export=ExportConfig(max_context=64), keep_work=True, resume=resume, progress=False))

    run("b", 3.0)
    assert scale_stages == ["scale54a", "scale54b"]
    capsys.readouterr()
    resumed = run("b", 5.0, resume=True)
    assert scale_stages == ["scale54a", "scale54b", "scale54b"]  # the first stage was taken from its checkpoint
    err = capsys.readouterr().err
    assert "reusing the loaded model's figures (baseline), stage 'scale54a' from" in err
    assert "the settings of the scale54b stage or a stage before it (the recipe, --set scale54b.*, or a shortcut " \
           "option) changed since the earlier build" in err
    straight = run("straight", 5.0)
    assert resumed.manifest["stages"][1]["config"] == {"factor": 5.0}
    assert (resumed.path / "model.onnx.data").read_bytes() == (straight.path / "model.onnx.data").read_bytes()


def test_a_resume_with_other_settings_of_the_first_stage_runs_every_stage_again(tmp_path, scale_stages):
    """A stage's key holds the settings of the stages before it: a change to the first one runs the second again."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model = save_tiny_model_dir(tmp_path / "model")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nstages:\n  - stage: scale54a\n  - stage: scale54b\n", encoding="utf-8")

    def run(first, resume=False):
        return build(BuildConfig(target="host", model=str(model), out=tmp_path / "b", recipe=str(recipe),
                                 overrides=(f"scale54a.factor={first}",), data=DataConfig(generated_sequences=0),
                                 export=ExportConfig(max_context=64), keep_work=True, resume=resume, progress=False))

    run(2.0)
    run(3.0, resume=True)
    assert scale_stages == ["scale54a", "scale54b", "scale54a", "scale54b"]
