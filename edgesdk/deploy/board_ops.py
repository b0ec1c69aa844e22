"""The board side of deploy, part 5 of 5: commit, verify, switch, prune, and the entry point."""

import errno
import http.client
import json
import os
import shlex
import shutil
import sys
import time
import urllib.error
import urllib.parse

if "BOARD_BUNDLED" not in globals():  # on the host; on the board the parts are concatenated
    from edgesdk.deploy.board_common import (
        MANIFEST,
        Lock,
        Refused,
        drop_journal,
        emit,
        free_bytes,
        fsync_dir,
        history_lines,
        is_plain_name,
        last_switch,
        link_target,
        paths,
        pending_switch,
        read_stamp,
        read_text,
        release_list,
        release_runtimes,
        runtime_finished,
        safe_id,
        settle_commit,
        switch_times,
        verify_dir,
        write_json,
    )
    from edgesdk.deploy.board_install import op_install, write_stamp
    from edgesdk.deploy.board_service import (
        DIRECT,
        SERVICE_NAME,
        SERVICE_RECORD,
        op_service,
        read_record,
        systemctl,
        systemd_quote,
        unit_path,
        unit_scope,
    )
    from edgesdk.deploy.board_transfer import (
        DISK_FULL,
        entry_kind,
        op_probe,
        op_receive,
        plain_id,
        remove_entry,
    )


STAGING_MAX_AGE_S = 24 * 3600
IN_FLIGHT_MAX_AGE_S = 6 * 3600  # the longest a deploy spends between commit and switch (engine build: 2 h)


def op_commit(params):
    """Verify staging/<id> completely, then rename it to releases/<id>.

    A sound releases/<id> (another deploy of this bundle committed it since this one's probe) stays as
    it is, whatever staging holds: that deploy's commit took the staging directory both transfers wrote."""
    p, root = paths(params["root"])
    bundle_id = safe_id(params["bundle_id"])
    staging = os.path.join(p["staging"], bundle_id)
    release = os.path.join(p["releases"], bundle_id)
    with Lock(root):
        settle_commit(p, root)
        if os.path.lexists(release) and not os.path.isdir(release):
            # Deploy writes only directories there: the rename of staging/<id> over this one failed ("Not a
            # directory") in every deploy of the bundle, after its whole transfer.
            raise Refused(f"{release} on the board is {entry_kind(release)}, not a release directory, so the commit "
                          f"cannot rename the bundle's transfer there; nothing was moved, and it stays in {staging}",
                          f"remove it on the board (rm {shlex.quote(release)}), then deploy again: it goes on from "
                          "the transfer, and the board keeps its current release")
        if os.path.isdir(release) and not verify_dir(release, params["manifest_sha256"])[0]:
            # It may be current and in use, so it stays where it is and this transfer goes.
            shutil.rmtree(staging, ignore_errors=True)
            os.utime(release)  # this deploy switches to it next: prune leaves it alone meanwhile
            return {"problems": [], "kept": True}
        for folder, _dirs, files in os.walk(staging):
            for file in files:
                if file.endswith(".partial"):
                    os.unlink(os.path.join(folder, file))
        problems, bad = verify_dir(staging, params["manifest_sha256"])
        if problems:
            for name in bad:
                remove_bad(staging, name)
            return {"problems": problems}
        os.makedirs(p["releases"], exist_ok=True)
        refuse_another_file_system(staging, p["releases"])
        if os.path.isdir(release):
            # A damaged copy of the same bundle (current, maybe): replace it. Two renames, and between them
            # releases/<id> is missing; the journal lets the next helper finish a commit a kill cut there.
            os.makedirs(p[".trash"], exist_ok=True)
            refuse_another_file_system(release, p[".trash"])
            trash = os.path.join(p[".trash"], f"{bundle_id}-{time.time_ns()}")
            write_json(p[".commit.json"], {"bundle_id": bundle_id, "trash": os.path.basename(trash)})
            fsync_dir(root)
            os.replace(release, trash)
        os.replace(staging, release)
        os.utime(release)  # its commit time: prune leaves a release alone while its deploy may still switch to it
        fsync_dir(p["releases"])
        drop_journal(p, root, ".commit.json")
        shutil.rmtree(p[".trash"], ignore_errors=True)
        return {"problems": []}


def refuse_another_file_system(source, folder):
    """Refuse a commit whose rename(2) of ``source`` into ``folder`` would fail, before anything moves: rename
    moves nothing across file systems (EXDEV), as where releases/ (or staging/) is a link to another disk. The
    OSError named only ``source`` and said to check permissions and free space, and every deploy failed there,
    after its whole transfer."""
    if os.stat(source).st_dev != os.stat(folder).st_dev:
        raise Refused(f"{source} and {folder} are on different file systems (a link to another disk?), so the "
                      "commit cannot rename the release into place (rename(2) EXDEV); nothing was moved, and the "
                      "transfer stays in staging",
                      "keep the deploy root's folders on one file system: link the whole deploy root to the other "
                      "disk (or pass that disk's path as --remote-root) instead of one folder under it, then "
                      "deploy again")


def remove_bad(staging, name):
    """Remove ``name``, which verify_dir found bad, from ``staging``, so the next deploy sends it again: a file, or a
    directory at a name the manifest lists as a file (a receive cannot rename the file over it, so left there it
    failed every deploy of the bundle). Only what lies in staging itself: a name read through a link in its parent
    path (``sub`` a link to a directory elsewhere) is left where it is, and the link, itself bad, goes instead. Best
    effort: what stays is found bad again by the next commit."""
    path = os.path.join(staging, name)
    inside = os.path.normpath(os.path.join(os.path.realpath(staging), os.path.dirname(name)))
    if os.path.realpath(os.path.dirname(path)) != inside:
        return
    try:
        remove_entry(path)
    except OSError:
        pass


