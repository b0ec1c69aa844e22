"""Review 61 of ``deploy --service``'s unit on the board: a unit directory that cannot be written (a user whose home
does not exist, a file where a directory belongs) is refused before the deploy switches ``current``, and
``systemctl --user`` finds the user's manager where the deploy runs without XDG_RUNTIME_DIR (a CI runner's service,
``su``, an ssh server without pam_systemd).

``tests/_utils/fake_systemd.py`` stands in for systemctl; a wrapper in front of it answers as the real one does
without a usable XDG_RUNTIME_DIR. The units' servers are real processes.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from edgesdk.deploy import board_service
from edgesdk.deploy.board_common import Refused
from tests._utils import fake_systemd
from tests._utils.deploy import edgesdk
from tests._utils.sshd import free_port
from tests.unit.test_deploy_review35 import good_argv

# As systemctl --user answers without a user bus to reach (src/shared/bus-util.c bus_connect_user_systemd).
NEEDS_RUNTIME_DIR = """#!{python}
import os, sys
given = os.environ.get("XDG_RUNTIME_DIR")
if "--user" in sys.argv[1:] and not (given and os.path.isdir(given)):
    print("Failed to connect to bus: " + ("No such file or directory" if given else
          "$DBUS_SESSION_BUS_ADDRESS and $XDG_RUNTIME_DIR not defined (consider using --machine=<user>@.host --user "
          "to connect to bus of other user)"), file=sys.stderr)
    sys.exit(1)
os.execv({fake!r}, [{fake!r}, *sys.argv[1:]])
"""


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Path:
    """The stand-in systemd first on PATH, its unit directory in tmp; the state folder is returned."""
    state = tmp_path / "systemd-state"
    for key, value in fake_systemd.install(tmp_path / "bin", state).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("EDGESDK_UNIT_DIR", str(tmp_path / "units"))
    yield state
    fake_systemd.stop_all(state)


def service(root: Path, action: str, argv: list[str], port: int) -> dict:
    return board_service.op_service({"root": str(root), "action": action, "argv": argv, "token": "t", "fix": "fix",
                                     "health_url": f"http://127.0.0.1:{port}/health", "timeout_s": 20})


@pytest.mark.parametrize("action", ["check", "install"])
def test_a_unit_directory_that_cannot_be_made_is_refused_naming_it(tmp_path, fake, monkeypatch, action):
    """The unit's directory lies under a file (a home that is no directory). The check said all was well, and the
    install failed after current was switched with "<dir>: Not a directory" and the fix for the deploy root. Both
    name the unit and the path in the way, change nothing, and say how to give the unit a place."""
    (tmp_path / "home").write_text("not a directory")
    monkeypatch.setenv("EDGESDK_UNIT_DIR", str(tmp_path / "home" / ".config" / "systemd" / "user"))
    root, port = tmp_path / "board", free_port()
    with pytest.raises(Refused) as refused:
        service(root, action, good_argv(tmp_path, port), port)
    assert f"unit {tmp_path / 'home' / '.config' / 'systemd' / 'user' / 'edgesdk-serve.service'} cannot be written: " \
           f"{tmp_path / 'home'} is not a directory" in refused.value.problem
    assert "EDGESDK_UNIT_DIR" in refused.value.fix
    assert "deploy root" not in refused.value.fix
    assert not (root / board_service.SERVICE_BEFORE).exists()  # nothing to put back: nothing changed
    assert not any(call[-2:] == ["restart", "edgesdk-serve"] for call in fake_systemd.calls(fake))


def test_a_user_without_a_home_is_told_to_give_it_one_or_deploy_as_root(tmp_path, fake, monkeypatch):
    """Without EDGESDK_UNIT_DIR a user unit goes to ~/.config/systemd/user: a home that is a file is the user's to fix,
    or root's unit is the way."""
    monkeypatch.delenv("EDGESDK_UNIT_DIR")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    (tmp_path / "home").write_text("not a directory")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(board_service, "unit_scope", lambda: "user")
    with pytest.raises(Refused) as refused:
        service(tmp_path / "board", "check", [], free_port())
    assert f"the user unit {tmp_path / 'home' / '.config' / 'systemd' / 'user' / 'edgesdk-serve.service'} cannot " \
           "be written" in refused.value.problem
    assert "give" in refused.value.fix
    assert "home directory" in refused.value.fix
    assert "deploy as root for a system unit" in refused.value.fix


