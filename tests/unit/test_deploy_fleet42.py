"""Fleet deploys (edgesdk/deploy/fleet.py): the inventory is refused line by line before any board is touched,
and the runner's concurrency, --fail-fast and Ctrl-C, with real threads and a real SIGINT."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.deploy import fleet
from edgesdk.deploy.orchestrate import Interrupted
from edgesdk.deploy.transport import DeployError


@pytest.fixture
def ssh_spy(tmp_path):
    """An --ssh-command that records any call: a refused inventory must not reach a board."""
    called = tmp_path / "ssh-called"
    script = tmp_path / "spy_ssh.py"
    script.write_text(f"import pathlib, sys\npathlib.Path({str(called)!r}).write_text(' '.join(sys.argv))\n"
                      "sys.exit(255)\n")
    return f"{sys.executable} {script}", called


@pytest.fixture
def python_handles_sigint():
    """SIGINT raises KeyboardInterrupt, as in an edgesdk started from a terminal, also where this test process
    inherited SIGINT ignored (a CI job started in the background); the handler before is put back after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def deploy_cli(tmp_path, spy, *args):
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    return CliRunner().invoke(main, ["deploy", str(bundle), "--ssh-command", spy[0], *map(str, args)],
                              prog_name="edgesdk")


@pytest.mark.parametrize(("lines", "number", "expected", "fix"), [
    (["pi@b1", "pi@b2 port=2222"], 2, "unknown setting 'port'", "use one of remote_root, remote_python, identity"),
    (["pi@b1 remote_root"], 1, "'remote_root' is not a KEY=VALUE setting", "one board per line"),
    (["pi@b1 pi@b2"], 1, "'pi@b2' is not a KEY=VALUE setting", "one board per line"),
    (["# lab", "remote_root=/data pi@b1"], 2, "starts with the setting 'remote_root=/data'", "start the line"),
    (["pi@b1:99999"], 1, "port 99999 is outside 1-65535", "valid ssh port"),
    (["pi@b;1"], 1, "';' cannot be part of a user or board name", "host name or address"),
    (["pi@@b1"], 1, "the board is not of the form user@board[:port]", "--host nvidia@orin.local"),
    (["pi@b1 remote_root=/a remote_root=/b"], 1, "remote_root is given twice", "keep one"),
    (["pi@b1 identity="], 1, "identity is empty", "identity=~/.ssh/id_ed25519"),
    (["pi@b1 remote_root='/data"], 1, "cannot be split into words", "close the quote"),
])
def test_a_bad_inventory_line_is_refused_naming_file_line_text_and_fix(tmp_path, ssh_spy, lines, number, expected,
                                                                        fix):
    inventory = tmp_path / "boards.txt"
    inventory.write_text("\n".join(lines) + "\n")
    result = deploy_cli(tmp_path, ssh_spy, "--hosts", inventory)
    assert result.exit_code == 8, result.output
    text = lines[number - 1].strip()
    assert f"error: --hosts {inventory} line {number} ({text!r}): {expected}" in result.stderr
    assert "fix: " in result.stderr
    assert fix in result.stderr
    assert not ssh_spy[1].exists()


def test_a_board_given_twice_is_refused_naming_both_places(tmp_path, ssh_spy):
    inventory = tmp_path / "boards.txt"
    inventory.write_text("pi@b1\n# same board, same root\n\npi@b1 remote_root=~/edgesdk\npi@b2\n")
    twice = deploy_cli(tmp_path, ssh_spy, "--hosts", inventory)
    assert twice.exit_code == 8
    assert f"board pi@b1 (deploy root ~/edgesdk) is given twice: at {inventory}:1 and at {inventory}:4" \
        in twice.stderr
    again = deploy_cli(tmp_path, ssh_spy, "--host", "pi@b2", "--host", "pi@b2")
    assert again.exit_code == 8
    assert "board pi@b2 (deploy root ~/edgesdk) is given twice: at --host and at --host" in again.stderr
    both = deploy_cli(tmp_path, ssh_spy, "--host", "pi@b2", "--hosts", inventory.with_name("one.txt"))
    assert both.exit_code == 8  # the inventory does not exist
    assert "one.txt cannot be read" in both.stderr
    assert not ssh_spy[1].exists()


