"""``edgesdk deploy --status`` and ``--rollback``: what the board holds, and going back one release."""

from __future__ import annotations

import contextlib
import datetime as _dt
import shlex

from edgesdk.deploy import install
from edgesdk.deploy.board_common import STATE_KEYS
from edgesdk.deploy.orchestrate import Interrupted
from edgesdk.deploy.remote import BoardRefusal
from edgesdk.deploy.report import Reporter, fmt_bytes
from edgesdk.deploy.service import restart_service
from edgesdk.deploy.session import (
    DEFAULT_REMOTE_ROOT,
    DeployOptions,
    board_edgesdk,
    open_board,
    probe,
    smoke_test,
)
from edgesdk.deploy.transport import DeployError

# the keys of a status() and of a rollback(), each always there (None where the board has nothing to say): a
# fleet's --json gives them, null, to a board that did not finish
STATUS_KEYS = ("where", "root", "root_exists", "board", "suggested_target", "runtime", "edgesdk_on_path", "service",
               *STATE_KEYS)
ROLLBACK_KEYS = ("where", "root", "from", "to", "runtime_from", "runtime", "seconds")


def status(options: DeployOptions) -> dict:
    """The board, its runtime, ``current``, ``previous`` and every release (JSON-friendly). A deploy root that does
    not exist is a state, shown as such ("root_exists" false; :func:`format_status` says nothing was deployed
    there), not an empty root: a mistyped --to or --remote-root read as "releases 0". A status is a question
    asked, so it is not refused (scripts and a fleet ask it of boards not deployed to yet); a rollback there is
    (:func:`require_root`)."""
    board = open_board(options)
    try:
        facts = probe(board, {"service": True})  # the unit deploy --service installed, too (board_ops.service_facts)
    finally:
        board.transport.close()
    runtime = facts.raw.get("runtime") or {}
    state = dict(facts.state)
    if isinstance(state.get("releases"), list):
        state["releases"] = [last_used(release) for release in state["releases"]]
    return {**dict.fromkeys(STATUS_KEYS),  # a board's state names current_problem and last_switch only if any
            "where": board.label, "root": facts.root, "root_exists": facts.raw.get("root_exists") is not False,
            "board": facts.describe(),
            "suggested_target": facts.board.suggested_target, "runtime": runtime.get("stamp"),
            "edgesdk_on_path": runtime.get("edgesdk_on_path"), "service": facts.raw.get("service"), **state}


def last_used(release: dict) -> dict:
    """A release of the board's list with ``last_used``, what its ``mtime`` holds: the time it last became current
    (history.jsonl), or that of its directory where that is later (its install, for a release never current
    since), so after a rollback the release rolled back to shows the rollback's time, not its install's. --keep
    keeps the releases current most recently (board_ops.op_prune), and ``releases`` lists them in that order,
    oldest first. ``mtime`` stays, for the scripts that read it."""
    return {**release, "last_used": release.get("mtime")} if isinstance(release, dict) else release


def require_root(board, facts, options: DeployOptions) -> None:
    """Refuse a rollback in a deploy root that does not exist: it read as one with "no previous release", so a
    mistyped --to or --remote-root went unnoticed. Only a deploy of a bundle makes the root."""
    if facts.raw.get("root_exists") is not False:
        return
    if options.local:
        where, source = facts.root, "--to"
    else:
        where = f"{facts.root} on {board.label}"
        source = options.remote_root_source or (None if options.remote_root == DEFAULT_REMOTE_ROOT else "--remote-root")
    given, check = source, f"check the path of {source} for a typo (pass the root a deploy used)"
    if source is None:  # no --remote-root nor remote_root=: nothing to mistype
        given = f"the default {DEFAULT_REMOTE_ROOT}: no --remote-root given"
        check = "pass --remote-root with the root a deploy used"
    raise DeployError(f"the deploy root {where} ({given}) does not exist: nothing was deployed there",
                      f"{check}, or deploy a bundle there first: a deploy makes the directory")


