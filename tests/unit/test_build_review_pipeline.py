"""Review of the bundle and build pipeline: profiles, the work directory, resuming from checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml

from edgesdk.build import registry
from edgesdk.build.checkpoint import WorkDir
from edgesdk.build.registry import register_stage
from edgesdk.errors import BuildError, ProfileError
from edgesdk.profile import parse_profile


def _profile_data(name: str = "rpi5") -> dict:
    return yaml.safe_load((resources.files("edgesdk.targets") / f"{name}.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("section", ["thermal", "memory", "cpu"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_profile_number_that_is_not_finite_is_refused_naming_the_key(section, value):
    """NaN passed the thermal order check (NaN compares false with every limit), so a guard built from a NaN
    hard_limit_c never paused and a NaN resume_c ended every pause at once; an infinite DRAM bandwidth made the
    thermal plan's decode rate infinite."""
    keys = {"thermal": ["resume_c", "soft_limit_c", "hard_limit_c", "firmware_throttle_c", "shutdown_c"],
            "memory": ["total_gb", "bandwidth_gbps"], "cpu": ["max_ghz"]}[section]
    for key in keys:
        data = _profile_data()
        data[section][key] = value
        with pytest.raises(ProfileError, match=rf"{section}\.{key}: Input should be a finite number"):
            parse_profile(yaml.safe_dump(data), "my-board.yaml")


@dataclass(frozen=True)
class _Factor:
    factor: float = 1.0  # multiplies the final norm weight (a visible, checkable change)


@pytest.fixture
def scaling_stages():
    """Two throwaway stages that scale the final norm: 'review_first' and 'review_second' (after it)."""
    calls = []

    def scale(name):
        def run(model, config, ctx):
            calls.append(name)
            model.model.norm.weight.data.mul_(config.factor)
            return model
        return run

    register_stage("review_first", _Factor, description="scale the final norm")(scale("review_first"))
    register_stage("review_second", _Factor, after=("review_first",), description="scale again")(
        scale("review_second"))
    yield calls
    registry.STAGES.pop("review_first")
    registry.STAGES.pop("review_second")


def _build(model_dir, out, recipe, resume=False):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    return build(BuildConfig(target="host", model=str(model_dir), out=out, recipe=str(recipe),
                             export=ExportConfig(max_context=64), resume=resume, progress=False))


def _final_norm(bundle):
    import onnx

    graph = onnx.load(str(bundle.path / "model.onnx"))
    norm = next(t for t in graph.graph.initializer if t.name == "final_norm.weight")
    return onnx.numpy_helper.to_array(norm)