def test_other_refusals_before_any_board(tmp_path, ssh_spy):
    inventory = tmp_path / "boards.txt"
    inventory.write_text("# nothing yet\n\n")
    empty = deploy_cli(tmp_path, ssh_spy, "--hosts", inventory)
    assert empty.exit_code == 8
    assert f"--hosts {inventory} lists no board" in empty.stderr
    inventory.write_text("pi@b1\npi@b2\n")
    to = deploy_cli(tmp_path, ssh_spy, "--host", "pi@b1", "--host", "pi@b2", "--to", tmp_path / "dir")
    assert to.exit_code == 2
    assert "--to" in to.stderr
    assert "takes no fleet (--host given 2 times)" in to.stderr
    unknown = deploy_cli(tmp_path, ssh_spy, "--hosts", inventory, "--limit", "pi@b3")
    assert unknown.exit_code == 8
    assert f"--limit pi@b3 names no board of {inventory} (it lists pi@b1, pi@b2)" in unknown.stderr
    alone = deploy_cli(tmp_path, ssh_spy, "--host", "pi@b1", "--limit", "pi@b1")
    assert alone.exit_code == 2
    assert "picks boards of an inventory" in alone.stderr
    assert not ssh_spy[1].exists()
    assert not (tmp_path / "dir").exists()


def test_inventory_settings_and_limit():
    boards = fleet.fleet_boards(("me@a",), None, (), "~/edgesdk")
    assert [(b.host, b.label, b.inventory) for b in boards] == [("me@a", "me@a", None)]
    options = fleet.board_options(fleet.DeployOptions(remote_root="~/x", remote_python="python3"),
                                  fleet.FleetBoard("pi@b", remote_root="/data", identity="~/.ssh/k"))
    assert (options.host, options.remote_root, options.remote_python, options.ssh.identity) == \
        ("pi@b", "/data", "python3", "~/.ssh/k")


def test_limit_picks_inventory_boards_and_labels_tell_twin_roots_apart(tmp_path):
    inventory = tmp_path / "boards.txt"
    inventory.write_text("pi@b1 remote_root=/one\npi@b1 remote_root=/two  # same board, second root\npi@b2\n")
    boards = fleet.fleet_boards((), inventory, (), "~/edgesdk")
    assert [b.label for b in boards] == ["pi@b1 /one", "pi@b1 /two", "pi@b2"]
    picked = fleet.fleet_boards(("me@a",), inventory, ("pi@b1 /two", "pi@b2"), "~/edgesdk")
    assert [b.label for b in picked] == ["me@a", "pi@b1 /two", "pi@b2"]
    assert fleet.retry_arguments(picked) == ["--host", "me@a", "--hosts", str(inventory),
                                             "--limit", "pi@b1 /two", "--limit", "pi@b2"]


def boards(*names):
    return [fleet.FleetBoard(host=name, label=name) for name in names]


def quiet():
    return fleet.Console(write=lambda line: None)


def test_at_most_jobs_boards_run_at_once_and_they_do_overlap():
    lock, active, peak = threading.Lock(), [0], [0]
    pair = threading.Barrier(2, timeout=60)  # breaks unless two boards run at the same time

    def work(board, report, progress):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            if board.host != "b5":
                pair.wait()
        finally:
            with lock:
                active[0] -= 1
        return {"host": board.host}, "r1"

    outcomes, stopped = fleet.run_fleet(boards("b1", "b2", "b3", "b4", "b5"), work, lambda b: None, quiet(), jobs=2)
    assert not stopped
    assert [(o.state, o.release, o.result) for o in outcomes] == [(fleet.OK, "r1", {"host": f"b{i}"})
                                                                  for i in range(1, 6)]
    assert peak[0] == 2


def test_a_failure_stops_no_other_board_unless_fail_fast():
    def work(board, report, progress):
        if board.host == "bad":
            progress.update(where=board.host, current="r0")
            raise DeployError("cannot reach bad: nothing accepts ssh connections", "check the board")
        if board.host == "bug":
            raise ValueError("unexpected")
        return {}, "r1"

    lines = []
    outcomes, _ = fleet.run_fleet(boards("bad", "good", "bug", "late"), work, lambda b: None,
                                  fleet.Console(write=lines.append), jobs=1)
    assert [o.state for o in outcomes] == [fleet.FAILED, fleet.OK, fleet.FAILED, fleet.OK]
    assert outcomes[0].release == "r0"  # nothing switched: the board is on the release it was on
    assert outcomes[2].problem == "ValueError: unexpected"
    assert "bad: error: cannot reach bad: nothing accepts ssh connections" in lines
    assert "bad:   fix: check the board" in lines
    assert [b.host for b in fleet.retry_boards(outcomes)] == ["bad", "bug"]

    fast, _ = fleet.run_fleet(boards("bad", "good", "bug", "late"), work, lambda b: None, quiet(), jobs=1,
                              fail_fast=True)
    assert [o.state for o in fast] == [fleet.FAILED, fleet.NOT_STARTED, fleet.NOT_STARTED, fleet.NOT_STARTED]
    text = "\n".join(fleet.summary("deploy", fast, 1.25))
    assert text.startswith("deploy of 4 boards: 0 of 4 boards ok, 1 failed, 3 not started (1.2 s)")
    row = text.splitlines()[2]
    assert row.split()[:4] == ["bad", "failed", "r0", fast[0].seconds and f"{fast[0].seconds:.1f}"]
    assert row.endswith("  cannot reach bad: nothing accepts ssh connections")


