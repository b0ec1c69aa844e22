"""Build pipeline: stage registry ordering rules, recipes, checkpoints and resume after a kill."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from edgesdk.build import registry
from edgesdk.build.recipes import Recipe, load_recipe, shipped_recipes
from edgesdk.build.registry import check_order, make_config, register_stage
from edgesdk.errors import BuildError


@dataclass(frozen=True)
class ScaleConfig:
    factor: float = 1.0  # multiplies the final norm weight (a visible, checkable change)


@pytest.fixture
def test_stages():
    """Two throwaway stages, 'first' and 'second' (which must come after 'first')."""
    calls = []

    @register_stage("first", ScaleConfig, description="scale the final norm")
    def first(model, config, ctx):
        calls.append("first")
        ctx.metrics["factor"] = config.factor
        model.model.norm.weight.data.mul_(config.factor)
        return model

    @register_stage("second", ScaleConfig, after=("first",), description="scale again")
    def second(model, config, ctx):
        calls.append("second")
        model.model.norm.weight.data.mul_(config.factor)
        return model

    yield calls
    registry.STAGES.pop("first")
    registry.STAGES.pop("second")


def test_order_rules_checked_before_compute(test_stages):
    check_order(["first", "second"])
    with pytest.raises(BuildError, match="'second' must come after 'first'"):
        check_order(["second", "first"])
    with pytest.raises(BuildError, match="appears twice"):
        check_order(["first", "first"])
    with pytest.raises(BuildError, match=r"unknown build stage 'nope'; known stages: .*first, .*second"):
        check_order(["nope"])


def test_stage_config_rejects_unknown_keys(test_stages):
    assert make_config("first", {"factor": 2.0}).factor == 2.0
    with pytest.raises(BuildError, match=r"no option\(s\) \['facter'\]; allowed: \['factor'\]"):
        make_config("first", {"facter": 2.0})


def test_register_twice_is_refused(test_stages):
    with pytest.raises(ValueError, match="registered twice"):
        register_stage("first", ScaleConfig)(lambda m, c, x: m)


def test_recipes_load_and_validate(tmp_path):
    assert "default" in shipped_recipes()
    assert [entry.stage for entry in load_recipe("default").stages] == ["qat"]
    assert load_recipe("fp32-fused").stages == ()
    with pytest.raises(BuildError, match="unknown recipe 'nope'"):
        load_recipe("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nstages: []\nextra: 1\n")
    with pytest.raises(BuildError,
                       match=r"bad\.yaml is invalid: extra is not a known key \(allowed keys: name,") as invalid:
        load_recipe(str(bad))
    assert Path(invalid.value.fix.rsplit(" ", 1)[-1]).is_file()  # a shipped recipe the user has
    no_suffix = tmp_path / "mine"
    no_suffix.write_text("name: mine\nstages: []\n")
    with pytest.raises(BuildError, match="does not end in .yaml or .yml") as unnamed:
        load_recipe(str(no_suffix))
    assert unnamed.value.fix == f"rename it to {no_suffix}.yaml and pass that path"
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\u00e9\nstages: []\n".encode("latin-1"))
    with pytest.raises(BuildError, match=r"recipe file .*latin.yaml is not UTF-8 text .* at byte 9"):
        load_recipe(str(latin))


def _build(tiny_model_dir, out, recipe, resume=False):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    return build(BuildConfig(target="host", model=str(tiny_model_dir), out=out, recipe=str(recipe),
                             export=ExportConfig(max_context=64), resume=resume, progress=False))


def test_killed_build_resumes_after_last_finished_step(test_stages, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Without progress bars, saving and loading the checkpoints shows none either (transformers drew its
    'Writing model shards' and 'Loading weights' bars). The resumed build takes its model from the checkpoint
    without first copying the loaded one for the stages (three models in memory where the build held two)."""
    import copy

    import edgesdk.build.pipeline as pipeline

    recipe = tmp_path / "two.yaml"
    recipe.write_text("name: two\nstages:\n  - stage: first\n    config: {factor: 2.0}\n"
                      "  - stage: second\n    config: {factor: 3.0}\n")
    out = tmp_path / "bundle"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while exporting")

    monkeypatch.setattr(pipeline, "export_model", killed)
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_model_dir, out, recipe)
    assert test_stages == ["first", "second"]
    assert not out.exists()
    assert (tmp_path / "bundle.build" / "stages" / "01-second").is_dir()
    err = capsys.readouterr().err
    assert "%|" not in err
    assert "(baseline, stage:first, stage:second) are kept in" in err
    assert "run the same command with --resume" in err

    monkeypatch.undo()
    deepcopy, copied = copy.deepcopy, []

    def watched_deepcopy(value, *args, **kwargs):
        if hasattr(value, "lm_head"):  # a whole causal LM, not one of its parts
            copied.append(type(value).__name__)
        return deepcopy(value, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", watched_deepcopy)
    bundle = _build(tiny_model_dir, out, recipe, resume=True)
    monkeypatch.undo()
    assert copied == []
    err = capsys.readouterr().err
    assert "resuming after stage 'second' from its checkpoint (2 of 2 stages done)" in err
    assert "%|" not in err
    assert test_stages == ["first", "second"]  # no stage ran again
    assert [s["stage"] for s in bundle.manifest["stages"]] == ["first", "second"]
    assert bundle.manifest["stages"][0]["metrics"] == {"factor": 2.0}
    assert not (tmp_path / "bundle.build").exists()  # work dir removed after success

    # The resumed model carries both scalings: compare with a straight build's final norm (the source's
    # final norm times 2 and 3; the tiny model's norm is not all ones, so compare with the source's own).
    import numpy as np
    import onnx
    from safetensors.numpy import load_file

    source = load_file(str(tiny_model_dir / "model.safetensors"))["model.norm.weight"]
    graph = onnx.load(str(out / "model.onnx"))
    norm = next(t for t in graph.graph.initializer if t.name == "final_norm.weight")
    np.testing.assert_allclose(onnx.numpy_helper.to_array(norm), source * 6.0, rtol=1e-5)


@pytest.mark.parametrize("recipe_name", ["fp32-fused", "int8-qdq-ptq"])
def test_a_build_killed_after_export_resumes_to_the_same_bundle_id(recipe_name, tiny_model_dir, tmp_path,
                                                                 monkeypatch):
    """The export record comes back from state.json with its keys sorted; the report's validation rows
    (hashed into the bundle id) must not depend on that order."""
    from edgesdk.build import checkpoint

    recipe = recipe_name
    if recipe_name == "int8-qdq-ptq":  # QDQ without stages: several validation rows (weights, qdq, shipped)
        recipe = tmp_path / "qdq.yaml"
        recipe.write_text("name: qdq\nstages: []\nexport: {form: standard, weights: int8}\n")
    straight = _build(tiny_model_dir, tmp_path / "straight", recipe)
    mark_done = checkpoint.WorkDir.mark_done

    def killed_after_export(self, step, record):
        result = mark_done(self, step, record)
        if step == "export":
            raise KeyboardInterrupt("killed after the export")
        return result

    monkeypatch.setattr(checkpoint.WorkDir, "mark_done", killed_after_export)
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_model_dir, tmp_path / "resumed", recipe)
    monkeypatch.undo()
    resumed = _build(tiny_model_dir, tmp_path / "resumed", recipe, resume=True)
    assert (resumed.path / "report.md").read_text() == (straight.path / "report.md").read_text()
    assert resumed.bundle_id == straight.bundle_id


