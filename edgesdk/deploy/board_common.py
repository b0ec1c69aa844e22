"""The board side of ``edgesdk deploy``, part 1 of 5: shared helpers (stdlib only, Python >= 3.8).

The five ``board_*.py`` files travel to the board concatenated into one script (common, transfer,
install, service, ops) and run as ``python3 -c BOOT OP JSON``; on the host each is also a normal module.

The host never builds shell text from paths or names: it sends the script (compressed, inside the
``-c`` argument) and the operation's parameters as one JSON argument, both shell-quoted. Each
operation prints one JSON object on stdout (``{"ok": true, ...}`` or ``{"error": ..., "fix": ...}``).
It runs on the board's Python before edgesdk is installed there, so it needs Python >= 3.8 and
nothing outside the standard library.

Layout under the deploy root::

    releases/<bundle-id>/   verified bundles, never modified after they are committed
    current -> releases/<id>    switched with rename(2) of a fresh symlink (atomic)
    previous -> releases/<id>   what ``current`` pointed to before the last switch
    .switch.json            a switch in progress (board_ops.op_switch); the next switch or prune finishes
                            or undoes one a kill cut short
    .commit.json            a commit replacing a damaged release in progress (board_ops.op_commit); the next
                            receive, commit, switch or prune finishes one a kill cut short
    staging/<bundle-id>/    files being received; ``<name>.partial`` while incomplete (resumable)
    runtime/<key>/          edgesdk runtime virtual environments; runtime/current -> <key>
    engines/<bundle-id>/    TensorRT engines, one directory per JetPack / TensorRT / SM
    history.jsonl           one line per switch
    runtimes.json           release id -> the runtime (``runtime/current``) it last ran with; a rollback goes
                            back to that pair
"""

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

CHUNK = 1 << 20
MANIFEST, DIGEST = "manifest.json", "manifest.sha256"


class Refused(Exception):
    """A failure the host shows as a problem and a fix."""

    def __init__(self, problem, fix):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(CHUNK)
            if not block:
                return digest.hexdigest()
            digest.update(block)


PARTIAL = ".partial"  # the suffix a file has on the board while it arrives (board_transfer.receive_file)


