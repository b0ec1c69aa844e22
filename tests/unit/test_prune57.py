"""Review 57 of block-sparsity selection: the measured (sensitivity) allocation keeps the density asked once its
per-weight shares are rounded to whole blocks, also where the min_density floors round up past it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import sparsify  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _kept(masks: dict) -> int:
    return sum(int(mask.sum()) for mask in masks.values())


def test_floors_rounded_up_past_the_total_are_paid_for_by_the_other_weights():
    """Three cheap weights clipped at min_density 0.3 want 9.6, 8.4 and 9.3 blocks and keep their floors 10, 9 and
    10 (1.7 blocks more); the costly weight wants 46.7, and rounding it down to 46 paid for 0.7 of them only, so
    75 blocks were kept for the 74 (0.5 x 148) asked. It gives one more back; every floor still holds."""
    config = sparsify.SparsifyConfig(density=0.5, min_density=0.3)
    sizes = {"cheap_a": 32, "cheap_b": 28, "costly": 57, "cheap_c": 31}
    densities = sparsify.allocate_densities({"cheap_a": 1e-3, "cheap_b": 1e-3, "costly": 1e3, "cheap_c": 1e-3},
                                            sizes, config)
    generator = torch.Generator().manual_seed(0)
    scores = {name: torch.rand(1, size, generator=generator) for name, size in sizes.items()}
    masks = sparsify.plan_masks_by_density(scores, densities, config.min_density)
    assert _kept(masks) == sparsify.check_floor_budget(sizes, config) == 74
    assert {name: int(mask.sum()) for name, mask in masks.items()} == {"cheap_a": 10, "cheap_b": 9, "costly": 45,
                                                                        "cheap_c": 10}


def test_sensitivity_plan_keeps_the_blocks_the_budget_check_counts():
    """``plan`` on a tiny model (264 blocks of 16) at density 0.4, min_density 0.3: the weights the probes found
    cheap sit at floors rounded up (ceil(0.3 x 28) = 9 for 8.4) and 109 blocks were kept (0.413) for 106."""
    model = tiny_llama(seed=4, hidden=64, heads=4, kv_heads=2)
    batches = [torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    for density in (0.35, 0.4, 0.5):
        config = sparsify.SparsifyConfig(density=density, min_density=0.3, block_size=16, probe_batches=1)
        scores = sparsify.block_importance(model, batches, config, 16)
        masks = sparsify.plan(model, scores, batches, 16, config)
        assert _kept(masks) == sparsify.check_floor_budget(sparsify.block_counts(model, 16), config), density
        for name, mask in masks.items():
            assert int(mask.sum()) >= sparsify.floor_blocks(0.3, mask.numel()), name


def test_the_kept_total_is_the_budget_checks_not_the_allocations_float_sum():
    """Density 0.5 of 295 blocks is 147.5, which the budget check rounds to 148; the allocation's shares summed to
    147.49999999937 (bisection), which rounded to 147. Given the check's total, the masks keep 148."""
    config = sparsify.SparsifyConfig(density=0.5, min_density=0.3)
    sizes = {"w0": 35, "w1": 56, "w2": 58, "w3": 40, "w4": 39, "w5": 45, "w6": 20, "w7": 2}
    costs = {"w0": 4.440181137211291e-07, "w1": 1.5312692677035843e-07, "w2": 0.8453250227814785, "w3": 0.0,
             "w4": 9.958682031963003e-07, "w5": 0.0, "w6": 0.0077449333120983566, "w7": 0.0}
    densities = sparsify.allocate_densities(costs, sizes, config)
    generator = torch.Generator().manual_seed(0)
    scores = {name: torch.rand(1, size, generator=generator) for name, size in sizes.items()}
    total = sparsify.check_floor_budget(sizes, config)
    assert total == 148
    assert _kept(sparsify.plan_masks_by_density(scores, densities, config.min_density, total)) == 148
