"""``edgesdk run``'s interactive chat (edgesdk/cli_interactive.py): ``/read`` of a file dragged onto the terminal,
which types its path quoted or escaped as a shell writes it."""

from __future__ import annotations

import pytest

from edgesdk.cli_interactive import read_for_prompt
from edgesdk.errors import EdgeSDKError


def _notes(tmp_path):
    path = tmp_path / "my notes.txt"
    path.write_text("the notes\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("typed", [
    lambda path: f"'{path}' ",  # GNOME Terminal (VTE) and Konsole: single quotes and a space after
    lambda path: str(path).replace(" ", "\\ "),  # macOS Terminal and iTerm2: each space escaped
    lambda path: f'"{path}"',  # Windows Terminal: double quotes
], ids=["single-quoted", "escaped", "double-quoted"])
def test_read_takes_a_dropped_file_path_as_the_terminal_types_it(tmp_path, typed):
    """Taken as typed, the quoted name named no file and /read was refused with 'check that '/tmp/.../my notes.txt'
    exists', about a file that does; the path the quoting gives is read, and named without its quotes."""
    path = _notes(tmp_path)
    text = read_for_prompt(typed(path).strip())
    assert text == f"--- File: {path} ---\nthe notes\n"


def test_read_looks_a_name_up_as_typed_first(tmp_path):
    """A file whose own name has quotes in it is the one read, not the file the quotes would name."""
    _notes(tmp_path)
    quoted = tmp_path / "'my notes.txt'"
    quoted.write_text("the quoted one\n", encoding="utf-8")
    assert read_for_prompt(str(quoted)) == f"--- File: {quoted} ---\nthe quoted one\n"


def test_read_of_a_quoted_path_that_names_nothing_is_refused_as_typed(tmp_path):
    typed = f"'{tmp_path / 'missing file.txt'}'"
    with pytest.raises(EdgeSDKError, match="cannot be read"):
        read_for_prompt(typed)
