"""Sending a bundle into ``staging/<bundle-id>`` on the board: only what it lacks, resumably.

The board's probe says, per file, whether it already has it (in staging, or in a release, which is
hard-linked; either with the manifest's sha256), has a ``.partial`` prefix of it (the transfer resumes
at that byte when the sha256 of those bytes is that of this file's first ones), or needs it whole. Everything still needed goes in one stream through one
ssh command: a JSON header line per file, then its bytes. The board hashes as it writes, renames
``name.partial`` to ``name`` only when the sha256 matches, and discards a damaged file. A cut
connection leaves ``.partial`` files that the next deploy continues; ``current`` is never touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, Bundle
from edgesdk.deploy.remote import Board, parse_reply
from edgesdk.deploy.report import Reporter, files_count, fmt_bytes
from edgesdk.deploy.transport import DeployError, with_signal_note
from edgesdk.hashing import sha256_file

CHUNK = 1 << 18
_CHANGED_FIX = ("leave the bundle alone while it deploys (is a build writing into the same --out?), then run the "
                "deploy again: it verifies the bundle first, and the board keeps its current release")


def bundle_files(bundle: Bundle) -> dict[str, dict]:
    """Every file deploy ships (the manifest's list plus the manifest and its digest)."""
    files = {name: {"size": facts["size"], "sha256": facts["sha256"]} for name, facts in bundle.manifest["files"].items()}
    for name in (MANIFEST, MANIFEST_DIGEST):
        path = bundle.path / name
        files[name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return files


@dataclass
class Plan:
    """What goes over the wire and what the board reuses."""

    send: list[tuple[str, int]] = field(default_factory=list)  # (name, resume offset)
    links: dict[str, str] = field(default_factory=dict)  # name -> release id it is hard-linked from
    in_staging: list[str] = field(default_factory=list)
    prefixes: dict[str, str] = field(default_factory=dict)  # name -> sha256 of the board's .partial to resume
    send_bytes: int = 0
    resumed_bytes: int = 0
    reused_bytes: int = 0

    def describe(self, files: dict[str, dict]) -> str:
        total = sum(f["size"] for f in files.values())
        parts = [f"{files_count(len(files))}, {fmt_bytes(total)}: {fmt_bytes(self.send_bytes)} to send "
                 f"({files_count(len(self.send))})"]
        if self.links or self.in_staging:
            parts.append(f"{len(self.links) + len(self.in_staging)} already on the board "
                         f"({fmt_bytes(self.reused_bytes)})")
        if self.resumed_bytes:
            parts.append(f"resuming after {fmt_bytes(self.resumed_bytes)} received earlier")
        return ", ".join(parts)


def make_plan(files: dict[str, dict], board_plan: dict) -> Plan:
    """Turn the board's per-file answer into what to send from which offset."""
    plan = Plan()
    for name in sorted(files):
        size = files[name]["size"]
        entry = board_plan.get(name, {"state": "send", "offset": 0})
        state = entry["state"]
        if state == "staging":
            plan.in_staging.append(name)
            plan.reused_bytes += size
        elif state == "link":
            plan.links[name] = entry["from"]
            plan.reused_bytes += size
        else:
            offset = int(entry.get("offset", 0)) if state == "partial" else 0
            prefix = board_plan.get(name + ".partial", {}).get("sha256") if offset else None
            if prefix:
                plan.prefixes[name] = prefix
            plan.send.append((name, offset))
            plan.send_bytes += size - offset
            plan.resumed_bytes += offset
    return plan


@dataclass
class Sent:
    bytes: int
    seconds: float


def _drain(stream, sink: list[bytes]) -> threading.Thread:
    thread = threading.Thread(target=lambda: sink.append(stream.read()), daemon=True)
    thread.start()
    return thread


def _prefix_sha256(handle, offset: int) -> str:
    """The sha256 of the first ``offset`` bytes of the open file ``handle``, which is left at ``offset``."""
    digest = hashlib.sha256()
    handle.seek(0)
    while handle.tell() < offset:
        block = handle.read(min(CHUNK, offset - handle.tell()))
        if not block:
            break
        digest.update(block)
    return digest.hexdigest()


def _resumable(bundle: Bundle, plan: Plan) -> dict[str, bool]:
    """Per file the plan resumes, whether this machine's copy starts with the bytes the board's ``.partial`` holds
    (the sha256 the plan gives). Hashed before the board's receive starts: it gives the transfer up after
    RECEIVE_IDLE_S (board_transfer.py) without data, which hashing a long prefix on a slow disk can take."""
    resumable = {}
    for name, offset in plan.send:
        if name in plan.prefixes:
            try:
                with open(Path(bundle.path) / name, "rb") as handle:
                    resumable[name] = _prefix_sha256(handle, offset) == plan.prefixes[name]
            except OSError as exc:  # removed or made unreadable since the bundle was verified, or the disk failed
                raise DeployError(f"{name} in the bundle {bundle.path} changed on this machine while deploy sent it: "
                                  f"it cannot be read now ({exc.strerror or exc})", _CHANGED_FIX) from exc
    return resumable


def _changed_here(path: Path, sha256: str) -> str | None:
    """How this machine's copy of a bundle file changed since it was verified, or None where it still has the
    manifest's ``sha256``: other bytes now, or removed or unreadable (a build writing into the same --out renames
    the old bundle away)."""
    try:
        return None if sha256_file(path) == sha256 else "its sha256 no longer matches the bundle's manifest"
    except OSError as exc:
        return f"it cannot be read now ({exc.strerror or exc})"


def send(board: Board, bundle: Bundle, files: dict[str, dict], plan: Plan, report: Reporter) -> Sent:
    """Stream the planned files to the board; raise DeployError if anything did not arrive intact.

    A file the board holds a ``.partial`` of resumes after it only when those bytes are this file's first
    ones (the sha256 the board's plan gives); otherwise it is sent whole and the board starts it afresh."""
    began = time.monotonic()
    total = plan.send_bytes
    resumable = _resumable(bundle, plan)
    proc = board.start("receive", {"bundle_id": bundle.bundle_id, "links": plan.links})
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [_drain(proc.stdout, out), _drain(proc.stderr, err)]
    sent = 0
    current = None
    changed = None  # (name, what it is now) for a bundle file that changed on this machine
    last_note = began
    try:
        for name, offset in plan.send:
            current = name
            facts = files[name]
            try:
                handle = open(Path(bundle.path) / name, "rb")  # noqa: SIM115 - closed by the with below
            except OSError as exc:  # removed or made unreadable since the bundle was verified
                changed = (name, f"it cannot be read now ({exc.strerror})")
                break
            with handle:
                if name in resumable and not resumable[name]:
                    report.info(f"{name}: the {fmt_bytes(offset)} an earlier transfer left on {board.label} "
                                "are not this file's first bytes; sending it whole")
                    total += offset
                    offset = 0
                header = {"name": name, "offset": offset, "size": facts["size"], "sha256": facts["sha256"]}
                proc.stdin.write(json.dumps(header).encode() + b"\n")
                # Exactly the header's byte count: the board reads that many, then the next header. A file that
                # is shorter or longer now than the manifest says (rewritten since the bundle was verified) ends
                # the stream without the end mark, as a cut connection would.
                handle.seek(offset)
                remaining = facts["size"] - offset
                while remaining > 0:
                    try:  # the read alone: a write's OSError (a broken pipe) means the connection went away
                        block = handle.read(min(CHUNK, remaining))
                    except OSError as exc:  # the disk failed under it (EIO): the board gets no end mark
                        changed = (name, f"reading it failed ({exc.strerror or exc})")
                        break
                    if not block:
                        break
                    proc.stdin.write(block)
                    sent += len(block)
                    remaining -= len(block)
                    if time.monotonic() - last_note > 2.0:
                        last_note = time.monotonic()
                        report.info(f"{fmt_bytes(sent)} of {fmt_bytes(total)} sent")
                now = os.fstat(handle.fileno()).st_size
            if changed is None and (remaining or now != facts["size"]):
                changed = (name, f"it is {now} bytes now, the bundle's manifest says {facts['size']}")
            if changed is not None:
                break
        else:
            current = None
            proc.stdin.write(b'{"end": true}\n')
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError, ValueError):
        pass  # the connection or the board's side went away; the exit status below says why
    returncode = proc.wait()
    for thread in readers:
        thread.join(timeout=10)
    stderr = b"".join(err)
    if changed is not None:
        name, now = changed
        raise DeployError(f"{name} in the bundle {bundle.path} changed on this machine while deploy sent it: {now}",
                          _CHANGED_FIX)
    during = f"sending {current} (after {fmt_bytes(sent)})" if current else f"sending the bundle ({fmt_bytes(sent)} written)"
    board.transport.check_connection(returncode, stderr.decode("utf-8", "replace"), during)
    answer = with_signal_note(subprocess.CompletedProcess(proc.args, returncode, b"".join(out), stderr),
                              remote=board.transport.remote)
    reply = parse_reply(answer, board.label, board.python, "receive")
    damaged = [r for r in reply["results"] if r.get("complete") and not r.get("ok")]
    # The board hashes what arrived; when this machine's copy no longer has the manifest's sha256 either, the
    # bundle changed here after it was verified, and the board and the link are not at fault.
    here = {r["name"]: _changed_here(Path(bundle.path) / r["name"], files[r["name"]]["sha256"]) for r in damaged}
    here = {name: how for name, how in here.items() if how}
    if here:
        raise DeployError("; ".join(f"{name} in the bundle {bundle.path} changed on this machine while deploy sent "
                                    f"it: {how}" for name, how in here.items()), _CHANGED_FIX)
    if damaged:
        names = ", ".join(f"{r['name']} (sha256 {r['sha256'][:16]}…, expected {files[r['name']]['sha256'][:16]}…)"
                          for r in damaged)
        raise DeployError(f"{len(damaged)} file(s) arrived damaged on {board.label}: {names}",
                          "run the deploy again: the damaged copies were discarded and the board keeps its "
                          "current release; if it repeats, check the board's storage and memory")
    if reply.get("eof") or len(reply["results"]) != len(plan.send):
        raise DeployError(f"the transfer to {board.label} stopped early ({during})",
                          "run the same deploy again: it resumes where it stopped, and the board keeps its "
                          "current release")
    return Sent(bytes=sent, seconds=time.monotonic() - began)
