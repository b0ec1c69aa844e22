"""Review 59 of the board side of deploy: --service on a machine whose init is not systemd (a container), and prune
of a staging directory written before the board's clock was set back."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from edgesdk.deploy import board_service
from edgesdk.deploy.board_common import Refused
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import LocalTransport

NOT_BOOTED = """#!{python}
import sys
print("System has not been booted with systemd as init system (PID 1). Can't operate.", file=sys.stderr)
print("Failed to connect to bus: Host is down", file=sys.stderr)
sys.exit(1)
"""


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


@pytest.fixture
def silent_systemctl(tmp_path, monkeypatch) -> Path:
    """A systemctl first on PATH that answers as one does where systemd is not PID 1 (a container)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(NOT_BOOTED.format(python=sys.executable))
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("EDGESDK_UNIT_DIR", str(tmp_path / "units"))
    return bin_dir


def _check(root: Path, argv: list[str]) -> dict:
    return board_service.op_service({"root": str(root), "action": "check", "argv": argv,
                                     "health_url": "http://127.0.0.1:9/health", "timeout_s": 1})


@pytest.mark.parametrize("scope", ["system", "user"])
def test_service_where_systemd_is_not_the_init_says_to_start_the_server_by_hand(tmp_path, monkeypatch,
                                                                               silent_systemctl, scope):
    """Deploying --service as root into a container (jetson-containers runs no systemd) was told to "deploy as root
    for a system unit" (it was root already) or to turn lingering on, neither of which starts a manager where systemd
    is not the init. It is told that, and to start the server by hand, with the command as one to paste (the deploy
    root's path has a space)."""
    monkeypatch.setattr(board_service, "unit_scope", lambda: scope)
    monkeypatch.setattr(board_service, "SYSTEMD_BOOTED", str(tmp_path / "not-there"), raising=False)
    root = tmp_path / "my models"
    argv = [str(root / "runtime" / "current" / "bin" / "edgesdk"), "serve", str(root / "current"), "--port", "8080"]
    with pytest.raises(Refused) as refused:
        _check(root, argv)
    assert "deploy as root" not in refused.value.fix
    assert "enable-linger" not in refused.value.fix
    assert refused.value.fix.endswith(f"start the server yourself: {shlex.join(argv)}")
    assert "not booted with systemd as its init" in refused.value.problem
    assert "does not answer (Failed to connect to bus: Host is down)" in refused.value.problem
    assert not (tmp_path / "units").exists()


def test_service_where_systemd_is_the_init_keeps_the_advice_for_each_manager(tmp_path, monkeypatch, silent_systemctl):
    """Where systemd is PID 1, a user's manager that does not answer runs once the user lingers; root's system manager
    not answering is systemd's own fault, and root is not told to deploy as root."""
    booted = tmp_path / "run-systemd-system"
    booted.mkdir()
    monkeypatch.setattr(board_service, "SYSTEMD_BOOTED", str(booted), raising=False)
    fixes = {}
    for scope in ("system", "user"):
        monkeypatch.setattr(board_service, "unit_scope", lambda scope=scope: scope)
        with pytest.raises(Refused) as refused:
            _check(tmp_path / "board", [])
        assert "not booted" not in refused.value.problem
        fixes[scope] = refused.value.fix
    assert "deploy as root" not in fixes["system"]
    assert "check systemd on the board" in fixes["system"]
    assert "enable-linger" in fixes["user"]


def test_a_staging_directory_from_before_the_clock_was_set_back_is_pruned(board):
    """A transfer left unfinished while the board's clock ran days ahead (no real-time clock, NTP not synced yet) has
    an mtime in the future once the clock is right. Taken as used less than a day ago, it was never pruned until the
    clock caught up: a bundle's room on the card. One a receive has just used stays."""
    root = Path(board.root)
    ahead, fresh = root / "staging" / "aaaa1111", root / "staging" / "bbbb2222"
    for folder in (ahead, fresh):
        folder.mkdir(parents=True)
        (folder / "w.partial").write_bytes(b"x" * 64)
    days_ahead = time.time() + 3 * 24 * 3600
    os.utime(ahead, (days_ahead, days_ahead))
    reply = board.call("prune", {"keep": 2})
    assert "staging/aaaa1111" in reply["removed"]
    assert not ahead.exists()
    assert fresh.is_dir()
    assert "staging/bbbb2222" not in reply["removed"]
