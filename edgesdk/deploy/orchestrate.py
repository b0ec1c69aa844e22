"""``edgesdk deploy BUNDLE``: from a built bundle to a verified, running board.

Steps (each printed with its time):

1. verify the bundle here (every sha256) - a bundle that fails is never sent;
2. probe the board (architecture, device-tree model, L4T/JetPack, TensorRT, Python, RAM, disk,
   runtime, releases) and what it already holds of this bundle;
3. refuse a bundle for another target (``ignore_target`` overrides), one larger than the board's
   memory budget or RAM, or one that does not fit on its disk with the runtime it installs and the TensorRT
   engine it builds (named as the board's engine builder, where it is there already, says), and with
   ``--service`` a board whose systemd does not answer or where another server answers on the service's
   port - before anything is written;
4. make sure the board's edgesdk runtime is the one of this checkout (installed when missing or
   different, skipped with ``install=False``);
5. send what the board lacks into ``staging/<id>`` (resumable), then verify every sha256 there
   and rename it to ``releases/<id>``;
6. the TensorRT engine on a Jetson (or say why it is skipped);
7. smoke-test ``edgesdk run releases/<id>`` with a few tokens;
8. switch ``current`` atomically, check it, keep the newest releases; any failure after the
   switch switches back to the previous release;
9. with ``--service``: install, enable and restart the systemd unit that serves ``current`` and wait
   for its ``/health`` (deploy/service.py); a service that does not come up switches ``current``
   back and puts the unit back as it was, so the server that ran before runs again.

Nothing before step 8 touches ``current``, so a failure anywhere leaves the board running what
it ran before.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

from edgesdk.bundle import MANIFEST, Bundle, verify_bundle
from edgesdk.deploy import engine, install, service
from edgesdk.deploy.board_ops import IN_FLIGHT_MAX_AGE_S
from edgesdk.deploy.probe import (
    RUNTIME_BYTES_FULL,
    RUNTIME_BYTES_INHERITED,
    BoardFacts,
    check_disk,
    check_memory,
    check_target,
    memory_bytes,
)
from edgesdk.deploy.remote import BoardRefusal
from edgesdk.deploy.report import Reporter, files_count, fmt_bytes
from edgesdk.deploy.session import (
    DeployOptions,
    board_edgesdk,
    check_destination,
    open_board,
    probe,
    run_argv,
    smoke_test,
    unpack_if_archive,
)
from edgesdk.deploy.transfer import Plan, bundle_files, make_plan, send
from edgesdk.deploy.transport import DeployError

REPAIRED = "its bad files sent again, and every sha256 checked on the board"


@dataclass
class DeployResult:
    """What one deploy did, for the summary line and the tests."""

    bundle_id: str
    where: str
    root: str
    bytes_sent: int
    files_sent: int
    bytes_reused: int
    runtime_bytes_sent: int
    seconds: float
    previous: str | None  # the release --rollback goes to, as the board's previous link names it
    engine: str
    generated: str
    run_command: str = ""  # how to run the live release on the board
    # whether this deploy moved current: a redeploy of the release that was current switches nothing
    switched: bool = True
    runtime_switched_to: str = ""  # the runtime key runtime/current was moved to, "" where it was not moved
    # the damage this deploy found in the board's releases/<id> (its first problem) and replaced; "" where the
    # release was sound or new
    repaired: str = ""

    def summary(self) -> str:
        reused = f", {fmt_bytes(self.bytes_reused)} already on the board" if self.bytes_reused else ""
        runtime = f" (+ {fmt_bytes(self.runtime_bytes_sent)} edgesdk wheel)" if self.runtime_bytes_sent else ""
        where = self.where if self.where.endswith(self.root) else f"{self.where} ({self.root})"  # --to DIR: once
        current = f"current -> releases/{self.bundle_id}"
        only_runtime = f"only runtime/current was switched (to {self.runtime_switched_to})"
        if not self.switched and self.repaired:
            current = (f"releases/{self.bundle_id} already was current and was damaged on the board "
                       f"({self.repaired}), so it was repaired ({REPAIRED}) and "
                       f"{only_runtime if self.runtime_switched_to else 'current was not switched'}: {current}")
        elif not self.switched and self.runtime_switched_to:
            current = f"releases/{self.bundle_id} already was current, so {only_runtime}: {current}"
        elif not self.switched:
            current = f"releases/{self.bundle_id} already was current, so nothing was switched: {current}"
        elif self.repaired:
            current = (f"releases/{self.bundle_id} was damaged on the board ({self.repaired}) and was repaired "
                       f"({REPAIRED}); {current}")
        return (f"deployed bundle {self.bundle_id} to {where} in {self.seconds:.1f} s: "
                f"{fmt_bytes(self.bytes_sent)} sent in {files_count(self.files_sent)}{runtime}{reused}; "
                f"{current} "
                + (f"(previous: {self.previous}, which --rollback goes to)" if self.previous else
                   "(no previous release to roll back to)")
                + (f"\nrun it on the board: {self.run_command}" if self.run_command else ""))


def _budget_mb(bundle_manifest: dict, facts: BoardFacts) -> tuple[int, str]:
    """The memory budget for the board in hand, and the words that say where it comes from.

    The budget is the board's profile's ``memory_budget_mb`` (the bundle's own profile where the board matches
    none, or where the bundle was built with an edited copy of the board's profile kept under its name: the
    manifest carries that copy, which the thermal guard reads too), made for the RAM that profile names
    (``memory.total_gb``). The board is matched to a profile by its
    model alone for a Raspberry Pi, so a Pi 5 with 2 or 4 GB is ``rpi5`` (made for the 8 GB board, 4500 MB) and a
    Pi 4 with 1 or 2 GB is ``rpi4`` (4 GB, 2000 MB); reference targets-thermal.md §1d lists those SKUs. Where
    the board's RAM (``MemTotal`` of its /proc/meminfo, which sits a little below the size on the box: the
    kernel and the firmware keep some) says it is a smaller board than the profile's, the budget shrinks by the
    same share, rounding ``MemTotal`` up to the power-of-two size boards are sold in (512 MB included): 4500 MB x
    2/8 = 1125 MB on a 2 GB Pi 5. A board with as much RAM as its profile, or more, keeps the profile's budget.
    """
    from edgesdk.errors import ProfileError
    from edgesdk.profile import get_profile

    target, budget, total_gb = None, None, None
    summary = bundle_manifest["target"]
    if facts.board.suggested_target:
        with contextlib.suppress(ProfileError):
            profile = get_profile(facts.board.suggested_target)
            target, budget, total_gb = profile.name, profile.memory_budget_mb, profile.memory.total_gb
    built_for_it = target is not None and summary.get("name") == target
    if built_for_it and summary.get("memory_budget_mb") != budget:
        # a copy of the board's profile kept under its name, its budget edited: the copy the bundle carries is it
        shipped, budget = budget, int(summary["memory_budget_mb"])
        total_gb = (summary.get("memory") or {}).get("total_gb")
        basis = (f"the {budget} MB memory budget of the profile '{target}' the bundle was built with (the shipped "
                 f"'{target}' has {shipped} MB)")
    elif budget is not None:
        basis = f"the {budget} MB memory budget of the board's profile '{target}'"
    else:
        target, budget = summary.get("name", "?"), int(summary["memory_budget_mb"])
        total_gb = (summary.get("memory") or {}).get("total_gb")
        suggested = facts.board.suggested_target  # a board that matches one whose get_profile raised ProfileError
        why = (f"the board's profile '{suggested}' could not be loaded" if suggested else
               "the board matches no shipped profile")
        basis = f"the {budget} MB memory budget of the bundle's target profile '{target}' ({why})"
    if not facts.mem_total or not total_gb:
        return budget, basis
    board_gib = facts.mem_total / 2**30
    # MemTotal 1.9 GiB -> a 2 GB board; 0.42 GiB -> a 512 MB board (a Pi Zero 2 W), never rounded up to 1 GB
    size_gb = 2.0 ** math.ceil(math.log2(board_gib) - 1e-9)
    if size_gb >= total_gb:
        return budget, basis
    scaled = int(budget * size_gb / total_gb)
    return scaled, (f"the {scaled} MB memory budget for this board's RAM ({board_gib:.1f} GiB, a {size_gb:g} GB "
                    f"board): profile '{target}' is made for {total_gb:g} GB with a {budget} MB budget")


def engine_builder(board, facts: BoardFacts, manifest: dict, edgesdk: list[str],
                   runtime_key: str | None) -> engine.BuilderStatus:
    """What the board's engine builder (``edgesdk``, the runtime ``runtime_key``) says it can build with, asked only
    where the engine step may build one (a Jetson with TensorRT, a standard graph); :data:`engine.NO_BUILDER`
    elsewhere. The engine directory is named after its answer, so the disk check asks it too where it is on the
    board before the transfer."""
    graph_form = manifest["graph"].get("form", "standard")
    if facts.board.family == "jetson" and bool(facts.tensorrt) and graph_form == "standard":
        return engine.builder_status(board, edgesdk, runtime_key)
    return engine.NO_BUILDER


def prune_old_releases(board, report, keep: int) -> None:
    """Remove the releases past the newest ``keep`` (current and previous always stay). The new release is live
    and smoke-tested by then: failing to tidy up is a warning, not a failed deploy, and each entry the board could
    not remove (a release, its engine or a stale transfer) is a warning naming it, the reason and its path."""
    try:
        pruned = board.call("prune", {"keep": keep})
    except DeployError as exc:
        report.info(f"warning: old releases were not pruned ({exc.problem}); the next deploy tries again")
    else:
        if pruned["removed"]:
            report.info(f"removed old releases {', '.join(pruned['removed'])} (--keep {keep})")
        held_back = pruned.get("in_flight") or []
        if held_back:  # else --keep N left more than N releases without a word
            them = "them" if len(held_back) > 1 else "it"
            report.info(f"kept {', '.join('releases/' + r for r in held_back)} past --keep {keep}: committed (or "
                        f"changed on the board) less than {IN_FLIGHT_MAX_AGE_S / 3600:g} h ago and not switched to "
                        f"since, so another deploy may still switch to {them}; a deploy after that prunes {them}")
        for failed in pruned.get("failed", []):
            report.info(f"warning: the board's {failed['path']} could not be removed ({failed['error']}) and still "
                        f"takes its space: remove it by hand on the board, rm -rf {shlex.quote(failed['path'])} "
                        "(with sudo where another user owns its files)")


def switch_back(board, failed: DeployError, previous: str, new_id: str, previous_before: str | None,
                runtime_key: str | None, switched: bool = True, new_runtime: str | None = None) -> str | None:
    """Point ``current`` (and ``runtime/current``) back at ``previous`` after ``failed``, restoring the
    board's ``previous`` as it was before this deploy, but only while ``current`` still points to ``new_id``:
    a concurrent deploy that switched it since (or a switch of this deploy that did not happen) is left as
    it is. Returns None once switched back, else the release ``current`` points to. Where the board does
    not answer, raise an error that says both releases ``current`` may point to. Where it refuses (``previous``
    removed from the board since the probe, or another deploy holding the root's lock), op_switch moved no link:
    the error says that ``current`` stays ``new_id`` where this deploy's switch is known to have happened
    (``switched``), and else that it is where that switch, whose reply was lost, left it. A redeploy of the
    release that was current (``previous`` is ``new_id``) switched ``runtime/current`` alone, from ``runtime_key``
    to ``new_runtime``: the errors are about that link, as current did not move."""
    try:
        reply = board.call("switch", {"bundle_id": previous, "action": "rollback after a failed deploy",
                                      "runtime_key": runtime_key, "previous": previous_before,
                                      "if_current": new_id})
    except BoardRefusal as refused:
        if previous == new_id:
            raise runtime_not_switched_back(failed, new_id, runtime_key, new_runtime, refused) from failed
        stays = (f"current stays releases/{new_id} (smoke-tested)" if switched else
                 f"current is where the switch whose reply was lost left it: releases/{new_id} (smoke-tested) or "
                 f"releases/{previous}")
        raise DeployError(
            f"{failed.problem}\nthe board refused to switch back to releases/{previous} "
            f"({refused.problem.splitlines()[0]}) and moved no link, so {stays}",
            "'edgesdk deploy --status' shows current and the releases the board holds; fix the problem above and "
            "deploy again, or go to one of those releases with 'edgesdk deploy --rollback --release ID'") from failed
    except DeployError as unreachable:
        if previous == new_id:
            raise runtime_not_switched_back(failed, new_id, runtime_key, new_runtime, unreachable) from failed
        # The first switch may have happened on the board before its reply was lost.
        raise DeployError(
            f"{failed.problem}\nswitching back to releases/{previous} failed too "
            f"({unreachable.problem.splitlines()[0]}), so the board's current release may be "
            f"releases/{new_id} (smoke-tested) or releases/{previous}",
            "once the board answers, 'edgesdk deploy --status' shows which; "
            f"{rollback_to(new_id, previous, switched)}") from failed
    return reply["to"] if reply.get("skipped") else None


def runtime_not_switched_back(failed: DeployError, release: str, runtime_key: str | None,
                              new_runtime: str | None, cause: DeployError) -> DeployError:
    """What :func:`switch_back` raises for a redeploy of ``release``, the release that was current, whose switch
    moved ``runtime/current`` alone (from ``runtime_key`` to ``new_runtime``), where the switch of
    ``runtime/current`` back was refused or not answered (``cause``): current stays ``release``, where
    ``runtime/current`` may point, and how to get back to ``runtime_key``."""
    new = new_runtime or "the edgesdk runtime this deploy switched to"
    if isinstance(cause, BoardRefusal):
        return DeployError(
            f"{failed.problem}\nthe board refused to switch runtime/current back to {runtime_key} "
            f"({cause.problem.splitlines()[0]}) and moved no link, so runtime/current stays {new} (smoke-tested "
            f"with releases/{release}, which stays current, as it was before this deploy)",
            "'edgesdk deploy --status' shows the runtime; fix the problem above and deploy again, or go back: "
            f"{back_to_runtime(release, runtime_key)}")
    # The switch back may have happened on the board before its reply was lost.
    return DeployError(
        f"{failed.problem}\nswitching runtime/current back to {runtime_key} failed too "
        f"({cause.problem.splitlines()[0]}), so runtime/current may still point to {new} (smoke-tested with "
        f"releases/{release}) or back to {runtime_key}, the runtime it ran with before this deploy; "
        f"releases/{release} stays current, as it was before this deploy",
        "once the board answers, 'edgesdk deploy --status' shows which (its runtime line). Where it is "
        f"{runtime_key}, restart the unit so it serves with it ({RESTART_UNIT}); where it is the new one, "
        f"{back_to_runtime(release, runtime_key)}")


def back_to_runtime(release: str, runtime_key: str) -> str:
    """The way back to ``runtime_key``, the runtime ``release`` ran with before a redeploy of it (the release that
    was current) switched ``runtime/current`` alone: no rollback goes to the release that is current, and a deploy
    switches ``runtime/current`` to the runtime of the edgesdk that runs it, installed already (a switch keeps the
    runtime it replaced), restarting the unit an earlier deploy --service installed."""
    return (f"deploying this bundle with the edgesdk whose runtime is {runtime_key} (it stays on the board) switches "
            "runtime/current back to it and restarts the unit an earlier deploy --service installed; 'edgesdk "
            f"deploy --rollback' cannot, as it refuses releases/{release}, the release that is current")


def rollback_to(new_id: str, before: str, switched: bool) -> str:
    """The way back from ``new_id`` to ``before``, the release current pointed to, where current may point to
    either: ``--rollback --release`` names ``before``, as a plain ``--rollback`` goes to the release ``previous``
    names, which is ``before`` only where current points to ``new_id`` (a switch back that happened put previous
    back as it was). Where the switch to ``new_id`` is not known to have happened (not ``switched``), it says why
    a plain one does not do."""
    named = (f"where current already points to releases/{new_id}, 'edgesdk deploy --rollback --release {before}' "
             f"goes back to releases/{before}")
    return named if switched else (f"{named} (a plain --rollback goes to the release previous names, which is "
                                   f"releases/{before} only where the switch happened)")


def switch_from_a_removed_release(new_id: str, was: str, rerun: str) -> tuple[str, str]:
    """What a switch from ``was``, a release whose directory was removed from the board, to ``new_id`` left where
    it may or may not have happened (its reply lost, or cut by a Ctrl-C): (problem, fix). No switch back and no
    rollback can go to ``was``; ``rerun`` (the same deploy run again) finishes the switch."""
    return (f"current may already point to releases/{new_id} (smoke-tested) or still to {was}, which is no longer "
            "on the board (its directory was removed), so there is no release to go back to",
            f"'edgesdk deploy --status' shows which; {rerun} finishes the switch ({unit_on_rerun()})")


def held_release(facts: BoardFacts, release: str | None) -> str | None:
    """``release``, the one a switch moved ``current`` away from, or None where that is the current release the
    probe found with its directory removed (by hand): no switch back and no rollback can go to it (op_switch
    refuses a release that is not on the board, and a switch away from it leaves ``previous`` unset). A release
    another deploy switched to since the probe is taken as held: the probe could not list it."""
    held = {entry.get("id") for entry in facts.state.get("releases") or []}
    return None if release == facts.state.get("current") and release not in held else release


@contextlib.contextmanager
def refusal(progress: dict):
    """Mark in ``progress`` a check that refused the bundle for this board (its target, the memory it takes, the
    disk it needs): the same deploy run again is refused again, so a fleet's retry line leaves that board out
    and names it with the fix instead. An error of the board's connection is no refusal: these checks only read
    the probe's facts."""
    try:
        yield
    except DeployError:
        progress["refused"] = True
        raise


def previous_release(facts: BoardFacts, left: str | None, new_id: str, switched: dict | None = None) -> str | None:
    """The release ``previous`` names after a deploy of ``new_id`` that switched ``current`` away from ``left``
    (None where that release is no longer on the board): what ``--rollback`` goes to. A deploy of the release that
    was current already (``left`` is ``new_id``) moves no ``previous``: it stays what the board's switch reply
    (``switched``) read under the root's lock. The probe's view is only the fallback: a concurrent deploy of the
    same bundle switched current (and previous) after this deploy's probe, and that view named the release
    previous pointed to before both."""
    if left != new_id:
        return left
    if switched is not None and "previous" in switched:
        return switched["previous"]
    before = facts.state.get("previous")
    held = {entry.get("id") for entry in facts.state.get("releases") or []}
    return before if before != new_id and before in held else None


def other_deploy(current: str | None, new_id: str) -> str:
    """Why ``current`` was not switched back from ``new_id``: another deploy (or a rollback) moved it since."""
    return (f"current stays releases/{current}, which another deploy or rollback switched to since (not "
            f"releases/{new_id}, so there was nothing of this deploy to switch back)") if current else \
        "current stays unset"


def undo_service(board, report: Reporter, failed: DeployError, token: str, switched_from: str | None, new_id: str,
                 previous_before: str | None, runtime_key: str | None, progress: dict | None = None,
                 runtime_moved: bool = False) -> DeployError:
    """The service did not come up (``failed``) after ``current`` was switched from ``switched_from`` to
    ``new_id``: switch back, put the unit back as it was before the install with ``token`` and restart the
    server that ran before, so a failed deploy leaves the board serving what it served. A redeploy of the release
    that was current already (``switched_from`` is ``new_id``) whose switch moved ``runtime/current`` alone
    (``runtime_moved``: another edgesdk) switches ``runtime/current`` back to ``runtime_key``, as
    :func:`restart_unit_after_switch` does, or the unit put back would run the edgesdk that did not come up. A
    first deploy keeps its smoke-tested release as current. Returns the error to raise, which says what was
    undone. ``progress`` records how far that got, for what a Ctrl-C says."""
    undone, overtaken = [], None
    progress = {} if progress is None else progress
    runtime_only = switched_from == new_id and runtime_moved
    if switched_from and (switched_from != new_id or (runtime_only and runtime_key)):
        progress["stage"] = "service switch back"
        now = switch_back(board, failed, switched_from, new_id, previous_before, runtime_key,
                          new_runtime=progress.get("runtime_key"))
        if now is None:
            progress["stage"] = "service switched back"
            undone.append(f"runtime/current switched back to {runtime_key}" if runtime_only else
                          f"current switched back to releases/{switched_from}")
        else:
            overtaken = other_deploy(now, new_id)
    try:
        line = service.revert_service(board, token)
        if line is None and undone and not isinstance(failed, BoardRefusal):
            # The install's reply was lost: it may have finished, its server running the release switched away from.
            line = service.restart_after_lost_install(board)
    except DeployError as revert_failed:
        left = '; '.join(undone) or overtaken or 'current stays releases/' + new_id
        raise DeployError(f"{failed.problem}\n{left}, but "
                          f"putting the service back failed too: {revert_failed.problem}",
                          revert_failed.fix) from failed
    if line:
        undone.append(line)
    for line in undone:
        report.info(line)
    if undone and undone[0].startswith("current switched"):
        kept = ""
    elif overtaken:
        kept = f"\n{overtaken}"
    elif switched_from == new_id:  # the release was current before this deploy: nothing of it to switch back
        kept = f"\nreleases/{new_id} stays current, as it was before this deploy" + (
            ", and runtime/current stays the runtime this deploy installed: the board had no runtime before it to "
            "go back to" if runtime_only and not runtime_key else "")
    else:
        kept = f"\nreleases/{new_id} (smoke-tested) stays current: there is no earlier release to go back to"
    return DeployError(f"{failed.problem}\nthe deploy was undone: {'; '.join(undone) or 'nothing had changed'}"
                       f"{kept}", service.SERVICE_FIX)


def restart_unit_after_switch(board, report: Reporter, switched_from: str | None, new_id: str,
                              previous_before: str | None, runtime_key: str | None, progress: dict) -> None:
    """A unit an earlier ``deploy --service`` installed serves ``current``, whose server still holds the release
    and the runtime it started with: restart it onto ``new_id`` (and onto ``runtime/current``, which a deploy of
    the release already current switches alone, ``switched_from`` then being ``new_id``). Where it does not come
    up there, switch ``current`` (and ``runtime/current``, to ``runtime_key``) back and restart it onto what it
    served, so the board serves what it served before the deploy. A unit that another user installed is not
    restarted and nothing is switched back (the board's reply says so, and this says it): it goes on serving the
    release it started with until that user restarts it, which is no fault of the smoke-tested ``new_id``, and
    switching back would undo every deploy of this user while that unit is there. ``progress`` records how far
    that got, for what a Ctrl-C says."""
    runtime_only = switched_from == new_id
    try:
        line = service.restart_after_switch(board)
    except BoardRefusal as failed:
        if runtime_only and not runtime_key:  # the release did not move: only the runtime did, from none
            raise DeployError(f"{failed.problem}\nreleases/{new_id} (smoke-tested) stays current, as it was, and "
                              "runtime/current stays the runtime this deploy installed: the board had no runtime "
                              "before it to go back to", failed.fix) from failed
        if not switched_from:
            raise DeployError(f"{failed.problem}\nreleases/{new_id} (smoke-tested) stays current: there is no "
                              "earlier release to go back to", failed.fix) from failed
        progress["stage"] = "switch back"
        now = switch_back(board, failed, switched_from, new_id, previous_before, runtime_key,
                          new_runtime=progress.get("runtime_key"))
        if now is None:
            progress["stage"] = "switched back"
        undone = (other_deploy(now, new_id) if now is not None else
                  f"runtime/current switched back to {runtime_key}" if runtime_only else
                  f"current switched back to releases/{switched_from}")
        try:
            again = service.restart_after_switch(board) or "the unit is gone, so no server was restarted"
        except DeployError as restart_failed:
            again = f"restarting the service onto it failed too: {restart_failed.problem}"
        raise DeployError(f"{failed.problem}\nthe deploy was undone: {undone}; {again}", failed.fix) from failed
    except DeployError as lost:  # no answer: the new release is live and smoke-tested, as after a failed prune
        report.info(f"warning: the board did not answer the restart of the unit an earlier deploy --service may "
                    f"have installed ({lost.problem.splitlines()[0]}); if one serves this root, restart it so it "
                    "serves current (systemctl restart edgesdk-serve, with --user for a user unit)")
        return
    if line:
        report.info(line)


def restart_unit_in_place(board, report: Reporter, release: str, runtime: str | None) -> None:
    """A deploy that switched nothing (``release`` was current already, with ``runtime`` as ``runtime/current``):
    the unit an earlier ``deploy --service`` installed may be down all the same (a failed deploy whose switch back
    was lost left it so). One that is active and answers on its /health is left running; one that is not is
    restarted and waited for as after a switch. Where it does not come up, nothing is switched back: this deploy
    moved no link, and the release (and runtime) it would go back to are the ones that did not come up."""
    try:
        line = service.restart_after_switch(board, unless_up=True)
    except BoardRefusal as failed:
        with_runtime = f", with runtime/current {runtime}" if runtime else ""
        raise DeployError(f"{failed.problem}\nthis deploy switched nothing (releases/{release} was current already"
                          f"{with_runtime}), so nothing was switched back: releases/{release} stays current and the "
                          "unit is not serving it", failed.fix) from failed
    except DeployError as lost:
        report.info(f"warning: the board did not answer the restart of the unit an earlier deploy --service may "
                    f"have installed ({lost.problem.splitlines()[0]}); if one serves this root, check that it runs "
                    f"(systemctl is-active edgesdk-serve) and restart it where it does not ({RESTART_UNIT})")
        return
    if line:
        report.info(line)


RESTART_UNIT = "systemctl restart edgesdk-serve, with --user for a user unit"


def unit_on_rerun(advise: bool = True) -> str:
    """What the same deploy run again does with the unit an earlier ``deploy --service`` installed where it finds
    the switch already done (:func:`restart_unit_in_place`): it restarts a unit that is down and leaves one that
    answers running, on the release and runtime it started with. ``advise``: and how to restart that one."""
    left = ("where it finds the switch already done, it restarts the unit an earlier deploy --service installed only "
            "if that unit is down" if advise else "restarts the unit only if it is down")
    return (f"{left}, and leaves one that answers on its /health running on what it started with"
            + (f": restart that one, {RESTART_UNIT}" if advise else ""))


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a deploy or a rollback: still a KeyboardInterrupt, carrying what the board was left with
    (``problem``) and what to do next (``fix``), so the command can say both instead of a bare abort."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def switch_of_the_current_release_interrupted(where: str, new_id: str, runtime_key: str | None,
                                              runtime_before: str | None) -> Interrupted:
    """A Ctrl-C during the switch of a redeploy of ``new_id``, the release that was current already: current stays
    as it was, and only ``runtime/current`` may move, where this deploy made another edgesdk runtime
    (``runtime_key``) current in place of the board's (``runtime_before``)."""
    if runtime_key and runtime_key != runtime_before:
        return Interrupted(f"deploy interrupted (Ctrl-C) while switching runtime/current on {where}: releases/{new_id} "
                           f"stays current, as it was before this deploy, and runtime/current may already point to "
                           f"{runtime_key} (smoke-tested with it) or still to {runtime_before or 'no runtime'}",
                           "'edgesdk deploy --status' shows which; where it is the new one, restart the unit an "
                           f"earlier deploy --service installed ({RESTART_UNIT}): the same deploy again finds the "
                           f"switch done and {unit_on_rerun(False)}")
    return Interrupted(f"deploy interrupted (Ctrl-C) on {where} while switching to releases/{new_id}, which was current "
                       "before this deploy, with the same edgesdk runtime: current and runtime/current stay as they "
                       "were", "run the same command again")


