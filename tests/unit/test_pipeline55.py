"""Review of the build pipeline, the export check and the bundle's report (edgesdk/build/pipeline.py,
export/validate.py, edgesdk/build/package.py): what a resumed build keeps when only a packaging setting changed,
and a check whose settings measure nothing, or run past the graph's context."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.pipeline import BuildConfig, build  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.onnx_export import MODEL_FILE, ExportConfig, export_model  # noqa: E402
from edgesdk.export.validate import ValidationConfig, validate_export  # noqa: E402
from tests._utils.tiny import CORPUS, save_tiny_model_dir, tiny_llama  # noqa: E402

SMOOTH_FUSED = """name: tiny-smooth-fused
stages:
  - stage: smooth
    config: {calibration_batches: 2, batch_size: 2, sequence_length: 24}
export: {form: ort-fused, weights: int8}
"""
FP32_FUSED = """name: tiny-fp32-fused
stages: []
export: {form: ort-fused, weights: fp32}
"""


def _build_config(root: Path, recipe_text: str, **changes) -> BuildConfig:
    """A build of a tiny random model for the host with ``recipe_text`` (written on the first call), into ``root/b``."""
    model, recipe, text = root / "model", root / "recipe.yaml", root / "train.txt"
    if not model.is_dir():  # made once: a resumed build's key holds the files' fingerprints
        save_tiny_model_dir(model, hidden=64, heads=4, kv_heads=2)
        recipe.write_text(recipe_text)
        text.write_text("\n".join(CORPUS * 3))
    data = DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=0)
    return BuildConfig(target="host", model=str(model), out=root / "b", recipe=str(recipe), data=data,
                       export=ExportConfig(max_context=64), progress=False, **changes)


def test_resume_with_another_weights_codec_keeps_the_trained_stages(tmp_path, capsys):
    """The weights file's coding is applied when the bundle is written, after every step: a resumed build with
    --set export.weights_codec=zlib takes the trained stage and the export, instead of refusing the work
    directory as another build's (which lost every trained stage)."""
    build(_build_config(tmp_path, SMOOTH_FUSED, keep_work=True))
    capsys.readouterr()
    bundle = build(_build_config(tmp_path, SMOOTH_FUSED, resume=True, overrides=("export.weights_codec=zlib",)))
    log = capsys.readouterr().err
    assert "reusing the loaded model's figures (baseline), stage 'smooth'" in log, log
    assert "export: done in an earlier run" in log, log
    assert bundle.manifest["graph"]["weights"]["codec"] == "zlib"
    assert (bundle.path / "model.onnx.data.zlib").is_file()


def test_build_without_decode_steps_says_agreement_not_measured(tmp_path):
    """decode_steps=0 measures no greedy step: the fused check runs (it failed stacking no decode logits), the
    manifest records the agreement as not measured (None, not 0 / 1 = 0.0) and no decode difference, and the report
    says so instead of '0%'."""
    bundle = build(_build_config(tmp_path, FP32_FUSED, validation=ValidationConfig(prompts=2, decode_steps=0)))
    check = bundle.manifest["export_validation"]
    assert check["top1_agree"] is None
    assert "logits/decode" not in check["max_abs_diff"]
    report = (bundle.path / "report.md").read_text(encoding="utf-8")
    assert "Greedy top-1 agreement over the decode steps: not measured (no decode steps)" in report, report


def test_standard_check_without_decode_steps_measures_no_agreement(tmp_path):
    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(max_context=32))
    report = validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=2, decode_steps=0))
    assert report.top1_agree is None
    assert "logits/decode" not in report.max_abs_diff
    assert report.to_json()["top1_agree"] is None
    measured = validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=2, decode_steps=2))
    assert measured.top1_agree == 1.0


def test_check_past_the_graph_context_is_refused_by_name(tmp_path):
    """prompt_length + decode_steps past the graph's context failed inside ONNX Runtime ('Gather ... indices
    element out of data bounds')."""
    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(max_context=16))
    with pytest.raises(ExportError) as caught:
        validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompt_length=14, decode_steps=4))
    assert "prompt_length 14 + decode_steps 4 = 18 tokens" in caught.value.problem
    assert "context of 16" in caught.value.problem
    assert "at most 16" in caught.value.fix


def test_build_refuses_a_check_past_the_context_before_the_stages(tmp_path, capsys):
    config = _build_config(tmp_path, SMOOTH_FUSED, validation=ValidationConfig(prompt_length=62, decode_steps=4))
    with pytest.raises(ExportError, match="context of 64"):
        build(config)
    log = capsys.readouterr().err
    assert "smooth:" not in log, log  # refused before the stage ran
    assert not (tmp_path / "b.build").exists()


@pytest.mark.parametrize(("field", "value"), [("prompts", 0), ("prompt_length", 0), ("decode_steps", -1)])
def test_check_that_compares_nothing_is_refused(field, value):
    """prompts=0 validated nothing and passed every graph; an empty prompt failed in a reshape."""
    with pytest.raises(ExportError) as caught:
        ValidationConfig(**{field: value})
    assert f"ValidationConfig {field} is {value}" in caught.value.problem
    assert field in caught.value.fix


@pytest.mark.parametrize("atol", [float("nan"), "1e-3"])
def test_check_without_a_usable_tolerance_is_refused(atol):
    """atol NaN passed every graph, a wrong one too (no difference is above NaN); a string failed at the first
    comparison with a TypeError."""
    with pytest.raises(ExportError) as caught:
        ValidationConfig(atol=atol)
    assert f"ValidationConfig atol is {atol!r}" in caught.value.problem
    assert "atol=1e-3" in caught.value.fix


def test_nan_tolerance_no_longer_passes_a_wrong_graph(tmp_path):
    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(max_context=32))
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(3)  # the graph no longer computes the model
    with pytest.raises(ExportError):
        validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=1, atol=float("nan")))
