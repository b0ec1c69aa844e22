"""A stand-in for ``systemctl``, ``journalctl`` and ``loginctl`` on a machine without systemd as init.

Tests install it under those three names in a directory put first on PATH (:func:`install`). It keeps
its state in ``$FAKE_SYSTEMD_STATE``: ``calls.jsonl`` (every call), ``<unit>.pid``, ``<unit>.enabled``
and ``<unit>.log``. ``restart`` really starts the unit's ExecStart (read from ``$EDGESDK_UNIT_DIR``,
unquoted as systemd does) as a detached process whose output is the unit's journal, so what runs is
the real server; only the service manager is stood in for.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path


def install(bin_dir: Path, state_dir: Path) -> dict[str, str]:
    """Write the three commands into ``bin_dir``; returns the environment variables to set."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in ("systemctl", "journalctl", "loginctl"):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parents[2])!r})\n"
                        f"from tests._utils.fake_systemd import main\nsys.exit(main({name!r}, sys.argv[1:]))\n")
        path.chmod(0o755)
    return {"FAKE_SYSTEMD_STATE": str(state_dir), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def calls(state_dir: Path) -> list[list[str]]:
    path = state_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def stop_all(state_dir: Path) -> None:
    for pid_file in state_dir.glob("*.pid"):
        _stop(pid_file)


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass
    pid_file.unlink(missing_ok=True)


def _alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text())
        waited, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (started by another call): probe it
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().split()[2] != "Z"
        except OSError:
            return False
    except (OSError, ValueError):
        return False
    return waited == 0


def _exec_start(unit: str) -> list[str]:
    text = (Path(os.environ["EDGESDK_UNIT_DIR"]) / f"{unit}.service").read_text()
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    return [arg.replace("%%", "%").replace("$$", "$") for arg in shlex.split(line[len("ExecStart="):])]


def main(name: str, args: list[str]) -> int:
    state = Path(os.environ["FAKE_SYSTEMD_STATE"])
    with open(state / "calls.jsonl", "a") as log:
        log.write(json.dumps([name, *args]) + "\n")
    args = [a for a in args if a != "--user"]
    if name == "loginctl":
        if args[0] == "show-user":
            print("no")
            return 0
        print("Could not enable linger: Access denied", file=sys.stderr)
        return 1
    if name == "journalctl":
        unit = args[args.index("-u") + 1]
        log_file = state / f"{unit}.log"
        print("\n".join(log_file.read_text().splitlines()[-15:]) if log_file.exists() else "-- No entries --")
        return 0
    command, unit = args[0], (args[1] if len(args) > 1 else "")
    if command in ("show-environment", "daemon-reload"):
        return 0
    if command == "enable":
        (state / f"{unit}.enabled").touch()
        return 0
    if command == "disable":
        (state / f"{unit}.enabled").unlink(missing_ok=True)
        return 0
    if command == "is-enabled":
        enabled = (state / f"{unit}.enabled").exists()
        print("enabled" if enabled else "disabled")
        return 0 if enabled else 1
    if command == "stop":
        _stop(state / f"{unit}.pid")
        return 0
    if command == "restart":
        _stop(state / f"{unit}.pid")
        with open(state / f"{unit}.log", "ab") as journal:
            process = subprocess.Popen(_exec_start(unit), stdout=journal, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        (state / f"{unit}.pid").write_text(str(process.pid))
        return 0
    if command == "is-active":
        active = _alive(state / f"{unit}.pid")
        print("active" if active else "failed")
        return 0 if active else 3
    print(f"fake systemctl: {command} is not stood in for", file=sys.stderr)
    return 1