def name_problem(name):
    """Why the board refuses ``name`` as a bundle file's name, or None: it must stay inside the bundle directory,
    as a plain relative path, and must not be taken for the receive's own files (``NAME.partial``, while NAME
    arrives). verify_bundle holds the same rule, so a bundle the board would refuse fails on the host first."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "would escape the bundle directory (an absolute path, '..', or an empty, '.' part)"
    if "\\" in name or "\x00" in name:
        return "holds a backslash or a NUL byte, which the board refuses in a bundle file's name"
    if name.endswith(PARTIAL):
        return (f"ends in '{PARTIAL}', the suffix the board gives a file while it arrives, so the board refuses it "
                "in a bundle file's name")
    return None


def safe_name(name):
    """A bundle file name must stay inside its directory (name_problem)."""
    problem = name_problem(name)
    if problem is not None:
        raise Refused(f"bundle file name {name!r} {problem}",
                      "rebuild the bundle with 'edgesdk build'; deploy only bundles it wrote")
    return name


REBUILD = "rebuild the bundle with 'edgesdk build'"


def is_plain_name(name):
    """Whether ``name`` is a plain name (letters, digits, '-', '_', '.', not starting with '.'): one directory entry
    that names nothing above it."""
    return (isinstance(name, str) and bool(name) and not name.startswith(".")
            and all(c.isalnum() or c in "-_." for c in name))


def safe_id(bundle_id, what="bundle id", fix=REBUILD):
    """``bundle_id`` where it is a plain name (letters, digits, '-', '_', '.', not starting with '.'), which names a
    directory under the deploy root and nothing above it; else a refusal naming ``what`` it is (a bundle id, a
    runtime key, a release directory) with the ``fix`` that fits where the name came from."""
    if not is_plain_name(bundle_id):
        raise Refused(f"{what} {bundle_id!r} is not a plain name (letters, digits, '-', '_' and '.', not starting "
                      "with '.')", fix)
    return bundle_id


def paths(root):
    root = os.path.abspath(os.path.expanduser(root))
    return {name: os.path.join(root, name) for name in
            ("releases", "staging", "runtime", "engines", "current", "previous", "history.jsonl", ".trash",
             ".switch.json", "runtimes.json", ".commit.json")}, root


def check_root_is_private(root):
    """Refuse a deploy root that another user could change: one that is, or lies in, a directory owned by a user
    other than this one and root, or one every user may write without the sticky bit (as ssh's StrictModes refuses
    such a home). That user could replace what deploy installs (the runtime a service runs as this user, or as root
    for a system unit) and plant links where deploy writes (its lock file, truncated when taken, pointing to any
    file of this user's). Both the path as given and the one its links resolve to are checked."""
    uid = os.geteuid()
    for start in (os.path.abspath(root), os.path.realpath(root)):
        path = start
        while True:
            facts = os.lstat(path)
            is_link = facts.st_mode & 0o170000 == 0o120000  # S_IFLNK: a link's own mode bits say nothing
            shared = not is_link and facts.st_mode & 0o002 and not facts.st_mode & 0o1000  # S_IWOTH, no S_ISVTX
            if facts.st_uid not in (uid, 0) or shared:
                try:
                    import pwd

                    owner = pwd.getpwuid(facts.st_uid).pw_name
                except (ImportError, KeyError):
                    owner = f"uid {facts.st_uid}"
                why = (f"{path} is writable by every user (mode {facts.st_mode & 0o7777:o}, no sticky bit)" if shared
                       else f"{path} belongs to {owner}, not to this user (uid {uid}) or root")
                raise Refused(f"the deploy root {root} on the board is not private: {why}, so another user could "
                              "replace what deploy installs there (the runtime and releases a service runs) or make "
                              "deploy write through a link to any file of this user's",
                              "deploy into a directory only this user (and root) can write, e.g. --remote-root "
                              "~/edgesdk (the default)" + (f", or take the other users' write permission away: "
                                                           f"chmod o-w {path}" if shared else
                                                           f", or deploy as {owner}, who owns {path}"))
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent


def refuse_a_root_behind_a_dangling_link(root):
    """Refuse a deploy root that is, or lies under, a link to nothing (the first one met walking up to the directory
    that exists): deploy cannot make the directory there (mkdir(2) EEXIST), and the free space of the disk holding
    the link is not that of the one it names (an SSD or SD card that is not mounted)."""
    path = root
    while not os.path.exists(path):
        if os.path.islink(path):
            raise Refused(f"the deploy root {root} on the board lies behind the link {path} -> {os.readlink(path)}, "
                          "which points to nothing (a disk that is not mounted?)",
                          "mount the disk that link points into (or make the directory it names), or pass "
                          "--remote-root a directory on the board (made if missing)")
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


HELD_ELSEWHERE = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)  # what flock(LOCK_NB) fails with while held


class Lock:
    """An exclusive flock on ROOT/.deploy.lock, so two deploys never interleave their writes."""

    def __init__(self, root, timeout=120.0):
        import fcntl  # here, not at the top: the host imports this module's checks (bundle.py) too
        refuse_a_root_behind_a_dangling_link(root)
        os.makedirs(root, exist_ok=True)
        check_root_is_private(root)
        path = os.path.join(root, ".deploy.lock")
        self.handle = open(path, "a+")
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in HELD_ELSEWHERE:  # the file system cannot lock: no deploy holds it
                    self.handle.close()
                    raise Refused(f"cannot lock {path} ({exc.strerror or exc}): the file system it lies on does "
                                  "not support flock(2) (an NFS mount without lockd, some FUSE file systems), so "
                                  "deploy cannot keep two deploys from writing at once",
                                  "deploy into a directory on a local disk (ext4, the SD card or an SSD), e.g. "
                                  "--remote-root ~/edgesdk (the default)") from None
                if time.monotonic() > deadline:
                    self.handle.seek(0)
                    holder = lock_record(self.handle.read(HOLDER_MAX))[0] or "unknown"
                    self.handle.close()
                    raise Refused(f"another deploy holds {path} for more than {timeout:.0f}s (process {holder})",
                                  "wait for that deploy to finish, or stop that process: the lock goes with it. Do "
                                  "not delete the file, which would let two deploys write at once") from None
                time.sleep(0.05)
        self.handle.truncate(0)  # who holds it, for the message above and for --status (lock_state)
        self.handle.write(lock_holder())
        self.handle.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:  # emptied while still held: a holder left in the file is one that ended without this (killed)
            self.handle.truncate(0)
        except OSError:
            pass
        self.handle.close()