def _source_final_norm(model_dir: Path):
    """The source model's final norm (the tiny model's is not all ones, so the stages' scalings are checked
    against it)."""
    from safetensors.numpy import load_file

    return load_file(str(model_dir / "model.safetensors"))["model.norm.weight"]


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("damaged", "how", "rerun"), [
    (["01-review_second"], "flip", ["review_second"]),
    (["01-review_second"], "truncate", ["review_second"]),
    (["00-review_first", "01-review_second"], "flip", ["review_first", "review_second"]),
])
def test_a_checkpoint_damaged_after_its_stage_finished_is_made_again_on_resume(
        scaling_stages, tiny_model_dir, tmp_path, monkeypatch, capsys, damaged, how, rerun):
    """A checkpoint is written before its stage is marked done, but a disk error or a power cut (the files were
    never flushed) can damage it afterwards. --resume loaded it as it was: a flipped byte went into the bundle
    as a wrong weight, which the bundle's own hashes then vouched for, and a truncated file failed with
    safetensors' error. Now the stage whose checkpoint is damaged runs again, and the stages after it."""
    import edgesdk.build.pipeline as pipeline

    recipe = tmp_path / "two.yaml"
    recipe.write_text("name: two\nstages:\n  - stage: review_first\n    config: {factor: 2.0}\n"
                      "  - stage: review_second\n    config: {factor: 3.0}\n")
    monkeypatch.setattr(pipeline, "export_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_model_dir, tmp_path / "b", recipe)
    monkeypatch.undo()
    assert scaling_stages == ["review_first", "review_second"]
    for stage in damaged:
        weights = tmp_path / "b.build" / "stages" / stage / "model.safetensors"
        if how == "flip":
            _flip_last_byte(weights)
        else:
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()
    scaling_stages.clear()

    bundle = _build(tiny_model_dir, tmp_path / "b", recipe, resume=True)
    assert scaling_stages == rerun
    err = capsys.readouterr().err
    assert "--resume: the checkpoint of stage 'review_second' is damaged (model.safetensors " in err
    assert "the stage runs again" in err
    np.testing.assert_allclose(_final_norm(bundle), _source_final_norm(tiny_model_dir) * 6.0, rtol=1e-5)
    assert [s["stage"] for s in bundle.manifest["stages"]] == ["review_first", "review_second"]


def test_exported_files_damaged_before_the_bundle_was_written_are_exported_again(tiny_model_dir, tmp_path,
                                                                                monkeypatch, capsys):
    """A build killed after its export was recorded as done takes the export directory as it finds it. A byte
    that changed there meanwhile went into the bundle, and the bundle's hashes (computed as it is written)
    made the damaged weights verify. Now they are checked against what the export wrote, and made again."""
    import edgesdk.build.pipeline as pipeline

    straight = _build(tiny_model_dir, tmp_path / "straight", "fp32-fused")
    monkeypatch.setattr(pipeline, "write_bundle", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_model_dir, tmp_path / "b", "fp32-fused")
    monkeypatch.undo()
    _flip_last_byte(tmp_path / "b.build" / "export" / "model.onnx.data")
    capsys.readouterr()

    resumed = _build(tiny_model_dir, tmp_path / "b", "fp32-fused", resume=True)
    assert resumed.bundle_id == straight.bundle_id
    err = capsys.readouterr().err
    assert "the exported files in " in err
    assert "are damaged (model.onnx.data changed since it was written); exporting again" in err
    assert (resumed.path / "model.onnx.data").read_bytes() == (straight.path / "model.onnx.data").read_bytes()


@pytest.mark.parametrize("text", ["", '{"build_key": "ab', "[]", '{"done": []}'])
def test_a_damaged_state_file_is_a_build_error_on_resume(tmp_path, text):
    """The state file is replaced in one step, but a disk error or an edit can still leave it unreadable:
    --resume failed with json's JSONDecodeError (or AttributeError on a list) and a traceback."""
    work = tmp_path / "b.build"
    WorkDir(work, {"build": 1}, resume=False).release()
    (work / "state.json").write_text(text)
    with pytest.raises(BuildError, match=r"--resume: the work directory's state file .*state.json cannot be read "
                                         r"\(.*\), so the steps it finished are not known") as refused:
        WorkDir(work, {"build": 1}, resume=True)
    assert refused.value.fix == f"drop --resume to start over (the build replaces {work})"
    WorkDir(work, {"build": 1}, resume=False).release()  # dropping --resume starts over there


@pytest.mark.parametrize("default_recipe", ["defualt", "mine.yaml"])
def test_a_profiles_default_recipe_that_cannot_be_loaded_is_named_as_the_profiles(tmp_path, default_recipe):
    """With no --recipe the build reads the target's default_recipe; a user profile naming one that does not
    exist was refused as "unknown recipe 'defualt'" (or "recipe file mine.yaml does not exist") with the fix
    to pass one of the shipped names, a recipe the user never gave, with no word of the profile."""
    from edgesdk.build.pipeline import BuildConfig, build, shortcut_overrides

    data = _profile_data("host")
    data["default_recipe"] = default_recipe
    data["name"], data["aliases"] = "my-host", []  # an edited copy takes a name of its own (targets/README.md)
    target = tmp_path / "my-host.yaml"
    target.write_text(yaml.safe_dump(data))
    problem = (f"no --recipe given, and the default_recipe of target profile 'my-host' cannot be used: "
               f"{'unknown recipe' if default_recipe == 'defualt' else 'recipe file'} ")
    for attempt in (lambda: build(BuildConfig(target=str(target), model=str(tmp_path / "none"), out=tmp_path / "b")),
                    lambda: shortcut_overrides(str(target), None, {"--density": 0.5})):
        with pytest.raises(BuildError) as refused:
            attempt()
        assert refused.value.problem.startswith(problem)
        assert refused.value.fix.startswith("pass --recipe NAME, or fix default_recipe in the profile (")
    assert not (tmp_path / "b.build").exists()


def _copy_with_manifest(bundle, tmp_path, change):
    """A copy of ``bundle`` whose manifest was edited by ``change`` and its digest rewritten to match."""
    import hashlib
    import json
    import shutil

    path = tmp_path / bundle.path.name
    shutil.copytree(bundle.path, path)
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    change(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / "manifest.json").write_text(text, encoding="utf-8")
    (path / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n", encoding="utf-8")
    return path


def _sparse(weights="model.onnx.data", kernels_dir=None):
    def add(manifest):
        manifest["sparse"] = {"weights": weights, "block": 32}
        if kernels_dir is not None:
            manifest["sparse"]["kernels"] = {"sm": 87, "dir": kernels_dir, "kernels": [], "failed": {}}
    return add


@pytest.mark.parametrize(("change", "match"), [
    (_sparse(weights="../elsewhere/sparse.safetensors"),
     r"'\.\./elsewhere/sparse\.safetensors' is opened by the runtime but not listed"),
    (_sparse(weights="/tmp/sparse.safetensors"), r"'/tmp/sparse\.safetensors' is opened by the runtime but not listed"),
    (_sparse(kernels_dir="../../elsewhere/sm_87"), r"'\.\./\.\./elsewhere/sm_87/index\.json' is opened by the runtime"),
    (_sparse(kernels_dir="kernels/sm_87"), r"'kernels/sm_87/index\.json' is opened by the runtime but not listed"),
    (lambda m: m.update(sparse=["sparse/weights.safetensors"]), r"'sparse' must be a mapping with a 'weights' string"),
    (lambda m: m.update(sparse={"weights": "model.onnx.data", "kernels": {"dir": 87}}),
     r"'kernels', when present, a mapping with a 'dir' string"),
], ids=["weights-dotdot", "weights-absolute", "kernels-dotdot", "kernels-unlisted", "sparse-list", "dir-number"])
def test_a_sparse_record_naming_files_outside_verification_is_refused(tiny_bundle, tmp_path, change, match):
    """The triton backend reads manifest['sparse']['weights'] and loads the cubins of sparse.kernels.dir onto the
    GPU; the manifest check covered the graph, tokenizer and weights files only, so an edited manifest could
    point them outside the bundle (or at unlisted files) and the bundle still verified."""
    from edgesdk.bundle import verify_bundle
    from edgesdk.errors import BundleError

    path = _copy_with_manifest(tiny_bundle, tmp_path, change)
    with pytest.raises(BundleError, match=match) as refused:
        verify_bundle(path)
    assert "edited by hand" in refused.value.fix


def test_a_sound_sparse_record_is_accepted(tiny_bundle, tmp_path):
    """Names in the bundle and listed: the record verifies, its kernel index included."""
    import hashlib

    from edgesdk.bundle import verify_bundle

    index = b'{"variants": []}'

    def add(manifest):
        _sparse(kernels_dir="kernels/sm_87/")(manifest)
        manifest["files"]["kernels/sm_87/index.json"] = {"size": len(index),
                                                         "sha256": hashlib.sha256(index).hexdigest()}

    path = _copy_with_manifest(tiny_bundle, tmp_path, add)
    (path / "kernels" / "sm_87").mkdir(parents=True)
    (path / "kernels" / "sm_87" / "index.json").write_bytes(index)
    assert verify_bundle(path).manifest["sparse"]["kernels"]["dir"] == "kernels/sm_87/"


def test_build_bundle_overrides_keep_none_tuples_and_strings():
    """A mapping's values went through str(): None became the text 'None' and a tuple '(0.3, 0.4, 0.3)', both
    refused by the stage's config for the very values its defaults hold."""
    from edgesdk.api import override_items
    from edgesdk.build.recipes import load_recipe
    from edgesdk.build.registry import make_config
    from edgesdk.power import stage as _power  # noqa: F401  (registers the stage)

    items = override_items({"power.weights": (0.3, 0.4, 0.3), "power.entropy_target": None,
                            "power.peak_layers": (-1,), "power.rounds": 3})
    entry = load_recipe("power").with_overrides(items).stages[0]
    config = make_config(entry.stage, entry.config)
    assert (config.weights, config.entropy_target, config.peak_layers, config.rounds) == ((0.3, 0.4, 0.3), None,
                                                                                         (-1,), 3)
    assert override_items("power.rounds=3") == ("power.rounds=3",)
    assert override_items(["power.rounds=3"]) == ("power.rounds=3",)


def test_a_shortcut_and_a_set_of_the_same_key_are_refused_naming_both(tmp_path):
    """--ffn-ratio 0.3 --set prune.ffn_ratio=0.5 pruned at 0.5: the last override won without a word."""
    from edgesdk.build.pipeline import shortcut_overrides

    with pytest.raises(BuildError) as refused:
        shortcut_overrides("rpi5", "int4-prune", {"--ffn-ratio": 0.3}, ("prune.ffn_ratio=0.5",))
    assert refused.value.problem == "--ffn-ratio 0.3 and --set prune.ffn_ratio=0.5 both set prune.ffn_ratio"
    assert shortcut_overrides("rpi5", "int4-prune", {"--ffn-ratio": 0.3}, ("prune.kv_group_ratio=0.5",)) == \
        ("prune.ffn_ratio=0.3",)


def test_unknown_stage_options_of_mixed_key_types_are_named():
    """YAML reads a bare 1 or yes as an int or a bool key: sorting them beside names raised a TypeError."""
    from edgesdk.build.registry import make_config
    from edgesdk.compress import qat as _qat  # noqa: F401  (registers the stage)

    with pytest.raises(BuildError, match=r"stage 'qat' has no option\(s\) \[1, 'foo'\]"):
        make_config("qat", {1: 2, "foo": 3})


def test_set_values_are_read_as_yaml_1_2_reads_them():
    """PyYAML's YAML 1.1 read --set power.rounds=010 as octal 8 and qat.block_size=1:00 as 60 (the error then
    showed 60, not what was typed)."""
    from edgesdk.build.recipes import load_recipe

    recipe = load_recipe("power").with_overrides(["power.rounds=010", "power.new_tokens=0x10"])
    config = recipe.stages[0].config
    assert (config["rounds"], config["new_tokens"]) == (10, 16)  # 0x10 is hexadecimal in both
    from edgesdk.build.registry import make_config
    from edgesdk.compress import qat as _qat  # noqa: F401  (registers the stage)

    entry = load_recipe("int4-prune").with_overrides(["qat.block_size=1:00"]).stages[0]
    with pytest.raises(BuildError, match="'1:00'"):
        make_config(entry.stage, entry.config)
