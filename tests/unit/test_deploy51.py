"""``edgesdk deploy``, review 51: rollback restores the release and the runtime it ran with; a commit cut
between its two renames is finished; a runtime install stops on the board when the host is interrupted.

ssh runs against a real sshd on 127.0.0.1 (tests/_utils/sshd.py, the fixture of test_deploy48).
"""

from __future__ import annotations

import json
import os
import shutil

from tests._utils.deploy import bundle_variant, current_id, edgesdk
from tests.unit.test_deploy48 import ServiceBoard


def relink(link, target: str) -> None:
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)


def test_a_rollback_switches_runtime_current_back_to_the_runtime_the_release_ran_with(
        ssh_server, tiny_bundle, tmp_path):
    """Release A ran with the runtime "older", release B with "newer" (a deploy of B with another edgesdk
    switches current and runtime/current together; here the runtime is switched by hand before a --no-install
    deploy, as this checkout's runtime key changes with every edit of its sources). ``--rollback`` switched
    current back to A but left runtime/current on B's edgesdk, so the board ran A with a runtime it had never
    run with (the edgesdk the user rolled back from), and the rollback's smoke test tried that pair. A
    blue-green rollback (jetson-containers, any release/runtime pair) goes back to the pair that worked:
    runtime/current goes back to "older" now, the smoke test runs A with it, and the next rollback goes
    forward to B with "newer"."""
    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root, log = board.root, board.log
    other = bundle_variant(tiny_bundle.path, tmp_path / "b", "review 51: B")
    current_runtime = root / "runtime" / "current"
    board.runtime("older")
    relink(current_runtime, "older")
    first = edgesdk(*board.deploy, "--no-install")  # A runs with the runtime "older"
    assert first.returncode == 0, first.stderr
    board.runtime("newer")
    relink(current_runtime, "newer")
    second = edgesdk(*[other.path if str(a) == str(tiny_bundle.path) else a for a in board.deploy], "--no-install")
    assert second.returncode == 0, second.stderr
    rollback = [*[a for a in board.deploy if str(a) != str(tiny_bundle.path)], "--rollback"]
    log.write_text("")

    back = edgesdk(*rollback)
    assert back.returncode == 0, back.stderr
    assert os.readlink(root / "current") == f"releases/{tiny_bundle.bundle_id}"
    assert os.readlink(current_runtime) == "older"  # before the fix: B's runtime "newer" stayed
    assert "runtime/current -> older (was newer)" in back.stderr
    assert [line.split()[:2] for line in log.read_text().splitlines()] == [["older", "run"]]  # the smoke test
    assert f"to {tiny_bundle.bundle_id} with the runtime older it ran with (was newer)" in back.stdout

    forward = edgesdk(*rollback, "--json")
    assert forward.returncode == 0, forward.stderr
    assert os.readlink(root / "current") == f"releases/{other.bundle_id}"
    assert os.readlink(current_runtime) == "newer"
    assert json.loads(forward.stdout)["runtime"] == "newer"


def test_a_rollback_to_a_release_whose_runtime_is_gone_keeps_runtime_current_and_says_so(
        ssh_server, tiny_bundle, tmp_path):
    """The runtime a release last ran with may have been removed since (a deploy keeps runtime/current and the
    one before it): the rollback then runs the release with runtime/current, and says so."""
    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root = board.root
    other = bundle_variant(tiny_bundle.path, tmp_path / "b", "review 51: B, gone")
    current_runtime = root / "runtime" / "current"
    board.runtime("older")
    relink(current_runtime, "older")
    assert edgesdk(*board.deploy, "--no-install").returncode == 0
    board.runtime("newer")
    relink(current_runtime, "newer")
    assert edgesdk(*[other.path if str(a) == str(tiny_bundle.path) else a for a in board.deploy],
                   "--no-install").returncode == 0
    shutil.rmtree(root / "runtime" / "older")

    back = edgesdk(*[a for a in board.deploy if str(a) != str(tiny_bundle.path)], "--rollback")
    assert back.returncode == 0, back.stderr
    assert os.readlink(current_runtime) == "newer"
    assert (f"releases/{tiny_bundle.bundle_id} last ran with the edgesdk runtime older, which is no longer on the "
            "board; it runs with runtime/current (newer)") in back.stderr


def test_a_commit_killed_between_its_two_renames_is_finished_by_the_next_deploy(tiny_bundle, tmp_path):
    """A deploy of the bundle whose release is current but damaged (a stray file) replaces it: the commit renames
    releases/<id> into .trash, then staging/<id> (verified) to releases/<id>. Killed between the two renames (the
    helper's SIGTERM at a Ctrl-C, a power cut), current pointed to no release, and a deploy of another bundle then
    committed and switched away from it, emptied .trash and left no previous: the release that had been current
    was gone from the board and --rollback had nothing to go back to. The commit keeps a journal now, and the next
    helper that takes the lock finishes the commit from the verified staging copy."""
    from tests.unit.test_deploy_kill35 import killed_deploy, killing_env, link

    root = tmp_path / "board"
    other = bundle_variant(tiny_bundle.path, tmp_path / "b", "review 51: commit")
    assert edgesdk("deploy", tiny_bundle.path, "--to", root).returncode == 0
    release = root / "releases" / tiny_bundle.bundle_id
    (release / "stray.txt").write_text("not the bundle's")
    killed_deploy(tiny_bundle.path, "--to", root,
                  env=killing_env(tmp_path, "os.rename", root / "staging" / tiny_bundle.bundle_id))
    assert not release.exists()  # the kill came between the two renames

    again = edgesdk("deploy", other.path, "--to", root)
    assert again.returncode == 0, again.stderr
    assert current_id(root) == other.bundle_id
    assert link(root, "previous") == tiny_bundle.bundle_id  # before the fix: no previous, the release gone
    assert edgesdk("verify", release).returncode == 0  # the verified copy, without the stray file
    assert not (root / "staging" / tiny_bundle.bundle_id).exists()
    back = edgesdk("deploy", "--rollback", "--to", root)
    assert back.returncode == 0, back.stderr
    assert current_id(root) == tiny_bundle.bundle_id