# What Lock writes into ROOT/.deploy.lock before its holder: an edgesdk before it left its bare process id there at
# every exit, so only a record with this mark was written by a deploy that empties the file when it ends
HOLDER_MARK = "edgesdk-deploy pid "
HOLDER_MAX = 128  # the most of the file read back: the mark, a process id and an IPv6 address fit


def lock_holder():
    """What Lock writes into ROOT/.deploy.lock: HOLDER_MARK, this process's id, and the address the deploying host's
    ssh connection came from where ssh says (SSH_CLIENT)."""
    client = (os.environ.get("SSH_CLIENT") or "").split()
    return HOLDER_MARK + str(os.getpid()) + (" from " + client[0] if client else "")


def lock_record(text):
    """(holder, marked) of what ROOT/.deploy.lock holds: the holder as messages name it (``1234 from 10.0.0.5``),
    "" for an empty file, and whether the record bears HOLDER_MARK (a deploy of this edgesdk wrote it)."""
    text = text.strip()
    if text.startswith(HOLDER_MARK):
        return text[len(HOLDER_MARK):].strip(), True
    return text, False


def lock_state(root):
    """ROOT/.deploy.lock as --status shows it, or None where no deploy holds it and none left its holder there:
    ``{"held": True, "holder": ...}`` while a deploy (or rollback, prune) holds it, ``{"held": False, "holder":
    ...}`` where the process written there ended without releasing it (a kill -9, a power cut): its flock went
    with it, and the next deploy takes the lock as it is. A record without HOLDER_MARK that no deploy holds is
    None: an edgesdk before it left its process id there after every deploy, one that ended well too, so it names
    no deploy killed. Only a regular file is opened (a FIFO would block)."""
    path = os.path.join(root, ".deploy.lock")
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    import fcntl  # here, as in Lock

    try:
        with open(path, errors="replace") as handle:
            holder, marked = lock_record(handle.read(HOLDER_MAX))
            if holder.split(" ")[0] == str(os.getpid()):  # this process holds it (a prune lists the releases)
                return None
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in HELD_ELSEWHERE:
                    return {"held": True, "holder": holder or None}
                return None  # a file system that cannot lock: no deploy holds it there either
    except OSError:
        return None
    return {"held": False, "holder": holder} if holder and marked else None


RUNTIME_STAMP = "edgesdk-runtime.json"  # what a runtime install writes last (board_install.write_stamp)


def read_stamp(path):
    """The ``edgesdk-runtime.json`` in the runtime directory ``path``, a mapping, or None where there is none that
    parses as one. Only a regular file is read (a FIFO would block)."""
    stamp_file = os.path.join(path, RUNTIME_STAMP)
    if not os.path.isfile(stamp_file):
        return None
    text = read_text(stamp_file)
    try:
        stamp = json.loads(text) if text else None
    except ValueError:
        return None
    return stamp if isinstance(stamp, dict) else None


def runtime_finished(stamp):
    """Whether ``stamp`` (read_stamp) is that of a finished install: the install writes it last, with the edgesdk
    version it installed (board_install.op_install), and reuses a runtime only where it has one."""
    return isinstance(stamp, dict) and isinstance(stamp.get("version"), str) and bool(stamp["version"])


def unfinished_runtimes(p):
    """The runtime/<key> directories without the stamp of a finished install (runtime_finished): an install in
    progress, or one a kill cut short. The next install of that key removes and redoes it (op_install); a switch to
    another runtime removes it (board_ops.drop_stale_runtimes)."""
    if not os.path.isdir(p["runtime"]):
        return []
    found = []
    for name in sorted(os.listdir(p["runtime"])):
        path = os.path.join(p["runtime"], name)
        if name in ("current", "wheels") or name.startswith(".") or os.path.islink(path) or not os.path.isdir(path):
            continue
        if not runtime_finished(read_stamp(path)):
            found.append(name)
    return found


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_text(path, limit=65536):
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def link_target(path):
    """The release id a ``current``/``previous`` link points to, or None."""
    try:
        return os.path.basename(os.readlink(path).rstrip("/"))
    except OSError:
        return None


