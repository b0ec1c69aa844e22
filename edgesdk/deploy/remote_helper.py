"""The board side of ``edgesdk deploy``: one stdlib-only script, run as ``python3 -c BOOT OP JSON``.

The host never builds shell text from paths or names: it sends this file (compressed, inside the
``-c`` argument) and the operation's parameters as one JSON argument, both shell-quoted. Each
operation prints one JSON object on stdout (``{"ok": true, ...}`` or ``{"error": ..., "fix": ...}``).
It runs on the board's Python before edgesdk is installed there, so it needs Python >= 3.8 and
nothing outside the standard library.

Layout under the deploy root::

    releases/<bundle-id>/   verified bundles, never modified after they are committed
    current -> releases/<id>    switched with rename(2) of a fresh symlink (atomic)
    previous -> releases/<id>   what ``current`` pointed to before the last switch
    staging/<bundle-id>/    files being received; ``<name>.partial`` while incomplete (resumable)
    runtime/<key>/          edgesdk runtime virtual environments; runtime/current -> <key>
    engines/<bundle-id>/    TensorRT engines, one directory per JetPack / TensorRT / SM
    history.jsonl           one line per switch
"""

import errno
import fcntl
import hashlib
import json
import os
import platform
import shutil
import site
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


def safe_name(name):
    """A bundle file name must stay inside its directory."""
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name or name.endswith(".partial")
            or any(p in ("", ".", "..") for p in parts)):
        raise Refused(f"bundle file name {name!r} would escape the bundle directory",
                      "rebuild the bundle with 'edgesdk build'; deploy only bundles it wrote")
    return name


def safe_id(bundle_id):
    if not bundle_id or not all(c.isalnum() or c in "-_." for c in bundle_id) or bundle_id.startswith("."):
        raise Refused(f"bundle id {bundle_id!r} is not a plain name", "rebuild the bundle with 'edgesdk build'")
    return bundle_id


def paths(root):
    root = os.path.abspath(os.path.expanduser(root))
    return {name: os.path.join(root, name) for name in
            ("releases", "staging", "runtime", "engines", "current", "previous", "history.jsonl", ".trash")}, root


class Lock:
    """An exclusive flock on ROOT/.deploy.lock, so two deploys never interleave their writes."""

    def __init__(self, root, timeout=120.0):
        os.makedirs(root, exist_ok=True)
        self.handle = open(os.path.join(root, ".deploy.lock"), "a")
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise Refused(f"another deploy holds {root}/.deploy.lock for more than {timeout:.0f}s",
                                  "wait for it to finish, or remove the lock if no edgesdk deploy runs on the board"
                                  ) from None
                time.sleep(0.05)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


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


def tensorrt_version():
    code, text = run_quiet([sys.executable, "-c", "import tensorrt; print(tensorrt.__version__)"])
    if code == 0 and text.strip():
        return {"version": text.strip().splitlines()[-1], "python": True}
    code, text = run_quiet(["dpkg-query", "-W", "-f=${Version}", "tensorrt"])
    if code == 0 and text.strip():
        return {"version": text.strip(), "python": False}
    return None


def runtime_facts(p):
    stamp_path = os.path.join(p["runtime"], "current", "edgesdk-runtime.json")
    stamp = None
    text = read_text(stamp_path)
    if text:
        try:
            stamp = json.loads(text)
        except ValueError:
            stamp = None
    on_path = shutil.which("edgesdk")
    version = None
    if on_path:
        code, text = run_quiet([on_path, "--version"])
        version = text.strip().split()[-1] if code == 0 and text.strip() else None
    return {"stamp": stamp, "edgesdk_on_path": on_path, "edgesdk_on_path_version": version}


def switch_times(p):
    """Release id -> the last time current was switched to it (from history.jsonl)."""
    times = {}
    for line in (read_text(p["history.jsonl"], 1 << 22) or "").splitlines():
        try:
            entry = json.loads(line)
            times[entry["to"]] = float(entry["time"])
        except (ValueError, KeyError, TypeError):
            continue
    return times