def op_verify(params):
    """Verify releases/<id> before a rollback smoke-tests it and switches to it: every file against its manifest,
    and the manifest naming bundle ``id`` (a release copied or renamed by hand names another, which the switch's
    check after moving ``current`` would refuse, after the smoke test ran)."""
    p, _root = paths(params["root"])
    bundle_id = safe_id(params["bundle_id"], "release directory",
                        "deploy names each release by its bundle id, so this one was made or renamed by hand: roll "
                        "back to a release 'edgesdk deploy --status' lists that deploy made, or deploy that bundle "
                        "again")
    release = os.path.join(p["releases"], bundle_id)
    if not os.path.isdir(release):
        raise Refused(f"release {release} does not exist on the board",
                      "run 'edgesdk deploy --status' to list the releases the board holds")
    problems = verify_dir(release)[0]
    if problems:
        return {"problems": problems}
    listed = listed_bundle_id(p, bundle_id)
    if listed == bundle_id:
        return {"problems": []}
    # the bundle the copy holds, where it is a plain id: the host's fix names the release to roll back to
    return {"problems": release_name_problem(p, bundle_id, listed),
            "holds": listed if isinstance(listed, str) and plain_id(listed) else None}


def listed_bundle_id(p, bundle_id):
    """The bundle id the (sound) manifest of releases/<bundle_id> names: any JSON value, None where it names none."""
    with open(os.path.join(p["releases"], bundle_id, MANIFEST), "rb") as handle:
        return json.loads(handle.read()).get("bundle_id")


def release_name_problem(p, bundle_id, listed):
    """[what is wrong] with releases/<bundle_id>, whose manifest names ``listed``, another bundle id (or none)."""
    named = f"bundle {listed}" if isinstance(listed, str) and listed else "no bundle id"
    way = ""
    if isinstance(listed, str) and plain_id(listed):
        if link_target(p["current"]) == listed:
            way = f" (releases/{listed}, which holds that bundle, is current already)"
        elif os.path.isdir(os.path.join(p["releases"], listed)):
            way = f" (releases/{listed} holds that bundle: roll back with --release {listed})"
        else:
            way = f" (rename the directory to releases/{listed} to roll back to it)"
    return [f"{MANIFEST} names {named}, not {bundle_id}: the release was copied or renamed by hand (deploy names "
            f"each release by its bundle id), and the switch would refuse it{way}"]