def free_bytes(path):
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    stat = os.statvfs(probe)
    return {"path": probe, "free": stat.f_bavail * stat.f_frsize, "total": stat.f_blocks * stat.f_frsize}


def meminfo():
    facts = {}
    for line in (read_text("/proc/meminfo") or "").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("MemTotal:", "MemAvailable:"):
            facts[parts[0][:-1]] = int(parts[1]) * 1024
    return facts


def run_quiet(argv, timeout=60):
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return proc.returncode, proc.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, str(exc)


HISTORY_READ = 1 << 22


def history_lines(p, limit=HISTORY_READ):
    """The lines of history.jsonl, from its last ``limit`` bytes: the file only grows (a line per switch, never
    trimmed), and the newest lines are the ones that count: the last switch, and the order and times of the
    latest uses. Its first ``limit`` bytes held the oldest switches only once the file outgrew them."""
    try:
        with open(p["history.jsonl"], "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - limit))
            lines = handle.read(limit).decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return lines[1:] if size > limit else lines  # the first line read is cut when the file is longer


def switch_times(p):
    """Release id -> the last time current was switched to it (from history.jsonl)."""
    times = {}
    for line in history_lines(p):
        try:
            entry = json.loads(line)
            times[entry["to"]] = float(entry["time"])
        except (ValueError, KeyError, TypeError):
            continue
    return times


def switch_order(p):
    """Release id -> the line of history.jsonl that last switched current to it: the order the switches
    happened in, which a clock set back or forward (a board without a real-time clock that booted before
    NTP synced) does not change."""
    order = {}
    for number, line in enumerate(history_lines(p)):
        try:
            order[json.loads(line)["to"]] = number
        except (ValueError, KeyError, TypeError):
            continue
    return order


def last_switch(p):
    """The last line of history.jsonl that parses (``action``, ``from``, ``to``, ``time``), or None: what the
    last switch did, such as a deploy switched back after its service did not come up."""
    for line in reversed(history_lines(p)):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("to"), str):
            return {key: entry.get(key) for key in ("action", "from", "to", "time")}
    return None


def pending_switch(p):
    """The journal of a switch a kill cut short (op_switch writes it before it moves a link), or None."""
    text = read_text(p[".switch.json"])
    try:
        journal = json.loads(text) if text else None
    except ValueError:
        return None
    return journal if isinstance(journal, dict) and isinstance(journal.get("to"), str) else None


def release_runtimes(p):
    """Release id -> the runtime key ``runtime/current`` pointed to after the last switch to that release
    (runtimes.json, written by board_ops.record_runtime), or {} where there is none or it does not parse."""
    text = read_text(p["runtimes.json"])
    try:
        pairs = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(pairs, dict):
        return {}
    return {k: v for k, v in pairs.items() if isinstance(k, str) and isinstance(v, str)}


def previous_of(p, current):
    """What ``previous`` is: its link, or, when a switch was cut short after it moved ``current``, the
    release that switch left (the next switch or prune points the link there)."""
    journal = pending_switch(p)
    if journal and current == journal["to"] and "previous_after" in journal:
        after = journal["previous_after"]
        return after if after and os.path.isdir(os.path.join(p["releases"], after)) else None
    return link_target(p["previous"])


# the keys of a release_list: "current_problem", "last_switch", "lock" (lock_state) and "unfinished_runtimes" only
# where there is one
STATE_KEYS = ("current", "previous", "releases", "staging", "current_problem", "last_switch", "lock",
              "unfinished_runtimes")


def shipped_bytes(release, manifest):
    """The size of a release as deploy ships it (transfer.bundle_files): the files its manifest lists, and the
    manifest and its digest themselves, so --status gives the figure the deploy said."""
    total = sum(f["size"] for f in manifest["files"].values())
    for name in (MANIFEST, DIGEST):
        try:
            total += os.path.getsize(os.path.join(release, name))
        except OSError:
            pass
    return total