SLOW_VENV = """
import os, sys, time
if "--without-pip" in sys.argv and os.environ.get("SLOW_VENV_MARKER"):  # the install's venv step
    with open(os.environ["SLOW_VENV_MARKER"], "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(120)
"""

HOST = """
import sys
from pathlib import Path
from edgesdk.deploy import install
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import HostSpec, SshOptions, SshTransport

destination, root, python, wheel, key, known_hosts = sys.argv[1:]
transport = SshTransport(HostSpec.parse(destination), SshOptions(
    identity=key, ssh_config="/dev/null", options=(f"UserKnownHostsFile={known_hosts}", "GlobalKnownHostsFile=/dev/null")))
board = Board(transport, python, root)
install.install_runtime(board, install.RuntimeSource(key="k51", wheel=Path(wheel)), False)
"""


def test_a_runtime_install_stops_on_the_board_when_the_host_is_interrupted(ssh_server, tmp_path):
    """The runtime install is the one board command whose stdin carries data (the wheel): ssh's stdin closed after
    it, so the board could not tell a Ctrl-C on the host from a deploy going on, and the install ran on (venv, pip:
    up to an hour) holding the deploy lock. The next deploy waited 120 s for that lock and was refused, told that
    "another deploy" held it. The host now keeps stdin open after the wheel, and the board stops the install,
    and the step it runs, once stdin ends."""
    import signal
    import subprocess
    import sys
    import time

    from edgesdk.deploy.board_common import Lock
    from tests._utils.signals import default_signals

    root, marker, hook = tmp_path / "board", tmp_path / "venv-step.pid", tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_VENV)
    python = tmp_path / "board-python"
    python.write_text(f"#!/bin/sh\nexport PYTHONPATH='{hook}' SLOW_VENV_MARKER='{marker}'\n"
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    wheel = tmp_path / "edgesdk-0.0.0-py3-none-any.whl"
    wheel.write_bytes(b"not a real wheel: the venv step comes first" * 1000)
    host = subprocess.Popen([sys.executable, "-c", HOST, ssh_server.destination, str(root), str(python), str(wheel),
                             str(ssh_server.user_key), str(ssh_server.known_hosts)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()):
            assert host.poll() is None, host.communicate()
            assert time.monotonic() < deadline, "the install never reached its venv step"
            time.sleep(0.05)
        step = int(marker.read_text())
        os.killpg(host.pid, signal.SIGINT)  # Ctrl-C on the host
        host.communicate(timeout=60)
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
            host.wait()
    with Lock(str(root), timeout=30):  # before the fix: held by the install for the venv step's 120 s
        pass
    for _ in range(100):
        try:
            os.kill(step, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the install's venv step still runs on the board")
    assert not (root / "runtime" / "k51" / "edgesdk-runtime.json").exists()


def test_an_install_with_its_stdin_held_open_answers_and_ends_as_before(ssh_server, tmp_path):
    """The other side of the test above: an install that ends on its own (here refused: the file sent is no
    wheel) answers at once, though the host still holds its stdin open, and its thread watching stdin does not
    make the board's Python abort at exit."""
    import sys
    import time

    import pytest

    from edgesdk.deploy import install
    from edgesdk.deploy.remote import Board, BoardRefusal
    from edgesdk.deploy.transport import HostSpec, SshOptions, SshTransport

    wheel = tmp_path / "edgesdk-0.0.0-py3-none-any.whl"
    wheel.write_bytes(b"not a real wheel" * 1000)
    transport = SshTransport(HostSpec.parse(ssh_server.destination), SshOptions(
        identity=str(ssh_server.user_key), ssh_config="/dev/null",
        options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null")))
    board = Board(transport, sys.executable, str(tmp_path / "board"))
    began = time.monotonic()
    try:
        with pytest.raises(BoardRefusal) as refused:
            install.install_runtime(board, install.RuntimeSource(key="k51", wheel=wheel), False)
    finally:
        transport.close()
    assert time.monotonic() - began < 60
    assert refused.value.problem.startswith(f"pip install {wheel.name} failed on the board")
    assert (tmp_path / "board" / "runtime" / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()


def test_a_commit_journal_without_its_trash_copy_never_takes_trash_itself(tmp_path):
    """settle_commit puts the release's copy in .trash back where staging is gone; a journal naming no copy (damaged,
    or hand-written) joined .trash with "", whose path ".trash/" passed the check, so the whole .trash folder (other
    releases' leftovers) was renamed to releases/<id>."""
    import json
    import os

    from edgesdk.deploy.board_common import paths, settle_commit

    p, root = paths(str(tmp_path / "root"))
    for name in ("releases", "staging", ".trash"):
        os.makedirs(p[name])
    os.makedirs(os.path.join(p[".trash"], "someone-else"))
    with open(p[".commit.json"], "w") as handle:
        json.dump({"bundle_id": "b1"}, handle)
    settle_commit(p, root)
    assert not os.path.lexists(os.path.join(p["releases"], "b1"))
    assert os.path.isdir(os.path.join(p[".trash"], "someone-else"))
    assert not os.path.lexists(p[".commit.json"])