def replace_link(link, target):
    """Point the symlink ``link`` at ``target`` with one rename(2): readers see the old or the new one."""
    tmp = os.path.join(os.path.dirname(link), f".{os.path.basename(link)}.tmp-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except OSError:  # ``link`` is a directory, say: no stray link is left for each try
        os.unlink(tmp)
        raise


def switch_runtime(p, key):
    """runtime/current -> key; the runtime it pointed to before (None where there was none). Nothing is removed
    here: the switch may still be undone (drop_stale_runtimes runs once it is done)."""
    safe_id(key, "edgesdk runtime key", "deploy again without --no-install: it installs the runtime under a plain "
            "key and records that one")
    if not runtime_finished(read_stamp(os.path.join(p["runtime"], key))):  # an install a kill cut short is none
        raise Refused(f"runtime {key} is not installed on the board", "deploy again without --no-install")
    old = link_target(os.path.join(p["runtime"], "current"))
    if old != key:
        replace_link(os.path.join(p["runtime"], "current"), key)
        fsync_dir(p["runtime"])
    return old


def drop_stale_runtimes(p, key, old, paired):
    """After a switch to runtime ``key`` is done: mark it switched to, and keep it, the one it replaced (``old``),
    ``paired`` (the runtime the release ``previous`` now points to last ran with: a rollback goes back to that
    pair) and any that a deploy in flight installed and has not switched to yet; drop older and unfinished
    runtimes. Not before the switch is done (its journal dropped, or settled by settle_switch): a switch undone
    puts back a ``previous`` whose runtime must still be there for a rollback. Best effort: the switch stands
    whatever this leaves, and the next switch drops what is left."""
    mark_switched(os.path.join(p["runtime"], key))
    try:
        for stale in os.listdir(p["runtime"]):
            if (stale not in (key, old, paired, "current", "wheels") and not stale.startswith(".")
                    and not runtime_in_flight(os.path.join(p["runtime"], stale))):
                shutil.rmtree(os.path.join(p["runtime"], stale), ignore_errors=True)
    except OSError:
        pass


def mark_switched(venv):
    """Record in the runtime's stamp that it has been runtime/current: no deploy in flight waits for it any
    more. Best effort: an unmarked runtime is only kept longer (runtime_in_flight)."""
    stamp = read_stamp(venv)
    if isinstance(stamp, dict) and "switched" not in stamp:
        try:
            write_stamp(venv, {**stamp, "switched": time.time()})
        except OSError:
            pass


def runtime_in_flight(venv):
    """The runtime was installed less than IN_FLIGHT_MAX_AGE_S ago (in either direction: a clock set back) and
    has never been runtime/current: the deploy that installed it may still switch to it, as with a release
    committed and not yet switched to (committed_since_switch)."""
    stamp = read_stamp(venv)
    if not isinstance(stamp, dict) or "switched" in stamp:
        return False
    installed = stamp.get("installed")
    return isinstance(installed, (int, float)) and abs(time.time() - installed) < IN_FLIGHT_MAX_AGE_S


def op_switch(params):
    """Point current at releases/<id> atomically (and runtime/current at ``runtime_key`` first, when
    given); previous keeps what current was.

    All or nothing: a switch that fails part-way (its history line or the check after it, on a full
    disk say) puts current, previous and runtime/current back as they were before it is refused, so a
    refusal means the board runs what it ran. A switch killed part-way (the helper, the connection or
    the board's power cut) leaves its journal, .switch.json: the next switch or prune finishes it when
    current had moved (previous -> the release it left, which prune would otherwise remove) and puts
    the links back when it had not (runtime/current with them).

    With ``if_current`` (undoing a failed deploy), nothing moves unless current still points to that
    release: a concurrent deploy that switched current since keeps its release and runtime, and the reply
    says ``"skipped": true`` with the release current points to.

    The reply's ``previous`` is the release previous points to after the switch, read under the root's lock
    (None where it points to no release on the board): what --rollback goes to. The deploy's probe read it
    before, and a concurrent deploy may have moved it since (two deploys of one bundle: the second finds the
    first's switch done, and previous is the release the first switched away from)."""
    p, root = paths(params["root"])
    bundle_id = safe_id(params["bundle_id"])
    with Lock(root):
        settle_commit(p, root)
        settle_switch(p, root)
        now = link_target(p["current"])
        if "if_current" in params and now != params["if_current"]:
            return {"from": now, "to": now, "runtime_from": None, "skipped": True}
        if not os.path.isfile(os.path.join(p["releases"], bundle_id, MANIFEST)):
            raise Refused(f"release {bundle_id} is not on the board", "deploy it first")
        for name in links_to_move(p, bundle_id, params):
            refuse_a_link_not_deploys(os.path.join(root, name), "runtime" if name == "runtime/current" else "release")
        before = {name: read_link(os.path.join(root, name)) for name in SWITCH_LINKS}
        # the runtime that previous last ran with stays: a redeploy of the release that is current (runtime/current
        # switched to itself) would otherwise remove it, and a rollback would run previous with another edgesdk
        paired = release_runtimes(p).get(previous_after(p, bundle_id, params))
        write_journal(p, root, bundle_id, before, params)
        try:
            result = switch_links(p, root, bundle_id, params)
        except BaseException:
            put_back(root, before)
            drop_journal(p, root)
            raise
        drop_journal(p, root)
        record_runtime(p, bundle_id)
        if result["from"] == bundle_id:
            no_longer_in_flight(p, bundle_id)
        if params.get("runtime_key"):  # the switch is done: what no rollback needs goes
            drop_stale_runtimes(p, params["runtime_key"], result["runtime_from"], paired)
        previous = link_target(p["previous"])
        held = is_plain_name(previous) and os.path.isdir(os.path.join(p["releases"], previous))
        result["previous"] = previous if held and previous != bundle_id else None
        return result


def no_longer_in_flight(p, bundle_id):
    """After a switch to releases/<bundle_id> that was current already (a deploy of the same bundle again, or one that
    repaired it), which moves no link and writes no history line: give the release back the time of its last switch,
    where that deploy's commit gave it a later one. Else, once current moved on, prune took it for a release another
    deploy had committed and not switched to yet (committed_since_switch) and kept it past --keep, without a word, for
    IN_FLIGHT_MAX_AGE_S. Best effort: a release left as it is is only kept longer."""
    switched = switch_times(p).get(bundle_id)
    release = os.path.join(p["releases"], bundle_id)
    try:
        if switched is not None and os.path.getmtime(release) > switched:
            whole = int(switched)  # whole seconds: not past the switch once the file system rounds it
            os.utime(release, (whole, whole))
    except (OSError, OverflowError, ValueError):
        pass


def links_to_move(p, bundle_id, params):
    """The SWITCH_LINKS a switch to ``bundle_id`` may replace or remove, as switch_links moves them: current and
    runtime/current where they point elsewhere (runtime/current only with a ``runtime_key``), previous only where
    current moves and previous goes to the release current left or back to ``params["previous"]``. A redeploy of
    the current release moves none of them."""
    now = link_target(p["current"])
    moved = []
    if now != bundle_id:
        moved.append("current")
        if "previous" in params or (now and os.path.isdir(os.path.join(p["releases"], now))):
            moved.append("previous")
    if params.get("runtime_key") and link_target(os.path.join(p["runtime"], "current")) != params["runtime_key"]:
        moved.append("runtime/current")
    return moved


def refuse_a_link_not_deploys(link, what):
    """Refuse a switch that would move ``link`` (current or previous, the link to a release; runtime/current, to a
    runtime: ``what``) where that is a directory or file, not the link deploy makes: rename(2) of a link onto a
    directory fails (EISDIR), and no link may replace a file not deploy's. Found only by the rename, the error
    named the switch's temporary link, gone by then, and said to check permissions and free space."""
    if os.path.lexists(link) and not os.path.islink(link):
        kind = "directory" if os.path.isdir(link) else "file"
        raise Refused(f"{link} on the board is a {kind}, not the link to a {what} that deploy makes, so the switch "
                      "cannot replace it; nothing was switched",
                      f"move that {kind} away (it is not deploy's), then deploy or roll back again")


def record_runtime(p, bundle_id):
    """Note in runtimes.json that releases/<bundle_id> runs with the runtime runtime/current points to now (after
    a switch to it: runtime/current moves only with a switch, so this is the runtime it last ran with), for a
    rollback to go back to that pair (releases.rollback). Entries of releases no longer on the board are
    dropped. Best effort: the switch is done, and a rollback without an entry keeps runtime/current."""
    pairs = release_runtimes(p)
    runtime = link_target(os.path.join(p["runtime"], "current"))
    if runtime:
        pairs[bundle_id] = runtime
    else:
        pairs.pop(bundle_id, None)
    pairs = {k: v for k, v in pairs.items() if os.path.isdir(os.path.join(p["releases"], k))}
    try:
        write_json(p["runtimes.json"], pairs)
    except OSError:
        try:
            os.unlink(p["runtimes.json"] + ".partial")
        except OSError:
            pass


SWITCH_LINKS = ("current", "previous", "runtime/current")


def write_journal(p, root, bundle_id, before, params):
    """What this switch is about to do, on disk before any link moves (written whole, or not at all)."""
    journal = {"time": time.time(), "to": bundle_id, "from": link_target(p["current"]), "before": before,
               "action": params.get("action", "deploy"), "runtime_key": params.get("runtime_key")}
    if journal["from"] != bundle_id:
        if "previous" in params:  # undoing a failed deploy: previous goes back to what it was
            journal["previous_after"] = params["previous"]
        elif journal["from"] and os.path.isdir(os.path.join(p["releases"], journal["from"])):
            journal["previous_after"] = journal["from"]
        elif link_target(p["previous"]) == bundle_id:  # as switch_links: previous is not left equal to current
            journal["previous_after"] = None
    write_json(p[".switch.json"], journal)
    fsync_dir(root)


def put_back(root, before):
    """current, previous and runtime/current as they were before a switch (``before``: name -> raw link)."""
    for name in SWITCH_LINKS:
        link = os.path.join(root, name)
        if read_link(link) != before.get(name):
            put_link(link, before.get(name))
    fsync_dir(root)


def settle_switch(p, root):
    """Finish or undo a switch that was killed part-way (its journal is still there): once current points to
    the new release the switch counts as done, so previous moves to the release it left, its history line is
    written if missing and, where it switched runtime/current, the runtimes no rollback needs are dropped, as
    op_switch drops them; before that, every link goes back as it was."""
    journal = pending_switch(p)
    if journal is None:
        if os.path.lexists(p[".switch.json"]):  # unreadable: cut short while written, before any link moved
            drop_journal(p, root)
        return
    bundle_id = journal["to"]
    if link_target(p["current"]) == bundle_id:
        if "previous_after" in journal:
            restore_link(p, "previous", journal["previous_after"])
        if journal["from"] != bundle_id and not switch_recorded(p, journal):
            append_history(p, {"time": journal["time"], "action": journal.get("action", "deploy"),
                               "from": journal["from"], "to": bundle_id})
        fsync_dir(root)
        record_runtime(p, bundle_id)  # runtime/current moves first: where current has moved, it has too
    else:
        put_back(root, journal.get("before") or {})
    drop_journal(p, root)
    key = journal.get("runtime_key")
    if key and link_target(p["current"]) == bundle_id and link_target(os.path.join(p["runtime"], "current")) == key:
        old = (journal.get("before") or {}).get("runtime/current")
        drop_stale_runtimes(p, key, os.path.basename(old.rstrip("/")) if isinstance(old, str) else None,
                            release_runtimes(p).get(link_target(p["previous"])))


def switch_recorded(p, journal):
    """Whether the last line of history.jsonl is the switch of ``journal``: switch_links writes it last, under the
    lock, so no line follows it. Not by time: on a board whose clock was set back since (no real-time clock, NTP
    not synced yet), an earlier switch to the same release has a later time than this one's journal."""
    last = last_switch(p)
    return last is not None and last["to"] == journal["to"] and last["from"] == journal["from"]


def read_link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def put_link(link, target):
    """``link`` -> ``target`` again, or no ``link`` when ``target`` is None (best effort: undoing a switch)."""
    try:
        if target is None:
            os.unlink(link)
        else:
            replace_link(link, target)
    except OSError:
        pass


def previous_after(p, bundle_id, params):
    """The release ``previous`` points to once switch_links has switched current to ``bundle_id``."""
    if "previous" in params:  # undoing a failed deploy: previous goes back to what it was
        return params["previous"]
    now = link_target(p["current"])
    if now != bundle_id and now and os.path.isdir(os.path.join(p["releases"], now)):
        return now
    previous = link_target(p["previous"])
    return previous if previous != bundle_id else None


def switch_links(p, root, bundle_id, params):
    old_runtime = switch_runtime(p, params["runtime_key"]) if params.get("runtime_key") else None
    old = link_target(p["current"])
    if old != bundle_id:
        replace_link(p["current"], os.path.join("releases", bundle_id))
        if old and os.path.isdir(os.path.join(p["releases"], old)):
            replace_link(p["previous"], os.path.join("releases", old))
        elif link_target(p["previous"]) == bundle_id and os.path.lexists(p["previous"]):
            # current pointed to a removed release (a rollback out of that): previous named the release switched
            # to, which would leave previous the same as current and a later --rollback "already current"
            os.unlink(p["previous"])
        if "previous" in params:  # undoing a failed deploy: previous goes back to what it was, too
            restore_link(p, "previous", params["previous"])
        fsync_dir(root)
    now = link_target(p["current"])
    listed, holding = manifest_bundle_id(os.path.join(p["current"], MANIFEST))
    if now != bundle_id or listed != bundle_id:
        raise Refused(f"after the switch, current points to {now} holding {holding}, not {bundle_id}",
                      "the switch was undone, current is as it was; deploy that bundle again (it replaces a "
                      "damaged release) and report this if it repeats")
    if old != bundle_id:  # after the check: a switch it undoes leaves no line saying current moved
        append_history(p, {"time": time.time(), "action": params.get("action", "deploy"), "from": old,
                           "to": bundle_id})
    return {"from": old, "to": bundle_id, "runtime_from": old_runtime}


def manifest_bundle_id(path):
    """(the bundle id the manifest at ``path`` names or None, how the switch's refusal words what it holds). A
    manifest.json that is no JSON (a damaged block of the board's card: the switch back after a failed deploy
    verifies nothing first) is named as such: its parse error failed the helper, which said to report a bug."""
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, bad UTF-8, deep nesting
        return None, f"a {MANIFEST} that is not JSON (damaged)"
    listed = manifest.get("bundle_id") if isinstance(manifest, dict) else None  # a manifest made by hand: refused
    return listed, f"bundle {listed}" if isinstance(listed, str) else "a manifest with no bundle id"


def ends_a_line(path):
    """Whether the file at ``path`` is empty, missing or ends with a newline: a line appended to it starts a line."""
    try:
        with open(path, "rb") as handle:
            if handle.seek(0, os.SEEK_END) == 0:
                return True
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
    except OSError:
        return True


def append_history(p, entry):
    """Append ``entry`` to history.jsonl as a line of its own. After a line cut short (a full disk took part of a
    switch's line, and the switch was undone), it starts a new line: joined to that one, it did not parse, and the
    switch was missing from history (the last switch, and the order prune keeps releases in)."""
    text = json.dumps(entry) + "\n"
    with open(p["history.jsonl"], "a") as handle:
        handle.write(text if ends_a_line(p["history.jsonl"]) else "\n" + text)


def restore_link(p, name, bundle_id):
    """Point ``name`` back at releases/<bundle_id>, or remove it when that was none or is gone."""
    if bundle_id and os.path.isdir(os.path.join(p["releases"], safe_id(bundle_id))):
        replace_link(p[name], os.path.join("releases", bundle_id))
    elif os.path.lexists(p[name]):
        os.unlink(p[name])


def committed_since_switch(p, bundle_id, switched):
    """releases/<id> was committed less than IN_FLIGHT_MAX_AGE_S ago and current has not been switched to it
    since: a deploy may still switch to it (a bundle deployed again after a prune has a switch from before).
    A commit time further in the future than that (the clock was set back since) is no deploy in flight."""
    try:
        committed = os.path.getmtime(os.path.join(p["releases"], bundle_id))
    except OSError:
        return False
    return (switched.get(bundle_id, float("-inf")) < committed
            and abs(time.time() - committed) < IN_FLIGHT_MAX_AGE_S)


def staging_unused(path):
    """The staging directory at ``path`` was last used more than STAGING_MAX_AGE_S ago, in either direction: a
    receive sets its mtime to now, so one further in the future than that was written before the clock was set back
    (a board without a real-time clock whose clock ran ahead until NTP synced), and no deploy has used it since. Taken
    as fresh, it stayed until the clock caught up with it, a bundle's room on the card that no prune freed."""
    return abs(time.time() - os.lstat(path).st_mtime) > STAGING_MAX_AGE_S  # a link's own: it may lead nowhere


def keep_mtime(path, before):
    """Give the directory at ``path``, where it is still there, the times ``before`` (its lstat) held: what a removal
    cut short took out of it changed its mtime, and a release changed since its last switch is one a deploy is
    taken to be committing (committed_since_switch), which the next prune kept without a word."""
    try:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    except OSError:
        pass


def removal_problem(path):
    """Remove what is at ``path`` (a directory with all it holds, a file, a link itself and not what it points to),
    as far as it goes: None where nothing is there now, else why not (the first error, naming its file). rmtree
    refuses a link, and a file is no directory to it, so with its errors ignored it left both where they were,
    reported removed; and a release whose removal failed part-way (a file the helper may not delete, a mount
    point under it) was reported neither removed nor kept."""
    errors = []

    def note(_function, failed, error):  # error: the exception (onexc), or sys.exc_info() (onerror, before 3.12)
        error = error[1] if isinstance(error, tuple) else error
        errors.append(f"{failed}: {getattr(error, 'strerror', None) or error}")

    if os.path.isdir(path) and not os.path.islink(path):
        before = os.lstat(path)
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=note)  # onerror is deprecated there
        else:
            shutil.rmtree(path, onerror=note)
        keep_mtime(path, before)
    else:
        try:
            os.unlink(path)
        except OSError as exc:
            note(os.unlink, path, exc)
    if not os.path.lexists(path):
        return None
    return errors[0] if errors else f"{path} is still there"


