"""Target profiles, recipes and the environment report: a version written unquoted in a profile, a target file
with an upper-case suffix, a recipe stage with an empty ``config:``, and pip's per-CUDA TensorRT packages."""

from __future__ import annotations

from importlib import metadata, resources

import pytest

from edgesdk.build.recipes import load_recipe
from edgesdk.envinfo import NOT_INSTALLED, PACKAGES, package_version
from edgesdk.errors import ProfileError
from edgesdk.profile import get_profile, parse_profile


def _shipped(name: str) -> str:
    return (resources.files("edgesdk.targets") / f"{name}.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(("quoted", "unquoted", "key", "read_as"), [
    ('python: "3.10"', "python: 3.10", "software.python", "3.1"),
    ('cuda: "12.6"', "cuda: 12.6", "software.cuda", "12.6"),
])
def test_unquoted_version_names_the_key_and_the_quoting(quoted, unquoted, key, read_as):
    """YAML reads ``python: 3.10`` as the float 3.1; the refusal said only "should be a valid string (got 3.1)", a
    value the file never held, without saying to quote it."""
    text = _shipped("orin-nx-16gb")
    assert quoted in text
    with pytest.raises(ProfileError) as caught:
        parse_profile(text.replace(quoted, unquoted), "board.yaml")
    message = str(caught.value)
    line = next(line for line in message.splitlines() if key in line)
    assert f"the number {read_as}" in line
    assert "quote" in line
    assert '"3.10"' in line


def test_quoted_versions_and_numbers_still_load():
    profile = parse_profile(_shipped("orin-nx-16gb"), "board.yaml")
    assert profile.software.python == "3.10"
    assert profile.cpu.max_ghz == 2.0
    assert profile.runtime.threads == 6


def test_profile_file_with_upper_case_suffix_is_read_as_a_file(tmp_path):
    """``--target board.YAML`` was looked up as a shipped name ("unknown target"), where ``--recipe r.YAML`` is
    read as a file."""
    path = tmp_path / "my-board.YAML"
    path.write_text(_shipped("rpi5").replace("name: rpi5", "name: my-board"), encoding="utf-8")
    profile = get_profile(str(path))
    assert profile.name == "my-board"
    for suffix in (".YAML", ".Yml"):
        with pytest.raises(ProfileError) as caught:
            get_profile(f"missing-board{suffix}")
        assert "does not exist" in str(caught.value)


def test_profile_name_with_upper_case_yaml_suffix_is_refused():
    text = _shipped("rpi5").replace("name: rpi5", "name: my-board.YAML")
    with pytest.raises(ProfileError, match="not a plain board name"):
        parse_profile(text, "board.yaml")


def test_stage_with_empty_config_runs_with_defaults(tmp_path):
    """``config:`` with every option commented out is YAML's null; the recipe was refused with "Input should be a
    valid dictionary" although a stage without the key loads."""
    path = tmp_path / "gates.yaml"
    path.write_text("name: gates\nstages:\n  - stage: power\n    config:\n    # {steps: 8}\n"
                    "export: {form: ort-fused, weights: fp32}\n", encoding="utf-8")
    recipe = load_recipe(str(path))
    assert recipe.stages[0].config == {}
    assert [name for name, _ in recipe.validated()] == ["power"]
    assert recipe.with_overrides(["power.steps=4"]).stages[0].config == {"steps": 4}


def test_tensorrt_installed_as_its_cuda_13_package_is_reported(tmp_path, monkeypatch):
    """``pip install tensorrt-cu13`` (TensorRT's pip guide) installs no distribution named "tensorrt": the report
    said "not installed"."""
    try:
        metadata.version("tensorrt")
        pytest.skip("a real tensorrt distribution is installed")
    except metadata.PackageNotFoundError:
        pass
    info = tmp_path / "tensorrt_cu13-10.16.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt-cu13\nVersion: 10.16.1\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    version = package_version(*PACKAGES["tensorrt"])
    assert version != NOT_INSTALLED
    assert version == "10.16.1 (tensorrt-cu13)"


def test_profile_file_without_suffix_is_named_as_a_file(tmp_path, monkeypatch):
    """A profile file passed without its suffix was refused as an "unknown target" with the list of shipped names;
    a recipe file so passed is named as a file to rename (load_recipe)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-board").write_text(_shipped("rpi5"), encoding="utf-8")
    with pytest.raises(ProfileError) as caught:
        get_profile("my-board")
    assert "does not end in .yaml or .yml" in str(caught.value)
    assert "rename it to my-board.yaml" in caught.value.fix
    with pytest.raises(ProfileError, match="unknown target 'no-such-board'"):
        get_profile("no-such-board")
