"""``edgesdk deploy`` to several boards: an inventory, concurrent deploys, one summary.

Each board goes through the single-board code path (:func:`~edgesdk.deploy.orchestrate.deploy`,
:func:`~edgesdk.deploy.releases.rollback`, :func:`~edgesdk.deploy.releases.status`) in a thread of
its own: the work is ssh subprocesses, so threads overlap it. At most ``jobs`` boards run at once;
a board that fails does not stop the others (their releases are independent) unless ``fail_fast``,
which starts no board after the first failure. Every progress line carries the board's name and is
written whole, under one lock, so lines of two boards never mix.

Ctrl-C reaches the main thread only (Python delivers signals there), so the main thread stops
starting boards and raises KeyboardInterrupt in every board still running, where the single-board
interrupt handling turns it into what that board was left with. A terminal's Ctrl-C also stops the
board's ssh client (same process group), so the board's thread wakes at once; a SIGINT sent to this
process alone reaches a board's thread once its current ssh command returns.

The inventory (``--hosts FILE``) has one board per line, as ``--host`` takes it, with settings that
differ between boards after it::

    # lab boards
    nvidia@orin-1.local
    nvidia@orin-2.local:2222   remote_root=/data/edgesdk
    pi@192.168.1.40            remote_python=/usr/bin/python3.11 identity=~/.ssh/pi_fleet

``identity=`` is a key on this machine: ``~`` is the home directory, and a relative path is relative to the
inventory file, not to the directory the command runs in.
"""

from __future__ import annotations

import ctypes
import os
import posixpath
import queue
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transport import DeployError, HostSpec
from edgesdk.errors import BundleError, EdgeSDKError

INVENTORY_KEYS = ("remote_root", "remote_python", "identity")
LOCAL_PATH_KEYS = ("identity",)  # paths on this machine: resolved against the inventory file (inventory_path)
DEFAULT_JOBS = 4

OK, FAILED, INTERRUPTED, NOT_STARTED = "ok", "failed", "interrupted", "not started"
# A terminal's Ctrl-C reaches the boards' ssh clients as it reaches this process: a board whose ssh it ended can
# fail before the main thread has taken the KeyboardInterrupt. A failed board waits this long for that interrupt
# before it is reported as failed rather than interrupted.
INTERRUPT_GRACE_S = 0.5


@dataclass
class FleetBoard:
    """One board of a fleet: the host as written, the per-board settings, and where it was given."""

    host: str
    remote_root: str | None = None
    remote_python: str | None = None
    identity: str | None = None
    origin: str = "--host"  # "--host", or "FILE:LINE" for an inventory line
    inventory: Path | None = None
    label: str = ""  # the name its output lines and the summary carry (set by :func:`fleet_boards`)
    root: str = ""  # its deploy root as given: remote_root= or --remote-root (set by :func:`fleet_boards`)


def _inventory_error(path: Path, number: int, text: str, problem: str, fix: str) -> DeployError:
    return DeployError(f"--hosts {path} line {number} ({text.strip()!r}): {problem}", fix)


def _uncommented(line: str) -> str:
    """``line`` up to its comment, as a POSIX shell reads one (XCU 2.3 Token Recognition, rule 9): ``#`` starts a
    comment only where a word would start, outside quotes. ``shlex.split(comments=True)`` also ends a word at a
    ``#`` inside it and drops the rest of the line, so ``remote_root=/data/edge#2 remote_python=...`` became
    ``remote_root=/data/edge`` with no ``remote_python``, silently."""
    quote, escaped, word_starts = None, False, True
    for at, char in enumerate(line):
        if escaped:
            escaped, word_starts = False, False
        elif quote is not None:
            if char == quote:
                quote = None
            elif char == "\\" and quote == '"':
                escaped = True
        elif char.isspace():
            word_starts = True
        elif char == "#" and word_starts:
            return line[:at]
        else:
            word_starts = False
            if char == "\\":
                escaped = True
            elif char in "'\"":
                quote = char
    return line


