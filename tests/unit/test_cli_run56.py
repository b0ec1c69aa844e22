"""``edgesdk run``'s files named by an option or by /read: a path that cannot even be looked up, and a ``~user`` that
names no home, are refused by name instead of ending the run (or the chat) with a traceback."""

from __future__ import annotations

import os
import pwd

import pytest

from edgesdk.cli_interactive import read_for_prompt
from edgesdk.errors import EdgeSDKError
from tests.unit.test_cli import invoke


def unreachable_name(directory) -> str:
    """A file name one character longer than the file system allows (NAME_MAX), so that looking it up fails with
    ENAMETOOLONG, as a path under a directory this user may not search fails with EACCES (which root, running the
    tests, never sees)."""
    return "a" * (os.pathconf(directory, "PC_NAME_MAX") + 1)


def test_read_of_a_path_that_cannot_be_looked_up_is_refused_by_name(tmp_path, monkeypatch):
    """``Path.is_file`` raises where the path cannot be looked up; the OSError ended the chat with a traceback, its
    conversation lost, where a file that cannot be read is told and the chat goes on."""
    monkeypatch.chdir(tmp_path)
    name = unreachable_name(tmp_path)
    with pytest.raises(EdgeSDKError) as caught:
        read_for_prompt(name)
    assert "cannot be read (File name too long)" in str(caught.value)
    assert name in str(caught.value)


def test_read_of_a_home_that_does_not_exist_is_refused_by_name(tmp_path, monkeypatch):
    """``/read ~nobody/notes.txt``: ``Path.expanduser`` raises RuntimeError for a user with no home, which ended the
    chat with a traceback; the shell keeps such a ``~user`` as typed, and so does /read, which then says that
    nothing is there."""
    user = "edgesdk-no-such-user-56"
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EdgeSDKError) as caught:
        read_for_prompt(f"~{user}/notes.txt")
    assert f"~{user}/notes.txt cannot be read (No such file or directory)" in str(caught.value)


def test_read_keeps_a_user_home_it_can_expand(tmp_path, monkeypatch):
    """The fallback is for a home that cannot be found only: ``~/FILE`` still reads the file in $HOME."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "notes.txt").write_text("kept\n", encoding="utf-8")
    assert read_for_prompt("~/notes.txt") == "--- File: ~/notes.txt ---\nkept\n"


@pytest.mark.parametrize(("option", "hint"), [("-f", "'--file' / '-f'"),
                                               ("-sysf", "'--system-prompt-file' / '-sysf'"),
                                               ("--grammar-file", "'--grammar-file'"),
                                               ("-jf", "'--json-schema-file' / '-jf'")])
def test_an_option_file_that_cannot_be_looked_up_is_refused_under_the_option(tmp_path, option, hint):
    """``Path.exists`` raises where the path cannot be looked up (EACCES on the way, ENAMETOOLONG): run ended with an
    OSError traceback before the bundle was even opened; it is refused under the option that named it, as a
    missing file is."""
    name = tmp_path / unreachable_name(tmp_path)
    extra = () if option == "-f" else ("-p", "hi")
    result = invoke("run", tmp_path, option, name, *extra)
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"Invalid value for {hint}" in result.stderr
    assert "cannot be looked up (File name too long)" in result.stderr
    assert "Traceback" not in result.output


def test_a_json_schema_text_too_long_for_a_path_is_refused_as_neither_file_nor_json(tmp_path):
    """``--json-schema`` takes a file or a JSON text: a long text that is neither (YAML, say) was looked up as a path
    and crashed with 'File name too long'; it is told as neither, the lookup's reason beside it."""
    text = "type: object " * 40
    result = invoke("run", tmp_path, "--json-schema", text, "-p", "hi")
    assert result.exit_code == 2, (result.output, result.exception)
    assert "is neither a file nor a JSON text starting with '{' (as a path: File name too long)" in result.stderr
