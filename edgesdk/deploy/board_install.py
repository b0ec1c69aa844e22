"""The board side of deploy, part 3 of 5: installing the edgesdk runtime into a virtual environment."""

import json
import os
import platform
import shutil
import signal
import site
import subprocess
import sys
import threading
import time

if "BOARD_BUNDLED" not in globals():  # on the host; on the board the parts are concatenated
    from edgesdk.deploy.board_common import (
        CHUNK,
        Lock,
        Refused,
        fsync_dir,
        paths,
        read_stamp,
        run_quiet,
        runtime_finished,
        safe_id,
        sha256_file,
        write_json,
    )
    from edgesdk.deploy.board_transfer import RECEIVE_IDLE_S, IdleDeadline


# Distributions that install the module ``onnxruntime`` under a name of their own: the GPU build (PyPI
# onnxruntime-gpu, and the Jetson Zoo / jetson-containers wheels a JetPack board has in its system Python) and the
# other execution-provider builds. pip matches a requirement by distribution name, so ``onnxruntime>=1.18`` is not
# satisfied by onnxruntime-gpu: it installs the CPU onnxruntime into the venv, whose site-packages come before the
# system's, and ``import onnxruntime`` there loses the CUDA / TensorRT providers (ONNX Runtime: only one of the
# packages belongs in an environment, microsoft/onnxruntime#10685, #26996); a board without a network fails instead.
ONNXRUNTIME_BUILDS = {"onnxruntime": ["onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml",
                                      "onnxruntime-qnn", "onnxruntime-training"]}

# Run by the new venv's Python after edgesdk itself is installed (--no-deps): edgesdk's dependencies (its
# Requires-Dist, extras left out), less those a build above that the venv sees already provides at a version the
# requirement takes. Prints {"keep": [requirement, ...], "provided": [[requirement, distribution, version], ...]}.
DEPENDENCIES = r"""
import json, re, sys
if sys.path and sys.path[0] == "":  # python -c: the working directory (an edgesdk checkout's egg-info) is not the venv
    del sys.path[0]
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    try:
        from pip._vendor.packaging.requirements import Requirement
    except ImportError:  # a pip whose vendored libraries a distribution took out: pip install SPEC as it is
        print(json.dumps({"keep": None, "provided": []}))
        sys.exit(0)

def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def takes(specifier, version):
    try:
        return specifier.contains(version, prereleases=True)
    except Exception:  # a version PEP 440 cannot read: pip decides, as before
        return False

builds, have = json.loads(sys.argv[1]), {}
for dist in metadata.distributions():
    if dist.metadata["Name"]:
        have.setdefault(canonical(dist.metadata["Name"]), dist.version)
keep, provided = [], []
for text in metadata.requires("edgesdk") or []:
    requirement = Requirement(text)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    name = canonical(requirement.name)
    found = [b for b in builds.get(name, []) if b in have and takes(requirement.specifier, have[b])]
    if name not in have and found:
        provided.append([str(requirement), found[0], have[found[0]]])
    else:
        keep.append(str(requirement))
print(json.dumps({"keep": keep, "provided": provided}))
"""