def runtime_switch_back_interrupted(where: str, new_id: str, stage: str, runtime_key: str | None,
                                    runtime_before: str | None) -> Interrupted:
    """A Ctrl-C while (``stage`` "switch back") or after ("switched back") switching ``runtime/current`` back from
    ``runtime_key`` to ``runtime_before``, after the unit an earlier deploy --service installed did not come up on
    a redeploy of ``new_id``, the release that was current already: current stays as it was, and only
    ``runtime/current`` moved."""
    new, old = runtime_key or "the edgesdk runtime this deploy switched to", runtime_before or "the runtime before"
    if stage == "switch back":
        return Interrupted(f"deploy interrupted (Ctrl-C) on {where} while switching runtime/current back to {old}, "
                           f"after the unit an earlier deploy --service installed did not come up on {new}: "
                           f"runtime/current may point to either; releases/{new_id} stays current, as it was before "
                           "this deploy",
                           f"'edgesdk deploy --status' shows which (its runtime line). Where it is {old}, restart "
                           f"the unit so it serves with it ({RESTART_UNIT}); where it is the new one, "
                           f"{back_to_runtime(new_id, old)}")
    return Interrupted(f"deploy interrupted (Ctrl-C) after switching runtime/current on {where} back to {old}, as the "
                       f"unit an earlier deploy --service installed did not come up on {new}; releases/{new_id} "
                       "stays current, as it was before this deploy, and the unit may not have been restarted onto "
                       f"{old}",
                       f"restart the unit so it serves current ({RESTART_UNIT}); its journal says why the server did "
                       f"not come up on {new}")


