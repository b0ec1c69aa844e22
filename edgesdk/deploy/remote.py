"""Calls into the board-side helper (``board_*.py``) over a transport.

The helper travels inside the ``-c`` argument of the board's Python, zlib-compressed and base64
encoded (no quote or backslash in it, so any POSIX login shell passes it through unchanged);
its parameters travel as one JSON argument. Both are quoted by the transport like any argument.
"""

from __future__ import annotations

import base64
import json
import subprocess
import zlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from edgesdk.deploy.transport import DeployError, Transport

BOARD_PARTS = ("board_common.py", "board_transfer.py", "board_install.py", "board_service.py", "board_ops.py")


# The first statements of the boot code, in syntax every Python reads (2.7 too): an interpreter too old
# to compile the helper answers with the helper's JSON refusal instead of a SyntaxError traceback.
HELPER_MIN_PYTHON = (3, 8)  # board_common.py: the helper is written for Python >= 3.8
_MIN_TEXT = ".".join(map(str, HELPER_MIN_PYTHON))
_VERSION_GATE = (
    f"import sys,json,platform;sys.version_info>={HELPER_MIN_PYTHON!r} or (sys.stdout.write(json.dumps({{'ok':False,"
    f"'error':'the board Python %s (%s) is too old to run the deploy helper, which needs Python >= {_MIN_TEXT}; "
    "edgesdk itself needs >= 3.10' % (platform.python_version(),sys.executable),'fix':'install Python >= 3.10 on "
    "the board and pass --remote-python /path/to/python3.10'})+chr(10)),sys.exit(3));")


@lru_cache(maxsize=1)
def boot_code() -> str:
    """``python -c`` text that runs the board helper (its parts concatenated) with the arguments after it."""
    package = resources.files("edgesdk.deploy")
    source = b"\n".join(package.joinpath(part).read_bytes() for part in BOARD_PARTS)
    packed = base64.b64encode(zlib.compress(source, 9)).decode("ascii")
    return (f"BOARD_BUNDLED=1;{_VERSION_GATE}import base64,zlib;exec(compile(zlib.decompress(base64.b64decode("
            f"'{packed}')),'edgesdk-deploy-helper','exec'))")


class BoardRefusal(DeployError):
    """The board answered, so what the operation did is known: the helper refused (in its own words),
    or the board's Python could not be started (it did nothing). As against a command whose answer
    never came back (ssh lost, a deadline, a helper killed mid-way)."""


def parse_reply(proc: subprocess.CompletedProcess | tuple[int, bytes, bytes], label: str, python: str,
                op: str) -> dict:
    """The helper's JSON answer, or a DeployError naming what went wrong on the board."""
    if isinstance(proc, tuple):
        returncode, stdout, stderr = proc
    else:
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    out = stdout.decode("utf-8", "replace")
    err = stderr.decode("utf-8", "replace").strip()
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                break
            if reply.get("ok"):
                return reply
            raise BoardRefusal(reply.get("error", "the board refused"), reply.get("fix"))
    # 127 / 126: the shell (or timeout) did not find the Python or could not execute it. Its words alone do not
    # tell: a login shell without the client's locale prints 'No such file or directory' before every command.
    if returncode in (126, 127):
        raise BoardRefusal(f"{python!r} cannot be started on {label}: {err[-300:] or f'exit {returncode}'}",
                          "install Python 3 on the board (edgesdk needs >= 3.10), or pass --remote-python PATH")
    # stderr first (a traceback); where it is empty, what the command printed on stdout (a wrapper's own words, a
    # reply cut short) is the only account of the failure, not "no output"
    said = err or out.strip()
    tail = "\n    ".join(said.splitlines()[-8:]) or "(no output)"
    raise DeployError(f"the deploy helper ({op}) failed on {label} with exit {returncode}:\n    {tail}",
                      "check the board's free space and permissions under the deploy root, then run it again")


@dataclass
class Board:
    """The deploy root on one board, reached through a transport with the board's Python."""

    transport: Transport
    python: str
    root: str

    @property
    def label(self) -> str:
        return self.transport.label

    def helper_argv(self, op: str, params: dict) -> list[str]:
        return [self.python, "-c", boot_code(), op, json.dumps({"root": self.root, **params})]

    def call(self, op: str, params: dict | None = None, stdin: bytes | None = None,
             timeout: float | None = 600, hold_stdin: bool = False) -> dict:
        """Run one helper operation to completion and return its reply (``hold_stdin``: Transport.run's)."""
        proc = self.transport.run(self.helper_argv(op, params or {}), input=stdin, timeout=timeout,
                                  what=f"the deploy helper ({op})", **({"hold_stdin": True} if hold_stdin else {}))
        return parse_reply(proc, self.label, self.python, op)

    def start(self, op: str, params: dict) -> subprocess.Popen:
        """Start a helper operation that reads a stream on stdin (see transfer.py)."""
        return self.transport.popen(self.helper_argv(op, params))

    def path(self, *parts: str) -> str:
        """A path under the deploy root (absolute once probe has resolved the root)."""
        return "/".join([self.root.rstrip("/"), *parts])
