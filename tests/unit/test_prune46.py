"""Review tests of width pruning: the FFN ratio is met when a layer's floor binds, and width ratios the model's
structure cannot carry out are refused instead of pruning less than asked, or nothing."""

from __future__ import annotations

import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir, tiny_llama

torch = pytest.importorskip("torch")


def test_a_layer_held_at_its_floor_leaves_its_share_of_the_removal_to_the_others():
    """ffn_ratio is the fraction of all FFN channels removed. Layer 0 is the least salient: the global ranking
    would empty it, the min_ffn_keep floor holds it at 32, and the channels the floor keeps used to be simply not
    removed (asked 50 %, 37.5 % went); they are now taken from the other layers, least salient first."""
    from edgesdk.compress.prune import PruneConfig, plan_ffn

    scores = [torch.arange(128.0) * 1e-3, torch.arange(128.0) + 100, torch.arange(128.0) + 1000]
    plan = plan_ffn(scores, PruneConfig(ffn_ratio=0.5, min_ffn_keep=0.25, ffn_multiple=1))
    assert [len(p) for p in plan] == [32, 32, 128]  # 192 of 384 kept: exactly half removed
    assert plan[0] == list(range(96, 128))  # each layer's most salient
    assert plan[1] == list(range(96, 128))
    # with the block multiple the kept widths stay multiples of it and the ratio is still met
    plan = plan_ffn(scores, PruneConfig(ffn_ratio=0.5, min_ffn_keep=0.25, ffn_multiple=32))
    assert [len(p) for p in plan] == [32, 32, 128]


def test_a_ratio_the_floors_do_not_bind_plans_as_before():
    from edgesdk.compress.prune import PruneConfig, plan_ffn

    torch.manual_seed(0)
    scores = [torch.rand(96) for _ in range(3)]
    plan = plan_ffn(scores, PruneConfig(ffn_ratio=0.25, min_ffn_keep=0.1, ffn_multiple=1))
    kept = torch.cat(scores).sort(descending=True).values[: 288 - 72]
    assert sum(len(p) for p in plan) == 216
    assert all(float(s[i]) >= float(kept[-1]) for s, p in zip(scores, plan, strict=True) for i in p)


def _build(tmp_path, prune: str, **model):
    recipe = (f"name: r\nstages:\n  - stage: prune\n    config: {{{prune}, calibration_batches: 2, batch_size: 2, "
              "sequence_length: 24}\nexport: {form: ort-fused, weights: fp32}\n")
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, layers=2, intermediate=128, **model)
    return build_tiny_bundle(tmp_path, recipe, "host", model_dir=model_dir)


def test_group_pruning_of_a_multi_query_model_is_refused_not_skipped(tmp_path):
    """One KV head per layer (Gemma 3 270M / 1B): every layer keeps its only group, so kv_group_ratio 0.5
    removed nothing and the build reported success with the attention unpruned."""
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match="multi-query attention") as error:
        _build(tmp_path, "ffn_ratio: 0.0, kv_group_ratio: 0.5", kv_heads=1)
    assert "prune.kv_group_ratio is 0.5" in str(error.value)
    assert "prune.kv_group_ratio=0" in error.value.fix


def test_an_ffn_ratio_past_the_floors_is_refused_not_cut_short(tmp_path):
    """Widths of 128 with min_ffn_keep 0.25 keep at least 32 each: at most 0.75 of the channels can go, and
    ffn_ratio 0.9 used to remove 0.75 and report success."""
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match=r"prune.ffn_ratio is 0.9, but min_ffn_keep 0.25 keeps at least 64 of the "
                                         r"256 FFN channels .* at most 0.75 of them can go") as error:
        _build(tmp_path, "ffn_ratio: 0.9", kv_heads=2)
    assert "lower prune.ffn_ratio to 0.75 or less" in error.value.fix


def test_group_ratios_that_remove_none_or_more_than_all_but_one_per_layer_are_refused():
    """The check runs before any calibration (no data is needed to refuse)."""
    from edgesdk.compress.prune import PruneConfig, check_width_ratios, prune_stage
    from edgesdk.errors import BuildError

    model = tiny_llama(layers=2, heads=4, kv_heads=2, intermediate=128)  # 4 groups, at most 2 removable
    with pytest.raises(BuildError, match=r"is 0.9 \(4 groups\), but the model has 4 GQA groups .* at most 2 can go"):
        prune_stage(model, PruneConfig(ffn_ratio=0.0, kv_group_ratio=0.9), ctx=None)
    with pytest.raises(BuildError, match="0.1 of them rounds to no group removed") as error:
        check_width_ratios(model, PruneConfig(ffn_ratio=0.0, kv_group_ratio=0.1))
    assert "at least 0.25 (one group)" in error.value.fix
    check_width_ratios(model, PruneConfig(ffn_ratio=0.75, kv_group_ratio=0.5))  # exactly what can go
    assert [layer.self_attn.k_proj.out_features for layer in model.model.layers] == [32, 32]  # untouched


def test_a_group_pruned_build_still_removes_the_asked_groups(tmp_path):
    bundle = _build(tmp_path, "ffn_ratio: 0.5, kv_group_ratio: 0.5", kv_heads=2)
    layers = bundle.manifest["stages"][0]["metrics"]["layers"]
    assert sum(layer["kv_heads"] for layer in layers) == 2
    assert sum(layer["ffn"] for layer in layers) == 128


def test_a_width_ratio_is_refused_before_any_stage_runs(tmp_path, capsys):
    """After a QAT stage the refusal used to come only when prune started, after QAT's training; the pipeline now
    checks the loaded model's widths before the first stage, and leaves no work directory behind."""
    from edgesdk.errors import BuildError

    recipe = ("name: r\nstages:\n  - stage: qat\n    config: {steps: 2, batch_size: 2, sequence_length: 24}\n"
              "  - stage: prune\n    config: {ffn_ratio: 0.0, kv_group_ratio: 0.5}\n"
              "export: {form: ort-fused, weights: fp32}\n")
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, layers=2, intermediate=128, kv_heads=1)
    with pytest.raises(BuildError, match="multi-query attention"):
        build_tiny_bundle(tmp_path, recipe, "host", model_dir=model_dir)
    assert "[2/" not in capsys.readouterr().err  # no stage started
    assert not (tmp_path / "b.build").exists()
