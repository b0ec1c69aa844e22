"""``edgesdk deploy`` to a fleet, review 54: the runtime wheel is built only where a board needs it, once for the
boards that need it at the same time, and a failed build says what each of its pip runs said."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from edgesdk.deploy import install
from edgesdk.deploy.transport import DeployError
from tests._utils.deploy import tiny_checkout


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A small checkout of its own (a stable source digest) and a wheel cache in tmp."""
    root = tiny_checkout(tmp_path / "checkout")
    monkeypatch.setattr(install, "checkout_root", lambda: root)
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    return root


def plant_runtime(root, key: str) -> None:
    """The runtime ``key`` on the board at ``root``, as current: its edgesdk is this one."""
    venv = root / "runtime" / key
    (venv / "bin").mkdir(parents=True)
    (venv / "edgesdk-runtime.json").write_text(json.dumps({"key": key, "version": "0", "installed": time.time(),
                                                           "switched": time.time()}))
    script = venv / "bin" / "edgesdk"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m edgesdk.cli "$@"\n')
    script.chmod(0o755)
    (root / "runtime" / "current").symlink_to(key)


def test_a_fleet_whose_boards_all_have_the_runtime_builds_no_wheel(ssh_server, tiny_bundle, checkout, tmp_path):
    """A fleet deploy built the runtime wheel up front (pip wheel, up to twice 600 s) before any board was probed,
    also where every board already ran the runtime of this checkout and nothing was installed."""
    from edgesdk.cli import main

    key = f"{install.__version__}-{install.source_digest(checkout)[:12]}-py{sys.version_info[0]}{sys.version_info[1]}"
    roots = [tmp_path / "board-a", tmp_path / "board-b"]
    for root in roots:
        plant_runtime(root, key)
    inventory = tmp_path / "boards.txt"
    inventory.write_text("".join(f"{ssh_server.destination} remote_root={root}\n" for root in roots))
    result = CliRunner().invoke(main, ["deploy", str(tiny_bundle.path), "--hosts", str(inventory),
                                       *ssh_server.client_args(), "--remote-python", sys.executable])
    assert result.exit_code == 0, result.output
    assert result.output.count(f"up to date ({key})") == 2
    assert not install.cache_dir().exists()  # no wheel was built


def test_boards_that_need_the_wheel_at_once_share_one_build(checkout, monkeypatch):
    """Boards of a fleet that need the wheel at the same time wait for one build and get its wheel, as the up-front
    build did; each of them ran pip wheel itself before."""
    runs, entered, real_pip, real_build = [], [], install._pip_wheel, install.build_wheel
    all_in = threading.Event()

    def entering(root, digest):
        entered.append(digest)
        if len(entered) == 3:
            all_in.set()
        return real_build(root, digest)

    def counted(argv, root):
        runs.append(argv)
        all_in.wait(60)  # the three boards need the wheel while it is built
        return real_pip(argv, root)

    monkeypatch.setattr(install, "build_wheel", entering)
    monkeypatch.setattr(install, "_pip_wheel", counted)
    wheels, errors = [], []

    def board():
        try:
            wheels.append(install.runtime_source((3, 10), False).wheel)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=board) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors
    assert len(wheels) == 3
    assert len(set(wheels)) == 1
    assert wheels[0].is_file()
    assert len(runs) == 1  # one pip wheel run (the offline one) for the three


def test_a_failed_wheel_build_shows_what_both_pip_runs_said(checkout, monkeypatch):
    """build_wheel runs pip wheel offline (this environment's setuptools), then with build isolation; its error
    showed the second run's stderr alone, which offline is only 'could not find setuptools>=68', while the first
    run's said what was wrong with the checkout."""
    (checkout / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=68", "no-such-backend-54"]\n'
                                             'build-backend = "no_such_backend_54"\n\n'
                                             '[project]\nname = "edgesdk"\nversion = "0.1.0"\n')
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the isolated run fails at once, as offline, on setuptools>=68
    with pytest.raises(DeployError) as failed:
        install.build_wheel(checkout, install.source_digest(checkout))
    problem = failed.value.problem
    assert "no_such_backend_54" in problem  # the offline run: the checkout names a backend that is not there
    assert "setuptools>=68" in problem  # the isolated run: the package index has none