def release_list(p):
    """current, previous, the releases (oldest first by last use) and leftover staging directories."""
    releases = []
    used = switch_times(p)
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
                entry["bytes"] = sum(f["size"] for f in manifest["files"].values())
                entry["created"] = manifest.get("created")
            except (OSError, ValueError, KeyError, TypeError):
                entry["target"] = None
            releases.append(entry)
    releases.sort(key=lambda r: r["mtime"])
    staging = sorted(os.listdir(p["staging"])) if os.path.isdir(p["staging"]) else []
    return {"current": link_target(p["current"]), "previous": link_target(p["previous"]),
            "releases": releases, "staging": staging}


def verify_dir(path, expected_manifest_sha=None):
    """Mirror of edgesdk.bundle.verify_bundle: (problems, names of bad files)."""
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
        listed = json.loads(raw)["files"]
    except (ValueError, KeyError, TypeError):
        return [f"{MANIFEST} is not a bundle manifest"], [MANIFEST, DIGEST]
    for name in sorted(listed):
        facts = listed[name]
        safe_name(name)
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            problems.append(f"{name}: missing")
        elif os.path.getsize(file) != facts["size"]:
            problems.append(f"{name}: {os.path.getsize(file)} bytes, manifest says {facts['size']}")
            bad.append(name)
        elif sha256_file(file) != facts["sha256"]:
            problems.append(f"{name}: sha256 differs from the manifest")
            bad.append(name)
    for folder, _dirs, files in os.walk(path):
        for file in files:
            rel = os.path.relpath(os.path.join(folder, file), path).replace(os.sep, "/")
            if rel not in listed and rel not in (MANIFEST, DIGEST):
                problems.append(f"{rel}: not listed in the manifest")
                bad.append(rel)
    return problems, bad


def plan_files(p, bundle_id, files):
    """What the board already has of each file: complete in staging, partial, or in another release."""
    staging = os.path.join(p["staging"], bundle_id)
    by_release = release_list(p)
    order = [r["id"] for r in reversed(by_release["releases"]) if r["id"] != bundle_id]
    if by_release["current"] in order:
        order.remove(by_release["current"])
        order.insert(0, by_release["current"])
    plan = {}
    for name in sorted(files):
        facts = files[name]
        safe_name(name)
        target = os.path.join(staging, name)
        if os.path.isfile(target) and os.path.getsize(target) == facts["size"]:
            plan[name] = {"state": "staging"}
            continue
        partial = target + ".partial"
        if os.path.isfile(partial) and 0 < os.path.getsize(partial) <= facts["size"]:
            plan[name] = {"state": "partial", "offset": os.path.getsize(partial)}
            continue
        plan[name] = {"state": "send", "offset": 0}
        for release in order:
            candidate = os.path.join(p["releases"], release, name)
            if (os.path.isfile(candidate) and os.path.getsize(candidate) == facts["size"]
                    and sha256_file(candidate) == facts["sha256"]):
                plan[name] = {"state": "link", "from": release}
                break
    return plan


