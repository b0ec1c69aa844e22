"""Review 58 of structured pruning: the refusal of an ffn_ratio that removes no channel names the cause it has."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.prune import PruneConfig, check_width_ratios, plan_ffn  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


@pytest.mark.parametrize("multiple", [1, 32])
def test_a_ratio_of_all_channels_rounding_to_none_is_not_blamed_on_ffn_multiple(multiple):
    """ffn_ratio 0.001 of 2 x 128 FFN channels is 0.256 of a channel: none, whatever ffn_multiple is. The refusal
    said each layer keeps a multiple of ffn_multiple and told to lower it, also where it was 1 already; lowering it
    still removes none. It names the rounding of the ratio and a ratio that removes channels."""
    model = tiny_llama(layers=2, hidden=64, intermediate=128)
    config = PruneConfig(ffn_ratio=0.001, ffn_multiple=multiple)
    with pytest.raises(BuildError) as raised:
        check_width_ratios(model, config)
    assert "0.001 of the model's 256 FFN channels rounds to no channel removed" in raised.value.problem
    assert "ffn_multiple" not in raised.value.problem
    assert "ffn_multiple" not in raised.value.fix
    with pytest.raises(BuildError):  # the fix it no longer gives: ffn_multiple 1 removes no channel either
        check_width_ratios(model, PruneConfig(ffn_ratio=0.001, ffn_multiple=1))
    least = float(raised.value.fix.split("at least ")[1].split(" ")[0])
    accepted = PruneConfig(ffn_ratio=least, ffn_multiple=multiple)
    check_width_ratios(model, accepted)  # the ratio the fix names is accepted and removes channels
    assert sum(len(p) for p in plan_ffn([torch.rand(128), torch.rand(128)], accepted)) < 256


def test_a_ratio_the_multiple_rounds_away_still_names_ffn_multiple():
    """13 channels asked, each layer loses whole multiples of 32: lowering ffn_multiple is a real fix there."""
    model = tiny_llama(layers=2, hidden=64, intermediate=128)
    with pytest.raises(BuildError) as raised:
        check_width_ratios(model, PruneConfig(ffn_ratio=0.05, ffn_multiple=32))
    assert "13 of the model's 256 FFN channels" in raised.value.problem
    assert "ffn_multiple 32" in raised.value.problem
    assert "lower prune.ffn_multiple" in raised.value.fix