def op_prune(params):
    """Keep the newest ``keep`` releases, never current, previous or one that another deploy committed
    and has not switched to since (its engine build or smoke test may still be running: protected for
    IN_FLIGHT_MAX_AGE_S after its commit); drop staging dirs unused for a day. With ``remove`` (a release id:
    ``deploy --remove``), that one release goes instead, and nothing else (remove_release)."""
    p, root = paths(params["root"])
    if params.get("remove") is not None:
        return remove_release(p, root, params["remove"])
    keep = max(int(params["keep"]), 1)
    gone, failed = [], []

    def remove(name, path, listed=True):
        problem = removal_problem(path)
        if problem:
            failed.append({"name": name, "path": path, "error": problem})
        elif listed:
            gone.append(name)

    with Lock(root):
        settle_commit(p, root)  # a commit a kill cut short: its release first, which prune must not miss
        settle_switch(p, root)  # a switch a kill cut short: previous first points where it belongs
        state = release_list(p)
        switched = switch_times(p)
        in_flight = {r["id"] for r in state["releases"] if committed_since_switch(p, r["id"], switched)}
        protected = {state["current"], state["previous"]} | in_flight
        newest = [r["id"] for r in reversed(state["releases"])]
        kept = [r for r in newest if r in protected]
        for release in newest:
            if release in protected:
                continue
            if len(kept) < keep:
                kept.append(release)
                continue
            remove(release, os.path.join(p["releases"], release))
            # An engine left behind is named: no later prune looks for it once its release is gone.
            remove("engines/" + release, os.path.join(p["engines"], release), listed=False)
        held_back = kept_in_flight(newest, {state["current"], state["previous"]}, in_flight, keep)
        # Unfinished transfers of other bundles stay resumable for a day (and a deploy running
        # next to this one keeps its staging directory); older ones go.
        for stale in state["staging"]:
            path = os.path.join(p["staging"], stale)
            if staging_unused(path):
                remove("staging/" + stale, path)
    return {"removed": gone, "kept": kept, "failed": failed, "in_flight": held_back}


