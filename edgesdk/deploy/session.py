"""Deploy options, opening the board (ssh or local), and the steps shared by deploy and rollback."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.deploy.install import RUNTIME_MIN_PYTHON, runtime_argv
from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.service import ServiceOptions
from edgesdk.deploy.transport import DeployError, HostSpec, LocalTransport, SshOptions, SshTransport, TimedOut

DEFAULT_REMOTE_ROOT = "~/edgesdk"


@dataclass
class DeployOptions:
    """Everything ``edgesdk deploy`` takes besides the bundle."""

    host: str | None = None
    to: Path | None = None
    remote_root: str = DEFAULT_REMOTE_ROOT
    remote_root_source: str | None = None  # where remote_root came from: "--remote-root" or "remote_root= in FILE" (an
    # inventory line), even as the default path; None: nothing given, the default
    ssh: SshOptions = field(default_factory=SshOptions)
    remote_python: str | None = None  # python3 on a board, this interpreter for --to
    ignore_target: bool = False
    install: bool = True
    system_site_packages: bool | None = None  # runtime venv sees the board's packages; None: on a Jetson
    keep: int = 3
    smoke_prompt: str = "hi"
    smoke_tokens: int = 4
    smoke_timeout: float = 900.0
    service: ServiceOptions | None = None  # --service: a systemd unit serving current (deploy/service.py)

    @property
    def local(self) -> bool:
        return self.to is not None


def check_destination(options: DeployOptions) -> None:
    """Exactly one of --host and --to, and a well-formed host."""
    if (options.host is None) == (options.to is None):
        raise DeployError("deploy needs exactly one of --host user@board and --to DIR",
                          "pass --host to deploy over ssh, or --to DIR to install into a local directory")
    if options.to is not None and options.to.exists() and not options.to.is_dir():
        raise DeployError(f"--to {options.to} is a file; it must be a directory (made if missing)",
                          "pass a directory for the deploy root, e.g. --to /opt/edgesdk")
    if options.host is not None:
        HostSpec.parse(options.host)


def open_board(options: DeployOptions) -> Board:
    """The deploy root on the board (``--host``) or in a local directory (``--to``)."""
    check_destination(options)
    if options.local:
        root = str(Path(options.to).expanduser().resolve())
        python = os.path.expanduser(options.remote_python) if options.remote_python else sys.executable
        return Board(LocalTransport(root), python, root)
    python = options.remote_python or "python3"
    if python.startswith("~/"):
        # Every argument reaches the board's shell quoted (transport.remote_command), and a quoted ~ is not
        # expanded (POSIX 2.6.1), so remote_python=~/venv/bin/python3 of an inventory (where no local shell
        # expanded it) named no program. ssh starts remote commands in the home directory, as for --remote-root.
        python = "./" + python[2:]
    root = options.remote_root
    if root.startswith("~/"):
        # ssh starts remote commands in the home directory; ~//x is ~/x, as a shell expands it, not /x
        root = root[2:].lstrip("/") or "."
    elif root == "~":
        root = "."
    if not root:
        raise DeployError("--remote-root is empty", "pass a directory on the board, e.g. --remote-root ~/edgesdk")
    return Board(SshTransport(HostSpec.parse(options.host), options.ssh), python, root)


def probe(board: Board, params: dict | None = None) -> BoardFacts:
    """Ask the board what it is and holds; afterwards ``board.root`` is absolute."""
    facts = BoardFacts.from_probe(board.call("probe", params or {}, timeout=900))
    board.root = facts.root
    return facts


def board_edgesdk(board: Board, facts: BoardFacts, local: bool) -> list[str]:
    """How to start edgesdk on the board: the deployed runtime, else an edgesdk on its PATH."""
    runtime = facts.raw.get("runtime") or {}
    if local or runtime.get("stamp"):
        return runtime_argv(board, local)
    if runtime.get("edgesdk_on_path"):
        return [runtime["edgesdk_on_path"]]
    fix = "deploy without --no-install: it installs the runtime into the deploy root"
    if tuple(facts.python_version[:2]) < RUNTIME_MIN_PYTHON:  # the install that fix runs refuses this Python
        need = ".".join(map(str, RUNTIME_MIN_PYTHON))
        fix = (f"install Python >= {need} on the board (its Python {'.'.join(map(str, facts.python_version))} is "
               f"older than edgesdk needs), then deploy without --no-install and with --remote-python "
               f"/path/to/python{need}: it installs the runtime into the deploy root")
    raise DeployError(f"{board.label} has no edgesdk: no runtime under {board.path('runtime')} and no "
                      "'edgesdk' on the PATH of ssh sessions", fix)


def run_argv(edgesdk: list[str], release: str, options: DeployOptions) -> list[str]:
    """``edgesdk run RELEASE`` as the board runs it (with --ignore-target when the deploy had it: run
    refuses another board's bundle)."""
    return [*edgesdk, "run", release, *(["--ignore-target"] if options.ignore_target else [])]


SMOKE_FIX = "the board keeps its current release; {what} and deploy again"
STDERR_TAIL_LINES = 10


def smoke_test(board: Board, edgesdk: list[str], release: str, options: DeployOptions, report: Reporter,
               fix: str = SMOKE_FIX) -> str:
    """``edgesdk run RELEASE --prompt hi -n 4 --raw --stats`` on the board; returns the generated text. ``fix`` is
    what a failed run's error says to do (a deploy's, or a rollback's), with ``{what}`` where what to do about the
    run itself goes: a run that failed printed why, one that exited 0 with no text did not. ``--stats`` has the run
    say which backend it opened and why each one before it in the bundle's chain did not: a Jetson without TensorRT
    runs the bundle on the CPU, and a deploy that said only "generated" looked as good as one on the GPU (llama.cpp
    says how many layers it offloaded, ``ollama ps`` "100% GPU"). That is said, as a warning: the model runs."""
    argv = [*run_argv(edgesdk, release, options), "--prompt", options.smoke_prompt, "-n", str(options.smoke_tokens),
            "--raw", "--stats"]
    try:
        proc = board.transport.run(argv, timeout=options.smoke_timeout, what="the smoke test")
    except TimedOut as exc:
        raise TimedOut(exc.what, board.label, exc.seconds,
                       "the board keeps its current release; check its load and free memory (a bundle larger than "
                       "the free RAM swaps), or give the smoke test longer with --smoke-timeout SECONDS") from exc
    text = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0 or not text.strip():
        tail = stderr_tail(proc.stderr.decode("utf-8", "replace"))
        if proc.returncode != 0:
            why, none, what = f"exit {proc.returncode}", "(no output)", "fix the problem shown above"
        else:  # a run that exited 0 failed by generating no text: its stderr (warnings, if any) is not why
            why, none = f"exit 0, but it generated no text: its output was {text!r}", "(nothing on stderr)"
            what = "run the command quoted above on the board and see why the model answers nothing"
        # the command as it ran (its edgesdk, --ignore-target, --raw), quoted so it can be pasted on the board
        raise DeployError(f"the smoke test failed on {board.label} ({why}): "
                          f"{shlex.join(argv)}\n    " + "\n    ".join(tail or [none]), fix.replace("{what}", what))
    used, skipped = backend_used(proc.stderr.decode("utf-8", "replace"))
    report.info(f"generated {text.strip()!r}" + (f" on backend {used}" if used else ""))
    if used and skipped:
        first = skipped[0].partition(": ")[0]
        report.info(f"warning: the model runs on {used}, not on {first}, the bundle's first backend "
                    f"({'; '.join(skipped)}); the deploy goes on, as the model runs, but to run it on {first} fix "
                    "what stops it and deploy again")
    return text


# What ``edgesdk run --stats`` says on stderr about the backends of the bundle's chain, in its order: each one that
# did not open as "edgesdk: NAME: REASON", then the one that did as "edgesdk: NAME: used" (runtime/session.py
# open_runtime). Without --stats a run says only a fallback, as "edgesdk: backend NAME (NAME: REASON; ...)".
_BACKEND_NOTE = re.compile(r"edgesdk: ([A-Za-z0-9_.-]+): (.+)")
_FALLBACK_LINE = re.compile(r"edgesdk: backend ([A-Za-z0-9_.-]+) \((.+)\)")
_NOT_BACKENDS = ("warning", "error", "note", "fix")


def backend_used(stderr: str) -> tuple[str | None, list[str]]:
    """(the backend a run opened, ``"NAME: REASON"`` for each backend of the chain before it that did not open) from
    the run's stderr; (None, []) where it names none (a board edgesdk that does not say it). The notes of the chain
    come in one block that ends with the one used, so those right above it are the backends skipped. A line that
    does not start with "edgesdk: " inside the block continues the note above it (a refusal spanning lines, as an
    edgesdk that printed a loader's message whole wrote it): it is joined to it, not taken for the block's end."""
    lines = [line.strip() for line in stderr.splitlines()]
    for index in range(len(lines) - 1, -1, -1):
        note = _BACKEND_NOTE.fullmatch(lines[index])
        if note and note[2] == "used" and note[1] not in _NOT_BACKENDS:
            skipped: list[str] = []
            continued: list[str] = []  # lines under the note above them, read bottom up
            for line in reversed(lines[:index]):
                if not line.startswith("edgesdk: "):
                    if line:
                        continued.insert(0, line)
                    continue
                before = _BACKEND_NOTE.fullmatch(line)
                if before is None or before[1] in _NOT_BACKENDS or before[2] == "used":
                    break
                skipped.insert(0, " ".join([f"{before[1]}: {before[2]}", *continued]))
                continued = []
            return note[1], skipped
    for index in range(len(lines) - 1, -1, -1):
        if not lines[index].startswith("edgesdk: backend "):
            continue
        joined = lines[index]
        for line in [*lines[index + 1:], None]:  # the reasons in its parentheses may span lines too
            fallback = _FALLBACK_LINE.fullmatch(joined)
            if fallback:
                return fallback[1], [fallback[2]]
            if line is None or line.startswith("edgesdk: "):
                break
            joined = f"{joined} {line}" if line else joined
    return None, []


def stderr_tail(stderr: str, lines: int = STDERR_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a failed command's stderr, led by its ``error:`` headline where the tail
    cut it off: edgesdk prints its error first and the list under it after (one line for each initializer of a
    bundle whose weights do not match, hundreds for a real model), so the tail alone showed the list without
    the error it belongs to."""
    every = stderr.strip().splitlines()
    tail = every[-lines:]
    cut = every[:-lines]
    if any(line.startswith("error:") for line in tail):  # the tail has its headline: an earlier one is another's
        return tail
    headline = next((i for i in range(len(cut) - 1, -1, -1) if cut[i].startswith("error:")), None)
    if headline is None:
        return tail
    skipped = len(every) - len(tail) - headline - 1
    return [cut[headline], *([f"  ... ({skipped} more lines)"] if skipped else []), *tail]


def unpack_if_archive(path: Path, stack) -> Path:
    """A bundle archive is unpacked into a temporary directory first: a file named as one (.tar, a compressed
    tar such as .tar.gz / .tgz, .tar.bz2, .tar.xz, or a format edgesdk cannot read such as .tar.zst, which
    'edgesdk unpack' then names with the command that decompresses it), or any file that is a tar archive
    or starts as a compressed one ('edgesdk pack' writes a plain tar under any other name). Any other file
    is refused by name, as is one that cannot be read, with :class:`BundleError` (exit 5): the bundle is wrong,
    whatever command was given it (deploy, a fleet, verify), and no board was contacted; a directory is returned as
    it is."""
    from edgesdk.bundle import (
        COMPRESSED_SUFFIXES,
        SUPPORTED_ARCHIVES,
        UNREADABLE_MAGIC,
        UNSUPPORTED_SUFFIXES,
        model_not_bundle,
        unpack_bundle,
    )
    from edgesdk.errors import BundleError

    if not path.is_file():
        return path
    archive = path.name.lower().endswith((".tar", *COMPRESSED_SUFFIXES, *UNSUPPORTED_SUFFIXES))
    if not archive:
        try:
            with open(path, "rb") as file:
                head = file.read(8)
            archive = tarfile.is_tarfile(path) or any(head.startswith(magic) for magic, _, _ in UNREADABLE_MAGIC)
        except OSError as exc:
            raise BundleError(f"cannot read the bundle archive {path} ({exc.strerror or exc})",
                              "check that the file is readable, or pass the bundle directory") from exc
    if not archive:
        model = model_not_bundle(path)  # a GGUF file, which 'edgesdk build' takes
        if model is not None:
            raise model
        raise BundleError(f"{path} is a file, but neither a bundle directory nor a bundle archive (not a tar "
                          f"archive; deploy reads {SUPPORTED_ARCHIVES} from 'edgesdk pack')",
                          "pass the bundle directory 'edgesdk build' wrote, or its archive from 'edgesdk pack'")
    tmp = Path(tempfile.mkdtemp(prefix="edgesdk-deploy-"))
    stack.callback(shutil.rmtree, tmp, ignore_errors=True)
    return unpack_bundle(path, tmp).path