def inventory_path(value: str, inventory: Path) -> str:
    """A path on this machine that an inventory line gives (``identity=``), as the user reads it: ``~`` is their
    home, and a relative path is relative to the inventory file (as an Ansible inventory's ``host_vars`` are), so
    the file works whatever directory the fleet runs from. (``remote_root=`` and ``remote_python=`` are paths on
    the board, which resolves them.)"""
    local = Path(value).expanduser()
    return os.path.abspath(Path(inventory).parent / local)


def read_inventory(path: Path) -> list[FleetBoard]:
    """The boards of an inventory file (see the module docstring); any line that is not one is refused with
    the file, its line number and text, before any board is touched. A UTF-8 byte order mark (what Windows
    Notepad wrote before Windows 10 1903) is no part of the first board's name."""
    from edgesdk.errors import read_utf8

    text = read_utf8(Path(path), "the inventory (--hosts)", DeployError).removeprefix("\ufeff")
    boards = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            words = shlex.split(_uncommented(line))
        except ValueError as exc:  # an unclosed quote
            raise _inventory_error(path, number, line, f"cannot be split into words ({exc})",
                                   "close the quote, or write the value without quotes") from exc
        if not words:
            continue
        host, settings = words[0], {}
        if "=" in host:
            raise _inventory_error(path, number, line, f"starts with the setting {host!r} instead of a board",
                                   "start the line with the board (USER@BOARD[:PORT] or an ssh config alias), "
                                   "then its settings, e.g. pi@192.168.1.40 remote_root=/data/edgesdk")
        try:
            HostSpec.parse(host)
        except DeployError as exc:  # HostSpec names "--host 'TEXT'"; here the line says which board
            rest = exc.problem.removeprefix(f"--host {host!r}")
            rest = rest[2:] if rest.startswith(": ") else f"the board{rest}"
            raise _inventory_error(path, number, line, rest, exc.fix or "") from exc
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if not equals:
                raise _inventory_error(path, number, line, f"{word!r} is not a KEY=VALUE setting",
                                       "put one board per line; after it only " + ", ".join(
                                           f"{k}=..." for k in INVENTORY_KEYS))
            if key not in INVENTORY_KEYS:
                raise _inventory_error(path, number, line, f"unknown setting {key!r}",
                                       f"use one of {', '.join(INVENTORY_KEYS)} (other options apply to every "
                                       "board: pass them on the command line)")
            if key in settings:
                raise _inventory_error(path, number, line, f"{key} is given twice", "keep one of them")
            if not value:
                raise _inventory_error(path, number, line, f"{key} is empty",
                                       f"give it a value, e.g. {key}=" + {"remote_root": "/data/edgesdk",
                                                                           "remote_python": "/usr/bin/python3",
                                                                           "identity": "~/.ssh/id_ed25519"}[key])
            try:
                settings[key] = inventory_path(value, Path(path)) if key in LOCAL_PATH_KEYS else value
            except RuntimeError:  # Path.expanduser: ~user of no user here, or ~ without a HOME
                raise _inventory_error(path, number, line, f"{key} {value!r} starts with a ~ whose home directory "
                                       "is not known here (no such user, or HOME unset)",
                                       f"write the key's full path, e.g. {key}=/home/pi/.ssh/id_ed25519") from None
        boards.append(FleetBoard(host=host, origin=f"{path}:{number}", inventory=Path(path), **settings))
    if not boards:
        raise DeployError(f"--hosts {path} lists no board (only comments and blank lines)",
                          "add one board per line, e.g. nvidia@orin.local")
    return boards


def same_root(root: str) -> str:
    """``root`` as the board resolves it, so that two spellings of one deploy root compare equal: ssh starts
    remote commands in the home directory, so ``~/edgesdk``, ``edgesdk`` and ``~/edgesdk/`` are one directory
    (session.open_board)."""
    if root == "~" or root.startswith("~/"):
        root = root[2:] or "."
    return posixpath.normpath(root)