def switched_line(last: dict | None) -> list[str]:
    """The last switch of ``current`` (history.jsonl's last line): a deploy switched back after its service
    did not come up reads "rollback after a failed deploy"."""
    if not last:
        return []
    try:
        when = _dt.datetime.fromtimestamp(float(last["time"])).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        when = "?"
    return [f"switched   {when} {last.get('action') or 'switch'}: {last.get('from') or 'none'} -> {last['to']}"]


def lock_line(lock: dict | None) -> list[str]:
    """The deploy lock (board_common.lock_state): held by a deploy running now, or left by one that ended without
    releasing it (killed), which holds nothing any more."""
    if not isinstance(lock, dict):
        return []
    holder = f"process {lock['holder']}" if lock.get("holder") else "a process that wrote no id"
    if lock.get("held"):
        return [f"lock       held by a deploy running now ({holder}): another deploy, rollback or prune waits for "
                "it to finish"]
    return [f"lock       .deploy.lock names {holder}, which ended without releasing it (a deploy killed, or the "
            "board lost power): no deploy holds it; the next one takes it as it is"]


def unfinished_lines(info: dict) -> list[str]:
    """The runtimes an install has not finished (no stamp) and the deploy lock: what a deploy killed during its
    runtime install leaves, or what one running now is installing."""
    lock = info.get("lock")
    running = isinstance(lock, dict) and lock.get("held")
    lines = [f"unfinished runtime/{key} (no edgesdk-runtime.json): "
             + ("being installed by the deploy holding the lock, or " if running else "")
             + "left by an install cut short; the next deploy of that runtime installs it again, and a switch to "
             "another runtime removes it" for key in info.get("unfinished_runtimes") or []]
    return lines + lock_line(lock)


def runtime_line(stamp: dict | None) -> str:
    """--status's runtime: the key runtime/current's edgesdk-runtime.json names. A stamp that names none (edited or
    written by hand: an install always writes the key) is said to be so; its KeyError ended --status with a
    traceback."""
    if not stamp:
        return "none installed by deploy"
    key = stamp.get("key")
    if isinstance(key, str) and key:
        return key
    return (f"unknown: runtime/current's edgesdk-runtime.json names no key (got {key!r:.60}), so it was not written by "
            "a deploy's install; the next deploy installs its own runtime and switches runtime/current to it")


def service_lines(service: dict | None, current: str | None) -> list[str]:
    """--status's service: the unit a ``deploy --service`` installed (board_ops.service_facts), as ``systemctl
    status`` and ``ollama ps`` say it: whether systemd has it enabled and running, its port, and what the server
    there answers (the model and backend on its /health, and the release it loaded). Before, --status said nothing
    of it: a server killed by hand read the same as one serving."""
    if not isinstance(service, dict):
        return ["service    none installed by deploy --service"]
    name, scope = service.get("name") or "edgesdk-serve", service.get("scope") or "?"
    url = service.get("health_url") or "?"
    if not service.get("unit_exists"):
        return [f"service    {name}: its {scope} unit {service.get('unit')} is gone (removed by hand?); deploy with "
                "--service again to install it"]
    if service.get("systemd"):
        states = f"no answer from systemd: {service['systemd']}"
    else:
        states = f"{service.get('enabled') or '?'}, {service.get('active') or '?'}"
    lines = [f"service    {name} ({scope} unit, {states}), /health {url}"]
    if service.get("serves_root") is False:
        lines.append("  the unit no longer serves this root's current: a deploy --service into another root rewrote "
                     "it")
    health = service.get("health") or {}
    if health.get("ok"):
        lines.append(f"  serving  model {health.get('model') or '?'} on the {health.get('backend') or '?'} backend"
                     + release_words(service.get("server"), current))
    else:
        restart = "systemctl " + ("--user " if scope == "user" else "") + f"restart {name}"
        lines.append(f"  serving  nothing: /health does not answer ({health.get('error') or 'no answer'}); the "
                     f"journal says why (journalctl {'--user-unit' if scope == 'user' else '-u'} {name}), and "
                     f"'{restart}' on the board starts it again")
    return lines


