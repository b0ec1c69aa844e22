"""Second reading of review 46's compression / build changes: what a fix left saying something false."""

from __future__ import annotations


def test_the_report_does_not_say_the_float_rows_were_measured_with_fake_quantization():
    """compress/measure.py switches on the fake quantization a stage has recorded; the loaded model (the report's
    first row) and a stage before QAT record none and are measured in float. The report's sentence said every row
    was measured "with the recipe's fake quantization on (weights and activations ...)", the loaded row too."""
    from edgesdk.build.report import markdown

    rows = [{"stage": "loaded", "parameters": 10, "weight_bytes": 40, "heldout_perplexity": 12.5},
            {"stage": "qat", "parameters": 10, "weight_bytes": 10, "heldout_perplexity": 13.0}]
    text = "\n".join(markdown(rows, None))
    assert "the recipe's fake quantization on" not in text
    assert "with the fake quantization recorded by then on" in text
    assert "the loaded model and any stage before QAT in float" in text
    assert "activations where the recipe quantizes them" in text
