"""Deploy mends 60: what a deploy says when the board stops answering while it switches back after a failed switch
or a unit that did not come up (real sshd, the real board helper): a plain 'edgesdk deploy --rollback' goes to the
release ``previous`` names, which is the release current pointed to only where current is on the new release, so
the way back names the release (``--rollback --release ID``) and does what it says whichever way the board went."""

from __future__ import annotations

import os

import pytest

from tests._utils import fake_systemd
from tests._utils.deploy import bundle_variant, current_id, edgesdk

# An ssh client wrapper: argv[1] the helper operation, argv[2] which call of it (1 the first), argv[3] "run" (it
# runs on the board, its reply lost) or "drop" (it never reaches the board), argv[4] a file counting the calls.
# From that call on the board is unreachable (every command exits 255, as ssh does when it cannot connect).
LOSE_NTH_SSH = '''
import os, subprocess, sys
operation, nth, run, count = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "run", sys.argv[4]
args = sys.argv[5:]
if os.path.exists(count + ".gone"):
    print("ssh: connect to host 127.0.0.1: Connection refused", file=sys.stderr)
    sys.exit(255)
if not (args and f" {operation} " in args[-1]):
    os.execvp("ssh", ["ssh", *args])
calls = int(open(count).read()) + 1 if os.path.exists(count) else 1
open(count, "w").write(str(calls))
if calls < nth:
    os.execvp("ssh", ["ssh", *args])
if run:
    subprocess.run(["ssh", *args], stdin=sys.stdin, stdout=subprocess.DEVNULL, check=False)
open(count + ".gone", "w").close()
print("Connection to 127.0.0.1 closed by remote host.", file=sys.stderr)
sys.exit(255)
'''


def _lose_nth(tmp_path, operation: str, nth: int, run: bool) -> str:
    """``--ssh-command`` value that cuts the board off at the ``nth`` call of ``operation`` (see LOSE_NTH_SSH)."""
    import sys

    script = tmp_path / "lose_nth_ssh.py"
    script.write_text(LOSE_NTH_SSH)
    return f"{sys.executable} {script} {operation} {nth} {'run' if run else 'drop'} {tmp_path / 'switch-calls'}"


def _previous_id(root) -> str:
    return os.readlink(root / "previous").rsplit("/", 1)[-1]


def _deploy(board, bundle, *extra, broken: bool = False):
    """Deploy ``bundle`` over the ServiceBoard ``board``; ``broken``: the unit's server does not come up on it."""
    runtime = board.root / "runtime" / board.runtime(None)  # the one this checkout's deploy switches to
    if broken:
        (runtime / "broken").touch()
    else:
        (runtime / "broken").unlink(missing_ok=True)
    return edgesdk("deploy", bundle.path, *board.deploy[2:], *extra)


def _rollback(board, release: str):
    return edgesdk("deploy", "--rollback", "--release", release, *board.deploy[2:])


@pytest.mark.parametrize("happened", [False, True])
def test_no_answer_to_the_switch_back_after_a_lost_switch_reply_names_the_release_to_roll_back_to(
        ssh_server, tiny_bundle, tmp_path, happened):
    """A board on its second release (previous: its first); a third deploy's switch got no reply, and the switch
    back no answer either. The error said 'edgesdk deploy --rollback' goes back; where the switch had not
    happened, that rollback went to the first release, not to the second current pointed to. The way back names
    the second, and does what it says whether or not the switch happened."""
    from tests.unit.test_deploy48 import ServiceBoard

    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root = board.root
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    third = bundle_variant(tiny_bundle.path, tmp_path / "third", "third")
    for bundle in (tiny_bundle, second):
        done = _deploy(board, bundle)
        assert done.returncode == 0, done.stderr

    failed = _deploy(board, third, "--ssh-command", _lose_nth(tmp_path, "switch", 1, happened))

    assert failed.returncode == 8, failed.stderr
    assert "Traceback" not in failed.stderr
    said = " ".join(failed.stderr.split())
    assert (f"switching back to releases/{second.bundle_id} failed too") in said, said
    assert (f"so the board's current release may be releases/{third.bundle_id} (smoke-tested) or "
            f"releases/{second.bundle_id}") in said, said
    assert "'edgesdk deploy --rollback' goes back" not in said, said
    assert (f"where current already points to releases/{third.bundle_id}, 'edgesdk deploy --rollback --release "
            f"{second.bundle_id}' goes back to releases/{second.bundle_id} (a plain --rollback goes to the release "
            f"previous names, which is releases/{second.bundle_id} only where the switch happened)") in said, said

    if happened:
        assert (current_id(root), _previous_id(root)) == (third.bundle_id, second.bundle_id)
        back = _rollback(board, second.bundle_id)
        assert back.returncode == 0, back.stderr
    else:
        # a plain --rollback would go to the first release, not back to the second
        assert (current_id(root), _previous_id(root)) == (second.bundle_id, tiny_bundle.bundle_id)
        kept = _rollback(board, second.bundle_id)
        assert kept.returncode != 0
        assert f"release {second.bundle_id} is already current" in kept.stderr, kept.stderr
    assert current_id(root) == second.bundle_id


@pytest.mark.parametrize("happened", [False, True])
def test_no_answer_to_the_switch_back_after_a_unit_did_not_come_up_names_the_release_to_roll_back_to(
        ssh_server, tiny_bundle, tmp_path, happened):
    """The unit an earlier deploy --service installed did not come up on a third release, and the switch back to
    the second got no answer: the error said 'edgesdk deploy --rollback' goes back, which where the switch back had
    happened (its reply lost) went to the first release. The way back names the second."""
    from tests.unit.test_deploy48 import ServiceBoard

    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root, state = board.root, board.state
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    third = bundle_variant(tiny_bundle.path, tmp_path / "third", "third")
    try:
        first = _deploy(board, tiny_bundle, "--service", "--service-port", board.port)
        assert first.returncode == 0, first.stderr
        done = _deploy(board, second)
        assert done.returncode == 0, done.stderr
        # the second switch is the switch back
        failed = _deploy(board, third, "--ssh-command", _lose_nth(tmp_path, "switch", 2, happened), broken=True)

        assert failed.returncode == 8, failed.stderr
        assert "Traceback" not in failed.stderr
        said = " ".join(failed.stderr.split())
        assert "did not come up" in said, said
        assert f"switching back to releases/{second.bundle_id} failed too" in said, said
        assert "'edgesdk deploy --rollback' goes back" not in said, said
        assert (f"where current already points to releases/{third.bundle_id}, 'edgesdk deploy --rollback --release "
                f"{second.bundle_id}' goes back to releases/{second.bundle_id}") in said, said
        assert "a plain --rollback" not in said, said  # the switch to the third release is known to have happened

        for broken in (root / "runtime").glob("*/broken"):
            broken.unlink()
        if happened:
            # a plain --rollback would go to the first release, not back to the second
            assert (current_id(root), _previous_id(root)) == (second.bundle_id, tiny_bundle.bundle_id)
            kept = _rollback(board, second.bundle_id)
            assert kept.returncode != 0
            assert f"release {second.bundle_id} is already current" in kept.stderr, kept.stderr
        else:
            assert (current_id(root), _previous_id(root)) == (third.bundle_id, second.bundle_id)
            back = _rollback(board, second.bundle_id)
            assert back.returncode == 0, back.stderr
        assert current_id(root) == second.bundle_id
    finally:
        fake_systemd.stop_all(state)
