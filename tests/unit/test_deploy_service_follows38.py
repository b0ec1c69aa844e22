"""A deploy without ``--service`` onto a root whose unit an earlier ``deploy --service`` installed: ``current``
moves, and the unit's server, which holds the release it started with in memory, is restarted onto it (as
``--rollback`` restarts it), so the board serves what it runs.

``tests/_utils/fake_systemd.py`` stands in for systemctl (systemd is not init here); the unit's ExecStart it
starts is the real ``edgesdk serve``, asked over real HTTP.
"""

from __future__ import annotations

import http.client
import json

import pytest

from tests._utils import fake_systemd
from tests._utils.deploy import current_id, edgesdk
from tests._utils.sshd import free_port


@pytest.fixture(scope="module")
def other_bundle(tmp_path_factory):
    """A bundle of another model, which the server names other-llama-host (the first is tiny-llama-host)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model = save_tiny_model_dir(tmp_path_factory.mktemp("models") / "other-llama", seed=1)
    return build(BuildConfig(target="host", model=str(model), out=tmp_path_factory.mktemp("bundles") / "other",
                             export=ExportConfig(max_context=256), progress=False))


def served_model(port: int) -> str:
    """The model the server answers a completion with (its bundle's model and target)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", "/v1/completions", body=json.dumps({"prompt": "The quick", "max_tokens": 2}))
    response = connection.getresponse()
    body = json.loads(response.read())
    connection.close()
    assert response.status == 200, body
    return body["model"]


def restarts(state) -> int:
    return sum(call[-2:] == ["restart", "edgesdk-serve"] for call in fake_systemd.calls(state))


def test_a_plain_deploy_restarts_the_unit_an_earlier_service_deploy_installed(tiny_bundle, other_bundle, tmp_path,
                                                                               systemd):
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    assert ("its log on the board: journalctl -u edgesdk-serve -f; to stop it and keep it stopped: "
            "systemctl disable --now edgesdk-serve") in first.stderr
    assert served_model(port) == "tiny-llama-host"
    assert restarts(state) == 1

    second = edgesdk("deploy", other_bundle.path, "--to", root, env=env)
    assert second.returncode == 0, second.stderr
    assert current_id(root) == other_bundle.bundle_id
    assert "(from an earlier --service deploy) restarted; it serves current" in second.stderr
    assert restarts(state) == 2
    assert served_model(port) == "other-llama-host"  # the server runs the new release

    again = edgesdk("deploy", other_bundle.path, "--to", root, env=env)  # nothing switched: left running
    assert again.returncode == 0, again.stderr
    assert restarts(state) == 2


def test_a_plain_deploy_without_a_unit_restarts_nothing(tiny_bundle, other_bundle, tmp_path, systemd):
    env, state = systemd
    root = tmp_path / "board"
    for bundle in (tiny_bundle, other_bundle):
        done = edgesdk("deploy", bundle.path, "--to", root, env=env)
        assert done.returncode == 0, done.stderr
        assert "restarted" not in done.stderr
    assert fake_systemd.calls(state) == []


def test_a_unit_that_does_not_come_up_on_the_new_release_switches_current_back(tiny_bundle, other_bundle, tmp_path,
                                                                               systemd):
    """The new release passes its smoke test ('edgesdk run'), but the restarted server exits: a blank
    EDGESDK_API_KEY, which 'edgesdk serve' refuses and 'run' never reads, in the environment the unit's server
    starts with here. current goes back to the release the board served, and the error says so."""
    env, state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr

    failed = edgesdk("deploy", other_bundle.path, "--to", root, env={**env, "EDGESDK_API_KEY": " "})
    assert failed.returncode == 8, failed.stderr
    assert "Traceback" not in failed.stderr
    assert "the system service edgesdk-serve did not come up" in failed.stderr
    assert f"the deploy was undone: current switched back to releases/{tiny_bundle.bundle_id}" in failed.stderr
    assert current_id(root) == tiny_bundle.bundle_id
