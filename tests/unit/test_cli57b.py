"""Review 57, second pass: the prompt cache's name limits (edgesdk/cli_prompt_cache.py), the one click type for a
path refused when empty (edgesdk/cli_options.py), --set values read by the recipe loader (edgesdk/build/recipes.py)."""

from __future__ import annotations

import os

import click
import pytest
from click.testing import CliRunner

from edgesdk.cli_prompt_cache import writable_prompt_cache
from edgesdk.errors import BuildError


def test_a_directory_name_too_long_below_a_missing_directory_is_refused_for_its_length(tmp_path):
    """The lookup fails ENOENT at the missing directory before it meets the long name: the path was said not to
    exist, with the fix "mkdir -p" it, which fails "File name too long"."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    path = tmp_path / "missing" / ("d" * (name_max + 1)) / "prompt.cache"
    with pytest.raises(click.BadParameter) as caught:
        writable_prompt_cache(path)
    message = caught.value.format_message()
    assert f"is {name_max + 1} bytes, more than the {name_max} bytes a file name may have" in message
    assert "mkdir" not in message


def test_a_prompt_cache_name_is_measured_against_its_file_systems_limit(tmp_path, monkeypatch):
    """A file system that takes shorter names than 255 bytes (eCryptfs: 143) refuses a name of 150 bytes, which
    the lookup reports as missing: it is refused by that file system's NAME_MAX, not said to pass PATH_MAX."""
    pathconf = os.pathconf
    monkeypatch.setattr(os, "pathconf", lambda path, name: 143 if name == "PC_NAME_MAX" else pathconf(path, name))
    with pytest.raises(click.BadParameter) as caught:
        writable_prompt_cache(tmp_path / ("c" * 150))
    message = caught.value.format_message()
    assert "is 150 bytes, more than the 143 bytes a file name may have" in message
    assert "PATH_MAX" not in message
    within = tmp_path / ("c" * 143)
    assert writable_prompt_cache(within) == within


def test_the_commands_share_one_type_for_a_path_refused_when_empty():
    from edgesdk.cli import main
    from edgesdk.cli_options import NamedPath

    options = {"deploy": ["to", "hosts_file"], "embed": ["text_file"]}
    for command, names in options.items():
        params = {param.name: param for param in main.commands[command].params}
        assert all(isinstance(params[name].type, NamedPath) for name in names), command
    build = {param.name: param for param in main.commands["engine"].commands["build"].params}
    assert isinstance(build["out"].type, NamedPath)
    assert isinstance(build["timing_cache"].type, NamedPath)


def test_a_named_path_refuses_an_empty_path_and_takes_click_paths_flags(tmp_path):
    from edgesdk.cli_options import NamedPath

    @click.command()
    @click.option("--inventory", type=NamedPath("inventory file", "--inventory boards.txt", dir_okay=False))
    def command(inventory):
        click.echo(repr(inventory))

    runner = CliRunner()
    empty = runner.invoke(command, ["--inventory", ""])
    assert empty.exit_code == 2
    assert "an empty path names no inventory file" in empty.output
    assert "e.g. --inventory boards.txt" in empty.output
    directory = runner.invoke(command, ["--inventory", str(tmp_path)])
    assert directory.exit_code == 2
    assert "is a directory" in directory.output
    given = runner.invoke(command, ["--inventory", str(tmp_path / "boards.txt")])
    assert given.exit_code == 0
    assert "PosixPath" in given.output or "WindowsPath" in given.output


@pytest.mark.parametrize(("raw", "expected"), [("010", 10), ("0o17", 15), ("1:00", "1:00"), ("1e3", 1000.0),
                                             ("-1e-3", -0.001), ("0x1F", 31), (".inf", float("inf")), ("yes", True),
                                             ("text", "text")])
def test_a_set_value_is_read_as_a_recipe_file_reads_it(raw, expected):
    """Numbers as YAML 1.2 reads them (010 is ten, 1:00 text, 1e3 the float 1000), as a recipe file reads them."""
    from edgesdk.build.recipes import _override_value

    value = _override_value(raw)
    assert value == expected
    assert type(value) is type(expected)


def test_a_set_value_giving_one_key_twice_is_refused_as_a_recipe_file_is():
    """``--set`` kept the last value of a mapping giving one key twice, which a recipe file refuses."""
    from edgesdk.build.recipes import load_recipe

    with pytest.raises(BuildError) as refused:
        load_recipe("jetson-sparse").with_overrides(["qat.granularity={a: 1, a: 2}"])
    assert "the value '{a: 1, a: 2}' gives the key 'a' twice" in refused.value.problem
    assert "not valid YAML" not in refused.value.problem
    assert refused.value.fix == "give each key once"
