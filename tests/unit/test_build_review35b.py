"""Build recipes and pipeline: faults found in review."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.build.recipes import load_recipe
from edgesdk.errors import BuildError


def test_a_recipe_file_with_unknown_keys_or_wrong_types_names_each_with_the_allowed_keys(tmp_path):
    """A recipe file pydantic refused was told with pydantic's whole report (its web link, no allowed keys),
    where a bad --set is one clean line per problem."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("name: mine\nstges: []\nstages:\n  - stage: qat\n    confg: {}\n"
                      "export:\n  weights: int3\n  block_size: big\n  sparce: true\n", encoding="utf-8")
    with pytest.raises(BuildError) as refused:
        load_recipe(str(recipe))
    message = refused.value.problem
    assert message.startswith(f"recipe {recipe} is invalid: ")
    for problem in ("stges is not a known key (allowed keys: name, description, stages, export)",
                    "stages.0.confg is not a known key (allowed keys: stage, config)",
                    "export.weights='int3': Input should be 'fp32', 'int8' or 'int4'",
                    "export.block_size='big': Input should be a valid integer",
                    "export.sparce is not a known key (allowed keys: form, weights, block_size, embedding_bits, "
                    "sparse, sparse_layout, weights_codec)"):
        assert problem in message
    assert "errors.pydantic.dev" not in message
    assert "Extra inputs" not in message
    assert "\n" not in message  # one line, the problems joined by '; '
    assert refused.value.fix.startswith("fix those keys; compare it with a shipped recipe, e.g. ")
    assert Path(refused.value.fix.rsplit(" ", 1)[-1]).is_file()


@pytest.mark.parametrize(("text", "problem"), [
    ("description: no name\n", "name is missing (a required key)"),
    ("name: x\nstages: {qat: {}}\n", "stages={'qat': {}}: expected a list"),
    ("name: x\nexport: int8\n", "export='int8': expected a mapping of keys (allowed keys: form, weights,"),
    ("name: x\nstages: [qat]\n", "stages.0='qat': expected a mapping of keys (allowed keys: stage, config)"),
    ("", "must be a YAML mapping of keys (name, description, stages, export), got an empty file"),
    ("- qat\n", "must be a YAML mapping of keys (name, description, stages, export), got a list: ['qat']"),
    ("name: [x\n", "is not valid YAML: "),
])
def test_a_recipe_file_of_the_wrong_shape_is_told_by_key(tmp_path, text, problem):
    recipe = tmp_path / "shape.yaml"
    recipe.write_text(text, encoding="utf-8")
    with pytest.raises(BuildError) as refused:
        load_recipe(str(recipe))
    assert str(refused.value).startswith(f"recipe {recipe} ")
    assert problem in str(refused.value)
    assert "errors.pydantic.dev" not in str(refused.value)
    assert Path(refused.value.fix.rsplit(" ", 1)[-1]).is_file()


def test_a_block_sparse_build_for_a_gpu_sm_without_kernel_settings_is_refused_before_the_model_loads(
        tiny_model_dir, tmp_path, capsys):
    """A user's board whose GPU SM the kernels have no launch settings for (a TX2's sm_62) failed the jetson
    recipe's block-sparse export only after every training stage had run; it is refused before the model loads,
    with the export's message, and leaves no work directory behind."""
    from importlib import resources

    import yaml

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    profile = yaml.safe_load((resources.files("edgesdk.targets") / "xavier-nx.yaml").read_text(encoding="utf-8"))
    profile["name"] = "my-tx2"
    profile["gpu"]["sm"] = 62
    board = tmp_path / "my-tx2.yaml"
    board.write_text(yaml.safe_dump(profile, sort_keys=False), encoding="utf-8")
    out = tmp_path / "bundle"
    with pytest.raises(BuildError, match=r"my-tx2's GPU is sm_62, and the block-sparse kernels have launch settings "
                                         r"only for sm_53, sm_72, .*so they cannot be compiled for it") as refused:
        build(BuildConfig(target=str(board), model=str(tiny_model_dir), out=out, recipe="jetson",
                          export=ExportConfig(max_context=64), progress=False))
    assert refused.value.fix.startswith("set export.sparse=false")
    assert "loading" not in capsys.readouterr().err  # no model loaded, no stage run
    assert not out.exists()
    assert not out.with_name("bundle.build").exists()
