"""Deploy --status and a fleet's summary, 62: one size for a release, what a deploy killed mid-install leaves, and a
fleet's wording and ``--limit``.

``deploy`` said "7 files, 402.4 kB" and ``--status`` 398.1 kB for the same release: the status left out manifest.json
and manifest.sha256. After a ``kill -9`` of a deploy during its runtime install the board kept the holder in
``.deploy.lock`` and a half-built ``runtime/<key>/``, and ``--status`` named neither. A fleet said "status of 1 boards:
1 of 1 boards ok", showed ``-`` and ``none`` in the RELEASE column without saying what each is, named an unreachable
board's block without its deploy root, and refused ``--limit ROOT`` with no example.

Deploys run into a real board root (``--to DIR``, the real board helper) or over ssh to the real local sshd of
tests/_utils/sshd.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from edgesdk.deploy import fleet
from edgesdk.deploy.releases import format_status
from edgesdk.deploy.transport import DeployError
from tests._utils.deploy import edgesdk

# --- one size for a release ------------------------------------------------------------------------------------


def test_status_gives_the_size_the_deploy_said(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    deployed = edgesdk("deploy", tiny_bundle.path, "--to", root)
    assert deployed.returncode == 0, deployed.stderr
    said = re.search(r"\d+ files, ([\d.]+ [kMG]?B)", deployed.stdout + deployed.stderr)
    assert said, deployed.stderr

    shown = edgesdk("deploy", "--status", "--to", root)
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if tiny_bundle.bundle_id in line and "*" in line)
    assert f"  {said.group(1)}  " in row, (said.group(1), row)

    as_json = json.loads(edgesdk("deploy", "--status", "--to", root, "--json").stdout)
    release = root / "releases" / tiny_bundle.bundle_id
    on_disk = sum(path.stat().st_size for path in release.rglob("*") if path.is_file())
    assert as_json["releases"][0]["bytes"] == on_disk


# --- what a deploy killed during its runtime install leaves -----------------------------------------------------

HOLD = """
import os, sys, time
from edgesdk.deploy.board_common import Lock
root, key = sys.argv[1], sys.argv[2]
with Lock(root):
    os.makedirs(os.path.join(root, "runtime", key, "bin"))  # a venv being made: no stamp yet
    print("held", flush=True)
    time.sleep(600)
"""


def _hold_lock(root, key):
    """A process that takes the real deploy lock of ``root`` and starts a runtime under it, as op_install does."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root), key], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_status_names_a_held_lock_a_lock_left_by_a_killed_deploy_and_an_unfinished_runtime(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    assert edgesdk("deploy", tiny_bundle.path, "--to", root).returncode == 0
    calm = edgesdk("deploy", "--status", "--to", root)
    assert "lock " not in calm.stdout, calm.stdout  # a deploy that ended
    assert "unfinished" not in calm.stdout

    holder = _hold_lock(root, "edgesdk-9.9.9-py3")
    try:
        running = edgesdk("deploy", "--status", "--to", root)
        assert running.returncode == 0, running.stderr
        assert f"lock       held by a deploy running now (process {holder.pid})" in running.stdout, running.stdout
        assert "unfinished runtime/edgesdk-9.9.9-py3 (no edgesdk-runtime.json): being installed by the deploy " \
            "holding the lock" in running.stdout
        info = json.loads(edgesdk("deploy", "--status", "--to", root, "--json").stdout)
        assert info["lock"] == {"held": True, "holder": str(holder.pid)}
    finally:
        holder.kill()  # kill -9: the lock file keeps its holder, the runtime stays half-built
        holder.wait()

    left = edgesdk("deploy", "--status", "--to", root)
    assert left.returncode == 0, left.stderr
    assert f"lock       .deploy.lock names process {holder.pid}, which ended without releasing it" in left.stdout
    assert "no deploy holds it" in left.stdout
    assert "unfinished runtime/edgesdk-9.9.9-py3 (no edgesdk-runtime.json): left by an install cut short; the " \
        "next deploy of that runtime installs it again" in left.stdout, left.stdout
    info = json.loads(edgesdk("deploy", "--status", "--to", root, "--json").stdout)
    assert (info["lock"], info["unfinished_runtimes"]) == ({"held": False, "holder": str(holder.pid)},
                                                           ["edgesdk-9.9.9-py3"])

    assert edgesdk("deploy", tiny_bundle.path, "--to", root).returncode == 0  # the next deploy takes the lock
    after = json.loads(edgesdk("deploy", "--status", "--to", root, "--json").stdout)
    assert after["lock"] is None