def same_host(spec: HostSpec) -> HostSpec:
    """``spec`` as ssh reaches it, so that two spellings of one board compare equal: ssh connects to the host name
    lowercased (``ssh -G ORIN.local`` says ``hostname orin.local``), DNS names are case-insensitive (RFC 4343),
    and an IP address has one canonical form (``[0:0::1]`` is ``[::1]``). User names and ports stay as given: a
    user name is case-sensitive, and a board without a port may have one of its own in ~/.ssh/config. (ssh
    matches ``Host`` patterns case-sensitively, so two aliases that differ only in case could name two boards;
    such a pair is refused here, and a remote_root= of each's own tells them apart.)"""
    import ipaddress

    host = spec.host.lower()
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        pass
    return replace(spec, host=host)


def fleet_boards(hosts: tuple[str, ...], inventory: Path | None, limit: tuple[str, ...],
                 remote_root: str) -> list[FleetBoard]:
    """The boards of ``--host`` (each as given) and ``--hosts``, narrowed by ``--limit``; a board named twice
    (the same host and deploy root) is refused, naming both places."""
    boards = []
    for host in hosts:
        HostSpec.parse(host)
        boards.append(FleetBoard(host=host))
    listed = read_inventory(inventory) if inventory is not None else []
    if limit:
        if inventory is None:
            raise DeployError(f"--limit {limit[0]} picks boards of an inventory, but no --hosts FILE was given",
                              "pass --hosts FILE with it, or name the boards with --host")
    seen: dict[tuple, FleetBoard] = {}
    for board in [*boards, *listed]:
        spec = same_host(HostSpec.parse(board.host))
        root = board.remote_root or remote_root
        key = (spec, same_root(root))
        if key in seen:
            first = seen[key]
            raise DeployError(f"board {board.host} (deploy root {root}) is given twice: at {first.origin} and "
                              f"at {board.origin}",
                              "drop one of them; to deploy twice to one board, give each a remote_root= of its own")
        seen[key] = board
    twice = {b.host for b in [*boards, *listed]
             if sum(o.host == b.host for o in [*boards, *listed]) > 1}
    for board in [*boards, *listed]:
        board.root = board.remote_root or remote_root
        board.label = f"{board.host} {board.root}" if board.host in twice else board.host
    if limit:
        listed = limited(listed, limit, inventory)
    return [*boards, *listed]


def limited(listed: list[FleetBoard], limit: tuple[str, ...], inventory: Path) -> list[FleetBoard]:
    """The inventory's boards that ``--limit`` picks. A name picks a board as its line starts (every board of that
    line's host, where it has several roots), by its label or ``HOST ROOT`` (the retry line names it so where a
    --host of the run before shared its host: retry_arguments), or, where one board has it, by its host name alone
    (``orin-1.local`` for nvidia@orin-1.local:2222) or its deploy root (``/data/edgesdk``). A host name or root
    of several boards is refused naming them; a name of none, naming the boards there are."""
    picked: list[FleetBoard] = []
    for name in limit:
        exact = [b for b in listed if name in (b.host, b.label, f"{b.host} {b.root}")]
        if not exact:
            by_host = [b for b in listed if same_host(HostSpec.parse(b.host)).host == name.lower()]
            by_root = [b for b in listed if same_root(b.root) == same_root(name)] if name else []
            for what, found in (("host", by_host), ("deploy root", by_root)):
                if len(found) > 1:
                    raise DeployError(f"--limit {name} is the {what} of {len(found)} boards of {inventory}: "
                                      f"{', '.join(b.label for b in found)}",
                                      f"pass one of them as --limit takes it, e.g. --limit {shlex.quote(found[0].label)}")
            exact = by_host or by_root
        if not exact:
            raise DeployError(f"--limit {name} names no board of {inventory} (it lists "
                              f"{', '.join(b.label for b in listed)})",
                              "pass a board as its line in the inventory starts (e.g. --limit "
                              f"{shlex.quote(listed[0].label)}), its host name, or its deploy root where one board "
                              "has it")
        picked += [b for b in exact if b not in picked]
    return [b for b in listed if b in picked]