def test_a_resume_with_other_validation_settings_validates_the_export_again(tiny_model_dir, tmp_path, capsys):
    """The validation settings are not in the build key (they change no stage): a resumed build that asks for
    another check exported and validated again instead of taking the earlier check's figures as its own."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.errors import EdgeSDKError
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.export.validate import ValidationConfig

    def built(validation: ValidationConfig, resume: bool):
        return build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "b", recipe="fp32-fused",
                                 export=ExportConfig(max_context=64), validation=validation, resume=resume,
                                 keep_work=True, progress=False))

    built(ValidationConfig(), resume=False)
    built(ValidationConfig(), resume=True)
    assert "[2/3] export: done in an earlier run" in capsys.readouterr().err
    with pytest.raises(EdgeSDKError, match=r"differs from PyTorch by more than atol=1\.?\d*e-30"):
        built(ValidationConfig(prompts=1, atol=1e-30), resume=True)  # no float32 graph passes that
    assert "the export was validated with other settings" in capsys.readouterr().err


@pytest.mark.parametrize(("change", "named"), [
    ("recipe", "the recipe's stages (--recipe or its file)"),
    ("edgesdk-version", "the edgesdk version"),
    ("target-yaml", "the target profile (--target or its YAML: its sparsity_block"),
])
def test_resume_refuses_a_different_build_naming_what_changed(test_stages, tiny_model_dir, tmp_path, monkeypatch,
                                                              change, named):
    """Another recipe, target, or another edgesdk (a stage's code may have changed between releases): the old
    checkpoints are not this build's, and the refusal names what changed (it listed every input). Another context,
    or other settings of a stage, are taken: what depends on them is made again (test_build54.py)."""
    import edgesdk.build.pipeline as pipeline
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    recipe = tmp_path / "one.yaml"
    recipe.write_text("name: one\nstages:\n  - stage: first\n")
    target = tmp_path / "host.yaml"
    host = (Path(__file__).resolve().parents[2] / "targets" / "host.yaml").read_text()
    target.write_text(host)

    def run(resume=False):
        return build(BuildConfig(target=str(target), model=str(tiny_model_dir), out=tmp_path / "b",
                                 recipe=str(recipe), export=ExportConfig(max_context=64), resume=resume,
                                 progress=False))

    monkeypatch.setattr(pipeline, "export_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.undo()
    if change == "recipe":
        recipe.write_text("name: one\nstages:\n  - stage: first\n  - stage: second\n")  # another stage list
    elif change == "edgesdk-version":
        monkeypatch.setattr(pipeline, "__version__", "99.0.0")
    else:
        target.write_text(host.replace("sparsity_block: 32", "sparsity_block: 16", 1))  # a setting a step reads
    with pytest.raises(BuildError, match="belongs to a different build: ") as refused:
        run(resume=True)
    changed = refused.value.problem.split("belongs to a different build: ", 1)[1]
    assert changed.startswith(named)
    assert changed.count("(") == named.count("(")  # only what changed is named
    assert "drop --resume" in refused.value.fix


def test_a_resume_with_nothing_to_resume_says_it_starts_from_the_beginning(tiny_model_dir, tmp_path, capsys):
    """--resume where no earlier build left a step (another --out, or a build that already finished) started
    over without a word: the user took it for a resumed build."""
    _build(tiny_model_dir, tmp_path / "b", "fp32-fused", resume=True)
    err = capsys.readouterr().err
    assert f"--resume: no finished step of this build in {tmp_path / 'b.build'}; starting from the beginning" in err
    _build(tiny_model_dir, tmp_path / "b", "fp32-fused")
    assert "--resume" not in capsys.readouterr().err


def test_training_text_with_a_recipe_without_stages_is_named_as_unused(tiny_model_dir, tmp_path, capsys):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    text = tmp_path / "train.txt"
    text.write_text("some training text\n")
    build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "b", recipe="fp32-fused",
                      data=DataConfig(files=(str(text),)), export=ExportConfig(max_context=64), progress=False))
    err = capsys.readouterr().err
    assert f"warning: --data {text} is not used: recipe 'fp32-fused' has no training stages" in err


def test_bad_order_fails_before_loading_anything(test_stages, tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("name: bad\nstages:\n  - stage: second\n  - stage: first\n")
    with pytest.raises(BuildError, match="must come after"):
        # the model path does not exist: the order check must fire first
        _build(tmp_path / "no-model", tmp_path / "b", recipe)


def test_recipe_model_roundtrip():
    recipe = Recipe(name="x", stages=())
    assert Recipe.model_validate(recipe.model_dump()) == recipe


def test_resume_refuses_a_build_whose_training_text_changed(test_stages, tiny_model_dir, tmp_path, monkeypatch):
    """Same file name, other content: the checkpoints were trained on the old text."""
    import edgesdk.build.pipeline as pipeline
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    recipe = tmp_path / "one.yaml"
    recipe.write_text("name: one\nstages:\n  - stage: first\n")
    text = tmp_path / "train.txt"
    text.write_text("the first training text\n")

    def run(resume=False):
        return build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "b", recipe=str(recipe),
                                 data=DataConfig(files=(str(text),)), export=ExportConfig(max_context=64),
                                 resume=resume, progress=False))

    monkeypatch.setattr(pipeline, "export_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.undo()
    text.write_text("another training text, longer than the first\n")
    with pytest.raises(BuildError, match="belongs to a different build"):
        run(resume=True)


@pytest.mark.parametrize(("content", "match"), [
    (None, "does not exist"),
    ("caf\u00e9\n".encode("latin-1") * 50, "is not UTF-8"),
    (b"short", "is empty after skipping 100 characters"),
], ids=["missing", "latin-1", "too-short"])
def test_training_text_is_checked_before_the_model_loads(test_stages, tmp_path, content, match):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig

    recipe = tmp_path / "one.yaml"
    recipe.write_text("name: one\nstages:\n  - stage: first\n")
    text = tmp_path / "train.txt"
    if content is not None:
        text.write_bytes(content)
    with pytest.raises(BuildError, match=match) as info:  # the model path does not exist: this check comes first
        build(BuildConfig(target="host", model=str(tmp_path / "no-model"), out=tmp_path / "b", recipe=str(recipe),
                          data=DataConfig(files=(str(text),), skip_chars=100), progress=False))
    assert info.value.fix


def users_path(path: Path, kind: str) -> Path:
    """A file of the user's at ``path`` ("file"), or a directory there holding one; returns that file."""
    if kind == "file":
        path.write_text("precious\n")
        return path
    path.mkdir()
    (path / "notes.txt").write_text("precious\n")
    return path / "notes.txt"


@pytest.mark.parametrize("kind", ["user-directory", "file"])
def test_an_output_path_that_is_not_a_bundle_is_left_alone(tiny_model_dir, tmp_path, kind):
    from edgesdk.errors import BundleError

    out = tmp_path / "mine"
    precious = users_path(out, kind)
    with pytest.raises(BundleError, match="not a bundle|is a file"):
        _build(tiny_model_dir, out, "fp32-fused")
    assert precious.read_text() == "precious\n"
    assert not (tmp_path / "mine.build").exists()


def test_recipe_overrides_with_bad_yaml_or_values_are_build_errors():
    recipe = load_recipe("fp32-fused")
    with pytest.raises(BuildError, match=r"override 'export.weights=\[int4': the value .* is not valid YAML"):
        recipe.with_overrides(["export.weights=[int4"])
    with pytest.raises(BuildError, match="block_size must be a power of two"):
        recipe.with_overrides(["export.block_size=48"]).validated()
    with pytest.raises(BuildError, match="temperature must be a positive finite number"):
        load_recipe("int4-prune").with_overrides(["distill.temperature=0"]).validated()
    with pytest.raises(BuildError, match="ffn_multiple must be >= 1") as refused:
        load_recipe("int4-prune").with_overrides(["prune.ffn_multiple=0"]).validated()
    assert "--set" in refused.value.fix  # the value may come from the command line, not the (shipped) recipe
    with pytest.raises(BuildError, match=r"'\.x=3' is not of the form stage\.field=value"):
        recipe.with_overrides([".x=3"])
    with pytest.raises(BuildError, match="has no stage 'prune'") as refused:
        recipe.with_overrides(["prune.ffn_ratio=0.4"])
    assert "--recipe int4-prune" in refused.value.fix


def test_the_recipe_named_default_is_the_shipped_one_and_no_recipe_is_the_targets(tiny_model_dir, tmp_path):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    plain = build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "a",
                              export=ExportConfig(max_context=64), progress=False))
    assert plain.manifest["recipe"]["name"] == "fp32-fused"  # host.yaml's default_recipe
    assert load_recipe("default").name != "fp32-fused"
    assert plain.manifest["model"]["before"]["source"] == str(tiny_model_dir.resolve())


