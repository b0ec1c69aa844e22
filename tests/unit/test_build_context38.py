"""What ``edgesdk build`` says: ``--max-context N`` on a model trained for fewer positions gives the bundle the
model's ``max_position_embeddings`` (the graph's rotary table covers those only), and the build says so; a
finished build names the commands that run and deploy the bundle."""

from __future__ import annotations

import json

import pytest

from tests._utils.deploy import edgesdk


@pytest.mark.parametrize(("asked", "said"), [(2048, True), (512, False)])
def test_a_context_the_model_bounds_is_said_during_the_build(tiny_model_dir, tmp_path, asked, said):
    out = tmp_path / "bundle"
    built = edgesdk("build", "--model", tiny_model_dir, "--target", "host", "--recipe", "fp32-fused", "--out", out,
                    "--max-context", asked, "--no-progress", timeout=300)
    assert built.returncode == 0, built.stderr
    assert json.loads((out / "manifest.json").read_text())["graph"]["max_context"] == 512
    line = "the bundle's context is 512 tokens, not --max-context 2048: the model's max_position_embeddings is 512"
    assert (line in built.stderr) is said
    assert ("the bundle's context is" in built.stderr) is said


def test_a_finished_build_names_the_commands_that_run_and_deploy_it(tiny_model_dir, tmp_path):
    out = tmp_path / "my bundle"
    built = edgesdk("build", "--model", tiny_model_dir, "--target", "rpi5", "--recipe", "fp32-fused", "--out", out,
                    "--no-progress", timeout=300)
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == str(out)  # stdout stays the bundle's path alone, for scripts
    assert (f"edgesdk build: next: edgesdk run '{out}' --prompt Hello (tries it here); edgesdk deploy '{out}' "
            "--host user@board (installs it on the board over ssh)") in built.stderr
