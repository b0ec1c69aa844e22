"""``edgesdk deploy --service``: a systemd unit that serves ``current``, installed, restarted on each
deploy and rollback, and refused early where systemd does not answer.

The deploys go ``--to`` a local directory through the installed CLI. systemd is not init here, so
``tests/_utils/fake_systemd.py`` stands in for systemctl; the unit's ExecStart it starts is the
real ``edgesdk serve``, asked over real HTTP.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket

import pytest

from edgesdk.deploy.board_service import render_unit, systemd_quote
from tests._utils import fake_systemd
from tests._utils.deploy import bundle_variant, current_id, edgesdk


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def chat(port: int) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", "/v1/chat/completions",
                       body=json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
    response = connection.getresponse()
    body = json.loads(response.read())
    connection.close()
    assert response.status == 200, body
    return body


def test_unit_quoting_keeps_every_argument_whole():
    """systemd's command-line syntax: quotes, backslashes, % specifiers and $ variables stay literal."""
    argv = ["/opt/edge sdk/bin/edgesdk", "serve", "/srv/a\"b\\c/100%/$HOME/current"]
    line = next(line for line in render_unit(argv, "system").splitlines() if line.startswith("ExecStart="))
    assert line == 'ExecStart="/opt/edge sdk/bin/edgesdk" "serve" "/srv/a\\"b\\\\c/100%%/$$HOME/current"'
    assert "WantedBy=multi-user.target" in render_unit(argv, "system")
    # serve's exit codes on a service manager's stop count as success, so 'systemctl stop' leaves it inactive
    success = next(line for line in render_unit(argv, "user").splitlines() if line.startswith("SuccessExitStatus="))
    assert {str(128 + signal.SIGTERM), str(128 + signal.SIGHUP)} <= set(success.split("=", 1)[1].split())
    assert "WantedBy=default.target" in render_unit(argv, "user")
    with pytest.raises(Exception, match="line break"):
        systemd_quote("/srv/a\nb")


def test_service_serves_current_and_follows_deploys_and_rollbacks(tiny_bundle, tmp_path, systemd):
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    unit = (tmp_path / "units" / "edgesdk-serve.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert f'"serve" "{root}/current"' in exec_start
    assert f'"--port" "{port}"' in exec_start
    assert '"--watch-thermal"' in exec_start
    assert json.loads((root / "service.json").read_text())["health_url"] == f"http://127.0.0.1:{port}/health"
    assert "written and enabled; serving on" in first.stderr + first.stdout
    assert chat(port)["model"] == "tiny-llama-host"
    changes = [call[1:] for call in fake_systemd.calls(state)
               if call[0] == "systemctl" and call[1] not in ("is-active", "show-environment")]
    assert changes == [["daemon-reload"], ["enable", "edgesdk-serve"], ["reset-failed", "edgesdk-serve"],
                       ["restart", "edgesdk-serve"]]

    second_bundle = bundle_variant(tiny_bundle.path, tmp_path / "second", "second release")
    second = edgesdk("deploy", second_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert second.returncode == 0, second.stderr
    assert current_id(root) == second_bundle.bundle_id
    assert "installed already: it is restarted" in second.stderr + second.stdout
    assert "written and" not in second.stderr + second.stdout  # the same unit: only a restart
    chat(port)

    back = edgesdk("deploy", "--rollback", "--to", root, env=env)
    assert back.returncode == 0, back.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert "restarted; it serves the release rolled back to" in back.stderr + back.stdout
    restarts = [call for call in fake_systemd.calls(state) if call[:2] == ["systemctl", "restart"]]
    assert len(restarts) == 3
    chat(port)


def test_service_that_does_not_come_up_is_reported_with_its_journal(tiny_bundle, tmp_path, systemd):
    env, state = systemd
    root = tmp_path / "board"
    with socket.socket() as taken:
        # bound, not listening: nothing accepts connections there (a port something listens on is refused by the
        # check before anything changes), but the server cannot bind it
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        result = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert result.returncode == 8, result.stderr
    assert "service edgesdk-serve did not come up" in result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr  # the journal's tail: the server's own error
    assert "pass another --service-port" in result.stderr
    # A first deploy: the smoke-tested release stays current, and the unit it wrote is taken away again.
    assert f"releases/{tiny_bundle.bundle_id} (smoke-tested) stays current" in result.stderr
    assert "stopped, disabled and removed" in result.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert not (tmp_path / "units" / "edgesdk-serve.service").exists()
    assert not (root / "service.json").exists()
    assert not (root / "service.before.json").exists()
    assert any(call[-2:] == ["disable", "edgesdk-serve"] for call in fake_systemd.calls(state))


def test_a_deploy_whose_service_does_not_come_up_leaves_the_old_release_served(tiny_bundle, tmp_path, systemd):
    """The new release passes its smoke test, but its service cannot listen: current is switched back, the
    unit is written back as it was and restarted, and the server that ran before answers again."""
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    unit_path = tmp_path / "units" / "edgesdk-serve.service"
    unit, record = unit_path.read_text(), (root / "service.json").read_text()
    chat(port)

    second_bundle = bundle_variant(tiny_bundle.path, tmp_path / "second", "second release")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: it passes the check, and the server cannot bind it
        other_port = taken.getsockname()[1]
        second = edgesdk("deploy", second_bundle.path, "--to", root, "--service", "--service-port", other_port,
                         env=env)
    assert second.returncode == 8, second.stderr
    assert f"cannot listen on 127.0.0.1:{other_port}" in second.stderr
    assert f"current switched back to releases/{tiny_bundle.bundle_id}" in second.stderr
    assert "put back as it was and restarted: it serves current again" in second.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert unit_path.read_text() == unit
    assert (root / "service.json").read_text() == record
    assert not (root / "service.before.json").exists()
    restarts = [call for call in fake_systemd.calls(state) if call[-2:] == ["restart", "edgesdk-serve"]]
    assert len(restarts) == 3  # the first deploy, the failed one, the one that put the old server back
    assert chat(port)["model"] == "tiny-llama-host"


def test_service_without_a_running_systemd_is_refused_before_anything_changes(tiny_bundle, tmp_path):
    """This machine's own systemctl (systemd is not init here), or none: refused at the checks."""
    root = tmp_path / "board"
    env = {**os.environ, "EDGESDK_UNIT_DIR": str(tmp_path / "units")}
    result = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", env=env)
    assert result.returncode == 8, result.stderr
    assert "does not answer" in result.stderr or "has no systemctl" in result.stderr
    assert "fix:" in result.stderr
    assert current_id(root) is None
    assert not (root / "releases").exists()
    assert not (tmp_path / "units").exists()


def test_service_options_need_service(tiny_bundle, tmp_path):
    result = edgesdk("deploy", tiny_bundle.path, "--to", tmp_path / "board", "--service-port", 9000)
    assert result.returncode == 2
    assert "works only with --service" in result.stderr
    result = edgesdk("deploy", "--rollback", "--to", tmp_path / "board", "--service")
    assert result.returncode == 2
    assert "restarts a unit" in result.stderr