def test_deploy_into_a_board_whose_unit_directory_cannot_be_made_switches_nothing(tiny_bundle, tmp_path, systemd):
    """End to end: the deploy is refused at its --service check, before it switches current, instead of at the install
    after it, which then had to switch back."""
    env, state = systemd
    (tmp_path / "etc").write_text("a file where the unit directory belongs")
    env = {**env, "EDGESDK_UNIT_DIR": str(tmp_path / "etc" / "systemd" / "system")}
    root = tmp_path / "board"
    result = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", free_port(), env=env)
    assert result.returncode != 0
    assert f"{tmp_path / 'etc'} is not a directory" in result.stderr
    assert "deploy root on the board" not in result.stderr
    assert not os.path.lexists(root / "current")
    assert not any(call[-2:] == ["restart", "edgesdk-serve"] for call in fake_systemd.calls(state))


@pytest.fixture
def user_bus(tmp_path, fake, monkeypatch) -> Path:
    """A user unit's systemctl that needs XDG_RUNTIME_DIR, as the real one does, and this user's runtime directory
    where pam_systemd makes it (under a root in tmp): that directory is returned."""
    wrapper = tmp_path / "bus-bin"
    wrapper.mkdir()
    (wrapper / "systemctl").write_text(NEEDS_RUNTIME_DIR.format(python=sys.executable,
                                                                fake=str(tmp_path / "bin" / "systemctl")))
    (wrapper / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(board_service, "unit_scope", lambda: "user")
    monkeypatch.setattr(board_service, "USER_RUNTIME_ROOT", str(tmp_path / "run-user"))
    monkeypatch.setattr(board_service, "SYSTEMD_BOOTED", str(tmp_path))  # systemd is the init
    monkeypatch.setenv("XDG_RUNTIME_DIR", "set so that monkeypatch puts back what was there")
    return tmp_path / "run-user" / str(os.geteuid())


@pytest.mark.parametrize("given", [None, "gone"])
def test_a_user_unit_is_installed_where_the_deploy_has_no_runtime_directory_of_its_own(tmp_path, user_bus,
                                                                                     monkeypatch, given):
    """A deploy run without XDG_RUNTIME_DIR (or with one that names no directory: another login's, gone) while the
    user's manager runs: every systemctl --user failed with "Failed to connect to bus", and the deploy was refused as if
    no manager ran. The manager is found in the user's runtime directory, and the unit is installed and serves."""
    user_bus.mkdir(parents=True)
    if given is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR")
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / given))
    port = free_port()
    argv = good_argv(tmp_path, port)
    assert service(tmp_path / "board", "check", argv, port)["scope"] == "user"
    reply = service(tmp_path / "board", "install", argv, port)
    assert reply["restarted"]
    assert reply["scope"] == "user"
    assert os.environ["XDG_RUNTIME_DIR"] == str(user_bus)


def test_a_runtime_directory_the_deploy_was_given_is_kept(tmp_path, user_bus, monkeypatch):
    """XDG_RUNTIME_DIR that names a directory of this user's is the session's own: left as it is."""
    own = tmp_path / "session-runtime"
    own.mkdir()
    user_bus.mkdir(parents=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(own))
    service(tmp_path / "board", "check", [], free_port())
    assert os.environ["XDG_RUNTIME_DIR"] == str(own)


def test_a_user_whose_manager_is_not_running_is_told_to_linger(tmp_path, user_bus, monkeypatch):
    """No runtime directory: no manager runs for the user (a login without pam_systemd starts none), and logging in
    again does not help; lingering starts it."""
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    with pytest.raises(Refused) as refused:
        service(tmp_path / "board", "check", [], free_port())
    assert f"it is not running (there is no {user_bus}" in refused.value.problem
    assert refused.value.fix.startswith("run 'sudo loginctl enable-linger ")
    assert "log in once" not in refused.value.fix
    assert shutil.which("systemctl")  # the wrapper, not systemd's absence, refused it
