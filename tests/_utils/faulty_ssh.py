"""An ssh client wrapper for deploy tests: passes everything to ``ssh`` but can break the upload.

Used as ``--ssh-command "python faulty_ssh.py MODE SSHD_PID"``; the deploy then appends its ssh
arguments. Only the command that streams the bundle (the helper's ``receive``) is touched:

- ``pass``: no fault;
- ``client:N``: forward N bytes of the upload, then SIGKILL the ssh client (exit 255);
- ``server:N``: forward N bytes, then SIGKILL the sshd processes serving the connection;
- ``flip:NAME``: flip one byte in the middle of file NAME's data (the board must notice);
- ``lose:OP:MARKER``: the helper operation OP runs on the board but its reply is lost (exit 255),
  and from then on the board is unreachable (every command exits 255; MARKER records it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests._utils.sshd import kill_sshd_sessions  # noqa: E402


def _is_upload(args: list[str]) -> bool:
    return bool(args) and " receive " in args[-1]


def _copy(src, dst, n: int, flip_at: int | None = None) -> int:
    done = 0
    while done < n:
        block = src.read(min(1 << 16, n - done))
        if not block:
            break
        if flip_at is not None and done <= flip_at < done + len(block):
            raw = bytearray(block)
            raw[flip_at - done] ^= 0xFF
            block = bytes(raw)
        dst.write(block)
        done += len(block)
    return done


def _flip(src, dst, name: str) -> None:
    """Forward the framed stream (JSON header line, then bytes) and damage one file's data."""
    while True:
        line = src.readline()
        if not line:
            return
        dst.write(line)
        header = json.loads(line)
        if header.get("end"):
            return
        n = header["size"] - header["offset"]
        _copy(src, dst, n, n // 2 if header["name"] == name else None)


def _lose_reply(mode: str, args: list[str]) -> int:
    _, op, marker = mode.split(":", 2)
    if os.path.exists(marker):
        print("ssh: connect to host 127.0.0.1: Connection refused", file=sys.stderr)
        return 255
    if not (args and f" {op} " in args[-1]):
        os.execvp("ssh", ["ssh", *args])
    subprocess.run(["ssh", *args], stdin=sys.stdin, stdout=subprocess.DEVNULL, check=False)  # done on the board
    Path(marker).touch()
    print("Connection to 127.0.0.1 closed by remote host.", file=sys.stderr)
    return 255


def main() -> int:
    mode, listener, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if mode.startswith("lose:"):
        return _lose_reply(mode, args)
    if mode == "pass" or not _is_upload(args):
        os.execvp("ssh", ["ssh", *args])
    proc = subprocess.Popen(["ssh", *args], stdin=subprocess.PIPE)
    src = sys.stdin.buffer
    kind, _, value = mode.partition(":")
    try:
        if kind == "flip":
            _flip(src, proc.stdin, value)
        else:
            _copy(src, proc.stdin, int(value))
            proc.stdin.flush()
            time.sleep(0.05)  # let the bytes reach the board before the cut
            if kind == "client":
                proc.kill()
                proc.wait()
                return 255
            kill_sshd_sessions(listener)
            return proc.wait()
        _copy(src, proc.stdin, 1 << 62)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