def kept_in_flight(newest, base, in_flight, keep):
    """The releases of ``in_flight`` (committed_since_switch) that prune kept only for that: past the newest ``keep``
    with current and previous (``base``). The host names them, or --keep N left more than N without a word."""
    would_keep = [r for r in newest if r in base]
    for release in newest:
        if release not in base and len(would_keep) < keep:
            would_keep.append(release)
    return [r for r in newest if r in in_flight and r not in would_keep]


def remove_release(p, root, bundle_id):
    """Remove releases/<bundle_id>, its engines and the runtime only it ran with (``deploy --remove``), as a prune
    removes a release past --keep, under the same lock. Current is refused: the host refuses it after its probe,
    and this refuses it again under the lock, where a deploy may have switched to it since. Previous goes, link
    and all: a link left naming a removed release made --status list it as "removed" and --rollback fail on a
    missing directory, where without it both say there is no previous release."""
    bundle_id = safe_id(bundle_id, "release id", "pass an id that 'edgesdk deploy --status' lists")
    with Lock(root):
        settle_commit(p, root)
        settle_switch(p, root)
        state = release_list(p)
        held = [r["id"] for r in reversed(state["releases"])]
        if bundle_id not in held:
            raise Refused(f"release {bundle_id} is not on the board (it holds {', '.join(held) or 'no release'})",
                          "pass one of those ids; 'edgesdk deploy --status' lists them")
        if bundle_id == state["current"]:
            raise Refused(f"release {bundle_id} is current, so it is not removed",
                          "roll back first (edgesdk deploy --rollback) or deploy another bundle, then remove it")
        was_previous = bundle_id == state["previous"]
        runtime = release_runtimes(p).get(bundle_id)
        problem = removal_problem(os.path.join(p["releases"], bundle_id))
        if problem:
            return {"removed": [], "failed": [{"name": bundle_id, "path": os.path.join(p["releases"], bundle_id),
                                               "error": problem}], "previous": was_previous, "runtime_removed": None}
        failed = []
        engines = os.path.join(p["engines"], bundle_id)
        problem = removal_problem(engines)
        if problem:
            failed.append({"name": "engines/" + bundle_id, "path": engines, "error": problem})
        if was_previous and os.path.islink(p["previous"]):
            os.unlink(p["previous"])
            fsync_dir(root)
        record_runtime_of_removed(p, bundle_id)
        gone_runtime = drop_runtime_of_removed(p, runtime)
    return {"removed": [bundle_id], "failed": failed, "previous": was_previous, "runtime_removed": gone_runtime}