def test_sparsify_block_other_than_the_profiles_fails_before_any_stage(tmp_path):
    """A sparse export stores the profile's sparsity_block; another sparsify.block_size used to fail at export,
    after every stage. The model path does not exist: the check fires before anything loads."""
    from tests._utils.builds import JETSON_RECIPE

    recipe = tmp_path / "jetson16.yaml"
    recipe.write_text(JETSON_RECIPE.replace("density: 0.5,", "density: 0.5, block_size: 16,"))
    from edgesdk.build.pipeline import BuildConfig, build

    with pytest.raises(BuildError, match="sparsify.block_size is 16, but orin-nx.*'s .* sparsity_block, 32") as refused:
        build(BuildConfig(target="orin-nx", model=str(tmp_path / "no-model"), out=tmp_path / "b",
                          recipe=str(recipe), progress=False))
    assert "--set sparsify.block_size=32" in refused.value.fix
    assert not (tmp_path / "b.build").exists()


def test_fused_form_refuses_a_head_dim_its_attention_cannot_take(tmp_path):
    """head_dim 12 (hidden 48, 4 heads): GroupQueryAttention needs a multiple of 16. Refused when the model is
    loaded, naming the standard form, not as an ONNX Runtime traceback during validation."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.errors import ExportError
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "hd12", hidden=48, heads=4, kv_heads=2)
    with pytest.raises(ExportError, match="head_dim is 12; the ort-fused form's GroupQueryAttention") as refused:
        build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b", recipe="fp32-fused",
                          export=ExportConfig(max_context=64), progress=False))
    assert "fp32-standard" in refused.value.fix
    assert not (tmp_path / "b.build").exists()  # nothing to resume: no empty work directory left
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "s", recipe="fp32-standard",
                               export=ExportConfig(max_context=64), progress=False))
    assert bundle.manifest["graph"]["form"] == "standard"


def test_a_sliding_window_shorter_than_the_context_is_refused_and_one_within_it_builds(tmp_path):
    """The graph attends over the whole context: the same as the model's window only up to the window."""
    import json

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.errors import ExportError
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "mistral", model_type="mistral")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "sliding_window": 32}))
    with pytest.raises(ExportError, match="sliding window of 32 tokens, shorter than the bundle's context of 64") \
            as refused:
        build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b", recipe="fp32-standard",
                          export=ExportConfig(max_context=64), progress=False))
    assert "--max-context 32" in refused.value.fix
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "w", recipe="fp32-standard",
                               export=ExportConfig(max_context=32), progress=False))
    assert bundle.manifest["graph"]["max_context"] == 32


