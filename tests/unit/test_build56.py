"""Review of the build pipeline's resume (edgesdk/build/pipeline.py, edgesdk/build/checkpoint.py)."""

from __future__ import annotations

import pytest

from edgesdk.build.checkpoint import WorkDir
from edgesdk.build.pipeline import export_key, profile_key, sparse_export_key
from edgesdk.export.onnx_export import ExportConfig
from edgesdk.profile import get_profile


def _key(export: ExportConfig, profile) -> dict:
    """The target and export parts of a build key as build() writes them, beside parts that stay the same."""
    return {"model": "m", "recipe": ["qat"], "stage:qat": [["qat", {}]], "target": profile_key(profile),
            "export": export_key(export), "sparse_export": sparse_export_key(export, profile),
            "context": export.max_context}


def _resumed_after(tmp_path, first_key: dict, second_key: dict) -> WorkDir:
    """The work directory of a build with ``first_key`` that finished its stage and export, resumed with
    ``second_key``."""
    work = tmp_path / "out.build"
    first = WorkDir(work, first_key, resume=False)
    first.mark_done("baseline", {"parameters": 1})
    first.mark_done("stage:qat", {"stage": "qat"})
    first.mark_done("export", {"graph": {}})
    first.release()
    return WorkDir(work, second_key, resume=True)


@pytest.mark.parametrize("change", ["export", "gpu"])
def test_a_resume_with_other_block_sparse_settings_keeps_the_trained_stages_and_exports_again(tmp_path, change):
    """export.sparse, export.sparse_layout and the target's gpu (the SM the block-sparse kernels are compiled for) are
    read by the export step alone (no stage's figures depend on them), yet they were parts of the build key's export and
    target parts, which every step reads: a --resume with --set export.sparse=true, or with the board YAML's GPU
    corrected, was refused as a different build, and the trained stages were lost with the work directory."""
    orin = get_profile("orin-nx-16gb")
    before = (ExportConfig(form="ort-fused", weights="int8"), orin)
    if change == "export":
        after = (ExportConfig(form="ort-fused", weights="int8", sparse=True, sparse_layout="transposed"), orin)
    else:
        after = (before[0], orin.model_copy(update={"gpu": orin.gpu.model_copy(update={"sm": 72})}))
    resumed = _resumed_after(tmp_path, _key(*before), _key(*after))
    try:
        assert resumed.redone == ["sparse_export"]
        assert resumed.done("stage:qat") == {"stage": "qat"}
        assert resumed.done("baseline") == {"parameters": 1}
        assert resumed.done("export") is None  # made again, with the block-sparse weights or kernels asked for
    finally:
        resumed.release()


def test_a_resume_with_another_sparsity_block_is_still_another_build(tmp_path):
    """The block edge is read by the sparsify stage: it stays in the target part, which every step reads."""
    from edgesdk.errors import BuildError

    orin = get_profile("orin-nx-16gb")
    export = ExportConfig(form="ort-fused", weights="int8", sparse=True)
    other = orin.model_copy(update={"sparsity_block": orin.sparsity_block // 2})
    with pytest.raises(BuildError, match="belongs to a different build: the target profile"):
        _resumed_after(tmp_path, _key(export, orin), _key(export, other))

def test_a_hub_snapshot_of_a_repository_without_an_organisation_names_the_bundle_after_the_model(tmp_path):
    """The Hub caches a repository without an organisation (``gpt2``) as ``models--gpt2``, with one '--': its
    snapshot was not taken for a cache entry, and the default bundle directory was named after the commit hash."""
    from edgesdk.build.pipeline import default_out

    commit = "0123456789abcdef0123456789abcdef01234567"
    for repository, name in (("models--gpt2", "gpt2"), ("models--HuggingFaceTB--SmolLM2-135M", "SmolLM2-135M")):
        snapshot = tmp_path / repository / "snapshots" / commit
        snapshot.mkdir(parents=True)
        assert default_out(str(snapshot), "host").name == f"{name}-host"
        assert default_out(str(tmp_path / repository), "host").name == f"{name}-host"
    plain = tmp_path / "runs" / "merged"
    plain.mkdir(parents=True)
    assert default_out(str(plain), "host").name == "merged-host"  # any other directory by its own name


def test_the_pipeline_refuses_a_width_ratio_beside_depth_pruning_before_any_stage():
    """check_width_pruning skipped every check where layers are removed first, so a ratio the shortened model cannot
    carry out was refused only once the prune stage had run QAT before it: now checked before any stage where the
    layers' shapes alone tell the shortened model's widths."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import check_width_pruning
    from edgesdk.compress.prune import PruneConfig
    from edgesdk.errors import BuildError
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(layers=4, heads=4, kv_heads=2)
    with pytest.raises(BuildError, match="in 3 layers"):
        check_width_pruning([("qat", None), ("prune", PruneConfig(layers_removed=1, kv_group_ratio=0.75))], model)
    check_width_pruning([("qat", None), ("prune", PruneConfig(layers_removed=1))], model)


def test_the_pipeline_refuses_sensitivity_floors_above_the_density_before_any_stage():
    """check_stage_sizes ran the floor budget for ``allocation: global`` alone; sensitivity keeps the floors too."""
    from types import SimpleNamespace

    pytest.importorskip("torch")
    from edgesdk.build.pipeline import check_stage_sizes
    from edgesdk.compress.sparsify import SparsifyConfig
    from edgesdk.errors import BuildError
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    profile = SimpleNamespace(name="myboard", sparsity_block=16)
    config = SparsifyConfig(density=0.31, min_density=0.3, allocation="sensitivity", block_size=16)
    with pytest.raises(BuildError, match="min_density floors alone need"):
        check_stage_sizes([("qat", None), ("sparsify", config)], model, profile)