def release_list(p):
    """current, previous, the releases (oldest first by last use: the order of their last switches in
    history.jsonl, releases never switched to before them by mtime) and leftover staging directories."""
    releases = []
    used, order = switch_times(p), switch_order(p)
    if os.path.isdir(p["releases"]):
        for name in sorted(os.listdir(p["releases"])):
            path = os.path.join(p["releases"], name)
            if name.startswith(".") or not os.path.isdir(path):
                continue
            entry = {"id": name, "mtime": max(used.get(name, 0.0), os.path.getmtime(path))}
            try:
                with open(os.path.join(path, MANIFEST), "rb") as handle:
                    manifest = json.loads(handle.read())
                entry["target"] = manifest["target"]["name"]
                entry["bytes"] = shipped_bytes(path, manifest)
                entry["created"] = manifest.get("created")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no manifest, or not a bundle's
                entry["target"] = None
            releases.append(entry)
    releases.sort(key=lambda r: (order.get(r["id"], -1), r["mtime"]))  # not by time: clocks jump
    staging = sorted(os.listdir(p["staging"])) if os.path.isdir(p["staging"]) else []
    current = link_target(p["current"])
    state = {"current": current, "previous": previous_of(p, current), "releases": releases, "staging": staging}
    problem = current_problem(p)
    if problem:
        state["current_problem"] = problem
    last = last_switch(p)
    if last:
        state["last_switch"] = last
    lock = lock_state(os.path.dirname(p["releases"]))
    if lock:
        state["lock"] = lock
    unfinished = unfinished_runtimes(p)
    if unfinished:
        state["unfinished_runtimes"] = unfinished
    return state


def current_problem(p):
    """What is wrong with ``current`` where it is not a link to a release directory, or None."""
    link = p["current"]
    if os.path.islink(link):
        if os.path.isdir(link):
            return None
        return (f"current points to {os.readlink(link)}, which does not exist: deploy a bundle, or roll back to "
                "a release listed here with --rollback --release ID")
    if os.path.lexists(link):
        kind = "directory" if os.path.isdir(link) else "file"
        return (f"current is a {kind}, not the link to a release that deploy makes, so a switch cannot replace it: "
                f"move {link} away, then deploy or roll back")
    return None


def listed_file_problem(file, name, facts):
    """What is wrong with the file the manifest lists as ``name`` (at ``file``), as verify_bundle words it; None
    when it has the manifest's size and sha256. Only a regular file is read (a FIFO at that name would block the
    read); one that cannot be read (a failing SD card's EIO, permissions) is a problem, not an error."""
    try:
        if os.path.isdir(file):
            return f"{name}: a directory, not a file"
        if not os.path.isfile(file):
            return f"{name}: missing" if not os.path.lexists(file) else \
                f"{name}: not a regular file (a link to nothing, a device or a pipe)"
        size = os.path.getsize(file)
        if size != facts["size"]:
            return f"{name}: {size} bytes, manifest says {facts['size']}"
        if sha256_file(file) != facts["sha256"]:
            return f"{name}: sha256 differs from the manifest"
    except OSError as exc:
        return f"{name}: cannot be read ({exc.strerror or exc})"
    return None


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (json keeps the last value silently)."""


def unique_keys(pairs):
    """json's object_pairs_hook that refuses a key given twice in one object, as verify_bundle does."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # as 'edgesdk build' writes a sha256: 64 lowercase hex digits