@pytest.mark.parametrize("bias", ["attention_bias", "mlp_bias"])
def test_llama_with_o_proj_or_mlp_biases_is_refused_at_load(bias, tmp_path):
    """Llama's attention_bias also biases o_proj, mlp_bias every MLP projection; the exporter carries only
    q/k/v biases, so such a model is refused when it loads instead of failing the export check."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from edgesdk.errors import ModelSourceError
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.tiny import tiny_tokenizer

    config = AutoConfig.for_model("llama", vocab_size=320, hidden_size=64, intermediate_size=112,
                                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, **{bias: True})
    path = tmp_path / "biased"
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tiny_tokenizer(320).save_pretrained(path)
    with pytest.raises(ModelSourceError, match=f"sets {bias}: true") as refused:
        load_model(resolve_model(str(path)))
    assert "attention_bias and mlp_bias false" in refused.value.fix


def test_a_decoder_whose_ffn_is_not_silu_is_refused_at_load(tmp_path):
    """The graphs compute SwiGLU; a GELU config (the same weights' names) would export with wrong answers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from edgesdk.errors import ModelSourceError
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.tiny import tiny_tokenizer

    config = AutoConfig.for_model("qwen3", vocab_size=320, hidden_size=64, intermediate_size=112, head_dim=16,
                                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                  hidden_act="gelu_pytorch_tanh")
    path = tmp_path / "gelu"
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tiny_tokenizer(320).save_pretrained(path)
    with pytest.raises(ModelSourceError, match="uses hidden_act 'gelu_pytorch_tanh'") as refused:
        load_model(resolve_model(str(path)))
    assert "activation is silu" in refused.value.fix


def test_the_report_names_the_export_of_a_recipe_without_stages(tiny_model_dir, tmp_path):
    recipe = tmp_path / "ptq.yaml"
    recipe.write_text("name: ptq\nstages: []\nexport: {form: ort-fused, weights: int8}\n")
    bundle = _build(tiny_model_dir, tmp_path / "b", recipe)
    report = (bundle.path / "report.md").read_text()
    assert "stages: none (int8 export)" in report
    assert "fp32 export" not in report


def test_a_context_the_export_refuses_fails_before_any_stage(test_stages, tiny_model_dir, tmp_path):
    """--max-context below 16 used to run every stage and then fail at the export."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    recipe = tmp_path / "one.yaml"
    recipe.write_text("name: one\nstages:\n  - stage: first\n")
    with pytest.raises(BuildError, match="--max-context is 8, but a bundle needs a context of at least 16") as refused:
        build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "b", recipe=str(recipe),
                          export=ExportConfig(max_context=8), progress=False))
    assert "--max-context 16" in refused.value.fix
    assert test_stages == []
    assert not (tmp_path / "b.build").exists()


def _read_only_directory(path):
    """``path`` made a directory this process cannot write (chmod; for root, which ignores modes, the
    immutable attribute), or None where neither takes."""
    import os
    import subprocess

    path.mkdir()
    path.chmod(0o555)
    if not os.access(path, os.W_OK):
        return path
    try:
        subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return path


def _writable_again(path):
    """Undo :func:`_read_only_directory`."""
    import subprocess

    try:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    except OSError:
        pass
    path.chmod(0o755)


def test_an_output_under_a_file_is_a_build_error_before_the_model_loads(tmp_path):
    """It used to be a NotADirectoryError traceback when the work directory was made."""
    from edgesdk.build.pipeline import BuildConfig, build

    (tmp_path / "notes.txt").write_text("precious\n")
    with pytest.raises(BuildError, match=r"--out .*notes.txt/b: .*notes.txt is a file") as refused:
        build(BuildConfig(target="host", model=str(tmp_path / "no-model"), out=tmp_path / "notes.txt" / "b",
                          recipe="fp32-fused", progress=False))  # the model path does not exist: this check is first
    assert "--out" in refused.value.fix
    assert (tmp_path / "notes.txt").read_text() == "precious\n"


def test_an_output_in_a_read_only_directory_is_a_build_error_before_the_model_loads(tmp_path):
    """It used to be a PermissionError traceback when the work directory was made."""
    from edgesdk.build.pipeline import BuildConfig, build

    locked = _read_only_directory(tmp_path / "locked")
    if locked is None:
        pytest.skip("no way to make a directory read-only for this user here")
    try:
        with pytest.raises(BuildError, match=r"--out .*locked/new/b: the directory .*locked is not writable") \
                as refused:
            build(BuildConfig(target="host", model=str(tmp_path / "no-model"), out=locked / "new" / "b",
                              recipe="fp32-fused", progress=False))
    finally:
        _writable_again(locked)
    assert "writable" in refused.value.fix
    assert list(locked.iterdir()) == []


def test_models_whose_names_differ_after_a_dot_get_their_own_default_bundle(tmp_path, monkeypatch):
    """bundles/<model>-<target> took the directory's "stem": Qwen2.5-0.5B and Qwen2.5-0.5B-Instruct both
    became bundles/Qwen2.5-0-host, and the second build replaced the first model's bundle."""
    from pathlib import Path

    from edgesdk.build.pipeline import default_out

    base, instruct = tmp_path / "Qwen2.5-0.5B", tmp_path / "Qwen2.5-0.5B-Instruct"
    assert default_out(str(base), "host") == Path("bundles/Qwen2.5-0.5B-host")
    assert default_out(str(instruct) + "/", "host") == Path("bundles/Qwen2.5-0.5B-Instruct-host")
    assert default_out(str(tmp_path / "SmolLM2-1.7B.Q4_0.gguf"), "rpi5") == Path("bundles/SmolLM2-1.7B.Q4_0-rpi5")
    assert default_out("smollm2-135m", "rpi5") == Path("bundles/smollm2-135m-rpi5")
    base.mkdir()
    monkeypatch.chdir(base)
    assert default_out(".", "host") == Path("bundles/Qwen2.5-0.5B-host")


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_path_at_the_work_directory_that_is_not_one_is_left_alone(tiny_model_dir, tmp_path, kind):
    """<out>.build is deleted when a build starts over; a directory or file of the user's there was deleted too."""
    precious = users_path(tmp_path / "mine.build", kind)
    for resume in (False, True):
        with pytest.raises(BuildError, match=r"work directory .*mine.build is taken") as refused:
            _build(tiny_model_dir, tmp_path / "mine", "fp32-fused", resume=resume)
        assert "--out" in refused.value.fix
    assert precious.read_text() == "precious\n"
    assert not (tmp_path / "mine").exists()


def test_a_left_work_directory_is_still_replaced_by_a_new_build(tiny_model_dir, tmp_path):
    """An edgesdk work directory (its state file, or empty after a kill before the first state) starts over."""
    for content in ("state", "empty"):
        work = tmp_path / f"{content}.build"
        work.mkdir()
        if content == "state":
            (work / "state.json").write_text('{"build_key": "old", "done": {}}')
        bundle = _build(tiny_model_dir, tmp_path / content, "fp32-fused")
        assert bundle.path == tmp_path / content
        assert not work.exists()


def test_a_recipe_path_that_is_a_directory_is_named_as_one(tmp_path):
    (tmp_path / "mine.yaml").mkdir()
    with pytest.raises(BuildError, match=r"recipe file .*mine.yaml is a directory, not a file"):
        load_recipe(str(tmp_path / "mine.yaml"))


def test_a_bad_export_override_names_the_key_the_value_and_the_keys_there_are():
    """It printed pydantic's whole report (with its web link) and the fix 'fix the --set values'."""
    recipe = load_recipe("int8-only")
    with pytest.raises(BuildError) as refused:
        recipe.with_overrides(["export.weights=int3"])
    assert "--set export.weights=int3 makes recipe 'int8-only' invalid: export.weights='int3': Input should be " \
           "'fp32', 'int8' or 'int4'" in refused.value.problem
    assert "errors.pydantic.dev" not in str(refused.value)
    with pytest.raises(BuildError, match="export.wieghts is not a known key") as refused:
        recipe.with_overrides(["export.wieghts=int4"])
    assert "export keys: form, weights, block_size" in refused.value.fix


def test_a_second_build_to_the_same_out_is_refused_while_the_first_runs(tmp_path):
    """The first build holds its work directory; the second would otherwise delete the first one's
    checkpoints under it (starting over) or resume from a state still being written."""
    import subprocess
    import sys

    from edgesdk.build.checkpoint import WorkDir

    work = tmp_path / "out.build"
    first = WorkDir(work, {"build": 1}, resume=False)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from edgesdk.build.checkpoint import lock_work_dir\n"
                               f"lock_work_dir({str(work)!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        first.release()
        assert holder.stdout.readline().strip() == "held"
        for resume in (False, True):
            with pytest.raises(BuildError, match="another edgesdk build is using the work directory") as error:
                WorkDir(work, {"build": 2}, resume=resume)
            assert "--out another path" in error.value.fix
        assert (work / "state.json").is_file()  # the first build's state is still there
    finally:
        holder.kill()
        holder.wait()
    WorkDir(work, {"build": 2}, resume=False).release()  # free again once the first build is gone
    WorkDir(work, {"build": 3}, resume=False)  # and once this process's own earlier build has ended


def test_a_build_that_failed_leaves_its_work_directory_to_other_builds(test_stages, tiny_model_dir, tmp_path):
    """A build that raised (a stage failed) in a process that goes on (a notebook, a sweep of builds) held
    the lock on its work directory until that process ended: '--resume' from a shell was refused as
    'another edgesdk build is using the work directory ... right now'."""
    import subprocess
    import sys

    from edgesdk.build.checkpoint import _HELD

    @register_stage("fails", ScaleConfig, description="a stage that fails")
    def fails(model, config, ctx):
        raise BuildError("the stage failed", "fix it")

    try:
        recipe = tmp_path / "fails.yaml"
        recipe.write_text("name: fails\nstages:\n  - stage: first\n  - stage: fails\n")
        with pytest.raises(BuildError, match="the stage failed"):
            _build(tiny_model_dir, tmp_path / "b", recipe)
    finally:
        registry.STAGES.pop("fails")
    work = tmp_path / "b.build"
    assert (work / "state.json").is_file()  # kept for --resume
    assert str(work) not in _HELD
    other = subprocess.run([sys.executable, "-c", "import sys\nfrom edgesdk.build.checkpoint import lock_work_dir\n"
                            f"lock_work_dir({str(work)!r})"], capture_output=True, text=True)
    assert other.returncode == 0, other.stderr


def test_a_refused_resume_leaves_the_work_directory_unlocked(tmp_path):
    """--resume of another build's work directory is refused; the lock taken to read it was kept."""
    from edgesdk.build.checkpoint import _HELD, WorkDir

    work = tmp_path / "out.build"
    WorkDir(work, {"build": 1}, resume=False).release()
    with pytest.raises(BuildError, match="belongs to a different build"):
        WorkDir(work, {"build": 2}, resume=True)
    assert str(work) not in _HELD


def test_a_work_directory_is_removed_in_one_step_and_what_a_kill_left_aside_goes_too(tmp_path):
    """Deleting the state file first and being killed left a directory the next build refused as
    'not an edgesdk work directory'; the directory is now renamed aside first, then removed."""
    from edgesdk.build.checkpoint import check_work_dir, remove_work_dir

    work = tmp_path / "out.build"
    (work / "stages" / "00-qat").mkdir(parents=True)
    (work / "state.json").write_text("{}")
    (work / "stages" / "00-qat" / "model.safetensors").write_bytes(b"0" * 1000)
    aside = tmp_path / ".out.build.removing"
    aside.mkdir()
    (aside / "model.safetensors").write_bytes(b"0")  # a removal killed part-way in an earlier build
    remove_work_dir(work)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    check_work_dir(work)  # nothing in the way of the next build


def test_the_report_states_the_block_sparse_bytes_read_per_token():
    from edgesdk.build.package import _sparse_lines

    record = {"block": 32, "layout": "plain", "density": 0.5512, "bytes_sparse": 58_000_000,
              "bytes_dense_int8": 106_790_400,
              "validation": {"max_abs_diff": {"logits/decode": 6.4e-05}, "top1_agree": 1.0},
              "kernels": {"sm": 87, "dir": "kernels/sm_87", "kernels": ["bsr_gemv_plain_32x32_fp16"], "failed": {}}}
    text = "\n".join(_sparse_lines(record))
    assert "55.1% of the decoder weights' blocks kept" in text
    assert "58.0 MB (INT8 blocks, block indices, row scales) against 106.8 MB dense INT8 (0.543x)" in text
    assert "logits/decode 6.400e-05" in text
    assert "sm_87" in text
    assert _sparse_lines(None) == []


def test_reordering_after_block_quantization_is_refused_before_any_stage():
    sparse = load_recipe("jetson-sparse").with_overrides(["sparsify.reorder=true"])
    assert [name for name, _ in sparse.validated()] == ["smooth", "qat", "sparsify", "distill"]
    blocked = Recipe.model_validate({"name": "blocked", "stages": [
        {"stage": "qat", "config": {"weight_bits": 8, "granularity": "block"}},
        {"stage": "sparsify", "config": {"reorder": True}}], "export": {"form": "ort-fused", "weights": "fp32"}})
    with pytest.raises(BuildError, match=r"sparsify.reorder cannot follow a qat stage .*granularity=block"):
        blocked.validated()


def test_the_power_stage_with_the_standard_form_is_refused_before_it_trains():
    """The gated graph is fused-only: the export refused it, but only after the power stage had trained."""
    recipe = load_recipe("power").with_overrides(["export.form=standard"])
    with pytest.raises(BuildError, match=r"recipe 'power': the power stage's gates export to the fused ONNX Runtime "
                                         r"form only, and export.form is standard") as info:
        recipe.validated()
    assert "--set export.form=ort-fused" in info.value.fix
    assert [name for name, _ in load_recipe("power").validated()] == ["power"]