def op_probe(params):
    p, root = paths(params["root"])
    facts = {
        "root": root,
        "root_exists": os.path.isdir(root),
        "arch": platform.machine(),
        "kernel": platform.release(),
        "device_tree_model": read_text("/proc/device-tree/model") or read_text("/sys/firmware/devicetree/base/model"),
        "nv_tegra_release": read_text("/etc/nv_tegra_release", 4096),
        "cpuinfo": read_text("/proc/cpuinfo"),
        "memory": meminfo(),
        "disk": free_bytes(root),
        "python": {"version": list(sys.version_info[:3]), "executable": sys.executable,
                   "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix)},
        "tensorrt": tensorrt_version(),
        "runtime": runtime_facts(p),
        "state": release_list(p),
    }
    bundle_id = params.get("bundle_id")
    if bundle_id:
        safe_id(bundle_id)
        release = os.path.join(p["releases"], bundle_id)
        facts["release"] = None
        if os.path.isdir(release):
            problems, _bad = verify_dir(release, params.get("manifest_sha256"))
            facts["release"] = {"problems": problems}
        if facts["release"] is None or facts["release"]["problems"]:
            facts["plan"] = plan_files(p, bundle_id, params["files"])
    return facts


def receive_file(header, stream, staging):
    """Write one file from the stream into staging, appending to its .partial; True when complete."""
    name = safe_name(header["name"])
    target = os.path.join(staging, name)
    partial = target + ".partial"
    os.makedirs(os.path.dirname(target), exist_ok=True)
    offset, size = int(header["offset"]), int(header["size"])
    digest = hashlib.sha256()
    mode = "r+b" if offset and os.path.isfile(partial) and os.path.getsize(partial) >= offset else "wb"
    if offset and mode == "wb":
        raise Refused(f"{name}: resume offset {offset} is past the end of {partial} on the board",
                      "run the deploy again; it re-plans from what the board holds")
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
    actual = digest.hexdigest()
    if actual != header["sha256"]:
        os.unlink(partial)
        return {"name": name, "complete": True, "ok": False, "sha256": actual}
    os.replace(partial, target)
    return {"name": name, "complete": True, "ok": True}


def op_receive(params):
    p, root = paths(params["root"])
    bundle_id = safe_id(params["bundle_id"])
    staging = os.path.join(p["staging"], bundle_id)
    results = []
    with Lock(root):
        try:
            os.makedirs(staging, exist_ok=True)
            for name, release in sorted(params.get("links", {}).items()):
                source = os.path.join(p["releases"], safe_id(release), safe_name(name))
                target = os.path.join(staging, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.exists(target):
                    os.unlink(target)
                try:
                    os.link(source, target)
                except OSError:
                    shutil.copy2(source, target)
            stream = sys.stdin.buffer
            while True:
                line = stream.readline(65536)
                if not line:
                    return {"results": results, "eof": True}
                header = json.loads(line.decode("utf-8"))
                if header.get("end"):
                    return {"results": results, "eof": False}
                result = receive_file(header, stream, staging)
                results.append(result)
                if not result["complete"]:
                    return {"results": results, "eof": True}
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                shutil.rmtree(staging, ignore_errors=True)
                free = free_bytes(root)["free"]
                raise Refused(f"the board ran out of disk space writing into {staging} ({free} bytes free now)",
                              "free space on the board (or choose --remote-root on a larger disk) and deploy "
                              "again; the staging copy was removed, the current release is untouched") from exc
            raise


def op_commit(params):
    """Verify staging/<id> completely, then rename it to releases/<id>."""
    p, root = paths(params["root"])
    bundle_id = safe_id(params["bundle_id"])
    staging = os.path.join(p["staging"], bundle_id)
    release = os.path.join(p["releases"], bundle_id)
    with Lock(root):
        for folder, _dirs, files in os.walk(staging):
            for file in files:
                if file.endswith(".partial"):
                    os.unlink(os.path.join(folder, file))
        problems, bad = verify_dir(staging, params["manifest_sha256"])
        if problems:
            for name in bad:
                try:
                    os.unlink(os.path.join(staging, name))
                except OSError:
                    pass
            return {"problems": problems}
        os.makedirs(p["releases"], exist_ok=True)
        if os.path.isdir(release):  # a damaged copy of the same bundle: replace it
            os.makedirs(p[".trash"], exist_ok=True)
            os.replace(release, os.path.join(p[".trash"], f"{bundle_id}-{time.time_ns()}"))
        os.replace(staging, release)
        fsync_dir(p["releases"])
        shutil.rmtree(p[".trash"], ignore_errors=True)
        return {"problems": []}


def op_verify(params):
    p, _root = paths(params["root"])
    release = os.path.join(p["releases"], safe_id(params["bundle_id"]))
    if not os.path.isdir(release):
        raise Refused(f"release {release} does not exist on the board",
                      "run 'edgesdk deploy --status' to list the releases the board holds")
    return {"problems": verify_dir(release)[0]}


def switch_link(p, root, link, bundle_id):
    tmp = os.path.join(root, f".{link}.tmp-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(os.path.join("releases", bundle_id), tmp)
    os.replace(tmp, p[link])


def op_switch(params):
    """Point current at releases/<id> atomically; previous keeps what current was."""
    p, root = paths(params["root"])
    bundle_id = safe_id(params["bundle_id"])
    with Lock(root):
        if not os.path.isfile(os.path.join(p["releases"], bundle_id, MANIFEST)):
            raise Refused(f"release {bundle_id} is not on the board", "deploy it first")
        old = link_target(p["current"])
        if old != bundle_id:
            switch_link(p, root, "current", bundle_id)
            if old and os.path.isdir(os.path.join(p["releases"], old)):
                switch_link(p, root, "previous", old)
            fsync_dir(root)
            with open(p["history.jsonl"], "a") as handle:
                handle.write(json.dumps({"time": time.time(), "action": params.get("action", "deploy"),
                                         "from": old, "to": bundle_id}) + "\n")
        now = link_target(p["current"])
        with open(os.path.join(p["current"], MANIFEST), "rb") as handle:
            listed = json.loads(handle.read())["bundle_id"]
        if now != bundle_id or listed != bundle_id:
            raise Refused(f"after the switch, current points to {now} holding bundle {listed}, not {bundle_id}",
                          "run 'edgesdk deploy --rollback' and report this")
        return {"from": old, "to": bundle_id}


def op_prune(params):
    """Keep the newest ``keep`` releases (never current or previous); drop other staging dirs."""
    p, root = paths(params["root"])
    keep = max(int(params["keep"]), 1)
    removed = []
    with Lock(root):
        state = release_list(p)
        protected = {state["current"], state["previous"]}
        newest = [r["id"] for r in reversed(state["releases"])]
        kept = [r for r in newest if r in protected]
        for release in newest:
            if release in protected:
                continue
            if len(kept) < keep:
                kept.append(release)
                continue
            shutil.rmtree(os.path.join(p["releases"], release), ignore_errors=True)
            shutil.rmtree(os.path.join(p["engines"], release), ignore_errors=True)
            removed.append(release)
        for stale in state["staging"]:
            if stale != params.get("keep_staging"):
                shutil.rmtree(os.path.join(p["staging"], stale), ignore_errors=True)
    return {"removed": removed, "kept": kept}


def inherit_site_packages(venv):
    """Let the new venv see this interpreter's own site-packages when it is itself a venv."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return []
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    code, out = run_quiet([os.path.join(venv, "bin", "python"), "-c",
                           "import site, json; print(json.dumps(site.getsitepackages()))"])
    if code != 0 or not dirs:
        return []
    target = json.loads(out.strip().splitlines()[-1])[0]
    with open(os.path.join(target, "zz-edgesdk-inherited.pth"), "w") as handle:
        handle.write("\n".join(dirs) + "\n")
    return dirs


def op_install(params):
    """Create runtime/<key> (a venv), pip install the wheel sent on stdin (or a pip spec) into it."""
    p, root = paths(params["root"])
    key = safe_id(params["key"])
    venv = os.path.join(p["runtime"], key)
    log = []

    def step(argv, what, fix, timeout=1800):
        code, out = run_quiet(argv, timeout)
        log.append(out[-4000:])
        if code != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise Refused(f"{what} failed on the board (exit {code}):\n{out[-2500:].rstrip()}", fix)
        return out

    with Lock(root):
        if sys.version_info < (3, 10):  # noqa: UP036 - runs on the board's Python, which may be 3.8
            raise Refused(f"the board's Python {platform.python_version()} ({sys.executable}) is older than 3.10, which edgesdk needs",
                          "install Python >= 3.10 on the board and pass --remote-python /path/to/python3.10")
        wheels = os.path.join(p["runtime"], "wheels")
        os.makedirs(wheels, exist_ok=True)
        spec = params.get("pip_spec")
        if params.get("wheel_name"):
            wheel = os.path.join(wheels, os.path.basename(params["wheel_name"]))
            with open(wheel + ".partial", "wb") as handle:
                shutil.copyfileobj(sys.stdin.buffer, handle, CHUNK)
            if sha256_file(wheel + ".partial") != params["wheel_sha256"]:
                os.unlink(wheel + ".partial")
                raise Refused("the edgesdk wheel arrived damaged on the board", "run the deploy again")
            os.replace(wheel + ".partial", wheel)
            spec = wheel
        shutil.rmtree(venv, ignore_errors=True)
        venv_argv = [sys.executable, "-m", "venv", "--without-pip"]
        if params.get("system_site_packages"):
            venv_argv.append("--system-site-packages")
        step(venv_argv + [venv], f"creating the virtual environment {venv}",
             "install the venv module on the board (Debian/Ubuntu: sudo apt install python3-venv)")
        inherited = inherit_site_packages(venv) if params.get("system_site_packages") else []
        python = os.path.join(venv, "bin", "python")
        if run_quiet([python, "-m", "pip", "--version"])[0] != 0:
            step([python, "-m", "ensurepip", "--default-pip"], f"installing pip into {venv}",
                 "install pip's bootstrap on the board (Debian/Ubuntu: sudo apt install python3-venv python3-pip)")
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        index_fix = ("give the board access to a package index (pip needs numpy, onnxruntime, tokenizers ...), or "
                     "install them for the board's Python and deploy with --runtime-venv-system-site-packages")
        # edgesdk itself into this venv even when an inherited site-packages already has the same version,
        # then whatever dependencies the board does not have yet.
        step(pip + ["--no-deps", "--force-reinstall", spec], f"pip install {os.path.basename(spec)}", index_fix)
        step(pip + [spec], f"pip install of the dependencies of {os.path.basename(spec)}", index_fix)
        step([os.path.join(venv, "bin", "edgesdk"), "--version"], "edgesdk --version in the new runtime",
             "report this: the wheel installed but its command does not start")
        version, where = step([python, "-c", "import edgesdk; print(edgesdk.__version__, edgesdk.__file__)"],
                              "import edgesdk in the new runtime", "report this").split()[-2:]
        if not os.path.realpath(where).startswith(os.path.realpath(venv) + os.sep):
            shutil.rmtree(venv, ignore_errors=True)
            raise Refused(f"the new runtime imports edgesdk from {where} instead of its own {venv}",
                          "unset PYTHONPATH for ssh sessions on the board, or deploy without "
                          "--runtime-venv-system-site-packages")
        with open(os.path.join(venv, "edgesdk-runtime.json"), "w") as handle:
            json.dump({"key": key, "version": version, "installed": time.time(), "inherited": inherited}, handle)
        tmp = os.path.join(p["runtime"], f".current.tmp-{os.getpid()}")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(key, tmp)
        old = link_target(os.path.join(p["runtime"], "current"))
        os.replace(tmp, os.path.join(p["runtime"], "current"))
        for stale in os.listdir(p["runtime"]):
            if stale not in (key, old, "current", "wheels") and not stale.startswith("."):
                shutil.rmtree(os.path.join(p["runtime"], stale), ignore_errors=True)
        return {"key": key, "version": version, "replaced": old}


OPS = {"probe": op_probe, "receive": op_receive, "commit": op_commit, "verify": op_verify,
       "switch": op_switch, "prune": op_prune, "install": op_install}


def main(argv):
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
        emit({"ok": False, "error": f"{getattr(exc, 'filename', None) or 'board'}: {exc.strerror or exc}",
              "fix": "check the permissions and free space under the deploy root on the board"})
        return 3
    except Exception as exc:  # noqa: BLE001 - reported to the host instead of a traceback it cannot parse
        emit({"ok": False, "error": f"the deploy helper failed on the board: {exc!r}",
              "fix": "report this with the output of 'edgesdk deploy --status'"})
        return 4


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
