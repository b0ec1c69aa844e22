"""Sizes a stage would find past the loaded model are refused before the first stage trains, not when that stage
starts (distill's soft prompt came after QAT's and prune's training; sparsify's block after QAT's)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._utils.tiny import save_tiny_model_dir

# block sparsity trained into dense INT8 weights (no sparse export, whose own check names a block edge other than
# the profile's before any stage)
DENSE_SPARSIFY = """name: dense-sparsify
description: QAT INT8, then block sparsity, exported dense
stages:
  - stage: qat
    config: {weight_bits: 8, steps: 2}
  - stage: sparsify
    config: {density: 0.9}
export:
  form: ort-fused
  weights: int8
  block_size: 32
"""


@pytest.mark.parametrize(("recipe", "override", "said"), [
    ("int8-prune-light", "distill.soft_prompt_tokens=100000", "distill.soft_prompt_tokens is 100000"),
    ("dense-sparsify.yaml", "sparsify.block_size=100000", "sparsify.block_size is 100000"),
])
def test_a_stage_size_past_the_model_is_refused_before_any_stage_runs(tmp_path, recipe, override, said):
    model = save_tiny_model_dir(tmp_path / "model")
    if recipe.endswith(".yaml"):
        (tmp_path / recipe).write_text(DENSE_SPARSIFY)
        recipe = str(tmp_path / recipe)
    build = subprocess.run([sys.executable, "-m", "edgesdk.cli", "build", "--target", "host", "--model", str(model),
                            "--recipe", recipe, "--no-progress", "--max-context", "64", "--out", str(tmp_path / "b"),
                            "--set", override], capture_output=True, text=True, timeout=600)
    assert build.returncode == 6, build.stderr
    assert said in build.stderr
    assert "] qat:" not in build.stderr  # no stage ran before the refusal
    assert "finished steps" not in build.stderr
    assert not (tmp_path / "b.build").exists()
