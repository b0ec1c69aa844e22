"""The restart a deploy without ``--service`` (and a rollback) gives the unit an earlier ``deploy --service``
installed: a unit its owner stopped on purpose stays stopped, and a board whose systemd is gone since keeps the
new release instead of undoing the deploy.

``tests/_utils/fake_systemd.py`` stands in for systemctl (systemd is not init here); the unit's ExecStart it
starts is the real ``edgesdk serve``. The board without systemd gets a ``systemctl`` that answers as the real one
does on a machine not booted with systemd.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests._utils import fake_systemd
from tests._utils.deploy import bundle_variant, current_id, edgesdk
from tests._utils.sshd import free_port

NOT_BOOTED = """#!{python}
import sys
print("System has not been booted with systemd as init system (PID 1). Can't operate.", file=sys.stderr)
print("Failed to connect to bus: Host is down", file=sys.stderr)
sys.exit(1)
"""


def restarts(state) -> int:
    return sum(call[-2:] == ["restart", "edgesdk-serve"] for call in fake_systemd.calls(state))


def systemctl(env, *args) -> None:
    subprocess.run(["systemctl", *args], env=env, check=False, capture_output=True)


def test_a_unit_stopped_and_disabled_on_purpose_stays_stopped_through_a_deploy_and_a_rollback(tiny_bundle,
                                                                                              tmp_path, systemd):
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    systemctl(env, "stop", "edgesdk-serve")  # 'systemctl disable --now edgesdk-serve', as the deploy said
    systemctl(env, "disable", "edgesdk-serve")
    assert restarts(state) == 1

    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    second = edgesdk("deploy", newer.path, "--to", root, env=env)
    assert second.returncode == 0, second.stderr
    assert current_id(root) == newer.bundle_id
    assert "not restarted: it is stopped" in second.stderr
    assert "disabled), as it was left on the board, so it stays stopped" in second.stderr
    assert "systemctl start edgesdk-serve" in second.stderr
    assert restarts(state) == 1
    assert not (state / "edgesdk-serve.pid").exists()

    back = edgesdk("deploy", "--rollback", "--to", root, env=env)
    assert back.returncode == 0, back.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert "not restarted: it is stopped" in back.stderr
    assert restarts(state) == 1


def test_a_board_whose_systemd_is_gone_keeps_the_new_release(tiny_bundle, tmp_path, systemd):
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    fake_systemd.stop_all(state)  # systemd went, and the unit's server with it

    gone = tmp_path / "no-systemd"
    gone.mkdir()
    (gone / "systemctl").write_text(NOT_BOOTED.format(python=sys.executable))
    (gone / "systemctl").chmod(0o755)
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    second = edgesdk("deploy", newer.path, "--to", root, env={**env, "PATH": f"{gone}:{env['PATH']}"})
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr
    assert current_id(root) == newer.bundle_id
    assert "not restarted: the systemd" in second.stderr
    assert "does not answer (Failed to connect to bus: Host is down)" in second.stderr
    assert "undone" not in second.stderr


def test_status_after_a_deploy_switched_back_says_so(tiny_bundle, tmp_path, systemd):
    """The restarted server exits on the new release (a blank EDGESDK_API_KEY, which 'edgesdk serve' refuses
    and the smoke test's 'edgesdk run' never reads): current goes back, and --status names that switch."""
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    failed = edgesdk("deploy", newer.path, "--to", root, env={**env, "EDGESDK_API_KEY": " "})
    assert failed.returncode == 8, failed.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    # a plain deploy never rewrites the unit: its fix does not say the plain deploy again installs it
    assert "fix: fix what the unit's journal shows (journalctl -u edgesdk-serve" in failed.stderr
    assert "which installs and restarts the service" not in failed.stderr

    status = edgesdk("deploy", "--status", "--to", root, env=env)
    assert status.returncode == 0, status.stderr
    assert f"current    {tiny_bundle.bundle_id}\n" in status.stdout
    assert (f" rollback after a failed deploy: {newer.bundle_id} -> {tiny_bundle.bundle_id}\n"
            in status.stdout), status.stdout
    assert "\nswitched   " in status.stdout


def test_a_user_unit_restarted_without_lingering_says_it_stops_with_the_session(tiny_bundle, tmp_path, systemd):
    """A user unit (what a non-root deploy user gets; service.json names its scope) whose user does not linger:
    logind stops it with the user's last session, so the restart says so, as the install did."""
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    record = json.loads((root / "service.json").read_text())
    (root / "service.json").write_text(json.dumps({**record, "scope": "user"}) + "\n")

    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    second = edgesdk("deploy", newer.path, "--to", root, env=env)
    assert second.returncode == 0, second.stderr
    assert "(from an earlier --service deploy) restarted; it serves current" in second.stderr
    assert ("warning: lingering could not be turned on (Could not enable linger: Access denied), so the user "
            "service stops when") in second.stderr
    assert ["systemctl", "--user", "restart", "edgesdk-serve"] in fake_systemd.calls(state)

    back = edgesdk("deploy", "--rollback", "--to", root, env=env)
    assert back.returncode == 0, back.stderr
    assert "restarted; it serves the release rolled back to" in back.stderr
    assert "warning: lingering could not be turned on" in back.stderr


@pytest.mark.parametrize("service", [False, True], ids=["restarted-unit", "service-deploy"])
def test_a_deploy_undone_after_its_unit_did_not_come_up_keeps_the_previous_release(tiny_bundle, tmp_path, systemd,
                                                                                 service):
    """--keep 1 after the switch keeps only current and previous: the release previous pointed to before the
    deploy is still there (and previous again) once the deploy is undone, whether the unit that did not come up
    was an earlier one restarted or the one this deploy installs (--service: the prune waits for it too)."""
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    second_bundle = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    second = edgesdk("deploy", second_bundle.path, "--to", root, env=env)
    assert second.returncode == 0, second.stderr

    third_bundle = bundle_variant(tiny_bundle.path, tmp_path / "third", "third")
    again = ("--service", "--service-port", port) if service else ()
    third = edgesdk("deploy", third_bundle.path, "--to", root, "--keep", "1", *again,
                    env={**env, "EDGESDK_API_KEY": " "})
    assert third.returncode == 8, third.stderr
    assert current_id(root) == second_bundle.bundle_id
    assert (root / "releases" / tiny_bundle.bundle_id).is_dir()
    assert (root / "previous").resolve().name == tiny_bundle.bundle_id
    assert "removed old releases" not in third.stderr