def inherit_site_packages(venv):
    """Let the new venv see this interpreter's own site-packages when it is itself a venv. Refused, the ``venv``
    removed (as read_answer does), where the venv's Python fails or names no site-packages directory."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return []
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    if not dirs:
        return []
    argv = [os.path.join(venv, "bin", "python"), "-c", "import site, json; print(json.dumps(site.getsitepackages()))"]
    code, out, err = run_answer(argv)
    found = answer_lines(out, 1, json.loads) if code == 0 else None
    target = found[0] if found else None
    if not (isinstance(target, list) and target and isinstance(target[0], str) and os.path.isdir(target[0])):
        shutil.rmtree(venv, ignore_errors=True)
        failed = f"failed (exit {code})" if code != 0 else "did not name its site-packages directory"
        raise Refused(f"the new runtime's Python {failed}, where a JSON list of its site-packages directories was "
                      f"expected: {shown(argv)} printed:\n{printed(out, err)}",
                      f"check that {argv[0]} starts and has the site module (run the command above on the board), "
                      "or deploy without --runtime-venv-system-site-packages")
    with open(os.path.join(target[0], "zz-edgesdk-inherited.pth"), "w") as handle:
        handle.write("\n".join(dirs) + "\n")
    return dirs


def answer_lines(out, count, parse=None):
    """The last ``count`` lines of a command's stdout ``out`` that are not blank, each read by ``parse`` when one is
    given; None where there are fewer, or ``parse`` cannot read one (a JSON error, a ValueError)."""
    lines = [line.strip() for line in out.splitlines() if line.strip()][-count:] if count else []
    if len(lines) < count:
        return None
    if parse is None:
        return lines
    try:
        return [parse(line) for line in lines]
    except ValueError:  # json.JSONDecodeError is one
        return None


def shown(argv):
    """``argv`` as one line for a message; a ``-c`` program of several lines is shown by its first one."""
    words = []
    for word in argv:
        lines = word.strip().splitlines()
        word = lines[0] + " ..." if len(lines) > 1 else word
        words.append(word if word and not any(char.isspace() for char in word) else repr(word))
    return " ".join(words)


def dependencies_answer(line):
    """DEPENDENCIES's answer read from its line; a ValueError where the line is not one."""
    value = json.loads(line)
    if not isinstance(value, dict) or "keep" not in value or "provided" not in value:
        raise ValueError(f"not the dependencies: {line}")
    return value


PRINTED_MAX = 2500  # the most of a stream a message shows: its last characters, where the error is


def printed(out, err):
    """What a command printed, for a message: its stdout and its stderr, each under its name as indented lines (a
    traceback reads as one), cut to its last PRINTED_MAX characters."""
    parts = []
    for name, text in (("stdout", out), ("stderr", err)):
        text = text.rstrip()
        if not text:
            parts.append(f"  on {name}: nothing")
            continue
        shown_text = text[-PRINTED_MAX:]
        cut = f" (its last {PRINTED_MAX} characters)" if len(shown_text) < len(text) else ""
        lines = [("    " + line).rstrip() for line in shown_text.splitlines()]
        parts.append("\n".join([f"  on {name}{cut}:"] + lines))
    return "\n".join(parts)


def read_answer(argv, count, parse, what, expected, fix, venv):
    """The last ``count`` lines ``argv`` (an install step) prints on stdout, each read by ``parse`` (when given): its
    stderr apart, so that a warning printed there after the answer (a DeprecationWarning, a .pth file's error) is not
    read as the answer. Refused, the ``venv`` removed, where it fails or prints no ``expected``."""
    code, out, err = run_answer_step(argv, 600)
    found = answer_lines(out, count, parse) if code == 0 else None
    if found is None:
        shutil.rmtree(venv, ignore_errors=True)
        failed = f"failed on the board (exit {code})" if code != 0 else f"printed no {expected} on the board"
        raise Refused(f"{what} {failed}: {shown(argv)} printed:\n{printed(out, err)}", fix)
    return found