def test_ctrl_c_starts_no_further_board_and_stops_the_running_ones(monkeypatch, python_handles_sigint):
    both = threading.Barrier(2, timeout=60)
    never = threading.Event()

    def work(board, report, progress):
        if both.wait() == 0:  # the two boards run: Ctrl-C, as a terminal sends it to this process
            os.kill(os.getpid(), signal.SIGINT)
        try:
            for _ in range(1200):  # a minute at most, should the interrupt never come
                never.wait(0.05)
        except KeyboardInterrupt:
            if board.host == "named":  # as deploy() does: say what the board was left with
                raise Interrupted("deploy interrupted (Ctrl-C): named keeps releases/r0", "run it again") from None
            raise
        return {}, "r1"

    lines = []
    outcomes, stopped = fleet.run_fleet(boards("named", "bare", "third"), work, lambda b: None,
                                        fleet.Console(write=lines.append), jobs=2)
    assert stopped
    assert [o.state for o in outcomes] == [fleet.INTERRUPTED, fleet.INTERRUPTED, fleet.NOT_STARTED]
    assert (outcomes[0].problem, outcomes[0].fix) == ("deploy interrupted (Ctrl-C): named keeps releases/r0",
                                                      "run it again")
    assert outcomes[1].problem == "interrupted (Ctrl-C)"
    assert "interrupted (Ctrl-C): no further board starts; stopping 2 running" in lines


def test_lines_of_boards_written_at_once_stay_whole(capfd):
    console = fleet.Console()
    writers = [console.board_writer(f"board{n}") for n in range(4)]

    def chatter(write):
        for i in range(300):
            write(f"line {i} " + "x" * 200)

    threads = [threading.Thread(target=chatter, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1200
    expected = {f"board{n}: line {i} " + "x" * 200 for n in range(4) for i in range(300)}
    assert set(err) == expected


def test_a_board_whose_ssh_the_ctrl_c_ended_as_an_error_says_what_it_was_left_with(python_handles_sigint):
    """A terminal's Ctrl-C stops the board's ssh client too: the work can end in the connection's error before
    the interrupt reaches its thread, and the fleet still reports the board as interrupted, in deploy's words."""

    def work(board, report, progress):
        progress.update(where=board.host, bundle_id="r1", current="r0")
        os.kill(os.getpid(), signal.SIGINT)
        try:
            for _ in range(1200):
                threading.Event().wait(0.05)
        except KeyboardInterrupt:
            pass
        raise DeployError("the ssh connection to b1 failed: killed by signal", "run it again")

    def said(progress, error):
        from edgesdk.deploy.orchestrate import interrupted

        return interrupted(progress)

    outcomes, stopped = fleet.run_fleet(boards("b1"), work, lambda b: None, quiet(), on_interrupt=said)
    assert stopped
    assert outcomes[0].state == fleet.INTERRUPTED
    assert outcomes[0].problem == "deploy interrupted (Ctrl-C): b1 keeps releases/r0 as current; releases/r1 was " \
                                  "not switched to"
    assert outcomes[0].release == "r0"


def test_a_board_that_failed_just_before_the_ctrl_c_was_taken_is_reported_interrupted(python_handles_sigint):
    """The terminal's Ctrl-C ends the board's ssh, whose error ends the work before this process has taken the
    SIGINT (here the error comes first and the SIGINT 50 ms later): the board is still reported interrupted, with
    what deploy says it was left with, not failed."""

    ctrl_c = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))

    def work(board, report, progress):
        progress.update(where=board.host, bundle_id="r1", current="r0")
        ctrl_c.start()
        raise DeployError("the ssh connection to b1 failed: killed by signal", "run it again")

    def said(progress, error):
        from edgesdk.deploy.orchestrate import interrupted

        return interrupted(progress)

    try:
        outcomes, stopped = fleet.run_fleet(boards("b1"), work, lambda b: None, quiet(), on_interrupt=said)
        ctrl_c.join()
        threading.Event().wait(0.2)  # a SIGINT the run did not take is raised here, not in a later test
    except KeyboardInterrupt:
        pytest.fail("the fleet run ended, its board reported, before the Ctrl-C was taken")
    assert stopped
    assert outcomes[0].state == fleet.INTERRUPTED
    assert outcomes[0].problem.startswith("deploy interrupted (Ctrl-C): b1 keeps releases/r0 as current")


def test_a_board_that_fails_with_no_ctrl_c_is_reported_failed():
    def work(board, report, progress):
        raise DeployError("the ssh connection to b1 failed: Connection refused", "check the board is on")

    outcomes, stopped = fleet.run_fleet(boards("b1"), work, lambda b: None, quiet())
    assert not stopped
    assert (outcomes[0].state, outcomes[0].problem) == (fleet.FAILED, "the ssh connection to b1 failed: "
                                                                       "Connection refused")
