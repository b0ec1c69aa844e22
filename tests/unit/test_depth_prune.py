"""Depth pruning in the prune stage: which layers go, the model without them, and the build around it."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.prune import PruneConfig, plan_depth  # noqa: E402
from edgesdk.compress.structure import keep_layers, layer_records, load_pruned, teacher_layers  # noqa: E402
from tests._utils.tiny import CORPUS, save_tiny_model_dir, tiny_llama  # noqa: E402

DEPTH_RECIPE = """name: tiny-depth
stages:
  - stage: qat
    config: {{weight_bits: 4, steps: 2, batch_size: 2, sequence_length: 24}}
  - stage: prune
    config: {{layers_removed: {removed}, ffn_ratio: {ffn}, calibration_batches: 2, layer_calibration_batches: 2,
             batch_size: 2, sequence_length: 24, ffn_multiple: 16}}
  - stage: distill
    config: {{steps: 2, batch_size: 2, sequence_length: 24}}
export: {{form: ort-fused, weights: int4, embedding_bits: 8}}
"""


def _batches(vocab: int = 320, count: int = 2):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (2, 16), generator=generator) for _ in range(count)]


def _silence(layer) -> None:
    """Make a decoder layer the identity: both residual branches write zeros."""
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


def test_the_layer_the_model_does_not_need_is_removed_first():
    model = tiny_llama(layers=4)
    _silence(model.model.layers[2])
    kept, rounds = plan_depth(model, _batches(), remove=1)
    assert kept == [0, 1, 3]
    assert rounds[0][2] < 1e-6 < min(cost for i, cost in enumerate(rounds[0]) if i != 2)
    assert len(model.model.layers) == 4  # planning leaves the model whole


def test_block_influence_removes_the_layer_that_changes_its_input_least():
    from edgesdk.compress.prune import block_influence

    model = tiny_llama(layers=4)
    _silence(model.model.layers[1])
    with torch.no_grad():
        scores = block_influence(model, _batches())
    assert scores[1] < 1e-6 < min(score for i, score in enumerate(scores) if i != 1)
    kept, rounds = plan_depth(model, _batches(), remove=1, criterion="block-influence")
    assert kept == [0, 2, 3]
    assert rounds == [[round(score, 6) for score in scores]]
    with pytest.raises(ValueError, match="depth_criterion must be one of kl, block-influence, got 'cosine'"):
        PruneConfig(depth_criterion="cosine")


def test_block_influence_scores_the_last_layer_by_its_own_output_not_the_final_norms():
    """transformers' last hidden state is the final norm's output: the last layer was scored against it, so a
    silent last layer scored high (never removed) and its score moved with the norm's weights."""
    from edgesdk.compress.prune import block_influence

    model = tiny_llama(layers=3)
    _silence(model.model.layers[-1])
    with torch.no_grad():
        model.model.norm.weight.copy_(torch.linspace(0.2, 3.0, model.model.norm.weight.numel()))
        scores = block_influence(model, _batches())
    assert scores[-1] < 1e-6 < min(scores[:-1])


def test_removal_is_one_shot_or_greedy_scoring_what_remains_after_each_removal():
    model = tiny_llama(layers=4)
    _silence(model.model.layers[1])
    _silence(model.model.layers[3])
    kept, rounds = plan_depth(model, _batches(), remove=2, rescore=True)
    assert kept == [0, 2]
    assert [len(r) for r in rounds] == [4, 3]  # the second round scores the three layers left
    one_shot, rounds = plan_depth(model, _batches(), remove=2)
    assert one_shot == [0, 2]
    assert [len(r) for r in rounds] == [4]  # scored once
    with pytest.raises(ValueError, match=r"layers_removed=4 leaves no decoder layer of 4; remove at most 3"):
        plan_depth(model, _batches(), remove=4)


def test_the_shortened_model_decodes_with_its_kv_cache_as_it_scores_whole_sequences():
    """Each remaining attention indexes the KV cache by its new position: with the old ones, a 3-layer
    cache would be read at layer 3 and incremental decoding would disagree with the full forward pass."""
    model = tiny_llama(layers=4)
    keep_layers(model, [0, 2, 3])
    assert model.config.num_hidden_layers == 3
    assert teacher_layers(model) == [0, 2, 3]
    ids = _batches(count=1)[0][:1]
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :10], use_cache=True)
        step = model(ids[:, 10:11], past_key_values=out.past_key_values, use_cache=True).logits
    assert torch.allclose(step[:, -1], full[:, 10], atol=1e-5)