def op_install(params):
    """Create runtime/<key> (a venv), pip install the wheel sent on stdin (or a pip spec) into it.

    ``runtime/current`` is not touched: it moves with the bundle's ``current`` (op_switch), once
    the new runtime has run the new bundle, so a failed deploy leaves the old runtime active."""
    p, root = paths(params["root"])
    key = safe_id(params["key"], "edgesdk runtime key", "the key comes from the deploying host's edgesdk: deploy "
                  "again with a released edgesdk there, or with --no-install to keep the board's runtime")
    venv = os.path.join(p["runtime"], key)

    def step(argv, what, fix, timeout=1800):
        code, out = run_step(argv, timeout)
        if code != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise Refused(f"{what} failed on the board (exit {code}):\n{out[-2500:].rstrip()}", fix)
        return out

    stop_steps_on_term()
    with Lock(root):
        if sys.version_info < (3, 10):  # noqa: UP036 - runs on the board's Python, which may be 3.8
            raise Refused(f"the board's Python {platform.python_version()} ({sys.executable}) is older than 3.10, "
                          "which edgesdk needs",
                          "install Python >= 3.10 on the board and pass --remote-python /path/to/python3.10")
        wheels = os.path.join(p["runtime"], "wheels")
        os.makedirs(wheels, exist_ok=True)
        spec = params.get("pip_spec")
        if params.get("wheel_name"):
            wheel = os.path.join(wheels, os.path.basename(params["wheel_name"]))
            receive_wheel(wheel + ".partial", params.get("idle_timeout", RECEIVE_IDLE_S), params.get("wheel_size"))
            if sha256_file(wheel + ".partial") != params["wheel_sha256"]:
                os.unlink(wheel + ".partial")
                raise Refused("the edgesdk wheel arrived damaged on the board", "run the deploy again")
            os.replace(wheel + ".partial", wheel)
            spec = wheel
        if "wheel_size" in params:  # the host holds stdin open past the wheel until it goes away
            end_with_host()
        stamp = read_stamp(venv)
        if runtime_finished(stamp):  # installed earlier (a deploy that failed after this step)
            return {"key": key, "version": stamp["version"], "reused": True}
        shutil.rmtree(venv, ignore_errors=True)  # an install cut short, or a stamp a power cut left unreadable
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
        # then its dependencies, less an onnxruntime that a build of another name the venv sees provides
        # (ONNXRUNTIME_BUILDS): 'pip install SPEC' put the CPU onnxruntime over the board's onnxruntime-gpu
        dependencies = read_answer([python, "-c", DEPENDENCIES, json.dumps(ONNXRUNTIME_BUILDS)], 1,
                                   dependencies_answer, f"reading the dependencies of {os.path.basename(spec)}",
                                   'JSON object {"keep": ..., "provided": ...}', "report this", venv)[0]
        if dependencies["keep"] is None or dependencies["keep"]:
            step(pip + (dependencies["keep"] or [spec]),
                 f"pip install of the dependencies of {os.path.basename(spec)}", index_fix)
        step([os.path.join(venv, "bin", "edgesdk"), "--version"], "edgesdk --version in the new runtime",
             "report this: the wheel installed but its command does not start")
        version, where = read_answer(
            [python, "-c", "import edgesdk; print(edgesdk.__version__); print(edgesdk.__file__)"], 2, None,
            "import edgesdk in the new runtime", "edgesdk version and file on two lines", "report this", venv)
        if not os.path.realpath(where).startswith(os.path.realpath(venv) + os.sep):
            shutil.rmtree(venv, ignore_errors=True)
            raise Refused(f"the new runtime imports edgesdk from {where} instead of its own {venv}",
                          "unset PYTHONPATH for ssh sessions on the board, or deploy without "
                          "--runtime-venv-system-site-packages")
        provided = [{"requirement": r, "by": f"{name} {at}"} for r, name, at in dependencies["provided"]]
        write_stamp(venv, {"key": key, "version": version, "installed": time.time(), "inherited": inherited,
                           "provided": provided})
        return {"key": key, "version": version, "provided": provided}


def receive_wheel(partial, idle_timeout, size=None):
    """The wheel from stdin into ``partial``, giving up (and the deploy lock with it) once the host has sent
    nothing for ``idle_timeout`` seconds: a connection that died without closing would otherwise hold the
    lock until the command's deadline, an hour later (RECEIVE_IDLE_S says why). With ``size`` the wheel is its
    first ``size`` bytes (the host keeps stdin open after them: end_with_host), else all of stdin."""
    stream = IdleDeadline(sys.stdin.buffer, idle_timeout, "the edgesdk wheel",
                          "run the deploy again (the wheel is sent again); the board keeps its current release")
    left = size
    try:
        with open(partial, "wb") as handle:
            while left is None or left > 0:
                block = stream.read(CHUNK if left is None else min(CHUNK, left))
                if not block:
                    return  # cut short: the sha256 check refuses it
                handle.write(block)
                if left is not None:
                    left -= len(block)
    except Refused:
        os.unlink(partial)
        raise
    finally:
        stream.close()


STEPS = []  # the command an install runs now (run_step), for end_with_host to stop


