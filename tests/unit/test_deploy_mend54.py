"""Deploy mend 54: the engine step's disk check and its engine name, a wheel build that fails for its waiters, the
runtimes a switch drops, a TensorRT backend whose device close fails, the port check with a unit file it cannot
read, and glibc's tunable overflow test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edgesdk.deploy import engine, install
from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError, LocalTransport
from edgesdk.runtime.huge_pages import UINT64_MAX, _tunable_number
from tests.unit.test_board54 import _install_runtime
from tests.unit.test_deploy_checks import ORIN
from tests.unit.test_deploy_helper import commit_by_hand, make_bundle
from tests.unit.test_tensorrt54 import ClosingHostDevice
from tests.unit.test_trt48 import standard_bundle  # noqa: F401 - the fixture: a tiny fp32-standard bundle


class FailingCloseDevice(ClosingHostDevice):
    """The host "device" whose close fails, as cudaStreamDestroy can on a GPU in an error state."""

    def close(self):
        self.closes += 1
        raise RuntimeError("cudaStreamDestroy failed: cudaErrorLaunchFailure")


def test_a_tensorrt_backend_whose_device_close_fails_still_gives_back_its_engine(standard_bundle, monkeypatch,  # noqa: F811
                                                                                 tmp_path):
    """close() marked the backend closed, then closed the device: where that raised, the engine, its context and the
    KV buffers stayed referenced, and every later close() returned at once, so they were never let go."""
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend
    from tests.unit.test_gpu_runtime46 import OrtTensorRT

    graph = standard_bundle.manifest["graph"]
    device = FailingCloseDevice()
    monkeypatch.setitem(sys.modules, "tensorrt", OrtTensorRT(standard_bundle.file(graph["file"]), graph, device, 4))
    (tmp_path / "engine.plan").write_bytes(b"plan")
    backend = TensorRTBackend(tmp_path / "engine.plan", graph, device=device)
    assert backend.prefill(np.arange(3, 9, dtype=np.int64)).shape == (1, graph["vocab_size"])
    with pytest.raises(RuntimeError, match="cudaStreamDestroy"):
        backend.close()
    assert (backend.engine, backend.context, backend._kv, backend._extra) == (None, None, [], {})
    backend.close()  # closed: nothing is done again
    assert device.closes == 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_port_check_takes_an_active_unit_whose_file_says_no_port_for_the_one_answering(tmp_path, systemd,
                                                                                           monkeypatch):
    """With no service.json in this deploy root, the check before a --service deploy reads the unit file for the
    port its server listens on. A unit file that does not say (an ExecStart edited by hand without --host and
    --port) made the active unit count as foreign, and the deploy was refused for the port the unit itself
    holds; where nothing says otherwise, the active unit is the one answering, as before the file was read."""
    env, _ = systemd
    for name in ("PATH", "FAKE_SYSTEMD_STATE", "EDGESDK_UNIT_DIR"):
        monkeypatch.setenv(name, env[name])
    units = Path(env["EDGESDK_UNIT_DIR"])
    units.mkdir()
    (units / "edgesdk-serve.service").write_text(
        f'[Service]\nExecStart="{sys.executable}" "-c" "import time; time.sleep(120)"\n')
    assert subprocess.run(["systemctl", "restart", "edgesdk-serve"]).returncode == 0
    board = Board(LocalTransport(str(tmp_path / "board")), sys.executable, str(tmp_path / "board"))
    params = {"action": "check", "argv": [], "timeout_s": 0, "fix": ""}
    port = _free_port()
    with socket.socket() as held_by_the_unit:  # stands in for the unit's server
        held_by_the_unit.bind(("127.0.0.1", port))
        held_by_the_unit.listen()
        reply = board.call("service", {**params, "health_url": f"http://127.0.0.1:{port}/health"})
    assert reply["installed"] is True


def test_glibc_reads_a_tunable_whole_up_to_where_its_overflow_test_trips():
    """_dl_strtoul tests for overflow before it takes each digit, and the test trips short of 2**64 - 1: a decimal
    number reads whole up to 18446744073709551605 and stops from 18446744073709551606 on (2**64 - 1 included); the
    docstring said only numbers past 2**64 - 1 stopped."""
    assert _tunable_number("18446744073709551605", (2, 35)) == UINT64_MAX - 10
    for text in ("18446744073709551606", str(UINT64_MAX), "0xfffffffffffffff0"):
        assert _tunable_number(text, (2, 35)) == UINT64_MAX  # stopped at the digit that tripped the test
        assert _tunable_number(text, (2, 39)) is None  # a digit left unread: glibc 2.39 ignores the setting
    assert _tunable_number("0xffffffffffffffef", (2, 39)) == UINT64_MAX - 16


def test_the_disk_check_counts_an_engine_cached_under_a_key_the_boards_builder_does_not_use(tmp_path):
    """The engine step names the engine directory after the TensorRT and GPU the board's builder reports; given the
    builder's answer, the disk check names the same directory (engine.engine_key), and counts the engine the step
    builds under another key than the probe's. Without it, the probe's key stands in, as before."""
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    probe_key_facts = BoardFacts.from_probe(ORIN)  # the probe's system Python: TensorRT 10.3.0
    probe_key = engine.cache_key(probe_key_facts.board.jetpack, "10.3.0", 87, engine.engine_module(probe_key_facts.board))
    facts = BoardFacts.from_probe({**ORIN, "engines": [probe_key]})
    manifest = {"graph": {"form": "standard"}, "target": {"gpu": {"sm": 87}}}
    files = {"model.onnx": {"size": 5_000_000}}
    builder = engine.builder_status(board, [sys.executable, "-c", "print('10.7.0 sm87')"])  # the runtime's TensorRT
    assert engine.decide(facts, 87, "abc", board, builder).build
    assert not engine.decide(facts, 87, "abc", board, builder).message.startswith("cached")
    assert engine.planned_engine_bytes(facts, manifest, files) == 0  # not known yet: the probe's key stands in
    assert engine.planned_engine_bytes(facts, manifest, files, builder) == 5_000_000  # another key: built
    same = engine.builder_status(board, [sys.executable, "-c", "print('10.3.0 sm87')"])
    assert engine.decide(facts, 87, "abc", board, same).message.startswith("cached")
    assert engine.planned_engine_bytes(facts, manifest, files, same) == 0  # the builder's own key is cached


class _CountedBuilds(dict):
    """install._BUILDS that sets ``all_in`` once ``callers`` builds have looked for the build in flight."""

    def __init__(self, callers: int):
        super().__init__()
        self.callers, self.looked, self.all_in = callers, 0, threading.Event()

    def get(self, key, default=None):
        self.looked += 1
        if self.looked == self.callers:
            self.all_in.set()
        return super().get(key, default)


def test_boards_waiting_for_a_wheel_build_that_fails_on_its_cache_share_its_error(tmp_path, monkeypatch):
    """Boards that need the wheel while it is built wait for that build and share its end; they shared its error
    only where it was a DeployError. A build that failed otherwise (the wheel cache not writable: an OSError from
    mkdir) sent each waiter round to build again, one after the other, each running pip wheel and failing the
    same way with a bare traceback. Now one pip run, and each board gets a DeployError that names the cache."""
    from tests._utils.deploy import tiny_checkout

    root = tiny_checkout(tmp_path / "checkout")
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "wheels").write_text("not a directory\n")  # the wheel cache cannot be made
    builds = _CountedBuilds(3)
    monkeypatch.setattr(install, "_BUILDS", builds)
    runs, real_pip = [], install._pip_wheel

    def counted(argv, where):
        runs.append(argv)
        builds.all_in.wait(60)  # the three boards need the wheel while it is built
        return real_pip(argv, where)

    monkeypatch.setattr(install, "_pip_wheel", counted)
    errors: list[BaseException] = []

    def board():
        try:
            install.build_wheel(root, install.source_digest(root))
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    threads = [threading.Thread(target=board) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(runs) == 1  # one pip wheel run (the offline one) for the three
    assert len(errors) == 3
    assert all(isinstance(error, DeployError) for error in errors), errors
    assert len({error.problem for error in errors}) == 1
    assert str(tmp_path / "cache" / "wheels") in errors[0].problem
    assert "EDGESDK_CACHE" in errors[0].fix


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def _history(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]


def test_a_switch_cut_short_while_it_drops_old_runtimes_stays_done(board, tmp_path, monkeypatch):
    """op_switch dropped the runtimes no rollback needs inside its all-or-nothing scope, after the history line was
    written: a Ctrl-C landing in that rmtree (a venv takes seconds to remove on an SD card) put current, previous
    and runtime/current back, while the history said the switch happened. The old runtimes go once the switch is
    done now, so such an interruption leaves the switch done, as its history says."""
    from edgesdk.deploy import board_ops

    root = Path(board.root)
    first, second = make_bundle(tmp_path / "a", {"w": b"1"}), make_bundle(tmp_path / "b", {"w": b"2"})
    commit_by_hand(board, first)
    _install_runtime(board, "ra")
    board.call("switch", {"bundle_id": first.bundle_id, "runtime_key": "ra"})
    commit_by_hand(board, second)
    _install_runtime(board, "rb")
    _install_runtime(board, "stale")

    def interrupted(path, ignore_errors=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(board_ops.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        board_ops.op_switch({"root": str(root), "bundle_id": second.bundle_id, "runtime_key": "rb"})
    assert os.readlink(root / "current") == f"releases/{second.bundle_id}"
    assert os.readlink(root / "runtime" / "current") == "rb"
    assert _history(root)[-1]["to"] == second.bundle_id
    assert not (root / ".switch.json").exists()


def test_a_killed_switch_that_the_next_one_finishes_drops_the_runtimes_no_rollback_needs(board, tmp_path):
    """A switch killed after current and runtime/current moved is finished by the next switch or prune
    (settle_switch), which never dropped the runtimes op_switch drops once a switch is done: each such kill left a
    whole venv behind on the board."""
    root = Path(board.root)
    bundles = [make_bundle(tmp_path / name, {"w": name.encode()}) for name in ("a", "b", "c")]
    for bundle, key in zip(bundles[:2], ("ra", "rb"), strict=True):
        commit_by_hand(board, bundle)
        _install_runtime(board, key)
        board.call("switch", {"bundle_id": bundle.bundle_id, "runtime_key": key})
    commit_by_hand(board, bundles[2])
    _install_runtime(board, "rc")
    _install_runtime(board, "stale")  # an older runtime no release pairs with
    # the deploy of the third with runtime rc, killed right after its links moved
    before = {"current": os.readlink(root / "current"), "previous": os.readlink(root / "previous"),
              "runtime/current": os.readlink(root / "runtime" / "current")}
    (root / ".switch.json").write_text(json.dumps({
        "time": 1.0, "to": bundles[2].bundle_id, "from": bundles[1].bundle_id, "before": before, "action": "deploy",
        "previous_after": bundles[1].bundle_id, "runtime_key": "rc"}))
    for link, target in ((root / "runtime" / "current", "rc"), (root / "current", f"releases/{bundles[2].bundle_id}")):
        os.symlink(target, link.with_name(".tmp-link"))
        os.replace(link.with_name(".tmp-link"), link)
    board.call("prune", {"keep": 5})  # settles the switch
    assert os.readlink(root / "previous") == f"releases/{bundles[1].bundle_id}"
    # rc (current), rb (the runtime previous ran with, for a rollback); ra and stale are no rollback's
    assert sorted(os.listdir(root / "runtime")) == ["current", "rb", "rc"]