def one_service_per_board(boards: list[FleetBoard], port: int) -> None:
    """Refuse ``--service`` for a board given twice (two deploy roots of one board): a board has one unit,
    edgesdk-serve, serving one root on ``--service-port``, so the two deploys, running at once, would each write
    the unit over the other's and both report it serving, while it served one root only. The user of ``--host``
    aside: root@board and pi@board are one board, whose two units would want the same port (two ssh ports of one
    host may be two boards behind a gateway's port forwards)."""
    seen: dict[tuple, FleetBoard] = {}
    for board in boards:
        spec = same_host(HostSpec.parse(board.host))
        first = seen.setdefault((spec.host, spec.port), board)
        if first is not board:
            raise DeployError(
                f"--service installs one unit per board (edgesdk-serve, on port {port}), but the board "
                f"{replace(spec, user=None)} is given twice ({first.label} at {first.origin}, {board.label} at "
                f"{board.origin}): each deploy would write the unit over the other's, and only one of its deploy "
                "roots would be served",
                "deploy --service to one deploy root of that board (--limit picks the inventory's boards), and to "
                "the other root without --service")


def board_options(options: DeployOptions, board: FleetBoard) -> DeployOptions:
    """The single-board options for ``board``: the command line's, with the board's own settings over them."""
    ssh = replace(options.ssh, identity=board.identity) if board.identity else options.ssh
    return replace(options, host=board.host, remote_root=board.remote_root or options.remote_root,
                   remote_python=board.remote_python or options.remote_python, ssh=ssh)


@dataclass
class Outcome:
    """How one board's deploy (rollback, status) ended."""

    board: FleetBoard
    state: str = NOT_STARTED
    release: str | None = None  # the release the board is on, where known
    seconds: float | None = None
    problem: str | None = None
    fix: str | None = None
    result: dict = field(default_factory=dict)
    # the board refused what was asked (a bundle for another target, too large for its memory or disk, a bundle
    # that fails verification): the same command run again fails again until the fix its error gives is made
    refused: bool = False

    def as_json(self, keys: Iterable[str] = ()) -> dict:
        """The single-board ``--json`` object (its ``keys`` null where this board has none: a board that did not
        finish has no result) with ``host``, ``remote_root`` (the deploy root as given), ``ok``, ``state``,
        ``error``, ``fix``, ``refused``, ``release`` and ``seconds`` added, so that every board's object has the same
        keys (:func:`json_entries`); ``error`` and ``fix`` are null for a board that finished, and ``seconds`` is the
        result's own where it has one. ``refused`` tells a script which failed boards the same command fails on
        again until their error's fix is made (the summary's retry line leaves them out), as ``ok`` alone did not.
        ``host`` alone named a board given twice with two roots (pi@a remote_root=/one, pi@a remote_root=/two)
        twice: a failed one, which has no ``root`` from the board, could not be told apart."""
        result = self.result if self.state == OK else {}
        entry = {**dict.fromkeys(keys), **result, "host": self.board.host,
                 "remote_root": self.board.root or self.board.remote_root, "ok": self.state == OK,
                 "state": self.state, "error": self.problem, "fix": self.fix, "refused": self.refused,
                 "release": self.release}
        entry["seconds"] = result.get("seconds", self.seconds)
        return entry


def json_entries(outcomes: list[Outcome], keys: Iterable[str] = ()) -> list[dict]:
    """The ``--json`` list: one object per board, each with the same keys, as a script reading it expects: the
    action's result keys (``keys``, and any other a board's result has), null where a board has no such value, then
    :meth:`Outcome.as_json`'s own."""
    names = dict.fromkeys(keys)
    for outcome in outcomes:
        if outcome.state == OK:
            names.update(dict.fromkeys(outcome.result))
    return [outcome.as_json(names) for outcome in outcomes]


class Console:
    """Writes whole lines, each prefixed with its board, under one lock (stderr by default)."""

    def __init__(self, write: Callable[[str], None] | None = None):
        import click

        self._lock = threading.Lock()
        self._write = write or (lambda line: click.echo(line, err=True))

    def line(self, text: str) -> None:
        with self._lock:
            self._write(text)

    def board_writer(self, label: str) -> Callable[[str], None]:
        return lambda line: self.line(f"{label}: {line}")


