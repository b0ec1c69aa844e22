"""Deploy transfer, review 58: the host hashed the prefix a resume continues after only once the board's receive
had started, and the board, waiting for data meanwhile, gave the transfer up as a stalled connection when that
took longer than its idle timeout (a long prefix on a slow disk). The prefixes are hashed before it starts now.

Every board operation runs the real helper through a LocalTransport; nothing is mocked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.bundle import BundleWriter
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transfer import bundle_files, make_plan, send
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests.unit.test_deploy_helper import FAKE_MANIFEST, make_bundle

PREFIX = 1 << 30  # zeros in sparse files (no disk used); hashing them takes longer than the board's 1 s below
TAIL = b"the bytes after the prefix"


class ImpatientBoard(Board):
    """A board whose receive waits 1 s for data from the host (RECEIVE_IDLE_S stands for 120 s)."""

    def start(self, op: str, params: dict) -> subprocess.Popen:
        return super().start(op, {**params, "idle_timeout": 1})


def test_the_board_does_not_wait_while_the_host_hashes_a_resume_prefix(tmp_path):
    writer = BundleWriter(tmp_path / "bundle")
    with open(writer.staging / "weights.bin", "wb") as handle:
        handle.truncate(PREFIX)
        handle.seek(PREFIX)
        handle.write(TAIL)
    bundle = writer.commit({**FAKE_MANIFEST, "graph": {"file": "weights.bin"}, "tokenizer": {"file": "weights.bin"}})
    files = bundle_files(bundle)
    root = str(tmp_path / "board")
    board = ImpatientBoard(LocalTransport(root), sys.executable, root)
    staging = Path(root) / "staging" / bundle.bundle_id
    staging.mkdir(parents=True)
    with open(staging / "weights.bin.partial", "wb") as handle:  # an earlier transfer cut after the zeros
        handle.truncate(PREFIX)
    facts = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    plan = make_plan(files, facts["plan"])
    assert dict(plan.send)["weights.bin"] == PREFIX
    assert "weights.bin" in plan.prefixes

    sent = send(board, bundle, files, plan, Reporter(1, write=lambda line: None))

    assert sent.bytes == plan.send_bytes == len(TAIL) + sum(files[n]["size"] for n in files if n != "weights.bin")
    received = staging / "weights.bin"
    assert received.stat().st_size == PREFIX + len(TAIL)
    with open(received, "rb") as handle:
        handle.seek(PREFIX)
        assert handle.read() == TAIL
    assert not os.path.exists(str(received) + ".partial")


def test_a_resume_prefix_that_cannot_be_read_is_named_before_the_board_receives(tmp_path):
    """Hashed before the receive starts, a prefix whose read fails (EIO, as a failing disk's) ends deploy naming
    the file as changed here; the board's .partial stays for the next deploy."""
    data = os.urandom(3000)
    bundle = make_bundle(tmp_path / "b", {"w": data}, "b")
    files = bundle_files(bundle)
    root = str(tmp_path / "board")
    board = Board(LocalTransport(root), sys.executable, root)
    partial = Path(root) / "staging" / bundle.bundle_id / "w.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:1000])
    facts = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    plan = make_plan(files, facts["plan"])
    assert dict(plan.send)["w"] == 1000
    (bundle.path / "w").unlink()
    (bundle.path / "w").symlink_to("/proc/self/mem")  # a read of address 0 fails with EIO

    with pytest.raises(DeployError) as failed:
        send(board, bundle, files, plan, Reporter(1, write=lambda line: None))
    assert failed.value.problem == (f"w in the bundle {bundle.path} changed on this machine while deploy sent it: "
                                    "it cannot be read now (Input/output error)")
    assert "leave the bundle alone while it deploys" in failed.value.fix
    assert partial.read_bytes() == data[:1000]
