"""What ``edgesdk deploy`` says about the deployed model: the backend its smoke test and its service run on (a
fallback warned of, with why), a service bound to the network named by the board's name and with a word about its
missing API key, the drop-in that keeps the unit's environment settings over redeploys, and the TensorRT step's
skips with their fix.

The board is this machine behind a real sshd on 127.0.0.1; its sessions get ``tests/_utils/fake_systemd.py`` for
systemctl through sshd's ``SetEnv``, so the unit's ExecStart runs the real ``edgesdk serve``, asked over real HTTP.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgesdk.bundle import BundleWriter, read_manifest
from edgesdk.deploy import engine
from edgesdk.deploy.board_service import render_unit
from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import LocalTransport
from edgesdk.runtime.tensorrt_engine import JETSON_TENSORRT
from tests._utils import fake_systemd
from tests._utils.deploy import current_id, edgesdk
from tests._utils.sshd import SshServer, _require_openssh, free_port

GB = 1024**3
START_WAIT_S = 120  # a bound on waiting for a server to load, not a measure of it
ORIN_PROBE = {"root": "/home/nvidia/edgesdk", "arch": "aarch64",
              "device_tree_model": "NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00",
              "nv_tegra_release": "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n",
              "cpuinfo": "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd42\n",
              "memory": {"MemTotal": 16 * GB, "MemAvailable": 8 * GB}, "disk": {"free": 50 * GB, "total": 100 * GB},
              "python": {"version": [3, 10, 12]}, "tensorrt": {"version": "10.3.0", "python": True}, "runtime": {},
              "state": {}}


@pytest.mark.parametrize(("tensorrt", "said"), [(None, "TensorRT was not found on the Jetson"),
                                                ({"version": "10.3.0", "python": False},
                                                 "its Python bindings are not importable")])
def test_a_tensorrt_skip_says_the_fix_and_that_onnx_runtime_runs_on_the_cpu(tmp_path, tensorrt, said):
    """The TensorRT step's skips said what was missing but not how to get it, and the one for no TensorRT at all did
    not say that ONNX Runtime, pip's aarch64 wheel, runs the model on the CPU: a Jetson deploy looked done."""
    facts = BoardFacts.from_probe({**ORIN_PROBE, "tensorrt": tensorrt})
    board = Board(LocalTransport(str(tmp_path)), "python3", "/root")
    decision = engine.decide(facts, 87, "abc", board, engine.BuilderStatus(True))
    assert not decision.build
    assert said in decision.message
    assert "on the CPU" in decision.message
    assert decision.message.endswith(f"Fix: {JETSON_TENSORRT}, then deploy again (it builds the engine)")


def test_the_unit_restarts_a_server_that_a_stray_signal_ended():
    """Restart=on-failure with SuccessExitStatus=143 129: a server ended by a SIGTERM that was no 'systemctl stop'
    exited "successfully" and stayed down. systemd restarts no unit that systemctl stopped, whatever Restart= says."""
    unit = render_unit(["/opt/edgesdk/bin/edgesdk", "serve", "/srv/current"], "system").splitlines()
    assert "Restart=always" in unit
    assert "SuccessExitStatus=143 129" in unit  # a 'systemctl stop' still leaves it inactive, not failed


# --- over ssh, with a service -----------------------------------------------------------------------------------


@dataclass
class ServiceBoard(SshServer):
    """An sshd whose sessions find fake_systemd's systemctl first on PATH (sshd_config ``SetEnv``), and which the
    client also knows as ``localhost``, so the deploy's ``--host`` is a name and not the address the board asks."""

    env: dict[str, str] = field(default_factory=dict)

    def write_known_hosts(self) -> None:
        public = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()
        self.known_hosts.write_text("".join(f"[{name}]:{self.port} {public[0]} {public[1]}\n"
                                            for name in ("127.0.0.1", "localhost")))

    def write_config(self) -> None:
        super().write_config()
        config = self.root / "sshd_config"
        setenv = "SetEnv " + " ".join(f"{key}={value}" for key, value in self.env.items())
        config.write_text(config.read_text() + setenv + "\n")


@pytest.fixture(scope="module")
def service_board(tmp_path_factory):
    _require_openssh()
    where = tmp_path_factory.mktemp("service-board")
    state, units = where / "systemd-state", where / "units"
    env = fake_systemd.install(where / "bin", state)
    server = ServiceBoard(root=where / "sshd", env={**env, "EDGESDK_UNIT_DIR": str(units), "EDGESDK_HUGE_PAGES": "0"})
    server.prepare()
    server.start()
    try:
        yield server, state, units
    finally:
        fake_systemd.stop_all(state)
        server.stop()


def deploy(server: ServiceBoard, root: Path, *extra) -> subprocess.CompletedProcess:
    return edgesdk("deploy", *extra, *server.client_args(), "--host", f"{server.user}@localhost:{server.port}",
                   "--remote-root", root, "--remote-python", sys.executable, "--runtime-venv-system-site-packages",
                   timeout=600)