def record_runtime_of_removed(p, bundle_id):
    """Drop the removed release's line of runtimes.json (best effort, as record_runtime writes it)."""
    pairs = release_runtimes(p)
    if pairs.pop(bundle_id, None) is None:
        return
    try:
        write_json(p["runtimes.json"], pairs)
    except OSError:
        pass


def drop_runtime_of_removed(p, key):
    """Remove runtime/<key>, the one the removed release last ran with, where no other release ran with it last,
    runtime/current does not point to it and no deploy in flight installed it: what a switch's drop_stale_runtimes
    keeps for a rollback to that release, which no rollback can go to any more. Returns the key removed, or None."""
    if not key or key in ("current", "wheels") or key.startswith(".") or key in release_runtimes(p).values():
        return None
    venv = os.path.join(p["runtime"], key)
    if (link_target(os.path.join(p["runtime"], "current")) == key or not os.path.isdir(venv)
            or runtime_in_flight(venv)):
        return None
    shutil.rmtree(venv, ignore_errors=True)
    return None if os.path.lexists(venv) else key


# The seconds --status waits for the service's /health: a server that holds its port without answering (stopped
# with SIGSTOP, or busy loading) is told as such, not waited on for the minutes of a deploy's wait
STATUS_HEALTH_TIMEOUT_S = 3
# what ``systemctl is-active`` and ``is-enabled`` print as a unit's state (systemctl(1)); anything else they print is
# the service manager's complaint (no bus, no user manager)
ACTIVE_STATES = ("active", "reloading", "inactive", "failed", "activating", "deactivating", "maintenance",
                 "refreshing", "unknown")
ENABLED_STATES = ("enabled", "enabled-runtime", "linked", "linked-runtime", "alias", "masked", "masked-runtime",
                  "static", "indirect", "disabled", "generated", "transient", "bad", "not-found")


def op_probe_status(params):
    """The probe (board_transfer.op_probe), with, when ``service`` is asked for (``deploy --status``), what the
    unit a ``deploy --service`` installed is doing (service_facts): one call, one ssh session."""
    facts = op_probe(params)
    if params.get("service"):
        p, root = paths(params["root"])
        facts["service"] = service_facts(p, root)
    return facts


