"""``edgesdk build``'s refusals of a stage setting name the setting, its value and what it takes, not the stage's
whole config; an empty ``--set`` value is refused as empty; a --data directory is refused in edgesdk's own words
with the fix. A user's profile file may be named otherwise than its ``name`` (an edited copy keeping its board's
name), as targets/README.md says."""

from __future__ import annotations

from importlib import resources

import pytest
from click.testing import CliRunner

from edgesdk.build.recipes import load_recipe
from edgesdk.cli import main
from edgesdk.errors import BuildError
from edgesdk.profile import get_profile


def _refusal(recipe: str, *overrides: str, terms: str = "cli") -> BuildError:
    with pytest.raises(BuildError) as caught:
        load_recipe(recipe).with_overrides(list(overrides), terms).validated(terms)
    return caught.value


def test_an_out_of_range_shortcut_value_names_the_setting_and_its_shortcut_not_the_whole_config():
    refused = _refusal("int4-prune", "prune.ffn_ratio=1.5")
    assert refused.problem == "stage 'prune' option ffn_ratio=1.5: ffn_ratio must be in [0, 1), got 1.5"
    assert refused.fix == ("change prune.ffn_ratio where it is given: --set prune.ffn_ratio=... (or --ffn-ratio), "
                           "or in the recipe")
    assert "--density" not in refused.fix


def test_a_mistyped_name_is_refused_with_the_names_taken_and_the_closest():
    refused = _refusal("int4-prune", "qat.activations=blok")
    assert refused.problem == ("stage 'qat' option activations='blok': activations must be none, block or tensor, "
                               "got 'blok'; did you mean 'block'?")
    assert "weight_bits" not in refused.problem
    assert "{" not in refused.problem
    python = _refusal("int4-prune", "qat.activations=blok", terms="python")
    assert python.fix == "change qat.activations where it is given: overrides=['qat.activations=...'], or in the recipe"


def test_two_settings_that_fail_only_together_are_both_named():
    refused = _refusal("int4", "qat.eight_bit_fraction=0.2", "qat.granularity=channel")
    assert refused.problem.startswith("stage 'qat' options eight_bit_fraction=0.2, granularity='channel': ")
    assert "steps=" not in refused.problem


@pytest.mark.parametrize("override", ["qat.steps=", "qat.steps=null"])
def test_an_empty_set_value_is_refused_as_empty_naming_the_type(override):
    refused = _refusal("int4-prune", override)
    assert refused.problem.startswith("stage 'qat' option steps has no value (--set qat.steps= with nothing")
    assert refused.problem.endswith("where it takes an int")
    assert "None" not in refused.problem
    assert refused.fix == "fix the recipe or the override, e.g. --set qat.steps=<int>"


def test_an_optional_setting_still_takes_null():
    stages = dict(load_recipe("jetson").with_overrides(["qat.embedding_bits=null"]).validated())
    assert stages["qat"].embedding_bits is None


def test_a_data_directory_is_refused_in_edgesdks_words_with_its_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "b.txt").write_text("more text\n", encoding="utf-8")
    (tmp_path / "texts" / "a.txt").write_text("some text\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    runner = CliRunner()
    result = runner.invoke(main, ["build", "-t", "host", "-m", str(tmp_path / "no-model"), "--data", "texts"])
    assert result.exit_code != 0
    assert "Invalid value for '--data'" not in result.output
    assert "training text texts is a directory; --data takes a plain-text file" in result.output
    assert "--data texts/a.txt --data texts/b.txt" in result.output
    empty = runner.invoke(main, ["build", "-t", "host", "-m", str(tmp_path / "no-model"), "--data", "empty"])
    assert "pass a plain-text file to --data (empty holds no files)" in empty.output


def test_a_data_directory_that_cannot_be_listed_says_so(tmp_path, monkeypatch):
    """A directory this user cannot list was said to hold no files."""
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "a.txt").write_text("text\n", encoding="utf-8")

    def refused(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", refused)
    result = CliRunner().invoke(main, ["build", "-t", "host", "-m", str(tmp_path / "no-model"), "--data", "locked"])
    assert result.exit_code != 0
    assert "pass a plain-text file to --data (locked cannot be listed: Permission denied)" in result.output


def test_a_user_profile_may_be_named_otherwise_than_its_file(tmp_path):
    """An edited copy of a shipped profile may keep its board's name under another file name (deploy budgets its
    bundle by the copy it carries): the name equals the file name for the shipped profiles alone."""
    source = resources.files("edgesdk.targets").joinpath("host.yaml").read_text(encoding="utf-8")
    lines = [line for line in source.splitlines() if not line.startswith("aliases")]
    other = tmp_path / "other-name.yaml"
    other.write_text("\n".join("name: my-board" if line.startswith("name:") else line for line in lines) + "\n",
                     encoding="utf-8")
    assert get_profile(str(other)).name == "my-board"