def is_byte_count(value):
    """Whether ``value`` is a whole number of bytes >= 0 (an int, not a bool: JSON's true is no size)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def listed_facts_problem(name, facts):
    """What is wrong with the manifest's record of the file ``name`` (``{size, sha256}``), as verify_bundle words
    it, or None. A sha256 in capitals is refused here: compared as it is, it named the intact file as corrupted, and
    commit removed it, so every deploy sent it again."""
    if (isinstance(facts, dict) and is_byte_count(facts.get("size")) and isinstance(facts.get("sha256"), str)
            and SHA256_HEX.fullmatch(facts["sha256"])):
        return None
    return (f"{MANIFEST}: files[{name!r}] must be {{size: int, sha256: str}}: the size a whole number of bytes >= 0, "
            f"the sha256 64 lowercase hex digits (as 'edgesdk build' writes them), got {facts!r:.200}")


def weights_record_problems(record):
    """What is wrong with 'graph.weights' (the compressed weights' record), as verify_bundle words it: the runtime
    reads every field and writes the inflated bytes under 'external_name', which must be a bare file name."""
    if record is None:
        return []
    fields = {"file": str, "codec": str, "external_name": str, "bytes": int, "sha256": str}
    if not (isinstance(record, dict) and all(isinstance(record.get(key), kind) for key, kind in fields.items())):
        return [f"{MANIFEST}: 'graph.weights' must be a mapping with {', '.join(fields)} ('bytes' a whole number, "
                f"the others strings), got {record!r:.120}"]
    name = record["external_name"]
    if "/" in name or name in ("", ".", ".."):
        return [f"{MANIFEST}: 'graph.weights.external_name' must be a bare file name, got {name!r}"]
    if not is_byte_count(record["bytes"]):
        return [f"{MANIFEST}: 'graph.weights.bytes' must be a whole number >= 0, got {record['bytes']!r}"]
    problems = []
    if SHA256_HEX.fullmatch(record["sha256"]) is None:
        problems.append(f"{MANIFEST}: 'graph.weights.sha256' must be 64 lowercase hex digits (as 'edgesdk build' "
                        f"writes it), got {record['sha256']!r:.80}")
    if record["codec"] == "none":
        problems.append(f"{MANIFEST}: 'graph.weights.codec' is 'none', which 'edgesdk build' never records: a plain "
                        "weights file has no 'graph.weights'")
    return problems


def manifest_shape_problems(manifest):
    """What verify_bundle refuses in the parts of a manifest this check reads: 'files' (a mapping of names to
    ``{size, sha256}``) and the compressed weights' record, 'graph.weights'. A record it cannot use crashed the
    check, or named an intact file as corrupted; one the host refuses passed here."""
    if not isinstance(manifest, dict) or "files" not in manifest:
        return [f"{MANIFEST} is not a bundle manifest"]
    files = manifest["files"]
    if not isinstance(files, dict):
        return [f"{MANIFEST}: 'files' must map file names to {{size, sha256}}, got {type(files).__name__}"]
    problems = [problem for problem in (listed_facts_problem(name, facts) for name, facts in sorted(files.items()))
                if problem]
    graph = manifest.get("graph")
    if isinstance(graph, dict):
        problems += weights_record_problems(graph.get("weights"))
    return problems


def verify_dir(path, expected_manifest_sha=None):
    """Mirror of edgesdk.bundle.verify_bundle: (problems, names of bad files). A bad file is one there that is
    wrong (its size or sha256, a directory or anything else but a regular file, or not readable) or not listed
    (a link to a directory too, which is not entered); commit removes those from staging (a directory with what
    it holds) so the next deploy sends them again. A missing file is a problem, not a bad file. A manifest that does
    not match its digest, or whose records verify_bundle refuses (manifest_shape_problems), makes the manifest and its
    digest the bad files, and no other file is checked."""
    problems, bad = [], []
    try:
        with open(os.path.join(path, MANIFEST), "rb") as handle:
            raw = handle.read()
        with open(os.path.join(path, DIGEST), "rb") as handle:
            digest = handle.read().decode("utf-8", "replace")
    except OSError as exc:
        return [f"{MANIFEST} or {DIGEST} unreadable ({exc.strerror})"], [MANIFEST, DIGEST]
    actual = hashlib.sha256(raw).hexdigest()
    if (digest[:-1] if digest.endswith("\n") else digest) != actual:
        return [f"{MANIFEST} has sha256 {actual}, {DIGEST} says otherwise"], [MANIFEST, DIGEST]
    if expected_manifest_sha and actual != expected_manifest_sha:
        return [f"{MANIFEST} has sha256 {actual}, the host's bundle has {expected_manifest_sha}"], \
            [MANIFEST, DIGEST]
    try:
        manifest = json.loads(raw, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        return [f"{MANIFEST} gives the key {exc.args[0]!r} more than once in one object, so readers could take "
                "either value"], [MANIFEST, DIGEST]
    except (ValueError, RecursionError):  # not JSON, bad UTF-8, deep nesting
        return [f"{MANIFEST} is not a bundle manifest"], [MANIFEST, DIGEST]
    problems = manifest_shape_problems(manifest)
    if problems:
        return problems, [MANIFEST, DIGEST]
    listed = manifest["files"]
    for name in sorted(listed):
        safe_name(name)
        problem = listed_file_problem(os.path.join(path, name), name, listed[name])
        if problem:
            problems.append(problem)
            if problem != f"{name}: missing":  # nothing there to remove
                bad.append(name)
    for folder, dirs, files in os.walk(path):  # followlinks=False: a link to a directory is among dirs, not entered
        linked_dirs = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        for file in files + linked_dirs:
            rel = os.path.relpath(os.path.join(folder, file), path).replace(os.sep, "/")
            if rel not in listed and rel not in (MANIFEST, DIGEST):
                problems.append(f"{rel}: not listed in the manifest"
                                + (" (a link to a directory)" if file in linked_dirs else ""))
                bad.append(rel)
    return problems, bad


def write_json(path, obj):
    """``obj`` into ``path``, whole or not at all (a .partial renamed over it after an fsync)."""
    with open(path + ".partial", "w") as handle:
        json.dump(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path + ".partial", path)


def drop_journal(p, root, name=".switch.json"):
    """Remove a journal (op_switch's .switch.json, op_commit's .commit.json) once what it guarded is done."""
    try:
        os.unlink(p[name])
    except FileNotFoundError:
        pass
    fsync_dir(root)


def settle_commit(p, root):
    """Finish a commit that a kill cut between its two renames (op_commit's journal, .commit.json, is still
    there): releases/<id> was renamed into .trash and staging/<id>, verified under the same lock, was not yet
    renamed to releases/<id>, so current (or previous) pointed to no release. staging/<id> becomes releases/<id>
    now, as the commit would have done; where it is gone, the copy in .trash goes back (the release as it was
    before that deploy). Called under the root's lock by every helper that writes releases or staging, before
    anything else, so staging/<id> is as the commit verified it."""
    text = read_text(p[".commit.json"])
    try:
        journal = json.loads(text) if text else None
    except ValueError:
        journal = None
    if isinstance(journal, dict) and isinstance(journal.get("bundle_id"), str):
        bundle_id = safe_id(journal["bundle_id"], f"the bundle id in {p['.commit.json']}",
                            f"that journal of an earlier commit is damaged: remove {p['.commit.json']} on the board, "
                            "then deploy again")
        release = os.path.join(p["releases"], bundle_id)
        staging = os.path.join(p["staging"], bundle_id)
        # the copy op_commit names <id>-<time>; "" for a journal without it, and one naming no plain name (".", "..":
        # .trash itself or the deploy root) is no copy to use either
        kept = os.path.basename(str(journal.get("trash") or ""))
        kept = kept if is_plain_name(kept) else ""
        if not os.path.lexists(release):
            if os.path.isdir(staging):
                os.replace(staging, release)
                os.utime(release)
            elif kept and os.path.isdir(os.path.join(p[".trash"], kept)):
                os.replace(os.path.join(p[".trash"], kept), release)
            fsync_dir(p["releases"])
        if kept and os.path.isdir(release):
            drop_replaced_copy(p, kept)
    if os.path.lexists(p[".commit.json"]):
        drop_journal(p, root, ".commit.json")


def drop_replaced_copy(p, kept):
    """Remove .trash/<kept>, the damaged release a settled commit replaced, once releases/<id> is in place again: the
    commit removes it last, and nothing else ever did (a whole bundle's room on the board's card, which no listing
    names). Only after the journal's commit is settled, so the copy is never the only one of the release."""
    copy = os.path.join(p[".trash"], kept)
    if os.path.isdir(copy) and not os.path.islink(copy):
        shutil.rmtree(copy, ignore_errors=True)
