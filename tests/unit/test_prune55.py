"""Review 55 of structured pruning and block-sparsity selection: the density delivered is the one asked once the
per-weight shares are rounded to whole blocks, and the sensitivity probes' costs are compared at one share."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import sparsify  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _kept(masks: dict) -> int:
    return sum(int(mask.sum()) for mask in masks.values())


def test_per_weight_densities_round_to_the_total_asked_not_each_on_its_own():
    """Ten weights of 4 blocks at density 0.9 want 3.6 blocks each: rounded each on its own every weight kept all
    4 (density 1.0 for 0.9 asked). Thirty weights of 108 blocks (SmolLM2's k_proj at block 32) at 0.95 kept 103
    each, 0.9537."""
    generator = torch.Generator().manual_seed(0)
    config = sparsify.SparsifyConfig(density=0.9, min_density=0.25)
    scores = {f"w{i}": torch.rand(2, 2, generator=generator) for i in range(10)}
    sizes = {name: s.numel() for name, s in scores.items()}
    densities = sparsify.allocate_densities(dict.fromkeys(scores, 1.0), sizes, config)
    masks = sparsify.plan_masks_by_density(scores, densities, config.min_density)
    assert _kept(masks) == 36  # 0.9 x 40
    for name, mask in masks.items():  # each weight's kept blocks are its best ones
        assert int(mask.sum()) in (3, 4)
        if not mask.all():
            assert scores[name][mask].min() >= scores[name][~mask].max()

    scores = {f"w{i}": torch.rand(6, 18, generator=generator) for i in range(30)}
    densities = sparsify.allocate_densities(dict.fromkeys(scores, 1.0), {n: 108 for n in scores},
                                            sparsify.SparsifyConfig(density=0.95))
    assert _kept(sparsify.plan_masks_by_density(scores, densities, 0.25)) == round(0.95 * 30 * 108)


def test_rounding_to_the_total_still_keeps_every_floor():
    """A weight clipped at min_density (0.25 of 10 blocks = 2.5) keeps ceil = 3; the blocks its floor adds come out
    of the others' rounding, so the total stays at the allocation's 10 of 20 (it was 11)."""
    config = sparsify.SparsifyConfig(density=0.5, min_density=0.25)
    densities = sparsify.allocate_densities({"cheap": 1.0, "costly": 1e6}, {"cheap": 10, "costly": 10}, config)
    generator = torch.Generator().manual_seed(1)
    scores = {"cheap": torch.rand(2, 5, generator=generator), "costly": torch.rand(2, 5, generator=generator)}
    masks = sparsify.plan_masks_by_density(scores, densities, config.min_density)
    assert int(masks["cheap"].sum()) == 3
    assert _kept(masks) == 10


def test_sensitivity_costs_are_scaled_to_the_probe_fraction():
    """k_proj of this model is 32 x 64: 2 blocks of 32. At probe_fraction 0.1 and at 0.5 the probe drops the same
    one block (at least one goes), so both measured the same KL; allocate_densities takes each cost as measured at
    probe_fraction, with cost growing as its square, so the 0.1 cost must be (0.1 / 0.5)^2 of the 0.5 one. The
    down projection (64 x 112, 2 x 4 = 8 blocks) drops 4 blocks at 0.5 (exactly half) and 1 at 0.1 (0.125)."""
    model = tiny_llama(seed=4).eval()
    batches = [torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    scores = sparsify.block_importance(model, batches, sparsify.SparsifyConfig(), 32)
    name = "model.layers.0.self_attn.k_proj"
    assert scores[name].numel() == 2
    at_tenth = sparsify.weight_sensitivity(model, scores, batches, 32, 0.1)
    at_half = sparsify.weight_sensitivity(model, scores, batches, 32, 0.5)
    assert at_half[name] > 0
    assert at_tenth[name] == pytest.approx(at_half[name] * 0.04, rel=1e-5)
    down = "model.layers.0.mlp.down_proj"
    assert scores[down].numel() == 8
    dropped_one = sparsify.weight_sensitivity(model, scores, batches, 32, 1 / 8)  # the same block as at 0.1
    assert at_tenth[down] == pytest.approx(dropped_one[down] * (0.1 * 8) ** 2, rel=1e-5)


def test_removing_layers_keeps_the_teacher_index_of_a_record_written_before_depth_pruning():
    """Records written before depth pruning carry no "layer": the i-th is the teacher's layer i. Removing layer 1
    of 4 kept the records without it, so the survivors read as teacher layers [0, 1, 2] instead of [0, 2, 3], and
    distillation matched student layer 1 (teacher layer 2) with the teacher's layer 1."""
    from edgesdk.compress.structure import LAYERS_KEY, keep_layers, teacher_layers

    model = tiny_llama(layers=4)
    config = model.config
    setattr(config, LAYERS_KEY, [{"heads": list(range(4)), "kv_heads": [0, 1], "ffn": list(range(config.intermediate_size))}
                                 for _ in range(4)])
    keep_layers(model, [0, 2, 3])
    assert teacher_layers(model) == [0, 2, 3]
    keep_layers(model, [0, 2])  # positions in the current model: teacher layers 0 and 3
    assert teacher_layers(model) == [0, 3]


@pytest.mark.parametrize(("terms", "said"), [("cli", "--set prune.kv_group_ratio="),
                                         ("python", "overrides=['prune.kv_group_ratio=")])
def test_group_ratio_errors_say_how_to_set_the_ratio_they_suggest(terms, said):
    """The other width-ratio errors give the override in the caller's terms; the two group-count ones named a ratio
    and no way to set it, so a build_bundle() caller had to guess that it goes in overrides=[...]."""
    from edgesdk.compress.prune import PruneConfig, check_width_ratios
    from edgesdk.errors import BuildError

    model = tiny_llama(layers=2, heads=4, kv_heads=2)  # 4 groups, 2 removable
    with pytest.raises(BuildError, match="rounds to no group removed") as error:
        check_width_ratios(model, PruneConfig(ffn_ratio=0.0, kv_group_ratio=0.1), terms)
    assert f"{said}0.25" in error.value.fix
    with pytest.raises(BuildError, match="at most 2 can go") as error:
        check_width_ratios(model, PruneConfig(ffn_ratio=0.0, kv_group_ratio=0.75), terms)
    assert f"{said}0.5" in error.value.fix