def service_facts(p, root):
    """The unit the deploy root's service.json records (None where none was installed): whether its file is still
    there and still serves this root's current, what systemd says of it (is-active, is-enabled; ``systemd`` names
    why it cannot say: no systemctl, or a manager that does not answer), what its /health answers (the model and
    backend the server runs) and the release it serves (server_facts). A server killed (kill -9) or stuck reads as
    such here, where --status said nothing of the service at all."""
    record = read_record(os.path.join(root, SERVICE_RECORD))
    if record is None:
        return None
    scope, unit, url = record.get("scope"), record.get("unit"), record.get("health_url")
    facts = {"name": SERVICE_NAME, "scope": scope, "unit": unit, "health_url": url, "unit_exists": False,
             "serves_root": None, "systemd": None, "active": None, "enabled": None, "health": None, "server": None}
    try:
        with open(unit, encoding="utf-8") as handle:
            facts["serves_root"] = systemd_quote(p["current"]) + " " in handle.read()
        facts["unit_exists"] = True
    except (OSError, TypeError, ValueError, Refused):
        pass
    if shutil.which("systemctl") is None:
        facts["systemd"] = "the board has no systemctl"
    elif scope in ("system", "user"):
        facts["active"], said = unit_answer(scope, "is-active", ACTIVE_STATES)
        facts["enabled"], said_too = unit_answer(scope, "is-enabled", ENABLED_STATES)
        facts["systemd"] = said or said_too
    if isinstance(url, str):
        facts["health"] = health_answer(url)
        facts["server"] = server_facts(p, url, facts["health"])
    return facts


def unit_answer(scope, command, states):
    """(the unit's state as ``systemctl is-active`` / ``is-enabled`` prints it, None), or (None, what systemctl said
    instead) where the manager did not answer (no bus, no user manager running)."""
    code, out = systemctl(scope, command, SERVICE_NAME, timeout=10)
    word = out.strip().splitlines()[-1].strip() if out.strip() else ""
    if word in states:
        return word, None
    return None, (word or f"systemctl {command} exited with {code}")[:300]


def health_answer(url):
    """What ``url`` (the unit's /health) answers: ``ok`` with the model, backend and bundle id it names, else the
    error. ``names_bundle_id`` tells a server that names none (null: a model is loading) from one older than
    bundle_id in /health, whose release only its start time tells (server_facts)."""
    try:
        with DIRECT.open(url, timeout=STATUS_HEALTH_TIMEOUT_S) as reply:
            status, text = reply.status, reply.read(1 << 16)
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": f"HTTP {exc.code}"}
    except urllib.error.URLError as exc:
        return {"ok": False, "error": str(getattr(exc.reason, "strerror", None) or exc.reason)}
    except (http.client.HTTPException, OSError, ValueError) as exc:
        return {"ok": False, "error": str(getattr(exc, "strerror", None) or exc) or type(exc).__name__}
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return {"ok": False, "error": f"HTTP {status} with a body that is no JSON object: not edgesdk serve"}
    return {"ok": status == 200, "status": body.get("status"), "model": body.get("model"),
            "backend": body.get("backend"), "bundle_id": body.get("bundle_id"),
            "names_bundle_id": "bundle_id" in body}


