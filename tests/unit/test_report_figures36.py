"""The bundle report (report.md, report.png) of builds through the real pipeline: a stage whose held-out
perplexity is not finite, a host without matplotlib, and a model path with Markdown's own characters."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import pytest

pytest.importorskip("torch")

from edgesdk.build import registry  # noqa: E402
from edgesdk.build.registry import register_stage  # noqa: E402
from tests._utils.builds import build_tiny_bundle  # noqa: E402


@dataclass(frozen=True)
class BrokenConfig:
    perplexity: str = "inf"  # the held-out perplexity the stage records: what a diverged stage measures


ONE_STAGE = "name: broken\nstages:\n  - stage: broken36\n    config: {perplexity: 'PPL'}\n"


@pytest.fixture
def broken_stage():
    """A stage that leaves the model as it is and records a held-out perplexity given by its config."""
    from edgesdk.compress.measure import stage_metrics

    @register_stage("broken36", BrokenConfig, description="records a non-finite held-out perplexity")
    def broken(model, config, ctx):
        ctx.metrics.update(stage_metrics(model, ctx.eval_ids()))
        ctx.metrics["heldout_perplexity"] = float(config.perplexity)
        return model

    yield
    registry.STAGES.pop("broken36")


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_non_finite_perplexity_is_stated_in_the_report_and_null_in_the_manifest(broken_stage, value, tmp_path):
    bundle = build_tiny_bundle(tmp_path, ONE_STAGE.replace("PPL", value), "host", generated_sequences=0)
    manifest = _strict_json((bundle.path / "manifest.json").read_text())  # NaN / Infinity are not JSON
    metrics = manifest["stages"][0]["metrics"]
    assert metrics["heldout_perplexity"] is None
    assert math.isfinite(manifest["baseline"]["heldout_perplexity"])
    report = (bundle.path / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| broken36 |"))
    assert "| not finite |" in row
    assert "report.png" in manifest["files"]


def test_without_matplotlib_the_report_says_the_plot_is_left_out(broken_stage, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError, as on a board
    bundle = build_tiny_bundle(tmp_path, ONE_STAGE.replace("PPL", "2.5"), "host", generated_sequences=0)
    assert "report.png" not in bundle.manifest["files"]
    assert not (bundle.path / "report.png").exists()
    report = (bundle.path / "report.md").read_text()
    assert "## Compression stages" in report
    assert "report.png" not in report
    assert "No plot of these figures: matplotlib is not installed" in report


def test_a_model_path_with_markdown_characters_is_shown_as_it_is(tmp_path):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model = save_tiny_model_dir(tmp_path / "a|b *x* [y](z) `q`\nnext line" / ("m" * 200))
    bundle = build(BuildConfig(target="host", model=str(model), out=tmp_path / "b",
                               export=ExportConfig(max_context=64), progress=False))
    heading = (bundle.path / "report.md").read_text().splitlines()[0]
    shown = str(model).replace("\n", "\\n")  # the heading stays one line
    assert heading == f"# edgesdk bundle: `` {shown} `` for host"  # a span fenced past its own backtick