# --- a fleet's wording -----------------------------------------------------------------------------------------


def _board(host, root="~/edgesdk"):
    return fleet.FleetBoard(host=host, label=host, root=root)


def test_the_summary_of_one_board_says_board():
    ok = fleet.Outcome(_board("pi@a"), state=fleet.OK, release="r1", seconds=1.0)
    assert fleet.summary("status", [ok], 1.0)[0] == "status of 1 board: 1 of 1 board ok (1.0 s)"
    two = fleet.summary("status", [ok, ok], 1.0)
    assert two[0] == "status of 2 boards: 2 of 2 boards ok (1.0 s)"
    assert not any("RELEASE none" in line for line in two)  # both on a release: nothing to explain


def test_the_summary_says_what_none_and_a_dash_are_in_the_release_column():
    lines = fleet.summary("status", [
        fleet.Outcome(_board("pi@a"), state=fleet.OK, release="none", seconds=1.0),
        fleet.Outcome(_board("pi@b"), state=fleet.FAILED, problem="cannot reach pi@b", seconds=0.1)], 1.0)
    assert [line.split()[2] for line in lines[2:4]] == ["none", "-"]
    assert lines[-1] == fleet.RELEASE_NOTE
    assert "none: the board has no current release" in lines[-1]
    assert "-: not known" in lines[-1]


def test_the_status_block_of_an_unreachable_board_names_its_root():
    failed = fleet.Outcome(_board("pi@b:2222", "/data/edgesdk"), state=fleet.FAILED, problem="cannot reach pi@b\nmore")
    assert fleet.status_block(failed, format_status) == "board      pi@b:2222 /data/edgesdk: failed: cannot reach pi@b"
    twice = fleet.FleetBoard(host="pi@b", label="pi@b /data", root="/data")  # a label that has its root already
    assert fleet.status_block(fleet.Outcome(twice, state=fleet.FAILED), format_status) == "board      pi@b /data: failed"


# --- --limit by line, host name or deploy root -----------------------------------------------------------------


def _inventory(tmp_path):
    inventory = tmp_path / "boards.txt"
    inventory.write_text("nvidia@orin-1.local:2222 remote_root=/data/edgesdk\npi@b1\npi@b2 remote_root=/srv/e\n"
                         "pi@c remote_root=/srv/e\n")
    return inventory


@pytest.mark.parametrize(("name", "picked"), [
    ("/data/edgesdk", ["nvidia@orin-1.local:2222"]),
    ("/data/edgesdk/", ["nvidia@orin-1.local:2222"]),
    ("ORIN-1.local", ["nvidia@orin-1.local:2222"]),
    ("b1", ["pi@b1"]),
    ("pi@b2", ["pi@b2"]),
    ("pi@c /srv/e", ["pi@c"]),
])
def test_limit_picks_a_board_by_its_line_its_host_name_or_its_root(tmp_path, name, picked):
    boards = fleet.fleet_boards((), _inventory(tmp_path), (name,), "~/edgesdk")
    assert [b.host for b in boards] == picked


def test_limit_names_the_boards_a_root_of_several_picks_and_gives_an_example(tmp_path):
    inventory = _inventory(tmp_path)
    with pytest.raises(DeployError) as several:
        fleet.fleet_boards((), inventory, ("/srv/e",), "~/edgesdk")
    assert several.value.problem == f"--limit /srv/e is the deploy root of 2 boards of {inventory}: pi@b2, pi@c"
    assert "e.g. --limit pi@b2" in several.value.fix
    with pytest.raises(DeployError) as none:
        fleet.fleet_boards((), inventory, ("/nowhere",), "~/edgesdk")
    assert none.value.problem.startswith(f"--limit /nowhere names no board of {inventory} (it lists ")
    assert "(e.g. --limit nvidia@orin-1.local:2222), its host name, or its deploy root" in none.value.fix


def test_a_fleet_status_limited_to_a_root_reaches_that_board(ssh_server, tmp_path):
    inventory = tmp_path / "boards.txt"
    inventory.write_text(f"{ssh_server.destination} remote_root=~/edgesdk-limit62\n"
                         f"{ssh_server.user}@127.0.0.1:1 remote_root=/data/unreached62\n")
    shown = edgesdk("deploy", "--status", "--hosts", inventory, "--limit", "~/edgesdk-limit62",
                    *ssh_server.client_args())
    assert shown.returncode == 0, shown.stderr
    assert "status of 1 board: 1 of 1 board ok (" in shown.stderr
    assert f"board      {ssh_server.destination} (" in shown.stdout
    assert "unreached62" not in shown.stdout + shown.stderr