def interrupted(progress: dict) -> Interrupted:
    """What a Ctrl-C at the point ``progress`` records (filled in by :func:`_deploy`) left on the board. Up to
    the switch nothing touches ``current`` and a transfer resumes from its ``.partial`` files; during the
    switch the board may or may not have switched (its reply may be what was cut); after it the new release
    is live, and a cut ``--service`` step leaves the unit as far as it got."""
    where, new_id, before = progress.get("where"), progress.get("bundle_id"), progress.get("current")
    was = f"releases/{before}" if before else "no current release"
    # the release current pointed to was removed from the board: no switch back and no rollback can go to it
    gone = bool(before) and before != new_id and bool(progress.get("current_removed"))
    no_previous = (f"{was}, which current pointed to, is no longer on the board (its directory was removed), so there "
                   "is no previous release to roll back to") if gone else ""
    stage = progress.get("stage")
    if where is None:
        return Interrupted("deploy interrupted (Ctrl-C) before it changed anything on the board",
                           "run the same command again")
    if stage == "switch" and before == new_id:
        return switch_of_the_current_release_interrupted(where, new_id, progress.get("runtime_key"),
                                                         progress.get("runtime_before"))
    if stage == "switch" and gone:
        problem, fix = switch_from_a_removed_release(new_id, was, "the same deploy again")
        return Interrupted(f"deploy interrupted (Ctrl-C) while switching current on {where}: {problem}", fix)
    if stage == "switch":
        # previous names releases/<before> only once the switch happened: a plain --rollback where it did not
        # goes to the release before that one, so the way back names the release
        back = f"; {rollback_to(new_id, before, False)}" if before else ""
        return Interrupted(f"deploy interrupted (Ctrl-C) while switching current on {where}: current may already "
                           f"point to releases/{new_id} (smoke-tested) or still to {was}",
                           "'edgesdk deploy --status' shows which; the same deploy again finishes the switch "
                           f"({unit_on_rerun()})" + back)
    if stage in ("switch back", "switched back") and before == new_id:
        return runtime_switch_back_interrupted(where, new_id, stage, progress.get("runtime_key"),
                                               progress.get("runtime_before"))
    if stage == "switch back":
        return Interrupted(f"deploy interrupted (Ctrl-C) while switching current on {where} back to {was}, after "
                           f"the unit an earlier deploy --service installed did not come up on releases/{new_id}: "
                           f"current may point to either", "'edgesdk deploy --status' shows which; then restart "
                           f"the unit so it serves current ({RESTART_UNIT})")
    if stage == "switched back":
        return Interrupted(f"deploy interrupted (Ctrl-C) after switching current on {where} back to {was}, as the "
                           f"unit an earlier deploy --service installed did not come up on releases/{new_id}; the "
                           "unit may not have been restarted onto it",
                           f"restart the unit so it serves current ({RESTART_UNIT}); its journal says why the "
                           "new release's server did not come up")
    if stage in ("service switch back", "service switched back") and before == new_id:
        # a redeploy of the release that was current: only runtime/current was switched, and is switched back
        return Interrupted(f"deploy interrupted (Ctrl-C) on {where} while undoing a redeploy of releases/{new_id} "
                           "(current, as before) whose service did not come up on the edgesdk runtime it switched "
                           "to: runtime/current may point to that runtime or back to the one before, and the unit "
                           "may not have been put back as it was, or restarted",
                           "'edgesdk deploy --status' shows the runtime; then run the deploy --service that installed "
                           f"the unit before, or restart the unit ({RESTART_UNIT}); its journal says why the "
                           "server did not come up")
    if stage == "service switch back":
        return Interrupted(f"deploy interrupted (Ctrl-C) while switching current on {where} back to {was}, after "
                           f"the service did not come up on releases/{new_id}: current may point to either, and the "
                           "unit may still be the one this deploy wrote", "'edgesdk deploy --status' shows which; "
                           "then deploy --service again with the bundle that is to serve, which rewrites and "
                           "restarts the unit")
    if stage == "service switched back":
        return Interrupted(f"deploy interrupted (Ctrl-C) after switching current on {where} back to {was}, as the "
                           f"service did not come up on releases/{new_id}; the unit may not have been put back as it "
                           "was, or restarted onto current",
                           f"restart the unit so it serves current ({RESTART_UNIT}), or run the deploy --service that "
                           "installed it before; its journal says why the new release's server did not come up")
    if stage == "service":
        return Interrupted(f"deploy interrupted (Ctrl-C) after switching {where} to releases/{new_id} (was {was}); "
                           + (f"{no_previous}; " if gone else "") + "the systemd unit may be half installed or not "
                           "restarted",
                           "run the same deploy again to finish it (nothing is sent twice)"
                           + ("" if gone else ", or 'edgesdk deploy --rollback' to go back"))
    if stage == "switched":
        switched = (f"switching {where} to releases/{new_id} (was {was})" if before != new_id else
                    f"the switch on {where} (releases/{new_id} stays current, as it was before this deploy)")
        return Interrupted(f"deploy interrupted (Ctrl-C) after {switched}" + (f"; {no_previous}" if gone else ""),
                           "the release is live; if an earlier deploy --service installed a unit for this root, "
                           "restart it so it serves current (systemctl restart edgesdk-serve, with --user for a "
                           "user unit)" + ("" if gone else "; 'edgesdk deploy --rollback' goes back"))
    kept = f"keeps releases/{before} as current" if before else "still has no current release"
    if before != new_id:
        kept += f"; releases/{new_id} was not switched to"
    return Interrupted(f"deploy interrupted (Ctrl-C): {where} {kept}",
                       "run the same command again: it goes on from where this one stopped, and files that already "
                       "arrived are not sent again")


