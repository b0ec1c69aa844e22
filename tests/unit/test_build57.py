"""Recipes: an empty key read as the key left out, a true/false export block size named as such, the fix for a
shipped recipe's name given with a suffix; the report's plot leaves the caller's matplotlib state alone."""

from __future__ import annotations

import pytest

from edgesdk.build.recipes import load_recipe
from edgesdk.errors import BuildError


@pytest.mark.parametrize("text", [
    "name: x\nstages:\n#  - stage: qat\n",
    "name: x\nstages: []\nexport:\n#  form: ort-fused\n",
    "name: x\ndescription:\nstages: []\n",
])
def test_recipe_key_left_empty_is_the_key_left_out(tmp_path, text):
    path = tmp_path / "mine.yaml"
    path.write_text(text, encoding="utf-8")
    recipe = load_recipe(str(path))
    assert recipe.stages == ()
    assert recipe.description == ""
    assert recipe.export.form == "standard"
    assert recipe.export.weights == "fp32"
    assert recipe.validated() == []


@pytest.mark.parametrize("value", ["true", "no"])
def test_export_block_size_true_false_is_refused_as_such(value):
    with pytest.raises(BuildError) as caught:
        load_recipe("default").with_overrides([f"export.block_size={value}"])
    message = str(caught.value)
    assert "export.block_size" in message
    assert "true/false" in message
    assert "greater than or equal to 16" not in message


def test_export_block_size_number_still_taken():
    assert load_recipe("default").with_overrides(["export.block_size=128"]).export.block_size == 128


def test_shipped_name_with_suffix_names_the_shipped_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BuildError, match=r"recipe file jetson\.yaml does not exist") as caught:
        load_recipe("jetson.yaml")
    assert "without the suffix, jetson" in caught.value.fix


def test_missing_recipe_file_fix_lists_the_shipped_recipes(tmp_path):
    with pytest.raises(BuildError) as caught:
        load_recipe(str(tmp_path / "mine.yaml"))
    assert "default" in caught.value.fix
    assert "jetson-sparse" in caught.value.fix


def test_report_plot_keeps_the_callers_backend_and_figures(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from edgesdk.build import report

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        mine = plt.figure()
        rows = [{"stage": "loaded", "parameters": 100, "weight_bytes": 400, "heldout_perplexity": 30.0,
                 "layers": [{"layer": 0, "heads": 4, "kv_heads": 2, "ffn": 64}]},
                {"stage": "power", "parameters": 100, "weight_bytes": 100, "heldout_perplexity": 31.0,
                 "layers": [{"layer": 0, "heads": 4, "kv_heads": 2, "ffn": 32}],
                 "curve": [{"tau": 0.0, "executed_fraction": 1.0, "perplexity": 31.0},
                           {"tau": 0.5, "executed_fraction": 0.5, "perplexity": 40.0}],
                 "sample_power": {"P": [0.25, 0.75, 0.5, 0.5], "entropy": [0.56, 0.69], "window": 2}}]
        assert report.plot(rows, tmp_path / "report.png") is None
        assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"
        assert matplotlib.get_backend().lower() == "svg"
        assert plt.fignum_exists(mine.number)
        plt.close(mine)
    finally:
        matplotlib.use(before)


@pytest.mark.parametrize(("value", "problem"), [
    ([0.5, 0.5], "(item 2 is missing)"),
    ([0.25, "a", 0.25], "(item 1: Input should be a valid number"),
])
def test_stage_list_option_names_the_item_at_fault(value, problem):
    from edgesdk.build.registry import make_config

    with pytest.raises(BuildError, match=r"option weights=.* is not a valid tuple\[float, float, float\]") as caught:
        make_config("power", {"weights": value})
    assert problem in caught.value.problem


def test_stage_nested_list_option_names_the_inner_item():
    from edgesdk.build.registry import make_config

    with pytest.raises(BuildError) as caught:
        make_config("power", {"sweep": [[0.25, 0.5, 0.25], [0.5, 0.5]]})
    assert "(item 2 of item 1 is missing)" in caught.value.problem