def test_a_saved_shortened_model_loads_back_with_its_layers_and_record(tmp_path):
    model = tiny_llama(layers=4)
    keep_layers(model, [1, 3])
    model.save_pretrained(tmp_path / "m")
    loaded = load_pruned(tmp_path / "m")
    assert [r["layer"] for r in layer_records(loaded)] == [1, 3]
    ids = _batches(count=1)[0]
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-6)


def test_depth_and_width_pruning_build_an_exported_bundle_with_fewer_layers(tmp_path):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    model_dir = save_tiny_model_dir(tmp_path / "model", layers=4)
    recipe = tmp_path / "depth.yaml"
    recipe.write_text(DEPTH_RECIPE.format(removed=1, ffn=0.25))
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3))
    data = DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=2, generated_tokens=8)
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b", recipe=str(recipe),
                               data=data, export=ExportConfig(max_context=64), progress=False))
    stages = {s["stage"]: s["metrics"] for s in bundle.manifest["stages"]}
    removed = stages["prune"]["layers_removed"]
    assert len(removed) == 1
    assert [len(r) for r in stages["prune"]["layer_removal_kl"]] == [4]
    assert [lay["layer"] for lay in stages["distill"]["layers"]] == [i for i in range(4) if i not in removed]
    assert bundle.manifest["model"]["after"]["layers"] == 3
    assert "3 of 4 layers kept" in (bundle.path / "report.md").read_text()
    assert bundle.manifest["export_validation"]["max_abs_diff"]["layout/decode"] < 1e-3
    runtime = open_runtime(bundle.path, threads=1)
    tokens, _ = generate(runtime.backend, [5, 17, 120, 33], SamplingConfig(max_new_tokens=8), stop_ids=set())
    assert len(tokens) == 8


def test_depth_pruning_settings_are_checked_and_power_gated_models_refused(tmp_path):
    with pytest.raises(ValueError, match="layers_removed must be >= 0, got -1"):
        PruneConfig(layers_removed=-1)
    with pytest.raises(ValueError, match="layer_calibration_batches must be >= 1, got 0"):
        PruneConfig(layer_calibration_batches=0)

    from edgesdk.compress.prune import prune_stage
    from edgesdk.errors import BuildError
    from edgesdk.power.adapter import install_adapters

    model = tiny_llama(layers=3)
    install_adapters(model, rank=4)
    before = copy.deepcopy([n for n, _ in model.named_parameters()])
    with pytest.raises(BuildError, match="power-gated model's adapters scale the next layer's attention heads"):
        prune_stage(model, PruneConfig(layers_removed=1), ctx=None)
    assert [n for n, _ in model.named_parameters()] == before


def test_the_prune_layers_shortcut_sets_the_stage_option():
    from edgesdk.build.pipeline import shortcut_overrides
    from edgesdk.build.recipes import load_recipe

    overrides = shortcut_overrides("rpi5", "int4-prune", {"--prune-layers": 3})
    assert overrides == ("prune.layers_removed=3",)
    stages = {entry.stage: entry for entry in load_recipe("int4-prune").with_overrides(list(overrides)).stages}
    assert stages["prune"].config["layers_removed"] == 3


def test_depth_pruning_a_recipe_or_model_cannot_take_is_refused_before_any_stage(tmp_path):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.errors import BuildError

    model_dir = save_tiny_model_dir(tmp_path / "model", layers=2)
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3))
    data = DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=0)

    def run(recipe_text: str):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(recipe_text)
        return build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b", recipe=str(recipe),
                                 data=data, progress=False))

    with pytest.raises(BuildError, match="prune.layers_removed is 2, but the model has 2 decoder layers") as refused:
        run(DEPTH_RECIPE.format(removed=2, ffn=0.0))
    assert "--prune-layers 1" in refused.value.fix
    assert not (tmp_path / "b.build" / "stages").exists()  # QAT never ran
    power = ("name: p\nstages:\n  - stage: power\n  - stage: prune\n    config: {layers_removed: 1}\n"
             "export: {form: ort-fused}\n")
    with pytest.raises(BuildError, match="prune.layers_removed is 1 in a recipe whose power stage runs before prune"):
        run(power)


def test_depth_pruning_before_the_power_stage_is_taken():
    """Prune before power: the power stage trains its adapters on the layers left, so nothing it scales is removed
    (this order was refused as if power ran first)."""
    from edgesdk.build.pipeline import check_depth_pruning
    from edgesdk.compress.prune import PruneConfig
    from edgesdk.errors import BuildError
    from edgesdk.power.stage import PowerConfig

    check_depth_pruning([("prune", PruneConfig(layers_removed=1)), ("power", PowerConfig())], layer_count=4)
    with pytest.raises(BuildError, match="put prune before power"):
        check_depth_pruning([("power", PowerConfig()), ("prune", PruneConfig(layers_removed=1))], layer_count=4)