def release_words(server: dict | None, current: str | None) -> str:
    """Which release the server on the unit's port serves (board_ops.server_facts), said against current. Its
    /health names the bundle it loaded, and so the release; a bundle no release here holds is said as such (a
    release removed since it loaded, or a server of another bundle). A server older than bundle_id in /health is
    told by when it started against the switches, which a clock step can fool: the line says so. Either way, a
    server serving a release current has left started before current switched and was not restarted."""
    if not isinstance(server, dict):
        return ""
    if server.get("release_from") == "health" and server.get("bundle_id") and not server.get("release"):
        return (f", serves bundle {server['bundle_id']}, which is not a release here; restart the unit to serve "
                f"current ({current or 'none'})")
    if not server.get("release"):
        return ""
    if server.get("serves_current") is False:
        return f" (process {server.get('pid')}: not a server of this root's current)"
    guessed = ("told by its start time, as its /health names no bundle_id (an older edgesdk serve)"
               if server.get("release_from") == "start time" else "")
    if server["release"] == current:
        return f", release {server['release']} (current{'; ' + guessed if guessed else ''})"
    return (f", release {server['release']}{' (' + guessed + ')' if guessed else ''}: it started before current "
            f"switched to {current or 'none'}, so it does not serve current; restart the unit")


# the header of --status's table of releases, as its JSON names them: "last_used" (see last_used())
RELEASE_COLUMNS = (" ", "id", "target", "size", "last used")
RELEASES_ORDER = (" (* current; last used: when it last became current, or was installed where that is later; "
                  "--keep keeps the most recently used)")


def format_status(info: dict) -> str:
    """Human-readable ``--status``."""
    lines = [f"board      {info['where']} ({info['board']})",
             f"root       {info['root']}" + ("" if info.get("root_exists", True) else
                                             " (does not exist: nothing was deployed there)"),
             f"runtime    {runtime_line(info['runtime'])}",
             *unfinished_lines(info),
             f"current    {info['current'] or 'none'}"
             + (f" ({info['current_problem']})" if info.get("current_problem") else ""),
             f"previous   {info['previous'] or 'none'}" + (
                 " (removed: no such release here)" if info["previous"] and info["previous"] not in
                 {r["id"] for r in info["releases"]} else ""),
             *switched_line(info.get("last_switch")),
             *service_lines(info.get("service"), info["current"]),
             f"releases   {len(info['releases'])}" + (RELEASES_ORDER if info["releases"] else "")]
    rows = []
    for release in reversed(info["releases"]):
        mark = "*" if release["id"] == info["current"] else " "
        try:
            when = _dt.datetime.fromtimestamp(release.get("last_used", release.get("mtime"))).strftime(
                "%Y-%m-%d %H:%M:%S")
        except (TypeError, ValueError, OverflowError, OSError):
            when = "?"
        size = fmt_bytes(release["bytes"]) if release.get("bytes") is not None else "?"
        target = str(release.get("target") or "?")  # a hand-written manifest may hold any JSON value there
        rows.append((mark, str(release["id"]), target, size, when))
    if rows:
        wide = [max(len(row[column]) for row in [RELEASE_COLUMNS, *rows]) for column in range(1, 4)]
        for mark, name, target, size, when in [RELEASE_COLUMNS, *rows]:
            lines.append(f"  {mark} {name:<{wide[0]}}  {target:<{wide[1]}}  {size:>{wide[2]}}  {when}".rstrip())
    if info["staging"]:
        lines.append(f"staging    {', '.join(info['staging'])} (unfinished transfers: a deploy of the same bundle "
                     "resumes one; the first deploy more than a day after one was last written removes it)")
    return "\n".join(lines)