def _raise_in(thread_id: int, exception: type[BaseException] | None) -> None:
    """Raise ``exception`` in the thread ``thread_id`` at its next Python instruction (None clears a pending one);
    CPython's PyThreadState_SetAsyncExc."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exception) if exception else ctypes.c_void_p(0))


class _Slot:
    """A running board: its thread, and whether a Ctrl-C may still be raised in it."""

    def __init__(self, outcome: Outcome):
        self.outcome = outcome
        self.lock = threading.Lock()
        self.armed = False
        self.interrupted = False
        self.thread_id: int | None = None

    def interrupt(self) -> None:
        with self.lock:
            if self.armed and not self.interrupted and self.thread_id is not None:
                self.interrupted = True
                _raise_in(self.thread_id, KeyboardInterrupt)

    def disarm(self) -> None:
        """No Ctrl-C is raised in this thread after this returns (one raised before is caught here)."""
        while True:
            try:
                with self.lock:
                    self.armed = False
                    _raise_in(threading.get_ident(), None)
                return
            except KeyboardInterrupt:
                continue


Work = Callable[[FleetBoard, Reporter | None, dict], tuple[dict, str | None]]

# The stages (the ``progress`` of orchestrate.deploy and releases.rollback) at which a board whose deploy or rollback
# ended without success is on a known release: nothing switched yet, or switched back after the unit did not come
# up (orchestrate.restart_unit_after_switch, undo_service), is the release it was on; switched and not switched back
# (the unit's restart failed after a rollback, a first deploy with nothing to go back to) is the one switched to.
STAGES_ON_CURRENT = (None, "switched back", "service switched back")
STAGES_ON_TARGET = ("switched", "service")


def left_on(progress: dict) -> str | None:
    """The release a board whose work ended without success was left on ("none" for no release), or None where
    that is not known: the board was not reached, or a switch (or switch back) may or may not have happened."""
    if progress.get("where") is None:
        return None
    stage = progress.get("stage")
    if stage in STAGES_ON_CURRENT:
        return progress.get("current") or RELEASE_NONE
    if stage in STAGES_ON_TARGET:  # a rollback names its release "target", a deploy "bundle_id"
        return progress.get("target") or progress.get("bundle_id")
    return None


def _attempt(slot: _Slot, work: Work, make_report: Callable[[FleetBoard], Reporter | None], console: Console,
             stopping: threading.Event, on_interrupt: Callable[[dict, BaseException], EdgeSDKError] | None) -> None:
    outcome, progress, ended = slot.outcome, {}, {}
    began = time.monotonic()
    try:
        try:
            ended["value"] = work(outcome.board, make_report(outcome.board), progress)
        except BaseException as stop:  # noqa: BLE001 - one board's failure, whatever it is, must not stop the fleet
            ended.setdefault("error", stop)
    except KeyboardInterrupt as late:  # the Ctrl-C landed as the work ended: a result that came back stands
        ended.setdefault("error", late)
    slot.disarm()
    outcome.seconds = time.monotonic() - began
    error = ended.get("error")
    if "value" not in ended and not isinstance(error, KeyboardInterrupt):
        stopping.wait(INTERRUPT_GRACE_S)  # disarmed: the main thread's interrupt() no longer raises in this thread
    if "value" in ended:
        outcome.state = OK
        outcome.result, outcome.release = ended["value"]
    elif isinstance(error, KeyboardInterrupt):  # the single-board code's Interrupted, or a bare Ctrl-C
        outcome.state, outcome.problem = INTERRUPTED, getattr(error, "problem", None) or "interrupted (Ctrl-C)"
        outcome.fix = getattr(error, "fix", None) or "run the same command again"
    elif stopping.is_set():
        # the Ctrl-C stopped this board's ssh client, which ended the work as an error before the interrupt
        # reached this thread: say what the board was left with, as the single-board Ctrl-C does
        said = on_interrupt(progress, error) if on_interrupt is not None else None
        outcome.state = INTERRUPTED
        outcome.problem = said.problem if said else getattr(error, "problem", None) or str(error)
        outcome.fix = said.fix if said else getattr(error, "fix", None)
    elif isinstance(error, EdgeSDKError):
        outcome.state, outcome.problem, outcome.fix = FAILED, error.problem, error.fix
        outcome.refused = bool(progress.get("refused")) or isinstance(error, BundleError)
    elif isinstance(error, Exception):
        outcome.state, outcome.problem = FAILED, f"{type(error).__name__}: {error}"
        outcome.fix = "this is a bug in edgesdk; report it with the output above"
    else:  # SystemExit and the like end the board's thread as they would end the command
        outcome.state, outcome.problem, outcome.fix = FAILED, f"{type(error).__name__}: {error}", None
    if outcome.state != OK:
        outcome.release = left_on(progress)
        write = console.board_writer(outcome.board.label)
        for line in f"error: {outcome.problem}".splitlines():
            write(line)
        if outcome.fix:
            write(f"  fix: {outcome.fix}")


def run_fleet(boards: list[FleetBoard], work: Work, make_report: Callable[[FleetBoard], Reporter | None],
              console: Console, jobs: int = DEFAULT_JOBS, fail_fast: bool = False,
              on_interrupt: Callable[[dict, BaseException], EdgeSDKError] | None = None
              ) -> tuple[list[Outcome], bool]:
    """Run ``work`` for every board, at most ``jobs`` at once; returns each board's outcome (in the order given)
    and whether a Ctrl-C stopped the fleet. ``work(board, report, progress)`` returns the board's JSON result
    and the release it is on; ``on_interrupt(progress, error)`` says what a board was left with when the
    Ctrl-C ended its work as an error instead of an interrupt."""
    outcomes = [Outcome(board) for board in boards]
    waiting = list(reversed(outcomes))
    done: queue.Queue[_Slot] = queue.Queue()
    running: list[_Slot] = []
    stopping, interrupted, failed = threading.Event(), False, False

    def start(slot: _Slot) -> None:
        with slot.lock:
            slot.thread_id = threading.get_ident()
            slot.armed = True
        try:
            _attempt(slot, work, make_report, console, stopping, on_interrupt)
        finally:
            done.put(slot)

    while waiting or running:
        try:
            while waiting and len(running) < jobs and not stopping.is_set() and not (fail_fast and failed):
                slot = _Slot(waiting.pop())
                running.append(slot)
                threading.Thread(target=start, args=(slot,), name=f"deploy {slot.outcome.board.label}",
                                 daemon=True).start()
            if not running:
                break
            # a timeout, not a bare wait: the kernel may deliver a Ctrl-C to a board's thread, and the main
            # thread runs Python's handler (KeyboardInterrupt) only once it wakes
            try:
                finished = done.get(timeout=0.2)
            except queue.Empty:
                continue
            running.remove(finished)
            failed = failed or finished.outcome.state != OK
        except KeyboardInterrupt:
            if not interrupted:
                interrupted = True
                stopping.set()
                console.line(f"interrupted (Ctrl-C): no further board starts; stopping {len(running)} running")
            for slot in running:
                slot.interrupt()
    return outcomes, interrupted


def _table(rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; the last column (the reason) is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        lines.append(("  " + "  ".join([*cells, row[-1]])).rstrip())
    return lines


def first_line(text: str | None) -> str:
    """The first line of a problem's text, "" for none (an exception with no message has the empty text)."""
    return next(iter((text or "").splitlines()), "")