def listener_pid(port):
    """The process that listens on TCP ``port`` here (its socket's inode in /proc/net/tcp{,6}, found among the open
    files of the processes this user may look into), or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read_text(table, 1 << 22) or "").splitlines()[1:]:
            fields = line.split()
            try:
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
            except (IndexError, ValueError):
                continue
    if not inodes:
        return None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if any(os.readlink(os.path.join("/proc", pid, "fd", fd)) in inodes
                   for fd in os.listdir(os.path.join("/proc", pid, "fd"))):
                return int(pid)
        except OSError:
            continue
    return None


def process_started(pid):
    """When process ``pid`` started, as time.time() counts (its start in clock ticks after boot, /proc/PID/stat's
    22nd field, against /proc/uptime), or None."""
    try:
        stat = read_text(f"/proc/{pid}/stat") or ""
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        uptime = float((read_text("/proc/uptime") or "").split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (IndexError, ValueError, OSError):
        return None


def served_release(p, started):
    """The release ``current`` pointed to when a server started at ``started`` read it: the one the last switch
    before then switched to (history.jsonl), else None. A server started before the last switch serves what current
    was then: its restart after a switch failed, or never ran (a switch by hand)."""
    served = None
    for line in history_lines(p):
        try:
            entry = json.loads(line)
            if float(entry["time"]) <= started:
                served = entry["to"] if isinstance(entry["to"], str) else served
        except (ValueError, KeyError, TypeError):
            continue
    return served


def served_bundle_release(p, bundle_id):
    """The release here that holds ``bundle_id``, the bundle a server's /health names: releases/<bundle_id>, as a
    commit names a release by its manifest's bundle id (and verify refuses one whose manifest names another), and
    as --status lists them (release_list); None where there is none (removed since the server loaded it, or a
    bundle never deployed here)."""
    if is_plain_name(bundle_id) and os.path.isdir(os.path.join(p["releases"], bundle_id)):
        return bundle_id
    return None


def server_facts(p, url, health=None):
    """The server on the port of ``url`` and the release it serves. Where its /health names the bundle it loaded
    (``health``: bundle_id, the manifest's), that is the release; a server older than bundle_id in /health is told
    by its start time against the switches (served_release), which needs this user to see its /proc entries and
    reads wrong after a clock step or a switch in the same second, so it is only the fallback (``release_from``).
    The listening process (its id, whether its command line serves this root's current) is added where this user
    may look into it. None where /health names no bundle and no process this user may look into listens there."""
    try:
        port = urllib.parse.urlsplit(url).port
    except ValueError:
        return None
    pid = listener_pid(port) if port else None
    named = isinstance(health, dict) and bool(health.get("ok")) and bool(health.get("names_bundle_id"))
    if pid is None and not named:
        return None
    facts = {"pid": pid, "serves_current": None, "started": None, "bundle_id": None, "release": None,
             "release_from": None}
    if pid is not None:
        facts["started"] = process_started(pid)
        facts["serves_current"] = p["current"] in (read_text(f"/proc/{pid}/cmdline") or "").split("\0")
    if named:
        bundle_id = health.get("bundle_id")
        facts["bundle_id"] = bundle_id if isinstance(bundle_id, str) else None
        facts["release"] = served_bundle_release(p, facts["bundle_id"])
        facts["release_from"] = "health"
    elif facts["started"] is not None:
        facts["release"] = served_release(p, facts["started"])
        facts["release_from"] = "start time"
    return facts


OPS = {"probe": op_probe_status, "receive": op_receive, "commit": op_commit, "verify": op_verify,
       "switch": op_switch, "prune": op_prune, "install": op_install, "service": op_service}


# The errors of a write that found no room: board_transfer's DISK_FULL (a full disk, the user's quota) and a file size
# limit (ulimit -f, or FAT32's 4 GiB), as edgesdk.errors.DISK_FULL lists them (the helper runs without edgesdk)
WRITE_NO_ROOM = (*DISK_FULL, errno.EFBIG)
OP_WORDS = {"receive": "receiving the bundle's files into staging", "commit": "committing the release",
            "switch": "switching current", "prune": "pruning old releases", "install": "installing the runtime",
            "service": "writing the service unit", "verify": "verifying a release", "probe": "probing the board"}


def free_now(folder):
    """``N MB free there now`` for ``folder`` (its nearest existing parent), read after the write failed: the room
    the failed step took may be back by then (a receive removes the file it could not finish), so a figure without
    "now" read as a contradiction of "No space left on device". '' where it cannot be read."""
    try:
        return f"{free_bytes(folder)['free'] / 1e6:.1f} MB free there now"
    except (OSError, TypeError):
        return ""


def no_room(op, params, exc):
    """The reply for a write the board had no room for (``exc``: errno in WRITE_NO_ROOM) during ``op``. A failed
    write names no file (only open(2) and the like do), so the generic OSError reply said "board: No space left on
    device" and to check the permissions: this one names the step, where it writes and the free space there now,
    and that current is untouched (a switch that fails puts every link back; no other step moves one). The
    ``service`` step writes its unit outside the deploy root, into systemd's unit directory (/etc/systemd/system,
    ~/.config/systemd/user, often another file system), and its record under the root: it names both."""
    root = params.get("root") if isinstance(params, dict) else None
    where = os.path.abspath(os.path.expanduser(root)) if isinstance(root, str) and root else None
    doing = OP_WORDS.get(op, f"running the helper's {op!r} operation")
    place = f"the deploy root {where}" if where else "the deploy root"
    free = free_now(where) if where else ""
    free = f", {free}" if free else ""
    if op == "service":
        units = os.path.dirname(unit_path(unit_scope()))
        rooms = [f"{folder}: {room}" for folder, room in ((units, free_now(units)), (where, free[2:])) if room]
        place, free = f"the unit directory {units} or {place}", f" ({'; '.join(rooms)})" if rooms else ""
    file = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    rerun = ("run the same command again: it resumes where this one stopped, and files that arrived whole are not "
             "sent again")
    if exc.errno == errno.EFBIG:
        return {"ok": False,
                "error": f"the board could not write a file{file} under {place} while {doing}: {exc.strerror or exc} "
                         f"(a file reached the largest size its file system, FAT32 say, or the helper's file size "
                         f"limit, ulimit -f, allows{free})",
                "fix": "current is untouched; raise the file size limit of the login shell on the board (ulimit -f "
                       "unlimited) or pass --remote-root a directory on a file system without FAT32's 4 GiB limit "
                       f"(ext4), then {rerun}"}
    return {"ok": False,
            "error": f"the board ran out of room under {place}{file} while {doing}: {exc.strerror or exc}{free}",
            "fix": f"current is untouched; free space under {place} ('edgesdk deploy --status' lists the releases "
                   f"it holds, '--remove ID' removes one), then {rerun}"}


def main(argv):
    op, params = None, None
    try:
        op, params = argv[0], json.loads(argv[1])
        if op not in OPS:
            raise Refused(f"unknown helper operation {op!r}", "use the same edgesdk version on both sides")
        result = OPS[op](params)
        result["ok"] = True
        emit(result)
        return 0
    except Refused as exc:
        emit({"ok": False, "error": exc.problem, "fix": exc.fix})
        return 3
    except OSError as exc:
        if exc.errno in WRITE_NO_ROOM:
            emit(no_room(op, params, exc))
            return 3
        emit({"ok": False, "error": f"{getattr(exc, 'filename', None) or 'board'}: {exc.strerror or exc}",
              "fix": "check the permissions and free space under the deploy root on the board"})
        return 3
    except Exception as exc:  # noqa: BLE001 - reported to the host instead of a traceback it cannot parse
        emit({"ok": False, "error": f"the deploy helper failed on the board: {exc!r}",
              "fix": "report this with the output of 'edgesdk deploy --status'"})
        return 4


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
