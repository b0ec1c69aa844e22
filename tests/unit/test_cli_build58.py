"""``edgesdk build``: an export section that is invalid on its own is refused as such, not blamed on the qat
stage; a block-sparse export without the per-row INT8 grid it reads is refused before any stage runs; an empty
--out is refused instead of building into (or over) the current directory."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.build.recipes import load_recipe
from edgesdk.cli import main
from edgesdk.errors import BuildError, ExportError


def _build(model_dir, *args: str):
    return CliRunner().invoke(main, ["build", "--target", "host", "--model", str(model_dir), "--max-context", "64",
                                     "--no-progress", *args], prog_name="edgesdk")


def test_a_standard_int4_export_is_refused_as_the_export_not_as_the_qat_stage():
    """default (int4) with --set export.form=standard was refused as 'qat.weight_bits is 4 but the standard int8
    (QDQ) export needs 8': the export asked for is standard int4, which no qat stage can match."""
    with pytest.raises(ExportError) as caught:
        load_recipe("default").with_overrides(["export.form=standard"]).validated()
    assert caught.value.problem.startswith("recipe 'default': ")
    assert "weights=int4" in caught.value.problem
    assert "qat." not in caught.value.problem
    assert "form: ort-fused" in caught.value.fix


@pytest.mark.parametrize(("recipe", "found"), [
    ("fp32-fused", "the recipe has no qat stage"),
    ("int8-only", "its qat stage has weight_bits 8, granularity block"),
    ("int4", "its qat stage has weight_bits 4, granularity block"),
])
def test_a_sparse_export_without_a_per_row_int8_qat_stage_is_refused_before_the_stages(recipe, found):
    with pytest.raises(BuildError) as caught:
        load_recipe(recipe).with_overrides(["export.sparse=true"]).validated()
    assert f"recipe '{recipe}': export.sparse" in caught.value.problem
    assert found in caught.value.problem
    assert "--set export.sparse=false" in caught.value.fix
    assert "--recipe jetson" in caught.value.fix


def test_the_jetson_recipes_sparse_export_is_still_taken():
    for recipe in ("jetson", "jetson-sparse"):
        loaded = load_recipe(recipe)
        assert loaded.export.sparse
        assert "qat" in [name for name, _ in loaded.validated()]


def test_cli_sparse_export_without_the_grid_is_refused_before_anything_is_built(tiny_model_dir, tmp_path):
    """It was refused by the export ('weight layers.0.qkv is not on a per-row INT8 grid'), after every stage."""
    out = tmp_path / "b"
    result = _build(tiny_model_dir, "--recipe", "fp32-fused", "--set", "export.sparse=true", "--out", str(out))
    assert result.exit_code == 6, result.output
    assert "export.sparse stores the weights as INT8 blocks" in result.stderr
    assert "per-row INT8 grid" not in result.stderr
    assert "exporting ONNX" not in result.stderr
    assert not out.exists()


def test_cli_empty_out_is_refused_and_the_current_directory_left_alone(tiny_model_dir, tmp_path, monkeypatch):
    """--out '' was the current directory: the bundle's files were written into it."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    result = _build(tiny_model_dir, "--recipe", "fp32-fused", "--out", "")
    assert result.exit_code == 6, result.output
    assert "--out '' is empty" in result.stderr
    assert "--out ." in result.stderr
    assert list(here.iterdir()) == []
    assert not (tmp_path / "here.build").exists()
