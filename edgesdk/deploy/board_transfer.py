"""The board side of deploy, part 2 of 5: probe (what the board is and holds) and receiving files."""

import errno
import getpass
import hashlib
import json
import os
import platform
import shutil
import signal
import struct
import sys

if "BOARD_BUNDLED" not in globals():  # on the host; on the board the parts are concatenated
    from edgesdk.deploy.board_common import (
        CHUNK,
        Lock,
        Refused,
        free_bytes,
        meminfo,
        paths,
        read_stamp,
        read_text,
        refuse_a_root_behind_a_dangling_link,
        release_list,
        release_runtimes,
        run_quiet,
        runtime_finished,
        safe_id,
        safe_name,
        settle_commit,
        sha256_file,
        verify_dir,
    )


def tensorrt_version():
    code, text = run_quiet([sys.executable, "-c", "import tensorrt; print(tensorrt.__version__)"])
    if code == 0 and text.strip():
        return {"version": text.strip().splitlines()[-1], "python": True}
    # dpkg-query -W lists a package in any state it still records: removed with its configuration kept
    # ("rc") or half-installed too. Only "ii" (installed, ok) counts.
    code, text = run_quiet(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Version}\n", "tensorrt"])
    if code == 0:
        for line in text.splitlines():
            status, _, version = line.partition("|")
            if status.strip() == "ii" and version.strip():
                return {"version": version.strip(), "python": False}
    return None


def runtime_facts(p):
    """The active runtime, every complete one (runtime_finished), and an edgesdk on the PATH (for --no-install)."""
    stamp = read_stamp(os.path.join(p["runtime"], "current"))
    installed = []
    if os.path.isdir(p["runtime"]):
        installed = sorted(name for name in os.listdir(p["runtime"]) if name not in ("current", "wheels")
                           and not name.startswith(".")
                           and runtime_finished(read_stamp(os.path.join(p["runtime"], name))))
    on_path = shutil.which("edgesdk")
    version = None
    if on_path and stamp is None:  # only needed when deploy may have to use it (--no-install)
        code, text = run_quiet([on_path, "--version"])
        version = text.strip().split()[-1] if code == 0 and text.strip() else None
    return {"stamp": stamp, "installed": installed, "edgesdk_on_path": on_path, "edgesdk_on_path_version": version}


def plain_id(name):
    try:
        safe_id(name)
    except Refused:
        return False
    return True


def plain_file(folder, name):
    """Whether ``name`` under ``folder`` is a regular file reached through no link: a link at its name, or where one
    of its directories goes, leads out of the deploy root, and a receive removes it (make_room) rather than write
    or link through it."""
    path = folder
    for part in name.split("/"):
        path = os.path.join(path, part)
        if os.path.islink(path):
            return False
    return os.path.isfile(path)


def same_file(folder, name, facts):
    """Whether ``name`` under ``folder`` is a plain file (plain_file) with the size and sha256 ``facts`` give (the
    size first: no read). The probe runs without the lock: a file another deploy's commit or prune moves away is
    not there."""
    path = os.path.join(folder, name)
    try:
        return (plain_file(folder, name) and os.path.getsize(path) == facts["size"]
                and sha256_file(path) == facts["sha256"])
    except OSError:
        return False


def hash_prefix(path, limit):
    """(bytes, sha256) of what ``path`` holds, up to ``limit`` bytes, from one read: the host compares it with
    its own file's first bytes before it resumes there (a .partial may hold other bytes: the host's file
    changed while an earlier transfer read it, or the board lost power as it wrote). A transfer that was cut
    may still be appending to it; the receive truncates it to the bytes counted here."""
    digest, count = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while count < limit:
            block = handle.read(min(CHUNK, limit - count))
            if not block:
                break
            digest.update(block)
            count += len(block)
    return count, digest.hexdigest()


