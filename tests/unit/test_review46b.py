"""Second reading of review 46's deploy changes: the refusal of a service program systemd would not start names
the fix for where that program comes from. For ``deploy --to DIR --service`` it is the Python running deploy
(edgesdk/deploy/install.py ``runtime_argv``), which no ``--remote-root`` (refused beside ``--to``) moves."""

from __future__ import annotations

import pytest

from edgesdk.deploy.board_common import Refused
from edgesdk.deploy.board_service import render_unit


def test_a_local_deploys_python_under_an_apostrophe_gets_a_fix_for_to():
    argv = ["/home/o'brien/venv/bin/python3", "-m", "edgesdk.cli", "serve", "/srv/edge/current"]
    with pytest.raises(Refused, match="Executable name contains special characters") as caught:
        render_unit(argv, "user")
    fix = caught.value.fix
    assert "with --to DIR, run deploy with a Python installed under such a path" in fix
    assert "--remote-root" in fix  # the runtime deploy installs over ssh lies under the deploy root
    assert fix.endswith("then deploy with --service again")


def test_a_relative_program_gets_the_path_fix_not_the_character_fix():
    """A relative program comes from a PATH entry that is relative (--no-install): no character is at fault."""
    with pytest.raises(Refused, match="not an absolute path") as caught:
        render_unit(["bin/edgesdk", "serve", "/srv/edge/current"], "user")
    assert "absolute directory" in caught.value.fix
    assert "apostrophe" not in caught.value.fix
