"""``edgesdk serve``'s refusals of --models-dir, --alias (LLAMA_ARG_ALIAS) and -np (LLAMA_ARG_N_PARALLEL): each
names the thing at fault, where it came from and the fix."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from edgesdk.bundle import MANIFEST
from edgesdk.cli import main


def _serve(args: list[str], env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["serve", *args], env=env)


# --- --models-dir pointed at a bundle ----------------------------------------------------------------------------


def test_models_dir_that_is_a_bundle_is_refused_as_one(tmp_path):
    bundle = tmp_path / "smollm2-135m-rpi5"
    bundle.mkdir()
    (bundle / MANIFEST).write_text("{}")
    (bundle / "model.onnx").write_bytes(b"")
    result = _serve(["--models-dir", str(bundle)])
    assert result.exit_code == 2, result.output
    assert f"{bundle} is a bundle itself (it holds {MANIFEST})" in result.output
    assert f"serve it as BUNDLE (or -m {bundle})" in result.output
    assert f"({tmp_path}) to --models-dir" in result.output
    # its own files were said to be no bundles ("manifest.json skipped: ... (no manifest.json)")
    assert "skipped" not in result.output


def test_models_dir_bundle_from_the_environment_names_the_variable(tmp_path):
    bundle = tmp_path / "one"
    bundle.mkdir()
    (bundle / MANIFEST).write_text("{}")
    result = _serve([], env={"LLAMA_ARG_MODELS_DIR": str(bundle)})
    assert result.exit_code == 2, result.output
    assert "is a bundle itself" in result.output
    assert f"LLAMA_ARG_MODELS_DIR={str(bundle)!r}" in result.output


def test_models_dir_of_bundles_is_still_read(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    result = _serve(["--models-dir", str(tmp_path)])
    assert "notes.txt skipped" in result.output
    assert f"--models-dir {tmp_path} holds no bundle" in result.output


# --- --alias from LLAMA_ARG_ALIAS -----------------------------------------------------------------------------------


@pytest.fixture
def two_bundles(tiny_bundle, tmp_path):
    folder = tmp_path / "models"
    for name in ("one", "two"):
        shutil.copytree(tiny_bundle.path, folder / name)
    return folder


def test_alias_refused_with_several_bundles_names_llama_arg_alias(two_bundles):
    result = _serve(["--models-dir", str(two_bundles)], env={"LLAMA_ARG_ALIAS": "mymodel"})
    assert result.exit_code == 2, result.output
    assert "each --alias is NAME=BUNDLE" in result.output
    assert "read from the environment, LLAMA_ARG_ALIAS='mymodel'" in result.output


def test_alias_naming_no_bundle_from_the_environment_names_the_variable(two_bundles):
    one = two_bundles / "one"
    result = _serve([str(one)], env={"LLAMA_ARG_ALIAS": "mymodel=elsewhere"})
    assert result.exit_code == 2, result.output
    assert "'elsewhere' is none of the bundles served" in result.output
    assert "LLAMA_ARG_ALIAS='mymodel=elsewhere'" in result.output


def test_alias_refused_on_the_command_line_names_no_variable(two_bundles):
    result = _serve(["--models-dir", str(two_bundles), "--alias", "mymodel"])
    assert result.exit_code == 2, result.output
    assert "each --alias is NAME=BUNDLE" in result.output
    assert "read from the environment" not in result.output


# --- -np read as llama.cpp reads its number ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["01", "+1", " 1"])
def test_one_slot_written_another_way_is_accepted(tmp_path, value):
    result = _serve(["-np", value, str(tmp_path / "missing")])
    assert "'-np'" not in result.output, result.output
    assert f"bundle {tmp_path / 'missing'} does not exist" in result.output


def test_one_slot_from_the_environment_written_another_way_is_accepted(tmp_path):
    result = _serve([str(tmp_path / "missing")], env={"LLAMA_ARG_N_PARALLEL": "01"})
    assert "LLAMA_ARG_N_PARALLEL (llama.cpp's --parallel) is accepted" in result.output, result.output
    assert "Invalid value" not in result.output
    assert "does not exist" in result.output


@pytest.mark.parametrize("value", ["4", "04"])
def test_more_slots_are_still_refused(tmp_path, value):
    result = _serve(["-np", value, str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert f"is {value}, and edgesdk serve decodes one sequence at a time" in result.output
