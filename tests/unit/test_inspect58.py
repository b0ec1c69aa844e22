"""Review 58 of 'edgesdk inspect' (edgesdk/cli.py): verification accepts a manifest without the descriptive keys
inspect shows (model.before and its facts, target.description, recipe, the graph's form, dtype, layers, kv heads
and context; deploy and pack need none of them), and inspect read them directly, so such a bundle failed with a
KeyError traceback. It shows what the manifest has and names what it lacks. Real tiny bundles, edited and hashed
again as a hand edit would be."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.bundle import read_manifest, verify_bundle
from edgesdk.cli import main
from tests.unit.test_api48 import _rehashed


def _edited_copy(tiny_bundle, tmp_path: Path, change) -> Path:
    """A copy of the tiny bundle with ``change(manifest)`` applied and its digest written again."""
    return _rehashed(Path(shutil.copytree(tiny_bundle.path, tmp_path / "edited")), change)


def _inspect(bundle: Path):
    result = CliRunner().invoke(main, ["inspect", str(bundle)], prog_name="edgesdk")
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    assert "Traceback" not in result.output
    return result


def _lacks_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("lacks")]
    assert len(lines) == 1, stdout
    return lines[0]


def _drop(section: str, key: str):
    return lambda manifest: manifest[section].pop(key)


@pytest.mark.parametrize(("change", "named"), [
    (lambda manifest: manifest["model"].pop("before"), "model.before"),
    (lambda manifest: manifest["model"].__setitem__("before", None), "model.before"),
    (lambda manifest: manifest["model"]["before"].pop("source"), "model.before.source"),
    (lambda manifest: manifest["model"]["before"].pop("architecture"), "model.before.architecture"),
    (lambda manifest: manifest["model"]["before"].pop("parameters"), "model.before.parameters"),
    (_drop("target", "description"), "target.description"),
    (lambda manifest: manifest.pop("recipe"), "recipe"),
    (lambda manifest: manifest.pop("created"), "created"),
    (_drop("graph", "form"), "graph.form"),
    (_drop("graph", "dtype"), "graph.dtype"),
    (_drop("graph", "num_layers"), "graph.num_layers"),
    (_drop("graph", "kv_heads"), "graph.kv_heads"),
    (_drop("graph", "max_context"), "graph.max_context"),
], ids=["no-before", "before-null", "no-source", "no-architecture", "no-parameters", "no-description", "no-recipe",
        "no-created", "no-form", "no-dtype", "no-num-layers", "no-kv-heads", "no-max-context"])
def test_inspect_names_a_key_the_manifest_lacks(tiny_bundle, tmp_path, change, named):
    bundle = _edited_copy(tiny_bundle, tmp_path, change)
    verify_bundle(bundle)  # verification accepts it: deploy and pack read none of it
    result = _inspect(bundle)
    manifest = read_manifest(bundle)
    assert manifest["bundle_id"] in result.stdout
    assert "target     host" in result.stdout
    for name in manifest["files"]:
        assert name in result.stdout
    assert _lacks_line(result.stdout).split("(", 1)[0].removeprefix("lacks").replace(",", " ").split() == [named]


def test_inspect_shows_what_a_bare_manifest_has(tiny_bundle, tmp_path):
    """Every descriptive key gone at once: the required ones are still shown, each missing one named once."""
    def strip(manifest):
        manifest["model"] = {}
        manifest.pop("recipe")
        manifest.pop("created")
        manifest["target"] = {"name": manifest["target"]["name"]}
        for key in ("form", "dtype", "num_layers", "kv_heads", "max_context"):
            manifest["graph"].pop(key)

    bundle = _edited_copy(tiny_bundle, tmp_path, strip)
    verify_bundle(bundle)
    result = _inspect(bundle)
    manifest = read_manifest(bundle)
    assert f"runtime    {manifest['runtime']['backend']}, {manifest['runtime']['threads']} threads" in result.stdout
    assert f"files      {len(manifest['files'])}," in result.stdout
    assert "model      ?" in result.stdout.splitlines()
    lacking = _lacks_line(result.stdout)
    named = lacking.split("(", 1)[0].removeprefix("lacks").replace(",", " ").split()
    assert sorted(named) == sorted(["created", "target.description", "model.before", "recipe", "graph.form",
                                    "graph.dtype", "graph.num_layers", "graph.kv_heads", "graph.max_context"])
    assert "rebuild the bundle with 'edgesdk build'" in lacking


def test_inspect_of_a_complete_manifest_names_nothing_lacking(tiny_bundle):
    result = _inspect(tiny_bundle.path)
    assert "lacks" not in result.stdout
    manifest = read_manifest(tiny_bundle.path)
    before = manifest["model"]["before"]
    assert f"model      {before['source']}: {before['architecture']}, {before['parameters']:,} parameters" \
        in result.stdout
    assert f"recipe     {manifest['recipe']['name']} (stages: " in result.stdout
    assert f"({manifest['target']['description']})" in result.stdout