def plan_files(p, bundle_id, files):
    """What the board already has of each file: complete in staging, in a release, or partial.

    A file counts as there only with the manifest's sha256, not by its size alone: the bundle id names the
    content, but manifest.json and manifest.sha256 also hold when the bundle was built, so another build of
    the same content (same id) leaves ones of the same size and other bytes in staging/<id> or releases/<id>.
    Nor is a .partial taken on trust: the plan's entry ``NAME.partial`` gives the sha256 of what it holds, for
    the host to check against its own file's first bytes before it resumes there. A copy in a release goes
    before a .partial: linking it sends nothing. Nothing reached through a link counts (plain_file): the receive
    removes a link in staging before it writes there, so a .partial behind one was no prefix to resume after."""
    staging = os.path.join(p["staging"], bundle_id)
    by_release = release_list(p)
    # Only releases deploy made: a directory someone put there ('my copy') is no release id, and the receive
    # refuses to link from it. This bundle's own release too: the probe found it damaged, or from another
    # build of the same content; what in it still has its sha256 need not be sent again.
    order = [r["id"] for r in reversed(by_release["releases"]) if plain_id(r["id"])]
    if by_release["current"] in order:
        order.remove(by_release["current"])
        order.insert(0, by_release["current"])
    plan = {}
    for name in sorted(files):
        facts = files[name]
        safe_name(name)
        if same_file(staging, name, facts):
            plan[name] = {"state": "staging"}
            continue
        release = next((r for r in order if same_file(os.path.join(p["releases"], r), name, facts)), None)
        if release is not None:
            plan[name] = {"state": "link", "from": release}
            continue
        partial = os.path.join(staging, name + ".partial")
        try:
            offset, sha256 = hash_prefix(partial, facts["size"]) if (
                plain_file(staging, name + ".partial") and 0 < os.path.getsize(partial) <= facts["size"]) else (0, None)
        except OSError:  # moved away since (as in same_file)
            offset = 0
        if offset:
            plan[name] = {"state": "partial", "offset": offset}
            plan[name + ".partial"] = {"state": "prefix", "sha256": sha256}  # no bundle file has that name
            continue
        plan[name] = {"state": "send", "offset": 0}
    return plan


def check_root(root):
    """The deploy root must be a directory, or missing under one (deploy makes it). Not a link to nothing, nor
    under one: deploy could not make the directory there (mkdir(2) EEXIST), and the free space the probe reports
    would be that of the disk holding the link, not of the one it names (an SSD or SD card not mounted)."""
    refuse_a_root_behind_a_dangling_link(root)
    existing = free_bytes(root)["path"]
    if not os.path.isdir(existing):
        raise Refused(f"the deploy root {root} on the board is not a directory: {existing} is a file",
                      "pass --remote-root a directory on the board (made if missing), e.g. --remote-root ~/edgesdk")


# What CUDA opens on a Jetson (nvgpu and nvmap; JetPack 6 also names the GPU under /dev/nvgpu/igpu0). L4T's
# udev rules give them to the group video, mode 0660, so a user outside that group has no usable CUDA device
# (cudaGetDeviceCount fails) though TensorRT imports; a container sees them only with --runtime nvidia.
JETSON_GPU_NODES = ("nvhost-ctrl-gpu", "nvmap", "nvgpu/igpu0/ctrl")


def jetson_gpu_problem(dev="/dev"):
    """Why this user cannot use the Jetson's GPU (None where it can): its device nodes missing, or not open for
    reading and writing to this user."""
    present = [os.path.join(dev, n) for n in JETSON_GPU_NODES if os.path.exists(os.path.join(dev, n))]
    user = getpass.getuser()
    if not present:
        return (f"no GPU device node of a Jetson ({', '.join(os.path.join(dev, n) for n in JETSON_GPU_NODES)}) "
                "exists here, so CUDA sees no device", "in a container, start it with --runtime nvidia (the NVIDIA "
                "Container Toolkit passes the GPU's nodes in); on the board itself, check that the nvgpu driver "
                "loaded (dmesg | grep nvgpu)")
    closed = [node for node in present if not os.access(node, os.R_OK | os.W_OK)]
    if not closed:
        return None
    try:
        import grp

        group = grp.getgrgid(os.stat(closed[0]).st_gid).gr_name
    except (ImportError, KeyError, OSError):
        group = "video"
    return (f"{user} cannot open the GPU's device node{'s' if len(closed) > 1 else ''} {', '.join(closed)} (group "
            f"{group}), so CUDA sees no device", f"add {user} to the group {group} on the board (sudo usermod -aG "
            f"{group} {user}), then deploy again: a new ssh session has the group")