def rollback(options: DeployOptions, release: str | None = None, report: Reporter | None = None,
             progress: dict | None = None) -> dict:
    """Switch ``current`` back to ``previous`` (or to ``release``) after verifying and smoke-testing it. A Ctrl-C
    comes out as :class:`~edgesdk.deploy.orchestrate.Interrupted`, saying what the board was left with.
    ``progress`` (filled in as it goes: the board, its current release, the stage) is for the caller."""
    report = report or Reporter(total=4, prefix="rollback")
    progress = {} if progress is None else progress
    try:
        return _rollback(options, release, report, progress)
    except Interrupted:
        raise
    except KeyboardInterrupt as stop:
        where, stage = progress.get("where"), progress.get("stage")
        was = f"releases/{progress['current']}" if progress.get("current") else "no current release"
        if where is None:
            raise Interrupted("rollback interrupted (Ctrl-C) before it changed anything on the board",
                              "run the same command again") from stop
        if stage == "switch":
            target = progress["target"]
            raise Interrupted(f"rollback interrupted (Ctrl-C) while switching current on {where}: current may "
                              f"already point to releases/{target} or still to {was}",
                              "'edgesdk deploy --status' shows which; if it did not switch, run 'edgesdk deploy "
                              f"--rollback --release {target}'") from stop
        if stage == "switched":
            raise Interrupted(f"rollback interrupted (Ctrl-C) after switching {where} to releases/{progress['target']} "
                              f"(was {was}): a unit deploy --service installed may not have been restarted",
                              "restart it on the board (systemctl restart edgesdk-serve, --user for a user "
                              "unit); without --service there is nothing left to do") from stop
        kept = f"keeps {was} as current" if progress.get("current") else "still has no current release"
        raise Interrupted(f"rollback interrupted (Ctrl-C): {where} {kept}",
                          "run the same command again") from stop


def _rollback(options: DeployOptions, release: str | None, report: Reporter, progress: dict) -> dict:
    board = open_board(options)
    with contextlib.ExitStack() as stack:
        stack.callback(board.transport.close)
        # a refusal of the release to switch to fails this step: after a "done" line it read as a finished rollback
        with report.step(f"probe {board.label} and choose the release"):
            facts = probe(board)
            require_root(board, facts, options)
            release = resolve_release(board.label, facts, release)
            current, target = facts.state.get("current"), release or facts.state.get("previous")
            report.info(f"current {current or 'none'}, previous {facts.state.get('previous') or 'none'}")
            progress.update(where=board.label, current=current, target=target)
            held = choose_release(board.label, facts, release, current, target)
        with report.step(f"verify releases/{target} on the board"):
            verified = board.call("verify", {"bundle_id": target})
            if verified["problems"]:
                raise DeployError(f"releases/{target} on {board.label} fails verification:\n  - "
                                  + "\n  - ".join(verified["problems"]),
                                  verify_fix(board, target, verified, current, held))
        runtime_key = paired_runtime(facts, target, options, report)
        with report.step(f"smoke test: edgesdk run releases/{target}"):
            edgesdk = install.runtime_argv(board, False, runtime_key) if runtime_key else \
                board_edgesdk(board, facts, options.local)
            kept = f"current stays releases/{current}" if current else "the board still has no current release"
            smoke_test(board, edgesdk, board.path("releases", target), options, report,
                       f"{kept}: nothing was switched; {{what}} and roll back again, or roll back "
                       "to another release with 'edgesdk deploy --rollback --release ID' ('edgesdk deploy --status' "
                       "lists them)")
        with report.step("switch current"):
            progress["stage"] = "switch"
            try:
                switched = board.call("switch", {"bundle_id": target, "action": "rollback",
                                                 **({"runtime_key": runtime_key} if runtime_key else {})})
            except BoardRefusal:
                raise  # the board answered: the switch did not happen (op_switch is all or nothing)
            except DeployError as lost:
                # No answer: the switch may have happened before its reply was lost. Then current is the
                # target and previous the release it left, so the same --rollback would go back to that one.
                was = f"releases/{current}" if current else "no release"
                raise DeployError(
                    f"{lost.problem}\nthe board's reply to the switch did not come back, so current may "
                    f"already point to releases/{target} (smoke-tested) or still to {was}",
                    "once the board answers, 'edgesdk deploy --status' shows which; if the switch did not "
                    f"happen, run 'edgesdk deploy --rollback --release {target}' (not a plain --rollback, "
                    f"which after a switch that did happen goes back to {was}); if it did, restart the "
                    "unit that deploy --service installed (systemctl restart edgesdk-serve, --user for a "
                    "user unit)"
                ) from lost
            progress["stage"] = "switched"
            report.info(f"current -> releases/{target} (was {switched['from'] or 'none'})")
            if runtime_key and switched.get("runtime_from") != runtime_key:
                report.info(f"runtime/current -> {runtime_key} (was {switched.get('runtime_from') or 'none'})")
            restarted = restart_service(board)  # a unit deploy --service installed serves current
            if restarted:
                report.info(restarted)
    return {"where": board.label, "root": board.root, "from": switched["from"], "to": target,
            "runtime_from": switched.get("runtime_from") if runtime_key else None, "runtime": runtime_key,
            "seconds": report.elapsed()}


