"""A Hugging Face directory with a file missing or broken: the fix names what the directory needs and how to
fetch it again, not 'the file is a complete, uncorrupted GGUF or Hugging Face model'."""

from __future__ import annotations

import shutil

import pytest

from tests._utils.deploy import edgesdk


@pytest.mark.parametrize(("damage", "problem"), [
    ("model.safetensors", "cannot load the weights of"),
    ("config.json", "cannot read the model config of"),
])
def test_an_incomplete_model_directory_names_the_files_it_needs(tiny_model_dir, tmp_path, damage, problem):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    if damage == "config.json":
        (model / damage).write_text("{")
    else:
        (model / damage).unlink()
    refused = edgesdk("build", "--model", model, "--target", "rpi5", "--recipe", "fp32-fused", "--out",
                      tmp_path / "bundle", "--no-progress", timeout=300)
    assert refused.returncode == 3, refused.stderr
    assert f"error: {problem} {model}" in refused.stderr
    assert (f"fix: check that {model} holds the model's complete files: config.json, the weights (model.safetensors, "
            "or every model-*.safetensors shard with model.safetensors.index.json) and the tokenizer; e.g. download "
            f"them again with 'hf download ORG/NAME --local-dir {model}'") in refused.stderr
    assert "GGUF" not in refused.stderr
    assert not (tmp_path / "bundle").exists()
