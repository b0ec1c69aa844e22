"""The compression stages in the real build pipeline: a tiny model through qat -> prune ->
distill, a kill between stages resumes to the same bundle, recipes and overrides validate."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from edgesdk.build.recipes import load_recipe, shipped_recipes  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import CORPUS  # noqa: E402

RECIPE = """name: tiny-compress
stages:
  - stage: qat
    config: {weight_bits: 4, steps: 2, batch_size: 2, sequence_length: 24}
  - stage: prune
    config: {ffn_ratio: 0.3, kv_group_ratio: 0.25, calibration_batches: 2, batch_size: 2, sequence_length: 24,
             ffn_multiple: 16}
  - stage: distill
    config: {steps: 2, batch_size: 2, sequence_length: 24}
export: {form: ort-fused, weights: int4, embedding_bits: 8}
"""


@pytest.fixture
def recipe_and_data(tmp_path):
    recipe = tmp_path / "tiny-compress.yaml"
    recipe.write_text(RECIPE)
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3))
    return recipe, text


def _build(model_dir, out, recipe, text, resume=False):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    data = DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=2, generated_tokens=8)
    return build(BuildConfig(target="host", model=str(model_dir), out=out, recipe=str(recipe), data=data,
                             export=ExportConfig(max_context=64), resume=resume, progress=False))


def test_compression_build_shrinks_the_model_and_reports_each_stage(tiny_model_dir, recipe_and_data, tmp_path):
    recipe, text = recipe_and_data
    bundle = _build(tiny_model_dir, tmp_path / "b", recipe, text)
    stages = bundle.manifest["stages"]
    assert [s["stage"] for s in stages] == ["qat", "prune", "distill"]
    baseline = bundle.manifest["baseline"]
    assert stages[-1]["metrics"]["parameters"] < baseline["parameters"]
    assert stages[0]["metrics"]["weight_bytes"] < baseline["weight_bytes"] / 3  # int4 layers, int8 head
    assert all("heldout_perplexity" in s["metrics"] for s in stages)
    assert "report.png" in bundle.manifest["files"]
    report = (bundle.path / "report.md").read_text()
    assert "## Compression stages" in report
    assert "![compression stages](report.png)" in report
    # The exported graph carries the pruned shapes and equals the baked model (layout check).
    assert bundle.manifest["export_validation"]["max_abs_diff"]["layout/decode"] < 1e-3


def test_the_manifest_facts_after_pruning_follow_the_kept_heads(tiny_model_dir, recipe_and_data, tmp_path):
    """Query heads go with their KV group: the facts after the stages said 4 heads where 2 were kept."""
    _, text = recipe_and_data
    recipe = tmp_path / "heads.yaml"
    recipe.write_text("name: heads\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.0, kv_group_ratio: 0.5, "
                      "calibration_batches: 1, batch_size: 2, sequence_length: 24}\n")
    bundle = _build(tiny_model_dir, tmp_path / "b", recipe, text)
    after, kept = bundle.manifest["model"]["after"], bundle.manifest["stages"][-1]["metrics"]["layers"]
    assert after["attention_heads"] == max(layer["heads"] for layer in kept) == 2
    assert after["kv_heads"] == max(layer["kv_heads"] for layer in kept) == 1
    assert bundle.manifest["model"]["before"]["attention_heads"] == 4


def test_killed_compression_build_resumes_to_the_same_bundle(tiny_model_dir, recipe_and_data, tmp_path,
                                                            monkeypatch):
    import edgesdk.build.registry as registry

    recipe, text = recipe_and_data
    straight = _build(tiny_model_dir, tmp_path / "straight", recipe, text)

    spec = registry.stage_spec("distill")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed during distill")

    monkeypatch.setitem(registry.STAGES, "distill", registry.StageSpec("distill", spec.config_class, killed,
                                                                       spec.after, spec.description))
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        _build(tiny_model_dir, out, recipe, text)
    assert (tmp_path / "resumed.build" / "stages" / "01-prune").is_dir()
    monkeypatch.undo()
    resumed = _build(tiny_model_dir, out, recipe, text, resume=True)
    assert resumed.bundle_id == straight.bundle_id
    assert resumed.manifest["files"]["model.onnx.data"] == straight.manifest["files"]["model.onnx.data"]


def test_shipped_recipes_validate_and_order_rules_hold(tmp_path):
    for name in shipped_recipes():
        load_recipe(name).validated()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nstages:\n  - stage: prune\n  - stage: qat\n")
    with pytest.raises(BuildError, match="'prune' must come after 'qat'"):
        load_recipe(str(bad)).validated()


def test_overrides_change_stage_configs_and_name_the_bad_ones():
    recipe = load_recipe("int8-prune-light").with_overrides(["prune.ffn_ratio=0.4", "export.weights=int4",
                                                             "qat.weight_bits=4"])
    stages = dict(recipe.validated())
    assert stages["prune"].ffn_ratio == 0.4
    assert recipe.export.weights == "int4"
    with pytest.raises(BuildError, match="has no stage 'distill'"):
        load_recipe("int8-only").with_overrides(["distill.steps=3"])
    with pytest.raises(BuildError, match="no option"):
        load_recipe("int8-only").with_overrides(["qat.nonsense=1"]).validated()
    with pytest.raises(BuildError, match="stage.field=value"):
        load_recipe("int8-only").with_overrides(["qat=1"])


def test_override_values_are_checked_against_the_option_types():
    """PyYAML reads ``1e-4`` (no dot) as a string; a float option takes it as the number. A value
    of the wrong type is refused before any compute, naming the option, not deep inside a stage."""
    qat = dict(load_recipe("int4").with_overrides(["qat.lr=3e-4", "qat.steps=12"]).validated())["qat"]
    assert qat.lr == pytest.approx(3e-4)
    assert isinstance(qat.lr, float)
    assert qat.steps == 12
    with pytest.raises(BuildError, match=r"qat' option steps=1.5 is not a valid int") as refused:
        load_recipe("int4").with_overrides(["qat.steps=1.5"]).validated()
    assert "--set qat.steps=<int>" in refused.value.fix
    with pytest.raises(BuildError, match=r"option lr='fast' is not a valid float"):
        load_recipe("int4").with_overrides(["qat.lr=fast"]).validated()
    with pytest.raises(BuildError, match=r"option train_embedding='maybe' is not a valid bool"):
        load_recipe("int4").with_overrides(["qat.train_embedding=maybe"]).validated()


@pytest.mark.parametrize(("recipe", "override", "match"), [
    ("int4-prune", "distill.logits_weight=.nan", r"distill' option logits_weight=nan holds NaN or infinity"),
    ("int4-prune", "distill.attention_weight=nan", r"attention_weight='nan' holds NaN or infinity"),
    ("power", "power.weight_budget=inf", r"weight_budget='inf' holds NaN or infinity"),
    ("power", "power.weights=[0.25, nan, 0.25]", r"option weights=\[0.25, 'nan', 0.25\] holds NaN or infinity"),
    ("int4", "qat.steps=true", r"qat' option steps=True is not a valid int \(a true/false value"),
])
def test_override_values_that_are_not_finite_numbers_are_refused_before_any_stage(recipe, override, match):
    """A NaN loss weight used to run every stage and fail at the export check (NaN logits); YAML's true
    was taken as 1 step."""
    with pytest.raises(BuildError, match=match) as refused:
        load_recipe(recipe).with_overrides([override]).validated()
    assert f"--set {override.split('=')[0]}=" in refused.value.fix
    load_recipe("int4").with_overrides(["qat.train_embedding=false"]).validated()  # a bool option takes a bool


def test_qat_and_export_must_share_the_block_size():
    """QAT learns weights on its block grid; exporting them on another grid is refused before any compute."""
    with pytest.raises(BuildError, match="qat.block_size is 64 but export.block_size is 32"):
        load_recipe("int4").with_overrides(["qat.block_size=64"]).validated()
    both = load_recipe("int4").with_overrides(["qat.block_size=64", "export.block_size=64"])
    assert dict(both.validated())["qat"].block_size == 64
    load_recipe("jetson").with_overrides(["export.block_size=64"]).validated()  # QDQ per channel: no grid
    assert dict(load_recipe("default").validated())["qat"].block_size == load_recipe("default").export.block_size


@pytest.mark.parametrize(("name", "overrides", "match", "fix"), [
    ("default", ["qat.weight_bits=8"], "qat.weight_bits is 8 but the ort-fused int4 export", "--weight-bits 8 sets both"),
    ("int4", ["qat.embedding_bits=4"], "qat.embedding_bits is 4 but .* needs 8", "export.embedding_bits=4"),
    ("int4", ["qat.embedding_bits=null"], "qat.embedding_bits is None", "qat.embedding_bits=8"),
    ("int8-only", ["qat.granularity=channel"], "qat.granularity is channel .* needs block", "qat.granularity=block"),
    ("int8-only", ["qat.activations=tensor"], "qat.activations is tensor .* needs block", "qat.activations=block"),
    ("int8-qdq", ["qat.activations=block"], r"qat.activations is block .*\(QDQ\) export needs tensor or none",
     "qat.activations=tensor"),
    ("jetson", ["qat.weight_bits=4"], "qat.weight_bits is 4 but the standard int8 .* needs 8", "qat.weight_bits=8"),
    ("jetson", ["qat.embedding_bits=8"], "qat.embedding_bits is 8 .* needs None", "qat.embedding_bits=null"),
])
def test_qat_settings_that_the_export_cannot_store_are_refused_before_any_stage(name, overrides, match, fix):
    """QAT trains one quantized form; an export of another would re-round (or drop) what it learned."""
    with pytest.raises(BuildError, match=match) as refused:
        load_recipe(name).with_overrides(overrides).validated()
    assert fix in refused.value.fix
    # the consistent pairs pass: the fused export follows --weight-bits 8 when told to
    load_recipe("default").with_overrides(["qat.weight_bits=8", "export.weights=int8"]).validated()
    load_recipe("int4").with_overrides(["qat.embedding_bits=4", "export.embedding_bits=4"]).validated()
    load_recipe("int8-qdq").with_overrides(["qat.activations=none"]).validated()


def test_weight_bits_conflict_fails_before_the_model_loads(tmp_path):
    """What ``edgesdk build --weight-bits 8`` passes with the default recipe: refused in build() before
    any stage (the model path does not even exist)."""
    from edgesdk.build.pipeline import BuildConfig, build

    with pytest.raises(BuildError, match="qat.weight_bits is 8"):
        build(BuildConfig(target="rpi5", model=str(tmp_path / "absent"), out=tmp_path / "b", recipe="default",
                          overrides=("qat.weight_bits=8",), progress=False))
    assert not (tmp_path / "b.build").exists()


def test_the_weight_bits_shortcut_sets_what_the_recipe_trains_and_stores():
    """--weight-bits N: QAT at N bits and, for a recipe storing quantized fused weights, the export too;
    the QDQ form holds INT8 only, so 4 bits there is refused before any work."""
    from edgesdk.build.recipes import load_recipe

    default = load_recipe("default")
    assert default.weight_bits_overrides(8) == ["qat.weight_bits=8", "export.weights=int8"]
    eight = default.with_overrides(default.weight_bits_overrides(8))
    assert eight.export.weights == "int8"
    eight.validated()  # consistent: trains and stores INT8 layers
    jetson = load_recipe("jetson")
    assert jetson.weight_bits_overrides(8) == ["qat.weight_bits=8"]
    with pytest.raises(BuildError, match="--weight-bits 4: recipe 'jetson' exports the standard INT8 "
                                         r"\(QDQ\) graph, which stores 8-bit weights only"):
        jetson.weight_bits_overrides(4)


@pytest.mark.parametrize("name", ["fp32-fused", "power"])
def test_weight_bits_on_a_recipe_without_qat_names_the_option(name):
    """It named the override --weight-bits makes ('qat.weight_bits=4'), which the user never typed."""
    from edgesdk.build.recipes import load_recipe

    with pytest.raises(BuildError, match=f"--weight-bits 4: recipe '{name}' has no qat stage") as refused:
        load_recipe(name).weight_bits_overrides(4)
    assert "drop --weight-bits" in refused.value.fix


def test_weight_bits_8_on_the_default_recipe_builds_int8_layers(tiny_model_dir, recipe_and_data, tmp_path):
    """Through the CLI, on a tiny model: --weight-bits 8 trains and stores INT8 layers (it used to set
    only QAT's bits, and the default recipe stored INT4)."""
    from click.testing import CliRunner

    from edgesdk.bundle import read_manifest
    from edgesdk.cli import main

    _, text = recipe_and_data
    out = tmp_path / "b"
    result = CliRunner().invoke(main, [
        "build", "--target", "rpi5", "--model", str(tiny_model_dir), "--recipe", "default", "--weight-bits", "8",
        "--set", "qat.steps=1", "--set", "qat.batch_size=2", "--set", "qat.sequence_length=24", "--data", str(text),
        "--data-skip-chars", "2000", "--generated-sequences", "0", "--max-context", "64", "--out", str(out),
        "--no-progress"])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    assert manifest["graph"]["dtype"] == "int8"
    assert manifest["stages"][0]["config"]["weight_bits"] == 8


def test_mixed_precision_build_keeps_the_chosen_units_at_8_bits(tiny_model_dir, recipe_and_data, tmp_path):
    """qat with eight_bit_fraction: the Fisher choice is recorded, costs bytes, and the exported
    graph still equals the baked model (validation compares it with the same mixed weights)."""
    _, text = recipe_and_data
    recipes = {}
    for fraction in (0.0, 0.3):
        recipes[fraction] = tmp_path / f"mixed-{fraction}.yaml"
        recipes[fraction].write_text(
            "name: tiny-mixed\nstages:\n  - stage: qat\n"
            f"    config: {{weight_bits: 4, steps: 1, batch_size: 2, sequence_length: 24, fisher_batches: 2, "
            f"eight_bit_fraction: {fraction}}}\n"
            "export: {form: ort-fused, weights: int4, embedding_bits: 8, weights_codec: zlib}\n")
    plain = _build(tiny_model_dir, tmp_path / "plain", recipes[0.0], text)
    mixed = _build(tiny_model_dir, tmp_path / "mixed", recipes[0.3], text)
    metrics = mixed.manifest["stages"][0]["metrics"]
    assert metrics["eight_bit_units"]
    assert set(metrics["int4_rounding_gain"]) >= set(metrics["eight_bit_units"])
    assert metrics["weight_bytes"] > plain.manifest["stages"][0]["metrics"]["weight_bytes"]
    assert mixed.manifest["export_validation"]["max_abs_diff"]["layout/decode"] < 1e-3
    assert mixed.manifest["graph"]["weights"]["bytes"] > plain.manifest["graph"]["weights"]["bytes"]


@pytest.mark.parametrize("shipped_name", ["default", "int4-small"])
def test_int4_embedding_trained_in_qat_reaches_the_graph(shipped_name, tiny_model_dir, recipe_and_data, tmp_path):
    """A shipped recipe's int4-head QAT on a tiny model (its stage and export settings, few short
    batches): the tied embedding is trained at 4 bits, the graph's LM head reads it at 4 bits on
    the recipe's block grid, and the export equals the baked model."""
    import onnx
    import yaml

    _, text = recipe_and_data
    shipped = load_recipe(shipped_name)
    qat = dict(shipped.stages[0].config)
    assert qat["embedding_bits"] == shipped.export.embedding_bits == 4
    assert qat["train_embedding"] is True
    qat.update(steps=2, batch_size=2, sequence_length=24, lr=0.01)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({"name": f"tiny-{shipped_name}", "stages": [{"stage": "qat", "config": qat}],
                                      "export": shipped.export.model_dump()}))
    bundle = _build(tiny_model_dir, tmp_path / "small", recipe, text)
    graph = onnx.load(str(bundle.path / "model.onnx"), load_external_data=False).graph
    head = [node for node in graph.node if node.op_type == "MatMulNBits" and node.input[1].startswith("embed_tokens")]
    attributes = {a.name: a.i for a in head[0].attribute}
    assert attributes["bits"] == 4
    assert attributes["block_size"] == shipped.export.block_size
    assert bundle.manifest["export_validation"]["max_abs_diff"]["layout/decode"] < 1e-3
    metrics = bundle.manifest["stages"][0]["metrics"]
    assert metrics["trained_parameters"] == metrics["parameters"]  # the tied embedding trained too