def run_step(argv, timeout):
    """run_quiet for the install's long steps (venv, pip): the command in a process group of its own, which
    end_with_host stops whole (pip and what it starts), as a timeout does. A step stopped at its ``timeout`` still
    answers with what it printed until then (the package pip was building when it hung), and the limit it reached:
    Python's output is unbuffered in it (``PYTHONUNBUFFERED``), since SIGKILL throws away what a buffer holds."""
    code, out, _ = run_in_group(argv, timeout, apart=False)
    return code, out


def run_answer_step(argv, timeout):
    """run_step for a step whose stdout is its answer: (exit code, stdout, stderr), stderr kept apart."""
    return run_in_group(argv, timeout, apart=True)


def run_answer(argv, timeout=60):
    """run_quiet for a short command whose stdout is its answer: (exit code, stdout, stderr), stderr kept apart."""
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def run_in_group(argv, timeout, apart):
    """(exit code, stdout, stderr) of ``argv`` run as run_step says; stderr is merged into stdout (and comes back
    empty) unless ``apart``."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE if apart else subprocess.STDOUT,
                                start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except OSError as exc:
        return (127, "", str(exc)) if apart else (127, str(exc), "")
    STEPS.append(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        stop_group(proc)
        out, err = rest_of_output(proc, exc.output, exc.stderr)
        out, err = out.decode("utf-8", "replace").rstrip(), err.decode("utf-8", "replace").rstrip()
        stopped = f"(stopped after {timeout:g} s, the time this step may take on the board)"
        if apart:
            return 124, out, (err + "\n" if err else "") + stopped
        return 124, (out + "\n" if out else "") + stopped, ""
    finally:
        STEPS.remove(proc)
    return proc.returncode, out.decode("utf-8", "replace"), (err or b"").decode("utf-8", "replace")


def rest_of_output(proc, printed, printed_err=None):
    """All a stopped step printed, (stdout, stderr): what ``communicate`` had read (``printed``, ``printed_err``)
    and what was left in the pipes, read for a few seconds at most (a process that left the step's group may hold
    a pipe open)."""
    try:
        out, err = proc.communicate(timeout=5)
        return out or b"", err or b""
    except subprocess.TimeoutExpired as late:
        return late.output or printed or b"", late.stderr or printed_err or b""


def stop_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def end_with_host():
    """End this install, and the venv or pip command it runs, when the host goes away (Ctrl-C or a kill of
    deploy, its ssh ended, the connection dropped). sshd sends a command started without a terminal no signal
    then: it only closes the command's stdin (as transport.REMOTE_DEADLINE_WATCHED says for the commands that
    read nothing), so an install whose stdin carried the wheel ran on for up to an hour holding the deploy lock,
    and the next deploy waited its 120 s for the lock and was refused, told "another deploy" held it. The host
    keeps stdin open after the wheel (transport.run_feeding_stdin): a thread here reads it to its end, then
    sends this helper SIGTERM, which stops the step's process group and the helper (stop_steps_on_term) and
    lets the lock go. A venv cut short has no stamp, and the next install builds it afresh."""

    def watch():
        # the file descriptor, not sys.stdin.buffer: a daemon thread blocked in the buffered reader holds its
        # lock, and Python aborts at exit when it closes sys.stdin ("could not acquire lock ... at interpreter
        # shutdown, possibly due to daemon threads")
        try:
            while os.read(sys.stdin.fileno(), CHUNK):
                pass
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # stop_steps_on_term

    threading.Thread(target=watch, daemon=True).start()


def stop_steps_on_term():
    """SIGTERM (the command's deadline, REMOTE_DEADLINE's timeout; end_with_host) stops the running step's
    process group too, which is not this helper's (run_step), then ends the helper as SIGTERM does."""

    def stop(signum, frame):
        for proc in list(STEPS):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def write_stamp(venv, stamp):
    """The install's last act, atomically: the stamp is whole or absent, even across a power cut."""
    write_json(os.path.join(venv, "edgesdk-runtime.json"), stamp)
    fsync_dir(venv)