def deploy(bundle_path: Path, options: DeployOptions, report: Reporter | None = None,
           progress: dict | None = None, verified: Bundle | None = None) -> DeployResult:
    """Deploy a bundle (directory, or archive from 'edgesdk pack') onto the board or directory named in
    ``options``. A Ctrl-C comes out as :class:`Interrupted`, saying what the board was left with. ``progress``
    (filled in as the deploy goes: the board, the release current was on, the stage, and ``refused`` where the
    board's checks refused this bundle, so running the same deploy again fails the same way) lets a caller say the
    same for a deploy that ended otherwise. ``verified`` is ``bundle_path`` verified (and unpacked) already: a
    fleet verifies its bundle once, before any board is contacted, rather than once per board."""
    report = report or Reporter(total=9 if options.service else 8)
    progress = {} if progress is None else progress
    try:
        return _deploy(bundle_path, options, report, progress, verified)
    except Interrupted:
        raise
    except KeyboardInterrupt as stop:
        raise interrupted(progress) from stop


def _deploy(bundle_path: Path, options: DeployOptions, report: Reporter, progress: dict,
            verified: Bundle | None = None) -> DeployResult:
    check_destination(options)
    with contextlib.ExitStack() as stack:
        with report.step(f"verify bundle {bundle_path} on this machine"):
            if verified is None:
                bundle = verify_bundle(unpack_if_archive(Path(bundle_path), stack))
            else:
                bundle = verified
                report.info("verified once for every board, before any board was contacted")
            files = bundle_files(bundle)
            total = sum(f["size"] for f in files.values())
            report.info(f"bundle {bundle.bundle_id}, target {bundle.target}, {len(files)} files, {fmt_bytes(total)}")
        board = open_board(options)
        stack.callback(board.transport.close)
        where = board.label
        with report.step(f"probe {where}"):
            facts = probe(board, {"bundle_id": bundle.bundle_id, "files": files,
                                  "manifest_sha256": files[MANIFEST]["sha256"]})
            report.info(facts.describe())
        # current_removed: current points to a release whose directory was removed, so no switch back or
        # rollback can go to it (what a Ctrl-C in the switch or after it says)
        progress.update(where=where, bundle_id=bundle.bundle_id, current=facts.state.get("current"),
                        current_removed=bool(facts.state.get("current"))
                        and held_release(facts, facts.state.get("current")) is None)
        release = facts.raw.get("release")
        release_ok = release is not None and not release["problems"]
        plan = Plan() if release_ok else make_plan(files, facts.raw["plan"])
        repaired = ""  # the damage found in the board's releases/<id>, which the transfer replaces
        with report.step("check target, memory and disk"):
            with refusal(progress):
                report.info(check_target(bundle.target, facts, where, options.ignore_target))
            budget, basis = _budget_mb(bundle.manifest, facts)
            with refusal(progress):
                for note in check_memory(memory_bytes(bundle.manifest, files), budget, facts, where, basis):
                    report.info(note)
            source, runtime_key, runtime_bytes = None, None, 0
            # JetPack installs TensorRT's bindings (and NVIDIA's onnxruntime-gpu wheels go) into the system
            # Python: a Jetson's runtime venv sees them unless asked not to.
            inherit = options.system_site_packages
            if inherit is None:
                inherit = facts.board.family == "jetson"
            if not options.local and options.install:
                # keyed by the board's Python (a venv is bound to its interpreter) and by whether it sees the
                # system's packages (another runtime than one that does not); a wheel is built only for a runtime
                # the board does not have
                installed = install.installed_keys(facts.raw)
                source = install.runtime_source(facts.python_version, inherit, installed)
                runtime_key = source.key
                if runtime_key not in installed:
                    runtime_bytes = RUNTIME_BYTES_INHERITED if inherit else RUNTIME_BYTES_FULL
            active_runtime = install.installed_key(facts.raw)
            progress.update(runtime_key=runtime_key, runtime_before=active_runtime)  # what a Ctrl-C in the switch says
            edgesdk = install.runtime_argv(board, False, runtime_key) if runtime_key else \
                board_edgesdk(board, facts, options.local)
            answering = runtime_key or (None if options.local else active_runtime)  # the runtime edgesdk runs
            # a builder already on the board is asked now, so the disk check counts the engine it builds
            builder = None if runtime_bytes else engine_builder(board, facts, bundle.manifest, edgesdk, answering)
            planned_engine = engine.planned_engine_bytes(facts, bundle.manifest, files, builder)
            with refusal(progress):
                report.info(check_disk(plan.send_bytes, runtime_bytes, facts, where, planned_engine))
            if options.service is not None:  # the unit's command line as the service step installs it
                unit_edgesdk = install.runtime_argv(board, options.local) if runtime_key else \
                    board_edgesdk(board, facts, options.local)
                report.info(service.check_service(board, options.service, service.serve_argv(
                    unit_edgesdk, board.path("current"), options.service, options.ignore_target)))
        runtime_sent = 0
        with report.step("edgesdk runtime on the board"):
            if options.local:
                report.info("local directory: this edgesdk runs the bundle")
            elif runtime_key is None:
                report.info("skipped (--no-install)")
            elif runtime_key == active_runtime:
                report.info(f"up to date ({runtime_key})")
            elif not runtime_bytes:
                report.info(f"runtime/{runtime_key} is installed already; it becomes current with the bundle")
            else:
                report.info(f"installing {runtime_key}: {source.describe()}")
                reply = install.install_runtime(board, source, inherit)
                runtime_sent = reply["bytes_sent"]
                report.info(f"installed edgesdk {reply['version']} into {board.path('runtime', runtime_key)}; "
                            "it becomes runtime/current with the bundle")
        with report.step("transfer and verify on the board"):
            if release_ok:
                # committed again: verified under the root's lock and marked as this deploy's, so another
                # deploy's prune leaves it alone while its engine build and smoke test run
                kept = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": files[MANIFEST]["sha256"]})
                if kept["problems"] or not kept.get("kept"):
                    raise DeployError(f"releases/{bundle.bundle_id} on {where} changed after the probe found it "
                                      "sound (another deploy or a prune at the same time?)",
                                      "run the deploy again; the board keeps its current release")
                report.info(f"the board already holds releases/{bundle.bundle_id}, and every sha256 checks: "
                            "nothing to send")
                sent_bytes = 0
            else:
                if release is not None and "the host's bundle has" in release["problems"][0]:
                    # the id hashes the content; the manifest also records when the bundle was built
                    report.info(f"releases/{bundle.bundle_id} on the board holds another build of this bundle "
                                "(the same content, another manifest); replacing it, its files linked where they "
                                "match")
                elif release is not None:
                    repaired = release["problems"][0]
                    report.info(f"releases/{bundle.bundle_id} on the board is damaged ({repaired}); replacing it")
                report.info(plan.describe(files))
                sent = send(board, bundle, files, plan, report)
                sent_bytes = sent.bytes
                rate = sent.bytes / sent.seconds / 1e6 if sent.seconds > 0 else 0.0
                report.info(f"sent {fmt_bytes(sent.bytes)} in {sent.seconds:.2f} s ({rate:.1f} MB/s)")
                committed = board.call("commit", {"bundle_id": bundle.bundle_id,
                                                  "manifest_sha256": files[MANIFEST]["sha256"]})
                problems = committed["problems"]
                if problems:
                    raise DeployError(f"the bundle failed verification on {where} after the transfer:\n  - "
                                      + "\n  - ".join(problems),
                                      "run the deploy again: the bad files were removed from staging and are sent "
                                      "again; the board keeps its current release")
                if committed.get("kept"):  # another deploy of this bundle committed it first
                    report.info(f"{len(files)} files verified on the board; releases/{bundle.bundle_id} was "
                                "already there and sound, so it stays as it is")
                else:
                    report.info(f"{len(files)} files verified on the board; installed as "
                                f"releases/{bundle.bundle_id}")
        release_path = board.path("releases", bundle.bundle_id)
        with report.step("TensorRT engine"):
            gpu = bundle.manifest["target"].get("gpu") or {}
            graph_form = bundle.manifest["graph"].get("form", "standard")
            if builder is None:  # the runtime this deploy installed: asked now that it is there
                builder = engine_builder(board, facts, bundle.manifest, edgesdk, answering)
            decision = engine.decide(facts, gpu.get("sm"), bundle.bundle_id, board, builder, graph_form)
            report.info(decision.message)
            if decision.build:
                engine.build_engine(board, edgesdk, release_path, decision)
        with report.step(f"smoke test: edgesdk run releases/{bundle.bundle_id}"):
            generated = smoke_test(board, edgesdk, release_path, options, report)
        with report.step("switch current"):
            previous = facts.state.get("current")
            progress["stage"] = "switch"
            try:
                switched = board.call("switch", {"bundle_id": bundle.bundle_id, "action": "deploy",
                                                 "runtime_key": runtime_key})
            except DeployError as failed:
                if isinstance(failed, BoardRefusal):
                    # The board answered: op_switch refuses before any link moves (another deploy holding the
                    # root's lock past its wait is one such refusal) or puts every link back first, so this
                    # deploy switched nothing. Asking the board to switch back would wait on that lock again
                    # and, refused again, could only say current may be either release.
                    kept = (f"current stays releases/{previous}, as it was before this deploy" if previous else
                            "the board still has no current release")
                    raise DeployError(f"{failed.problem}\nthe board refused the switch before moving any link, so "
                                      f"nothing was switched: {kept}", failed.fix) from failed
                if previous and previous != bundle.bundle_id and progress["current_removed"]:
                    # current pointed to a release whose directory was removed: no switch back can go to it
                    problem, fix = switch_from_a_removed_release(bundle.bundle_id, f"releases/{previous}",
                                                                 "deploying the same bundle again")
                    raise DeployError(f"{failed.problem}\nthe board's reply to the switch did not come back, so "
                                      f"{problem}", f"once the board answers, {fix}") from failed
                if previous and previous != bundle.bundle_id:
                    now = switch_back(board, failed, previous, bundle.bundle_id, facts.state.get("previous"),
                                      active_runtime if runtime_key else None, switched=False)
                    if now is None:
                        report.info(f"switched current back to releases/{previous}")
                    else:
                        report.info(f"current stays releases/{previous}: the switch did not happen"
                                    if now == previous else other_deploy(now, bundle.bundle_id))
                elif previous == bundle.bundle_id and runtime_key and runtime_key != active_runtime:
                    # A redeploy of the release that is current, with another edgesdk: the switch moves
                    # runtime/current alone, and may have moved it before its reply was lost.
                    raise DeployError(
                        f"{failed.problem}\nthe board's reply to the switch did not come back, so runtime/current may "
                        f"already point to {runtime_key} (smoke-tested with releases/{bundle.bundle_id}, current as "
                        f"before) or still to {active_runtime or 'no runtime'}",
                        "once the board answers, 'edgesdk deploy --status' shows which; where it is the new one, "
                        f"restart the unit an earlier deploy --service installed ({RESTART_UNIT}): the same deploy "
                        f"again finds the switch done and {unit_on_rerun(False)}") from failed
                elif not previous and not isinstance(failed, BoardRefusal):
                    # No answer at all: the switch may have happened on the board before its reply was lost.
                    raise DeployError(
                        f"{failed.problem}\nthe board's reply to the switch did not come back, so current may "
                        f"already point to releases/{bundle.bundle_id} (smoke-tested), or the board may still "
                        "have no current release",
                        "once the board answers, 'edgesdk deploy --status' shows which; deploying the same "
                        "bundle again finishes the switch") from failed
                raise
            progress["stage"] = "switched"
            if switched["from"] == bundle.bundle_id:
                report.info(f"current already is releases/{bundle.bundle_id}")
            else:
                report.info(f"current -> releases/{bundle.bundle_id} (was {switched['from'] or 'none'})")
            # what a failed restart switches back to, and the previous release: none where current pointed to a
            # release removed from the board (no switch or rollback can go back to it)
            left = switched["from"] if switched["from"] == bundle.bundle_id else held_release(facts, switched["from"])
            if switched["from"] and left is None:
                report.info(f"releases/{switched['from']}, which current pointed to, is no longer on the board (its "
                            "directory was removed), so there is no previous release to roll back to")
            if runtime_key and switched.get("runtime_from") != runtime_key:
                report.info(f"runtime/current -> {runtime_key} (was {switched.get('runtime_from') or 'none'})")
            # A unit an earlier --service deploy installed runs the release and the runtime it started with: a
            # redeploy of the release that is current with another edgesdk (a new runtime key) switches
            # runtime/current alone, and without a restart the unit went on serving the old edgesdk.
            runtime_moved = bool(runtime_key) and switched.get("runtime_from") != runtime_key
            if options.service is None and (switched["from"] != bundle.bundle_id or runtime_moved):
                # before the prune: a unit that does not come up switches current back, and previous back to
                # the release it pointed to, which a prune with current moved on could have removed
                restart_unit_after_switch(board, report, left, bundle.bundle_id,
                                          facts.state.get("previous"), active_runtime if runtime_key else None,
                                          progress)
            elif options.service is None:
                # nothing switched (an earlier deploy's switch already did, or its switch back was lost), yet the
                # unit may be down since: restarted where it does not answer, and never switched away from
                restart_unit_in_place(board, report, bundle.bundle_id, runtime_key or active_runtime)
            if options.service is None:
                prune_old_releases(board, report, options.keep)
        live = install.runtime_argv(board, options.local) if runtime_key else edgesdk  # runtime/current now
        if options.service is not None:
            progress["stage"] = "service"
            with report.step("service: edgesdk serve current"):
                argv = service.serve_argv(live, board.path("current"), options.service, options.ignore_target)
                token = secrets.token_hex(8)  # names this install's saved state on the board
                try:
                    lines = service.install_service(board, argv, options.service, token)[1]
                except DeployError as failed:
                    raise undo_service(board, report, failed, token, left, bundle.bundle_id,
                                       facts.state.get("previous"), active_runtime if runtime_key else None,
                                       progress, runtime_moved) from failed
                for line in lines:
                    report.info(line)
                # after the unit came up, as a deploy without --service prunes after its restart: a unit that
                # did not come up switched previous back to the release it pointed to, which the prune would
                # have removed
                prune_old_releases(board, report, options.keep)
        return DeployResult(bundle_id=bundle.bundle_id, where=where, root=board.root, bytes_sent=sent_bytes,
                            files_sent=len(plan.send), bytes_reused=plan.reused_bytes if not release_ok else total,
                            runtime_bytes_sent=runtime_sent, seconds=report.elapsed(),
                            previous=previous_release(facts, left, bundle.bundle_id, switched),
                            engine=decision.message, generated=generated,
                            run_command=shlex.join(run_argv(live, board.path("current"), options)),
                            switched=switched["from"] != bundle.bundle_id,
                            runtime_switched_to=runtime_key if runtime_moved else "", repaired=repaired)