def chain_variant(source: Path, destination: Path, chain: list[str]):
    """A copy of the bundle at ``source`` (a new id) whose runtime chain is ``chain``."""
    manifest = read_manifest(source)
    writer = BundleWriter(destination)
    for name in manifest["files"]:
        writer.add_file(source / name, name)
    body = {k: v for k, v in manifest.items() if k not in ("schema_version", "edgesdk_version", "created",
                                                          "bundle_id", "files")}
    body["runtime"] = {**body["runtime"], "backend": chain[0], "fallbacks": chain[1:]}
    return writer.commit(body)


def answers(port: int) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


@pytest.mark.slow
def test_deploy_says_the_backend_and_where_a_network_service_answers(service_board, tiny_bundle, tmp_path):
    """The smoke test said only "generated '...'" and the service "serving on http://127.0.0.1:P/v1": neither which
    backend ran the model (a Jetson without TensorRT deployed "green" onto the CPU), and for --service-host 0.0.0.0
    an address no other machine reaches, with no word that the server, bound to the network, had no API key."""
    server, state, units = service_board
    root, port = tmp_path / "board", free_port()
    first = deploy(server, root, tiny_bundle.path, "--service", "--service-host", "0.0.0.0", "--service-port", port)
    assert first.returncode == 0, first.stderr
    said = first.stderr
    assert "generated '" in said
    assert "' on backend ort-cpu" in said, said
    assert "not on " not in said  # the host bundle's own backend: no fallback
    assert f"serving on http://localhost:{port}/v1, on backend ort-cpu" in said, said
    assert answers(port)["backend"] == "ort-cpu"
    assert f"warning: no API key: anyone who can reach port {port} of the board can use the server" in said
    assert "Environment=EDGESDK_API_KEY=" in said
    assert "systemctl edit edgesdk-serve" in said or "systemctl --user edit edgesdk-serve" in said
    assert "go in a drop-in, which redeploys keep" in said
    assert "LLAMA_ARG_ENDPOINT_METRICS=1" in said
    assert "Restart=always" in (units / "edgesdk-serve.service").read_text().splitlines()

    # what 'systemctl edit' writes: a redeploy that rewrites the unit (another port) leaves it as it was
    drop_in = units / "edgesdk-serve.service.d" / "override.conf"
    drop_in.parent.mkdir()
    drop_in.write_text("[Service]\nEnvironment=LLAMA_ARG_ENDPOINT_METRICS=1\n")
    other = free_port()
    second = deploy(server, root, tiny_bundle.path, "--service", "--service-port", other)
    assert second.returncode == 0, second.stderr
    assert "written and enabled" in second.stderr  # the unit file was rewritten
    assert drop_in.read_text() == "[Service]\nEnvironment=LLAMA_ARG_ENDPOINT_METRICS=1\n"
    assert f"serving on http://127.0.0.1:{other}/v1, on backend ort-cpu" in second.stderr, second.stderr
    assert "no API key" not in second.stderr  # the loopback only

    # a bundle whose first backend cannot open here: the deploy goes on, and says what runs it and why
    fallback = chain_variant(tiny_bundle.path, tmp_path / "fallback", ["ort-cuda", "ort-cpu"])
    third = deploy(server, root, fallback.path)
    assert third.returncode == 0, third.stderr
    assert current_id(root) == fallback.bundle_id
    assert "' on backend ort-cpu" in third.stderr
    warning = next(line for line in third.stderr.splitlines() if "warning: the model runs on" in line)
    assert "the model runs on ort-cpu, not on ort-cuda, the bundle's first backend (ort-cuda: " in warning
    assert "CUDAExecutionProvider" in warning  # why ort-cuda did not open, as the runtime says it


@pytest.mark.slow
def test_the_board_tells_a_server_with_an_api_key_from_one_without(tiny_bundle, tmp_path):
    """The service step warns of a network bind without an API key only where the server answers without one: the
    board asks a keyed route with no key (a key set in a drop-in is in the server's environment, not the unit)."""
    from edgesdk.deploy.board_service import api_key_required, health_body

    for key, expected in (("a-secret", True), (None, False)):
        port = free_port()
        env = {**os.environ, "EDGESDK_HUGE_PAGES": "0"}
        env.pop("EDGESDK_API_KEY", None)
        env.pop("LLAMA_API_KEY", None)
        if key:
            env["EDGESDK_API_KEY"] = key
        # its log to a file, not a pipe nobody reads while it starts: a server that fills the pipe blocks on writing
        log = tmp_path / f"serve-{port}.log"
        with open(log, "wb") as journal:
            serve = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port",
                                      str(port)], env=env, stdout=subprocess.DEVNULL, stderr=journal)
        try:
            url = f"http://127.0.0.1:{port}/health"
            deadline = time.monotonic() + START_WAIT_S
            while health_body(url) is None and time.monotonic() < deadline:
                assert serve.poll() is None, log.read_text(errors="replace")
                time.sleep(0.2)
            assert health_body(url)["backend"] == "ort-cpu"
            assert api_key_required(url) is expected
        finally:
            serve.terminate()
            serve.wait(timeout=60)
    with socket.socket() as nothing:
        nothing.bind(("127.0.0.1", 0))
        assert api_key_required(f"http://127.0.0.1:{nothing.getsockname()[1]}/health") is None
