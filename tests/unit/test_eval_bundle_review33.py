"""Bundle writing, verification and evaluation: faults found in review, each shown on real files and a
real (tiny) bundle."""

from __future__ import annotations

import os

import pytest

from edgesdk.errors import BundleError


def _write_args(tiny_bundle, tiny_model_dir) -> dict:
    """write_bundle's inputs for the session's tiny bundle, taken from it (its graph and weights are the export)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgesdk.build.recipes import load_recipe
    from edgesdk.profile import get_profile

    manifest = tiny_bundle.manifest
    return {"export_dir": tiny_bundle.path, "graph": {k: v for k, v in manifest["graph"].items() if k != "file"},
            "validation": manifest["export_validation"], "profile": get_profile("host"),
            "recipe": load_recipe(manifest["recipe"]["name"]), "stages": [],
            "model": AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            "tokenizer": AutoTokenizer.from_pretrained(tiny_model_dir),
            "facts_before": manifest["model"]["before"], "facts_after": manifest["model"]["after"]}


def test_a_bundle_write_that_fails_leaves_no_hidden_partial_copy(tiny_bundle, tiny_model_dir, tmp_path):
    """The write stages the whole bundle (weights included) in .NAME.partial beside the output; a write refused
    or stopped (here: the output directory came to hold the user's files while the build ran) removed nothing,
    so a copy of the weights stayed there, hidden, until another build to the same output."""
    from edgesdk.build.package import write_bundle

    args = _write_args(tiny_bundle, tiny_model_dir)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(BundleError, match="holds files and is not a bundle"):
        write_bundle(out, **args)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no .out.partial
    assert sorted(os.listdir(out)) == ["notes.txt"]

    written = write_bundle(tmp_path / "fresh", **args)  # the same inputs make a bundle where nothing is in the way
    assert sorted(os.listdir(tmp_path)) == ["fresh", "out"]
    assert written.manifest["graph"] == tiny_bundle.manifest["graph"]
