"""``edgesdk eval --reference`` on a bundle whose source model is not on this machine."""

from __future__ import annotations

import shutil

from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import ModelSourceError
from tests._utils.tiny import CORPUS


def test_reference_without_the_source_model_is_refused_before_scoring_and_names_reference(tiny_model_dir,
                                                                                            tmp_path):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    bundle = build(BuildConfig(target="host", model=str(model), out=tmp_path / "b",
                               export=ExportConfig(max_context=64), progress=False)).path
    shutil.rmtree(model)  # the bundle copied to a machine without its build's model
    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS), encoding="utf-8")
    result = CliRunner().invoke(main, ["eval", str(bundle), "--text", str(text), "--context", "32", "--reference"],
                                prog_name="edgesdk")
    assert result.exit_code == ModelSourceError.exit_code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert f"--reference scores the model {bundle} was built from, {model.resolve()}" in result.stderr
    fix = result.stderr.split("fix:", 1)[1]
    assert "drop --reference" in fix
    assert "models list" not in fix  # eval takes no --model: that fix could not be followed
    assert "perplexity" not in result.stderr  # refused before the bundle was scored


def test_the_default_context_beyond_the_bundles_says_so_and_how_to_fix_it(tiny_bundle, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS), encoding="utf-8")
    result = CliRunner().invoke(main, ["eval", str(tiny_bundle.path), "--text", str(text)], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    assert "context 256, the bundle's max_context" in " ".join(result.stderr.split())