def boards_count(count: int) -> str:
    """``1 board``, ``2 boards``."""
    return f"{count} board" + ("" if count == 1 else "s")


# what the RELEASE column of a fleet's summary says where a board is on no release it can name
RELEASE_NONE, RELEASE_UNKNOWN = "none", "-"
RELEASE_NOTE = (f"  (RELEASE {RELEASE_NONE}: the board has no current release; {RELEASE_UNKNOWN}: not known, as the "
                "board was not reached, not started, or cut off while current may have been switched)")


def deploy_changed(result: dict) -> bool:
    """Whether a deploy that succeeded changed the board: switched current, switched runtime/current alone (a
    redeploy with another edgesdk), or repaired a damaged release. A deploy of the bundle the board already ran,
    sound, changes nothing, as Ansible's recap counts a task that found its state in place as ok, not changed."""
    return bool(result.get("switched") or result.get("runtime_switched_to") or result.get("repaired"))


def summary(what: str, outcomes: list[Outcome], seconds: float,
            changed: Callable[[dict], bool] | None = None) -> list[str]:
    """The lines after a fleet run: a count, then per board its state, release, seconds and reason; a note on
    ``none`` and ``-`` in the RELEASE column where one is there. ``what`` is the action ("status"). With
    ``changed`` (whether a board's result changed it: :func:`deploy_changed`), the count says how many of the
    boards that succeeded changed (before the time: "3 of 3 boards ok (1 changed, 2 unchanged; 9.1 s)") and a
    CHANGED column says which (yes, no; - for a board that did not succeed),
    so a fleet deploy that found most boards up to date is told from one that switched them all."""
    counts = {state: sum(o.state == state for o in outcomes) for state in (OK, FAILED, INTERRUPTED, NOT_STARTED)}
    boards = boards_count(len(outcomes))
    head = f"{what} of {boards}: {counts[OK]} of {boards} ok" + "".join(
        f", {counts[state]} {state}" for state in (FAILED, INTERRUPTED, NOT_STARTED) if counts[state])
    took = f"{seconds:.1f} s"
    if changed is not None and counts[OK]:
        moved = sum(changed(o.result) for o in outcomes if o.state == OK)
        took = f"{moved} changed" + (f", {counts[OK] - moved} unchanged" if moved < counts[OK] else "") + f"; {took}"
    rows = [["BOARD", "RESULT", "RELEASE", "SECONDS", *(["CHANGED"] if changed is not None else []), ""]]
    for outcome in outcomes:
        reason = first_line(outcome.problem) if outcome.state in (FAILED, INTERRUPTED) else ""
        column = []
        if changed is not None:
            column = [("yes" if changed(outcome.result) else "no") if outcome.state == OK else "-"]
        rows.append([outcome.board.label, outcome.state, outcome.release or RELEASE_UNKNOWN,
                     f"{outcome.seconds:.1f}" if outcome.seconds is not None else "-", *column, reason])
    note = [RELEASE_NOTE] if any(row[2] in (RELEASE_NONE, RELEASE_UNKNOWN) for row in rows[1:]) else []
    return [f"{head} ({took})", *_table(rows), *note]


