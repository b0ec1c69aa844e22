"""Deploy's smoke test and rollback: what a failed smoke test says, and the service host refused up front."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from edgesdk.deploy import service
from edgesdk.deploy.orchestrate import deploy
from edgesdk.deploy.releases import rollback
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transport import DeployError
from tests._utils.deploy import bundle_variant, current_id, tree_state


def quiet(total: int) -> Reporter:
    return Reporter(total, write=lambda line: None)


@pytest.fixture
def board_and_broken(tiny_bundle, tmp_path):
    """A deploy root with tiny_bundle current, and a bundle whose manifest is sound but whose weights file was cut
    to 16 bytes: 'edgesdk run' refuses it with one line for each initializer under its error line."""
    source = tmp_path / "cut"
    shutil.copytree(tiny_bundle.path, source)
    data = source / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:16])
    broken = bundle_variant(source, tmp_path / "broken", "weights cut")
    root = tmp_path / "board"
    deploy(tiny_bundle.path, DeployOptions(to=root), quiet(8))
    assert current_id(root) == tiny_bundle.bundle_id
    return root, broken


def test_a_failed_smoke_test_shows_the_error_line_a_long_list_under_it_pushed_out(board_and_broken, tiny_bundle):
    """The smoke test showed the last 10 lines of the run's stderr: for a bundle whose weights do not match its graph
    those were the list of initializers alone (one line each, hundreds for a real model), without the error line
    that says what they are."""
    root, broken = board_and_broken
    run = subprocess.run([sys.executable, "-m", "edgesdk.cli", "run", str(broken.path), "--prompt", "hi", "-n", "4",
                          "--raw"], capture_output=True, text=True, timeout=300)
    lines = run.stderr.strip().splitlines()
    assert run.returncode != 0, run.stderr
    assert len(lines) > 10, run.stderr
    assert "does not match its weights" in lines[0], run.stderr
    before = tree_state(root / "releases" / tiny_bundle.bundle_id)
    with pytest.raises(DeployError) as failed:
        deploy(broken.path, DeployOptions(to=root), quiet(8))
    problem = failed.value.problem
    assert problem.startswith(f"the smoke test failed on local directory {root}")
    assert "model.onnx does not match its weights:" in problem, problem
    assert lines[-1].strip() in problem  # the tail is still there
    assert "the board keeps its current release" in failed.value.fix
    assert current_id(root) == tiny_bundle.bundle_id
    assert tree_state(root / "releases" / tiny_bundle.bundle_id) == before


def test_a_rollback_whose_smoke_test_fails_says_to_roll_back_not_to_deploy(board_and_broken, tiny_bundle):
    """A rollback smoke-tests the release it goes to with the same code as a deploy, and its failure said 'fix the
    problem shown above and deploy again': there is nothing to deploy, the release is on the board already."""
    root, broken = board_and_broken
    with pytest.raises(DeployError):
        deploy(broken.path, DeployOptions(to=root), quiet(8))  # on the board now, never current
    with pytest.raises(DeployError) as failed:
        rollback(DeployOptions(to=root), broken.bundle_id, quiet(4))
    assert "the smoke test failed" in failed.value.problem
    assert "model.onnx does not match its weights:" in failed.value.problem
    fix = failed.value.fix
    assert fix.startswith(f"current stays releases/{tiny_bundle.bundle_id}: nothing was switched"), fix
    assert "roll back again" in fix
    assert "--rollback --release ID" in fix
    assert "deploy again" not in fix
    assert current_id(root) == tiny_bundle.bundle_id


@pytest.mark.parametrize("host", ["192.168.1.300", "10.0.0.1.5", "10.0.0.1.", "1.2.3.256"])
def test_digits_and_dots_that_are_no_ipv4_address_are_refused_as_service_host(host):
    """'192.168.1.300' passed as a host name: the unit's server could not bind it (getaddrinfo finds nothing for
    it), which showed only after the bundle was sent, smoke-tested and current switched, switched back then."""
    with pytest.raises(ValueError, match="is not an IPv4 address") as refused:
        service.ServiceOptions(host=host, port=8080)
    assert f"--service-host {host!r} is not an IPv4 address" in str(refused.value)


@pytest.mark.parametrize("host", ["127.1", "10.0.0.1", "0", "board-1.lan", "3dprinter", "[::1]"])
def test_addresses_getaddrinfo_reads_stay_service_hosts(host):
    assert service.ServiceOptions(host=host, port=8080).host == host


def test_a_lost_switch_reply_of_a_runtime_alone_says_runtime_current_may_have_moved(ssh_server, tiny_bundle,
                                                                                     tmp_path):
    """Redeploying the release that is current with another edgesdk switches runtime/current alone. Where the board
    switched it and the reply was lost, the deploy passed on ssh's own words (run the same deploy again), and the
    same deploy again found the switch done and restarted no unit, which went on serving the old edgesdk. It says
    that runtime/current may have moved, and to restart the unit."""
    import os

    from tests._utils.deploy import edgesdk, faulty_ssh_command
    from tests.unit.test_deploy48 import ServiceBoard

    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root = board.root
    board.runtime(None)
    first = edgesdk(*board.deploy)
    assert first.returncode == 0, first.stderr
    board.runtime("older")  # as if that deploy had run another edgesdk
    os.unlink(root / "runtime" / "current")
    os.symlink("older", root / "runtime" / "current")
    key = board.runtime(None)  # the runtime this checkout's deploy switches to
    lose = faulty_ssh_command(f"lose:switch:{tmp_path / 'board-gone'}", ssh_server.process.pid)
    failed = edgesdk(*board.deploy, "--ssh-command", lose)
    assert failed.returncode == 8, failed.stderr
    assert os.readlink(root / "runtime" / "current") == key  # the switch did happen
    assert current_id(root) == tiny_bundle.bundle_id
    assert f"runtime/current may already point to {key}" in failed.stderr, failed.stderr
    assert "or still to older" in failed.stderr
    assert "restart the unit an earlier deploy --service installed" in failed.stderr
