"""The board-side helper, run locally exactly as over ssh (``python -c BOOT OP JSON``)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from edgesdk.bundle import BundleWriter, verify_bundle
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transfer import bundle_files, make_plan
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils.small_disk import small_disk

FAKE_MANIFEST = {"target": {"name": "host", "memory_budget_mb": 100}, "model": {}, "graph": {}, "tokenizer": {},
                 "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1}, "stages": [],
                 "recipe": {"name": "none"}}


def make_bundle(path: Path, files: dict[str, bytes], note: str = ""):
    writer = BundleWriter(path)
    for name, data in files.items():
        target = writer.staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    first = next(iter(files))  # stands in for the graph and tokenizer files a manifest must list
    return writer.commit({**FAKE_MANIFEST, "graph": {"file": first}, "tokenizer": {"file": first}, "note": note})


def frame(name: str, data: bytes, offset: int = 0, size: int | None = None, sha: str | None = None) -> bytes:
    size = len(data) + offset if size is None else size
    header = {"name": name, "offset": offset, "size": size, "sha256": sha}
    return json.dumps(header).encode() + b"\n" + data


def stream_for(bundle, names=None) -> bytes:
    files = bundle_files(bundle)
    body = b"".join(frame(n, (bundle.path / n).read_bytes(), sha=files[n]["sha256"]) for n in (names or sorted(files)))
    return body + b'{"end": true}\n'


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def commit_by_hand(board, bundle, links=None, names=None) -> dict:
    """Send and commit ``bundle`` as a deploy does before its smoke test; returns the commit reply."""
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": links or {}}, stdin=stream_for(bundle, names))
    sha = bundle_files(bundle)["manifest.json"]["sha256"]
    reply = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})
    assert reply["problems"] == []
    return reply


def deploy_by_hand(board, bundle, links=None, names=None):
    commit_by_hand(board, bundle, links, names)
    return board.call("switch", {"bundle_id": bundle.bundle_id})


def deploy_several(board, tmp_path, count: int) -> list[str]:
    """Deploy ``count`` distinct bundles one after another; their ids, oldest first."""
    ids = []
    for i in range(count):
        bundle = make_bundle(tmp_path / f"b{i}", {"w": os.urandom(100)}, str(i))
        deploy_by_hand(board, bundle)
        ids.append(bundle.bundle_id)
    return ids


def test_probe_reads_the_machine_and_writes_nothing(board, tmp_path):
    facts = board.call("probe")
    assert facts["root"] == str(tmp_path / "board")
    assert facts["root_exists"] is False
    assert facts["disk"]["free"] > 0
    assert facts["disk"]["path"] == str(tmp_path)
    assert facts["python"]["version"][:2] == list(sys.version_info[:2])
    assert facts["state"] == {"current": None, "previous": None, "releases": [], "staging": []}
    assert not (tmp_path / "board").exists()


def test_receive_commit_switch_then_a_second_bundle_reuses_shared_files(board, tmp_path):
    first = make_bundle(tmp_path / "b1", {"weights.bin": os.urandom(3000), "tok.json": b"{}"}, "one")
    assert deploy_by_hand(board, first) == {"from": None, "to": first.bundle_id, "runtime_from": None, "previous": None,
                                            "ok": True}
    root = Path(board.root)
    assert os.readlink(root / "current") == f"releases/{first.bundle_id}"
    verify_bundle(root / "current")

    second = make_bundle(tmp_path / "b2", {"weights.bin": os.urandom(3000), "tok.json": b"{}"}, "two")
    files = bundle_files(second)
    facts = board.call("probe", {"bundle_id": second.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    assert facts["release"] is None
    plan = make_plan(files, facts["plan"])
    assert plan.links == {"tok.json": first.bundle_id}
    assert [name for name, _ in plan.send] == ["manifest.json", "manifest.sha256", "weights.bin"]
    switched = deploy_by_hand(board, second, plan.links, [name for name, _ in plan.send])
    assert switched["from"] == first.bundle_id
    assert os.readlink(root / "previous") == f"releases/{first.bundle_id}"
    assert os.stat(root / "releases" / first.bundle_id / "tok.json").st_ino == \
        os.stat(root / "releases" / second.bundle_id / "tok.json").st_ino  # hard link, no second copy
    history = [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]
    assert [(h["from"], h["to"]) for h in history] == [(None, first.bundle_id), (first.bundle_id, second.bundle_id)]
    # The same bundle again: the release verifies in place and nothing is planned.
    again = board.call("probe", {"bundle_id": second.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    assert again["release"] == {"problems": []}
    assert "plan" not in again


def test_a_cut_upload_resumes_from_the_partial_file(board, tmp_path):
    bundle = make_bundle(tmp_path / "b", {"weights.bin": os.urandom(10_000)})
    files = bundle_files(bundle)
    data = (bundle.path / "weights.bin").read_bytes()
    cut = frame("weights.bin", data[:4000], size=len(data), sha=files["weights.bin"]["sha256"])
    reply = board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=cut)
    assert reply["eof"] is True
    assert reply["results"] == [{"name": "weights.bin", "complete": False, "received": 4000}]
    partial = Path(board.root) / "staging" / bundle.bundle_id / "weights.bin.partial"
    assert partial.stat().st_size == 4000
    facts = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    assert facts["plan"]["weights.bin"] == {"state": "partial", "offset": 4000}
    rest = frame("weights.bin", data[4000:], offset=4000, sha=files["weights.bin"]["sha256"]) + b'{"end": true}\n'
    reply = board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=rest)
    assert reply["results"] == [{"name": "weights.bin", "complete": True, "ok": True}]
    assert (Path(board.root) / "staging" / bundle.bundle_id / "weights.bin").read_bytes() == data


def test_damaged_data_is_discarded_and_never_committed(board, tmp_path):
    bundle = make_bundle(tmp_path / "b", {"weights.bin": b"x" * 5000})
    files = bundle_files(bundle)
    bad = frame("weights.bin", b"y" * 5000, sha=files["weights.bin"]["sha256"]) + b'{"end": true}\n'
    reply = board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=bad)
    assert reply["results"][0]["ok"] is False
    staging = Path(board.root) / "staging" / bundle.bundle_id
    assert not (staging / "weights.bin").exists()
    assert not (staging / "weights.bin.partial").exists()


def test_commit_refuses_a_damaged_staging_copy_and_removes_the_bad_file(board, tmp_path):
    bundle = make_bundle(tmp_path / "b", {"weights.bin": b"x" * 5000})
    board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=stream_for(bundle))
    staged = Path(board.root) / "staging" / bundle.bundle_id / "weights.bin"
    staged.write_bytes(b"z" * 5000)  # damaged on the board's storage after arrival
    sha = bundle_files(bundle)["manifest.json"]["sha256"]
    reply = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})
    assert reply["problems"] == ["weights.bin: sha256 differs from the manifest"]
    assert not staged.exists()
    assert not (Path(board.root) / "releases" / bundle.bundle_id).exists()
    other = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": "0" * 64})
    assert "missing" in " ".join(other["problems"]) or "host's bundle" in " ".join(other["problems"])


@pytest.mark.parametrize("name", ["../evil", "/etc/evil", "a/../../evil", "a//b", "x.partial", "a\\b"])
def test_names_that_escape_are_refused(board, tmp_path, name):
    bundle = make_bundle(tmp_path / "b", {"f": b"1"})
    with pytest.raises(DeployError) as info:
        board.call("receive", {"bundle_id": bundle.bundle_id},
                   stdin=frame(name, b"1", sha=hashlib.sha256(b"1").hexdigest()))
    # a name that stays inside but that the board refuses all the same is named for what it is, not as an escape
    said = "ends in '.partial'" if name.endswith(".partial") else "holds a backslash" if "\\" in name else "escape"
    assert said in info.value.problem
    assert not (tmp_path / "evil").exists()
    with pytest.raises(DeployError):
        board.call("probe", {"bundle_id": bundle.bundle_id, "files": {name: {"size": 1, "sha256": "0"}}})
    with pytest.raises(DeployError):
        board.call("receive", {"bundle_id": "../x"}, stdin=b"")


def test_prune_keeps_current_previous_and_the_newest(board, tmp_path):
    ids = deploy_several(board, tmp_path, 5)
    board.call("switch", {"bundle_id": ids[1], "action": "rollback"})  # current = 1, previous = 4
    reply = board.call("prune", {"keep": 3})
    left = sorted(os.listdir(Path(board.root) / "releases"))
    assert left == sorted([ids[1], ids[4], ids[3]])
    assert sorted(reply["removed"]) == sorted([ids[0], ids[2]])


def test_prune_leaves_a_release_another_deploy_committed_but_has_not_switched_to(board, tmp_path):
    ids = deploy_several(board, tmp_path, 3)
    racing = make_bundle(tmp_path / "racing", {"w": os.urandom(100)}, "racing")  # smoke test still running
    commit_by_hand(board, racing)
    releases = Path(board.root) / "releases"

    assert sorted(board.call("prune", {"keep": 1})["removed"]) == [ids[0]]  # current, previous, in flight
    board.call("switch", {"bundle_id": racing.bundle_id})  # the racing deploy finishes
    assert releases.joinpath(racing.bundle_id).is_dir()

    late = make_bundle(tmp_path / "late", {"w": os.urandom(100)}, "late")  # a deploy abandoned long ago
    commit_by_hand(board, late)
    old = releases.joinpath(late.bundle_id).stat().st_mtime - 7 * 3600
    os.utime(releases / late.bundle_id, (old, old))
    assert late.bundle_id in board.call("prune", {"keep": 1})["removed"]


def test_committing_a_bundle_the_board_holds_sound_keeps_the_live_copy(board, tmp_path):
    bundle = make_bundle(tmp_path / "b", {"w": os.urandom(100)})
    deploy_by_hand(board, bundle)
    release = Path(board.root) / "releases" / bundle.bundle_id
    inode = release.stat().st_ino
    assert commit_by_hand(board, bundle)["kept"] is True  # a second deploy of the same bundle
    assert release.stat().st_ino == inode
    assert not (Path(board.root) / "staging" / bundle.bundle_id).exists()
    assert verify_bundle(Path(board.root) / "current").bundle_id == bundle.bundle_id


def test_switching_back_after_a_failed_deploy_restores_previous_too(board, tmp_path):
    a, b, c = (make_bundle(tmp_path / name, {"w": os.urandom(100)}, name) for name in "abc")
    for bundle in (a, b, c):
        deploy_by_hand(board, bundle)  # current c, previous b
    board.call("switch", {"bundle_id": b.bundle_id, "action": "rollback after a failed deploy",
                          "previous": a.bundle_id})
    root = Path(board.root)
    assert os.readlink(root / "current") == os.path.join("releases", b.bundle_id)
    assert os.readlink(root / "previous") == os.path.join("releases", a.bundle_id)  # not c, the withdrawn one
    board.call("switch", {"bundle_id": c.bundle_id, "previous": None})
    assert not (root / "previous").exists()


def test_the_runtime_moves_with_the_bundle_and_one_previous_runtime_is_kept(board, tmp_path):
    bundle = make_bundle(tmp_path / "b", {"w": b"1"})
    deploy_by_hand(board, bundle)
    runtime = Path(board.root) / "runtime"

    def install(key):
        (runtime / key).mkdir(parents=True)
        (runtime / key / "edgesdk-runtime.json").write_text(json.dumps({"key": key, "version": "0"}))

    install("k1")
    (runtime / "half-installed").mkdir()
    facts = board.call("probe")
    assert facts["runtime"]["installed"] == ["k1"]
    assert facts["runtime"]["stamp"] is None  # installed is not active
    for key, was in (("k1", None), ("k2", "k1"), ("k3", "k2")):
        if key != "k1":
            install(key)
        reply = board.call("switch", {"bundle_id": bundle.bundle_id, "runtime_key": key})
        assert reply["runtime_from"] == was
        assert os.readlink(runtime / "current") == key
    assert sorted(os.listdir(runtime)) == ["current", "k2", "k3"]  # the active one and the one before it
    with pytest.raises(DeployError) as info:
        board.call("switch", {"bundle_id": bundle.bundle_id, "runtime_key": "k9"})
    assert "not installed" in info.value.problem
    assert os.readlink(runtime / "current") == "k3"


def test_switch_to_a_missing_release_is_refused(board):
    with pytest.raises(DeployError) as info:
        board.call("switch", {"bundle_id": "0123456789abcdef"})
    assert "not on the board" in info.value.problem


def test_running_out_of_space_removes_the_staging_copy(tmp_path):
    with small_disk(tmp_path / "small") as root:  # 256 KiB
        board = Board(LocalTransport(str(root)), sys.executable, str(root))
        bundle = make_bundle(tmp_path / "b", {"big.bin": os.urandom(1_000_000)})
        with pytest.raises(DeployError) as info:
            board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=stream_for(bundle))
        assert "ran out of disk space" in info.value.problem
        assert "current release is untouched" in info.value.fix
        assert os.listdir(root / "staging") == []


def test_an_unreadable_runtime_stamp_is_an_unfinished_install(board, tmp_path):
    """A power cut can leave the stamp empty: the probe and the next install treat it as absent."""
    venv = Path(board.root) / "runtime" / "k2"
    venv.mkdir(parents=True)
    (venv / "edgesdk-runtime.json").write_text("")
    assert board.call("probe")["runtime"]["installed"] == []
    with pytest.raises(DeployError) as info:  # gets as far as pip, with a spec that cannot install
        board.call("install", {"key": "k2", "pip_spec": str(tmp_path / "missing.whl")}, timeout=600)
    assert "pip install missing.whl failed" in info.value.problem
    assert not venv.exists()


def test_a_held_lock_names_its_holder_and_warns_against_deleting_it(tmp_path):
    from edgesdk.deploy.board_common import Lock, Refused

    with Lock(str(tmp_path)), pytest.raises(Refused) as info:
        Lock(str(tmp_path), timeout=0.1)
    assert f"(process {os.getpid()})" in info.value.problem
    assert "Do not delete the file" in info.value.fix
    with Lock(str(tmp_path), timeout=0.1):  # released with its holder
        pass


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_deploy_root_that_is_a_file_is_named(tmp_path, below):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    root = str(afile / below) if below else str(afile)
    board = Board(LocalTransport(root), sys.executable, root)
    with pytest.raises(DeployError, match=r"deploy root .* is not a directory: .*afile is a file") as refused:
        board.call("probe", {})
    assert "--remote-root" in refused.value.fix
    assert afile.read_text() == "mine"


def test_a_stalled_upload_gives_up_the_lock_and_keeps_what_arrived(board, tmp_path):
    """A host that stops sending without closing the connection (a dead network) must not hold the deploy lock
    until sshd notices, hours later: the board stops after its idle deadline, and the next deploy resumes."""
    bundle = make_bundle(tmp_path / "b", {"weights.bin": os.urandom(10_000)})
    files = bundle_files(bundle)
    data = (bundle.path / "weights.bin").read_bytes()
    proc = board.start("receive", {"bundle_id": bundle.bundle_id, "idle_timeout": 1})
    proc.stdin.write(frame("weights.bin", data[:4000], size=len(data), sha=files["weights.bin"]["sha256"]))
    proc.stdin.flush()  # then nothing more, and the pipe stays open
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    reader.join(timeout=30)  # the helper exits by itself; stdin closing would end it as a cut stream
    stalled = reader.is_alive()
    proc.stdin.close()
    proc.wait(timeout=30)
    assert not stalled, "the board still waited on a stalled stream after 30 s"
    assert proc.returncode == 3
    reply = json.loads(out[0].decode().strip().splitlines()[-1])
    assert "no data from the host for 1 s" in reply["error"]
    partial = Path(board.root) / "staging" / bundle.bundle_id / "weights.bin.partial"
    assert partial.stat().st_size == 4000
    rest = frame("weights.bin", data[4000:], offset=4000, sha=files["weights.bin"]["sha256"]) + b'{"end": true}\n'
    reply = board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=rest, timeout=30)
    assert reply["results"] == [{"name": "weights.bin", "complete": True, "ok": True}]


def test_an_answer_from_the_board_is_told_from_no_answer():
    """Deploy tells a switch that may have happened (no answer) from one known not to (the board answered)."""
    from edgesdk.deploy.remote import BoardRefusal, parse_reply

    refusal = (3, b'{"ok": false, "error": "release x is not on the board", "fix": "deploy it first"}\n', b"")
    with pytest.raises(BoardRefusal, match="release x is not on the board"):
        parse_reply(refusal, "board", "python3", "switch")
    with pytest.raises(BoardRefusal, match="cannot be started"):  # its Python never ran: nothing happened
        parse_reply((127, b"", b"sh: python3: not found"), "board", "python3", "switch")
    with pytest.raises(DeployError) as lost:  # ssh gave up: the switch may or may not have happened
        parse_reply((255, b"", b"Connection reset by peer"), "board", "python3", "switch")
    assert not isinstance(lost.value, BoardRefusal)