def status_block(outcome: Outcome, format_status: Callable[[dict], str]) -> str:
    """A board's block of a fleet's --status: the board's own (``format_status`` of its result), or, for a board
    that did not answer, its name, deploy root and what ended it, so every block names the board and the root."""
    if outcome.state == OK:
        return format_status(outcome.result)
    board = outcome.board
    label = board.label if board.label.endswith(f" {board.root}") or not board.root else f"{board.label} {board.root}"
    return f"board      {label}: {outcome.state}" + (f": {first_line(outcome.problem)}" if outcome.problem else "")


def retry_boards(outcomes: list[Outcome]) -> list[FleetBoard]:
    """The boards a retry takes: those that failed, were interrupted or never started, less those that refused
    (:func:`refused_boards`), which the same command fails on again."""
    return [o.board for o in outcomes if o.state != OK and not o.refused]


def refused_boards(outcomes: list[Outcome]) -> list[FleetBoard]:
    """The boards that refused what was asked (:attr:`Outcome.refused`): run again only after the fix each one's
    error gives (--ignore-target, a smaller bundle, free space on the board)."""
    return [o.board for o in outcomes if o.state != OK and o.refused]


def retry_arguments(boards: list[FleetBoard]) -> list[str]:
    """``--host`` for each board given so, ``--hosts FILE --limit BOARD`` for each from an inventory."""
    words: list[str] = []
    for board in boards:
        if board.inventory is None:
            words += ["--host", board.host]
    inventories = list(dict.fromkeys(b.inventory for b in boards if b.inventory is not None))
    for inventory in inventories:
        words += ["--hosts", str(inventory)]
        for board in boards:
            if board.inventory == inventory:
                words += ["--limit", board.label]
    return words