def op_probe(params):
    p, root = paths(params["root"])
    check_root(root)
    facts = {
        "root": root,
        "root_exists": os.path.isdir(root),
        "arch": platform.machine(),
        "kernel": platform.release(),
        "device_tree_model": read_text("/proc/device-tree/model") or read_text("/sys/firmware/devicetree/base/model"),
        # NUL-separated; a Jetson's names its module's part number, which a third-party carrier's model does not
        "device_tree_compatible": (read_text("/proc/device-tree/compatible")
                                   or read_text("/sys/firmware/devicetree/base/compatible")),
        "nv_tegra_release": read_text("/etc/nv_tegra_release", 4096),
        "cpuinfo": read_text("/proc/cpuinfo"),
        "memory": meminfo(),
        "disk": free_bytes(root),
        "python": {"version": list(sys.version_info[:3]), "executable": sys.executable,
                   "bits": struct.calcsize("P") * 8,  # 32 on a 32-bit userland, where uname still says aarch64
                   "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix)},
        "tensorrt": tensorrt_version() if os.path.exists("/etc/nv_tegra_release") else None,
        "gpu_problem": jetson_gpu_problem() if os.path.exists("/etc/nv_tegra_release") else None,
        "runtime": runtime_facts(p),
        "state": release_list(p),
        "release_runtimes": release_runtimes(p),  # the runtime each release last ran with, for a rollback
    }
    bundle_id = params.get("bundle_id")
    if bundle_id:
        safe_id(bundle_id)
        release = os.path.join(p["releases"], bundle_id)
        engines = os.path.join(p["engines"], bundle_id)
        facts["engines"] = sorted(e for e in os.listdir(engines) if os.path.isdir(os.path.join(engines, e))
                                  and os.listdir(os.path.join(engines, e))) if os.path.isdir(engines) else []
        facts["release"] = None
        if os.path.isdir(release):
            problems, _bad = verify_dir(release, params.get("manifest_sha256"))
            facts["release"] = {"problems": problems}
        if facts["release"] is None or facts["release"]["problems"]:
            facts["plan"] = plan_files(p, bundle_id, params["files"])
    return facts


# Seconds the board waits for the next bytes from the host before it gives up the transfer. The host's ssh
# notices a dead link after 60 s (ServerAliveInterval 15 x ServerAliveCountMax 4); sshd on the board, by
# default, only through TCP keepalive, after about two hours, and until then this process holds the deploy
# lock, so the next deploy would be refused.
RECEIVE_IDLE_S = 120


class IdleDeadline:
    """The host's stream with a deadline on each read: SIGALRM interrupts a read that waits longer than
    ``seconds``, and the transfer stops as refused. What arrived stays in the .partial files (the next
    deploy resumes from them), and the deploy lock goes with this process. ``what`` names what is being
    received and ``fix`` is the refusal's fix (the runtime install's wheel is sent whole again)."""

    def __init__(self, stream, seconds, what="the bundle",
                 fix="run the deploy again: it resumes from what arrived, and the board keeps its current release"):
        self.stream, self.seconds, self.what, self.fix = stream, max(1, int(seconds)), what, fix
        self.previous = signal.signal(signal.SIGALRM, self._expired)

    def _expired(self, signum, frame):
        raise Refused(f"no data from the host for {self.seconds} s while receiving {self.what} (the connection "
                      "stalled)", self.fix)

    def read(self, size):
        """What has arrived, up to ``size`` bytes (b"" at the end of the stream): a full read would hold
        back a stalled file's last bytes in the buffer, and the deadline would then lose them."""
        signal.alarm(self.seconds)
        try:
            return self.stream.read1(size)
        finally:
            signal.alarm(0)

    def readline(self, size):
        signal.alarm(self.seconds)
        try:
            return self.stream.readline(size)
        finally:
            signal.alarm(0)

    def close(self):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # a write the disk (or the user's quota) had no room for


def remove_entry(path):
    """Remove what is at ``path``: a directory with all it holds, else the file, link, pipe or device itself."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def discard(path):
    """Remove the file at ``path`` where there is one, best effort (a write that failed is reported instead)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def megabytes(count):
    """``count`` bytes in MB (10**6 bytes), as the host's disk check says free space."""
    return f"{count / 1e6:,.1f} MB"


def entry_kind(path):
    """What is at ``path``, in words, for a refusal: a file, a link (and where it points), or another special file."""
    if os.path.islink(path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"a link to {target}" + ("" if os.path.exists(path) else ", which does not exist")
    if os.path.isfile(path):
        return f"a file of {os.path.getsize(path)} bytes"
    if os.path.isdir(path):
        return "a directory"
    return "a special file (a pipe, socket or device)"


def not_plain(path, kind):
    """Whether something other than a ``kind`` ("file" or "directory", not a link to one) is at ``path``."""
    if not os.path.lexists(path):
        return False
    return os.path.islink(path) or not (os.path.isfile(path) if kind == "file" else os.path.isdir(path))


def make_room(staging, name):
    """The path of ``name`` in ``staging``, its parent directories made and cleared of what a receive cannot write
    or rename its file over: a directory (or a link, pipe or device) at its name or its .partial, and a file or a
    link where one of its directories goes. A rename over a directory fails, and a link would be written through,
    to wherever it points. staging/<id> belongs to the deploy (commit removes what it finds bad there too): left
    in place, such an entry failed every receive of the bundle. A regular file at the name stays (the rename of
    the received one replaces it)."""
    parts = name.split("/")
    for depth in range(1, len(parts)):
        folder = os.path.join(staging, *parts[:depth])
        if not_plain(folder, "directory"):
            remove_entry(folder)
    target = os.path.join(staging, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    for path in (target, target + ".partial"):
        if not_plain(path, "file"):
            remove_entry(path)
    return target


def receive_file(header, stream, staging):
    """Write one file from the stream into staging, appending to its .partial; True when complete."""
    name = safe_name(header["name"])
    target = make_room(staging, name)
    partial = target + ".partial"
    offset, size = int(header["offset"]), int(header["size"])
    digest = hashlib.sha256()
    mode = "r+b" if offset and os.path.isfile(partial) and os.path.getsize(partial) >= offset else "wb"
    if offset and mode == "wb":
        raise Refused(f"{name}: resume offset {offset} is past the end of {partial} on the board",
                      "run the deploy again; it re-plans from what the board holds")
    try:
        with open(partial, mode) as handle:
            if offset:
                while handle.tell() < offset:
                    block = handle.read(min(CHUNK, offset - handle.tell()))
                    if not block:
                        break
                    digest.update(block)
                handle.truncate(offset)
                handle.seek(offset)
            remaining = size - offset
            while remaining:
                block = stream.read(min(CHUNK, remaining))
                if not block:
                    return {"name": name, "complete": False, "received": size - remaining - offset}
                handle.write(block)
                digest.update(block)
                remaining -= len(block)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise too_large(name, size, partial, staging) from exc
        if exc.errno in DISK_FULL:  # the file the disk had no room for: its room goes back, the whole ones stay
            discard(partial)
        raise
    actual = digest.hexdigest()
    if actual != header["sha256"]:
        os.unlink(partial)
        return {"name": name, "complete": True, "ok": False, "sha256": actual}
    os.replace(partial, target)
    return {"name": name, "complete": True, "ok": True}


def too_large(name, size, partial, staging):
    """The refusal of a file the board's filesystem will not hold at its size (write(2) EFBIG): FAT32 (vfat), what
    many SD cards and USB sticks come formatted with, takes no file of 4 GiB or more, and a file size limit on the
    helper's process (ulimit -f, RLIMIT_FSIZE) stops any file at that limit. Freeing space changes neither, and the generic advice
    said to check permissions and free space. Its .partial (``partial``: for a file reused from an earlier release
    where no hard link reaches it, the copy in staging) goes (it can never grow whole there); the files that arrived
    whole stay in staging for the next deploy."""
    try:
        stopped = os.path.getsize(partial)
    except OSError:
        stopped = None
    discard(partial)
    where = f" after {stopped:,} bytes" if stopped is not None else ""
    return Refused(f"the board refused to write {name} ({size:,} bytes, {megabytes(size)}) into {staging}: its "
                   f"filesystem, or a file size limit on the deploy helper, takes no file that large (the write "
                   f"stopped{where}: File too large)",
                   "deploy to a filesystem without the 4 GiB file size limit of FAT32 (ext4, say: pass "
                   "--remote-root a directory on such a disk, or reformat the card), or raise the file size limit "
                   "of the login shell on the board (ulimit -f unlimited), then deploy again; the current release "
                   "is untouched")


def read_header(line, count):
    """The JSON header before a file's bytes (or the end mark). Anything else means the stream is out of step
    with its framing (a header's size that is not the byte count that followed it), so nothing after it can be
    placed."""
    try:
        header = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and json.JSONDecodeError
        header = None
    if isinstance(header, dict) and (header.get("end") is True or (
            isinstance(header.get("name"), str) and isinstance(header.get("sha256"), str)
            and isinstance(header.get("offset"), int) and isinstance(header.get("size"), int)
            and 0 <= header["offset"] <= header["size"])):
        return header
    raise Refused(f"the upload stream is out of step after {count} file(s): the board expected a file header "
                  f"(one JSON line) and read {line[:48]!r}{'...' if len(line) > 48 else ''}",
                  "run the deploy again: it resumes from what arrived intact, and the board keeps its current "
                  "release")


def receive_stream(stream, staging, results):
    """Files framed by JSON headers until the host's end mark (eof False) or a cut stream (eof True)."""
    while True:
        line = stream.readline(65536)
        if not line:
            return {"results": results, "eof": True}
        header = read_header(line, len(results))
        if header.get("end"):
            return {"results": results, "eof": False}
        result = receive_file(header, stream, staging)
        results.append(result)
        if not result["complete"]:
            return {"results": results, "eof": True}


def op_receive(params):
    p, root = paths(params["root"])
    bundle_id = safe_id(params["bundle_id"])
    staging = os.path.join(p["staging"], bundle_id)
    results = []
    with Lock(root):
        settle_commit(p, root)  # staging/<id> of a commit a kill cut short becomes its release first
        try:
            # staging/<id> belongs to the deploy: a file or a link there (a dangling one too) is no transfer to
            # go on from, and makedirs failed on it ("File exists", "Not a directory") in every deploy of the bundle.
            # A link goes itself, not what it points to.
            if not_plain(staging, "directory"):
                remove_entry(staging)
            os.makedirs(staging, exist_ok=True)
            # In use from now: a receive that sends or links nothing new (every file arrived in an earlier one)
            # leaves the directory's mtime alone, and a concurrent deploy's prune took it for a day unused.
            os.utime(staging)
            for name, release in sorted(params.get("links", {}).items()):
                source = os.path.join(p["releases"], safe_id(release), safe_name(name))
                if not os.path.isfile(source):  # the probe is not under the lock: a prune may have run since
                    raise Refused(f"{name} was to be reused from releases/{release} on the board, which no longer "
                                  "holds it (another deploy's prune removed that release since this deploy's probe)",
                                  "run the deploy again: it plans afresh and sends that file; the board keeps its "
                                  "current release")
                target = make_room(staging, name)
                if os.path.lexists(target):  # a regular file: make_room removed anything else
                    os.unlink(target)
                try:
                    os.link(source, target)
                except OSError:
                    try:
                        shutil.copy2(source, target)
                    except OSError as exc:
                        if exc.errno == errno.EFBIG:  # as a file sent is refused; the copy cut short goes with it
                            raise too_large(name, os.path.getsize(source), target, staging) from exc
                        discard(target)  # a copy cut short, by a full disk say: no file the next deploy could use
                        raise
            stream = IdleDeadline(sys.stdin.buffer, params.get("idle_timeout", RECEIVE_IDLE_S))
            try:
                return receive_stream(stream, staging, results)
            finally:
                stream.close()
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise out_of_space(root, staging) from exc
            raise


def out_of_space(root, staging):
    """The refusal of a receive the disk had no room for (its file's .partial is gone by then, receive_file). What
    arrived whole stays in staging, and the .partial files of earlier transfers this one had not reached yet: the next
    deploy's probe finds each whole file by its sha256 and checks each .partial's bytes against the host's file
    (plan_files), sends only the rest, and its disk check counts only that. Where nothing stays, staging/<id> goes."""
    kept, whole, held = 0, 0, 0
    for folder, _dirs, files in os.walk(staging):
        for file in files:
            path = os.path.join(folder, file)
            if os.path.isfile(path) and not os.path.islink(path):
                kept += 1
                if not file.endswith(".partial"):
                    whole, held = whole + 1, held + os.path.getsize(path)
    try:
        free = megabytes(free_bytes(root)["free"])
    except OSError:
        free = "unknown space"
    problem = f"the board ran out of disk space writing into {staging} ({free} free on its disk now)"
    again = "free space on the board (or choose --remote-root on a larger disk) and deploy again"
    if not kept:
        shutil.rmtree(staging, ignore_errors=True)
        return Refused(problem, f"{again}; nothing had arrived whole, and the current release is untouched")
    arrived = f"the {whole} file(s) ({megabytes(held)}) that arrived whole" if whole else "what arrived"
    return Refused(problem, f"{again}: it resumes from {arrived}, kept in {staging}; the current release is untouched")
