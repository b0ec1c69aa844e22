"""``edgesdk deploy``: the board helper's answers, prune and transfer planning on a board root holding foreign
entries, and ``--to`` with a Python that cannot be started.

The board side runs for real through a local transport (``python -c BOOT OP JSON``), as over ssh.
"""

from __future__ import annotations

import sys

import pytest

from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import LocalTransport
from tests._utils.deploy import edgesdk


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def test_a_remote_python_that_cannot_be_started_is_named_with_to(tmp_path):
    """'deploy --to DIR --remote-python PATH' with no program at PATH ended in Python's FileNotFoundError
    traceback; it is refused as over ssh, naming the Python and the option."""
    root = tmp_path / "dir"
    for python in (tmp_path / "no such python", tmp_path / "not-executable"):
        if python.name == "not-executable":
            python.write_text("")
        proc = edgesdk("deploy", "--status", "--to", root, "--remote-python", python)
        assert proc.returncode == 8, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"'{python}' cannot be started" in proc.stderr
        assert "--remote-python PATH" in proc.stderr
    assert not root.exists()