def resolve_release(where: str, facts, release: str | None, flag: str = "--release") -> str | None:
    """The release ``--release`` (or ``flag``: --remove) names: an id the board holds, else the one release whose id
    starts with it (a bundle id shortened, as git and docker take an object's id); a prefix of several is refused
    naming them, as is one of none, naming the releases there are. None stays None (previous)."""
    if release is None:
        return None
    held = [r["id"] for r in reversed(facts.state.get("releases") or [])]  # newest first
    if release in held:
        return release
    matches = [name for name in held if release and name.startswith(release)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise DeployError(f"{flag} {release!r} is the start of {len(matches)} releases on {where}: "
                          f"{', '.join(matches)}", "pass more of the id, so that it names one of them")
    there = f"it holds {', '.join(held)}" if held else "it holds no release"
    raise DeployError(f"{flag} {release!r} is not a release on {where} ({there})",
                      "pass one of those ids (or the start of one); 'edgesdk deploy --status' lists them")


# the keys of remove()'s result, in --remove --json's order (as STATUS_KEYS are status()'s)
REMOVE_KEYS = ("where", "root", "removed", "was_previous", "runtime_removed", "failed")


def remove(options: DeployOptions, release: str, warn=None) -> dict:
    """``deploy --remove ID``: remove one release the board holds (``release``, an id or the unique start of one),
    with its engines and the runtime only it ran with, through the board's prune (board_ops.remove_release), as
    ``ollama rm`` and ``docker image rm`` remove one image. Current is refused: the board would serve nothing and
    a rollback could not go back to it. Previous goes, with a warning (``warn``: a callable taking the line) that
    --rollback then has no release to go back to."""
    board = open_board(options)
    with contextlib.ExitStack() as stack:
        stack.callback(board.transport.close)
        facts = probe(board)
        require_root(board, facts, options)
        target = resolve_release(board.label, facts, release, "--remove")
        current, previous = facts.state.get("current"), facts.state.get("previous")
        if target == current:
            others = [r["id"] for r in reversed(facts.state.get("releases") or []) if r["id"] != target]
            back = f" (to {previous})" if previous in others else ""
            raise DeployError(f"release {target} is current on {board.label}, so it is not removed: the board would "
                              "have no release to run",
                              f"switch current away first, with 'edgesdk deploy --rollback'{back} or a deploy of "
                              "another bundle, then remove it")
        if target == previous and warn is not None:
            others = len(facts.state.get("releases") or []) > 2  # another besides current and this one
            warn(f"warning: releases/{target} is previous on {board.label}: once it is removed, 'edgesdk deploy "
                 "--rollback' has no release to go back to" + (" (--rollback --release ID still goes to another one "
                                                               "'edgesdk deploy --status' lists)" if others else ""))
        done = board.call("prune", {"keep": options.keep, "remove": target})
    if not done["removed"]:
        failed = done["failed"][0]
        raise DeployError(f"releases/{target} on {board.label} could not be removed ({failed['error']})",
                          f"remove it by hand on the board, rm -rf {shlex.quote(failed['path'])} (with sudo where "
                          "another user owns its files)")
    result = {"where": board.label, "root": board.root, "removed": target, "was_previous": bool(done.get("previous")),
              "runtime_removed": done.get("runtime_removed"), "failed": done.get("failed") or []}
    return {key: result[key] for key in REMOVE_KEYS}


def choose_release(where: str, facts, release: str | None, current: str | None, target: str | None) -> list[str]:
    """Refuse a rollback to ``target`` (``release``, else previous) that cannot be: none, not on the board, or
    current already. Returns the board's release ids, newest first."""
    if not target:
        raise DeployError(f"{where} has no previous release to roll back to (current: {current or 'none'})",
                          "deploy another bundle first, or name a release from 'edgesdk deploy --status' "
                          "with --release ID")
    held = [r["id"] for r in reversed(facts.state.get("releases") or [])]  # newest first
    if release is not None and release not in held:
        raise DeployError(f"--release {release!r} is not a release on {where}",
                          "run 'edgesdk deploy --status' to list the releases and pass one of their ids")
    if release is None and target not in held:
        # previous still names a release whose directory was removed (by hand, or a disk cleanup): the
        # board's verify would only say that path does not exist, and --status still lists it as previous
        others = [r for r in held if r != current]
        raise DeployError(f"{where} cannot roll back: previous points to releases/{target}, which is no "
                          "longer on the board (its directory was removed)",
                          (f"roll back to a release it holds with --rollback --release ID ({', '.join(others)}), "
                           "or " if others else "") + "deploy that bundle again")
    if target == current:
        raise DeployError(f"release {target} is already current on {where}",
                          "name another release from 'edgesdk deploy --status' with --release ID")
    return held


def verify_fix(board, target: str, verified: dict, current: str | None, held: list[str]) -> str:
    """The fix for a rollback whose verify of releases/``target`` found problems. A damaged release is repaired by a
    deploy of its bundle. A sound copy made or renamed by hand (its manifest names the bundle ``holds``, or none) is
    not: a deploy of that bundle makes releases/<bundle id> and leaves the copy as it is, so the fix names the
    release that holds that bundle, or the rename that makes the copy one."""
    if "holds" not in verified:  # files damaged or missing
        return "deploy that bundle again (it repairs the release), or roll back to another one"
    holds, other = verified["holds"], "roll back to another release with 'edgesdk deploy --rollback --release ID'"
    if holds is None:
        return f"{other} ('edgesdk deploy --status' lists them)"
    if holds == current:
        return f"releases/{holds}, which holds that bundle, is current already: nothing to roll back to there; {other}"
    if holds in held:
        return f"roll back to the release that holds that bundle: 'edgesdk deploy --rollback --release {holds}'"
    rename = shlex.join(["mv", board.path("releases", target), board.path("releases", holds)])
    return f"rename the copy on the board ({rename}), then run 'edgesdk deploy --rollback --release {holds}'"


def paired_runtime(facts, target: str, options: DeployOptions, report: Reporter) -> str | None:
    """The runtime a rollback to ``target`` switches runtime/current to: the one the release last ran with
    (the board's runtimes.json, written at each switch), where that is another runtime than runtime/current and
    still installed; else None, and runtime/current stays. A deploy switches a release and the runtime that ran
    its smoke test together (install.py), so a rollback goes back to that pair, as a blue-green deploy goes back
    to the previous environment whole: otherwise the board ran the old release with the new edgesdk, a pair that
    never ran together, and a regression of the new edgesdk stayed after the rollback."""
    if options.local:  # --to DIR: this machine's edgesdk runs every release
        return None
    paired = (facts.raw.get("release_runtimes") or {}).get(target)
    active = install.installed_key(facts.raw)
    if not paired or paired == active:
        return None
    if paired not in install.installed_keys(facts.raw):
        report.info(f"releases/{target} last ran with the edgesdk runtime {paired}, which is no longer on the board; "
                    f"it runs with runtime/current ({active or 'none'})")
        return None
    report.info(f"releases/{target} last ran with the edgesdk runtime {paired}; runtime/current "
                f"({active or 'none'}) goes back to it with the release")
    return paired
