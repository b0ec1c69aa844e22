"""Review fixes of structured pruning, block sparsity and distillation (edgesdk/compress)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import BuildContext  # noqa: E402
from edgesdk.compress import prune  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


class _NoText(BuildContext):
    """A build context whose training text must not be needed: drawing it fails the test."""

    def training_data(self):
        raise AssertionError("the refusal came only after the stage drew calibration text")


@pytest.mark.parametrize(("setting", "said"), [
    ({"ffn_ratio": 0.9}, "prune.ffn_ratio is 0.9"),
    ({"kv_group_ratio": 0.75}, "prune.kv_group_ratio is 0.75"),
])
def test_a_width_ratio_beside_depth_pruning_is_refused_before_any_layer_is_scored(tmp_path, setting, said):
    """With layers removed the pipeline leaves the width check to the stage; on layers of one shape the shortened
    model's widths are known before the depth plan picks which layers go, so the refusal comes before the layers
    are scored on calibration text (it came after, wasting that scoring), naming the ratio and the shortened
    model's count (3 layers of 2 groups: 6 groups, at most 3 removable)."""
    model = tiny_llama(layers=4, heads=4, kv_heads=2, hidden=64, intermediate=128)
    ctx = _NoText(profile=SimpleNamespace(name="host"), work_dir=tmp_path, teacher=model, progress=False)
    config = prune.PruneConfig(layers_removed=1, calibration_batches=1, layer_calibration_batches=1, batch_size=1,
                               sequence_length=8, ffn_multiple=8, **setting)
    with pytest.raises(BuildError) as refused:
        prune.prune_stage(model, config, ctx)
    assert said in refused.value.problem
    if "kv_group_ratio" in setting:
        assert "6 GQA groups (KV heads) in 3 layers" in refused.value.problem
    assert len(model.model.layers) == 4  # nothing removed, and the module list is the model's own again


def test_the_sensitivity_allocation_refuses_a_density_the_floors_alone_exceed_as_global_does(tmp_path):
    """Blocks of 32 over 80 x 80, 16 x 80, 80 x 100 and 100 x 80 weights (120 blocks) at min_density 0.25 need 34
    blocks for their floors (ceil per weight), more than density 0.26 keeps (31). ``allocation: global`` refused
    that; the default ``sensitivity`` silently kept the floors, a density of 0.283 where 0.26 was asked."""
    from edgesdk.compress import sparsify

    model = tiny_llama(layers=2, hidden=80, heads=5, kv_heads=1, intermediate=100)
    assert sum(sparsify.block_counts(model, 32).values()) == 120
    ctx = _NoText(profile=SimpleNamespace(name="myboard", sparsity_block=32), work_dir=tmp_path, teacher=model,
                  progress=False)
    config = sparsify.SparsifyConfig(density=0.26, min_density=0.25, block_size=32, calibration_batches=1,
                                     probe_batches=1, batch_size=1, sequence_length=8)
    assert config.allocation == "sensitivity"
    with pytest.raises(BuildError, match="keeps 31 of the model's 120 blocks, but the min_density floors alone "
                                         "need 34"):
        sparsify.sparsify_stage(model, config, ctx)
