"""Review 48 of the quantization area (compress/measure.py, smooth.py, qat.py, fake_quant.py, build/sparse_step.py,
accuracy.py, weights_file.py): the defects found, each with a test that fails on the code before its fix."""

from __future__ import annotations

import torch

from edgesdk.compress.measure import HELDOUT_WINDOW, heldout_perplexity, stage_metrics
from tests._utils.tiny import tiny_llama


def test_stage_metrics_score_a_heldout_text_of_exactly_one_window():
    """``heldout_perplexity`` scores whole windows of HELDOUT_WINDOW tokens, so 256 held-out tokens are one window,
    as 257 are; the stage record left the figure out for exactly 256 (``numel() > HELDOUT_WINDOW``)."""
    model = tiny_llama(seed=2)
    ids = torch.randint(3, 320, (HELDOUT_WINDOW,), generator=torch.Generator().manual_seed(0))
    metrics = stage_metrics(model, ids)
    assert metrics["heldout_perplexity"] == round(heldout_perplexity(model, ids), 4)
    longer = torch.cat([ids, ids[:1]])  # one token more: the same window, the same figure
    assert stage_metrics(model, longer)["heldout_perplexity"] == metrics["heldout_perplexity"]
    assert "heldout_perplexity" not in stage_metrics(model, ids[:-1])  # less than one window: no figure
