"""What the board already holds of a bundle, over a real sshd: only the right bytes count as there.

The bundle id names the content (the files and their sha256), but manifest.json and manifest.sha256 also hold
when the bundle was built, so a rebuild of the same content has the same id and another manifest of the same
size. The board's plan took a staging file of the right size as arrived, resumed any .partial, and never
linked from the bundle's own release; it now checks the sha256 and links what a release already holds.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transfer import send
from tests.unit.test_deploy_board_facts37 import planned, quiet, ssh_board
from tests.unit.test_deploy_helper import make_bundle


def another_build(manifest: str) -> str:
    """The same manifest as another build of the same content writes it: another 'created', same length."""
    created = json.loads(manifest)["created"]
    other = "2020-01-01T00:00:00+00:00" if created != "2020-01-01T00:00:00+00:00" else "2021-01-01T00:00:00+00:00"
    assert len(other) == len(created)
    return manifest.replace(created, other)


def write_build(folder: Path, manifest: str) -> None:
    """manifest.json and its digest, as a build writes them, into ``folder``."""
    (folder / "manifest.json").write_text(manifest)
    (folder / "manifest.sha256").write_text(hashlib.sha256(manifest.encode()).hexdigest() + "\n")


def commit(board, bundle, files) -> dict:
    """The commit a deploy runs after the transfer."""
    return board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": files["manifest.json"]["sha256"]})


@pytest.mark.parametrize("left", ["complete", "partial"])
def test_the_manifest_another_build_left_in_staging_is_sent_again(ssh_server, tmp_path, left):
    """A deploy cut after the manifest and its digest arrived, then a rebuild (same content, same id) deployed:
    staging held manifest.json and manifest.sha256 of the same size from the first build. The plan called them
    arrived and the commit refused the bundle ('manifest.json has sha256 ..., the host's bundle has ...'); a
    .partial of them was resumed and the whole file reported damaged. Now they are sent whole and it commits."""
    root = tmp_path / "board"
    board = ssh_board(ssh_server, root)
    bundle = make_bundle(tmp_path / "b", {"w.bin": os.urandom(50_000), "tok.json": b"{}"})
    staging = root / "staging" / bundle.bundle_id
    staging.mkdir(parents=True)
    older = another_build((bundle.path / "manifest.json").read_text())
    if left == "complete":
        write_build(staging, older)
    else:
        half = len(older) // 2
        assert older[:half] != (bundle.path / "manifest.json").read_text()[:half]
        (staging / "manifest.json.partial").write_text(older[:half])
    files, plan = planned(board, bundle)
    assert sorted(name for name, _offset in plan.send) == ["manifest.json", "manifest.sha256", "tok.json", "w.bin"]
    lines: list[str] = []
    sent = send(board, bundle, files, plan, Reporter(1, write=lines.append))
    assert sent.bytes == sum(f["size"] for f in files.values())
    assert ("manifest.json: the" in "\n".join(lines)) is (left == "partial")  # resumed at first, then sent whole
    assert commit(board, bundle, files)["problems"] == []
    assert (root / "releases" / bundle.bundle_id / "manifest.json").read_bytes() == \
        (bundle.path / "manifest.json").read_bytes()


def test_a_rebuild_of_the_same_content_is_linked_from_its_own_release(ssh_server, tmp_path):
    """The board runs releases/<id>; the host rebuilds the same content (same id, another manifest). The probe
    finds the release's manifest differs and plans a transfer, which linked nothing from releases/<id>: every
    file, the weights too, crossed the link again. Now only the manifest and its digest are sent."""
    root = tmp_path / "board"
    board = ssh_board(ssh_server, root)
    weights = os.urandom(300_000)
    bundle = make_bundle(tmp_path / "b", {"w.bin": weights, "tok.json": b"{}"})
    files, plan = planned(board, bundle)
    send(board, bundle, files, plan, quiet())
    assert commit(board, bundle, files)["problems"] == []
    board.call("switch", {"bundle_id": bundle.bundle_id})
    write_build(bundle.path, another_build((bundle.path / "manifest.json").read_text()))

    files, plan = planned(board, bundle)
    assert sorted(name for name, _offset in plan.send) == ["manifest.json", "manifest.sha256"]
    assert plan.links == {"tok.json": bundle.bundle_id, "w.bin": bundle.bundle_id}
    sent = send(board, bundle, files, plan, quiet())
    assert sent.bytes == files["manifest.json"]["size"] + files["manifest.sha256"]["size"]
    assert commit(board, bundle, files)["problems"] == []
    assert (root / "current" / "w.bin").read_bytes() == weights
    assert (root / "current" / "manifest.json").read_bytes() == (bundle.path / "manifest.json").read_bytes()
    assert not (root / "staging" / bundle.bundle_id).exists()


def test_a_file_a_release_holds_is_linked_rather_than_resumed(ssh_server, tmp_path):
    """A transfer of bundle A was cut in its weights; bundle B (the same weights, other settings) was deployed
    since. Deploying A again resumed the .partial and sent the rest of the weights, which releases/B holds
    with the same sha256: now they are linked and nothing of them is sent."""
    root = tmp_path / "board"
    board = ssh_board(ssh_server, root)
    weights = os.urandom(300_000)
    first = make_bundle(tmp_path / "a", {"w.bin": weights}, "a")
    second = make_bundle(tmp_path / "b", {"w.bin": weights}, "b")
    assert first.bundle_id != second.bundle_id
    partial = root / "staging" / first.bundle_id / "w.bin.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(weights[:1000])  # what the cut transfer left
    files, plan = planned(board, second)
    send(board, second, files, plan, quiet())
    assert commit(board, second, files)["problems"] == []

    files, plan = planned(board, first)
    assert plan.links == {"w.bin": second.bundle_id}
    assert "w.bin" not in dict(plan.send)
    sent = send(board, first, files, plan, quiet())
    assert sent.bytes == files["manifest.json"]["size"] + files["manifest.sha256"]["size"]
    assert commit(board, first, files)["problems"] == []
    assert (root / "releases" / first.bundle_id / "w.bin").read_bytes() == weights
    assert not partial.exists()


def test_a_partial_file_that_is_not_the_file_s_first_bytes_is_sent_whole(ssh_server, tmp_path):
    """A .partial whose bytes are not the start of the file (the host's copy changed while an earlier transfer
    read it, or the board lost power as it wrote) was resumed as it was: the whole file hashed wrong on the
    board and the deploy failed with 'arrived damaged ... check the board's storage and memory'. The host now
    compares the sha256 of those bytes with its own first ones and sends the file whole; one whose bytes match
    still resumes after them."""
    root = tmp_path / "board"
    board = ssh_board(ssh_server, root)
    weights, tokens = os.urandom(300_000), os.urandom(200_000)
    bundle = make_bundle(tmp_path / "b", {"w.bin": weights, "t.bin": tokens})
    staging = root / "staging" / bundle.bundle_id
    staging.mkdir(parents=True)
    (staging / "w.bin.partial").write_bytes(weights[:100_000] + bytes(20_000))  # a zero-filled tail
    (staging / "t.bin.partial").write_bytes(tokens[:50_000])
    files, plan = planned(board, bundle)
    assert dict(plan.send)["w.bin"] == 120_000
    lines: list[str] = []
    sent = send(board, bundle, files, plan, Reporter(1, write=lines.append))
    assert commit(board, bundle, files)["problems"] == []
    assert (root / "releases" / bundle.bundle_id / "w.bin").read_bytes() == weights
    assert (root / "releases" / bundle.bundle_id / "t.bin").read_bytes() == tokens
    assert sum(f["size"] for f in files.values()) - sent.bytes == 50_000  # t.bin resumed, w.bin sent whole
    said = "\n".join(lines)
    assert "w.bin: the 120.0 kB an earlier transfer left on " in said
    assert "are not this file's first bytes; sending it whole" in said
    assert "t.bin:" not in said
