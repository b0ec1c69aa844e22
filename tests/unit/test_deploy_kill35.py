"""Deploys killed part-way: the board root stays consistent, the same deploy run again finishes it, and the
release that ran before is never lost.

Where the moment matters, the board helper kills itself and the deploy that started it (its process group)
at an exact point: a ``sitecustomize`` on PYTHONPATH adds an audit hook to the helper (a ``python -c``) that
sends SIGKILL when it is about to do what ``KILL_HELPER_AT`` names (``EVENT:PATH``, the audit event and the
start of the path it acts on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edgesdk.deploy.remote import boot_code
from tests._utils.deploy import bundle_variant, current_id, edgesdk

HOOK = """
import os, signal, sys
_event, _, _at = os.environ.get("KILL_HELPER_AT", "").partition(":")
if _at and sys.argv[:1] == ["-c"]:
    def _hook(event, args):
        if event == _event and str(args[1] if event == "os.symlink" else args[0]).startswith(_at):
            os.killpg(0, signal.SIGKILL)
    sys.addaudithook(_hook)
"""


def killing_env(tmp_path: Path, event: str, at: Path) -> dict[str, str]:
    """The environment of a deploy whose helper is killed, with the deploy, at audit ``event`` on ``at*``."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
            "KILL_HELPER_AT": f"{event}:{at}"}


def killed_deploy(*args, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``edgesdk deploy ARGS`` in its own process group, which the helper's hook kills."""
    proc = subprocess.run([sys.executable, "-m", "edgesdk.cli", "deploy", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env, start_new_session=True)
    assert proc.returncode == -9, proc.stderr  # killed where the hook says, not finished or refused
    return proc


def link(root: Path, name: str) -> str | None:
    path = root / name
    return os.path.basename(os.readlink(path)) if path.is_symlink() else None


def test_a_deploy_killed_between_current_and_previous_keeps_the_release_it_left(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    first, second, third = [tiny_bundle] + [bundle_variant(tiny_bundle.path, tmp_path / n, n) for n in "bc"]
    for bundle in (first, second):
        assert edgesdk("deploy", bundle.path, "--to", root).returncode == 0
    # current already points to the third release; previous still to the first, not the second it left
    killed_deploy(third.path, "--to", root, env=killing_env(tmp_path, "os.symlink", root / ".previous.tmp-"))
    assert current_id(root) == third.bundle_id
    assert link(root, "previous") == first.bundle_id

    status = edgesdk("deploy", "--status", "--json", "--to", root)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["previous"] == second.bundle_id  # what --rollback goes back to

    again = edgesdk("deploy", third.path, "--to", root, "--keep", "1")
    assert again.returncode == 0, again.stderr
    assert current_id(root) == third.bundle_id
    assert link(root, "previous") == second.bundle_id
    assert edgesdk("verify", root / "releases" / second.bundle_id).returncode == 0  # not pruned
    assert not (root / ".switch.json").exists()
    back = edgesdk("deploy", "--rollback", "--to", root)
    assert back.returncode == 0, back.stderr
    assert current_id(root) == second.bundle_id
    assert link(root, "previous") == third.bundle_id


def test_a_switch_killed_before_current_moved_puts_the_runtime_back(tiny_bundle, tmp_path):
    """The helper itself, as deploy --host runs it with a runtime to switch: killed after runtime/current
    moved, before current did, the next prune puts runtime/current back with the release it runs."""
    root = tmp_path / "board"
    second = bundle_variant(tiny_bundle.path, tmp_path / "b", "b")
    for bundle in (tiny_bundle, second):
        assert edgesdk("deploy", bundle.path, "--to", root).returncode == 0
    for key in ("old", "new"):
        (root / "runtime" / key).mkdir(parents=True)
        (root / "runtime" / key / "edgesdk-runtime.json").write_text(json.dumps({"key": key, "version": "0"}))
    os.symlink("old", root / "runtime" / "current")

    def helper(op: str, params: dict, env=None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", boot_code(), op, json.dumps({"root": str(root), **params})],
                              capture_output=True, text=True, timeout=120, env=env, start_new_session=True)

    cut = helper("switch", {"bundle_id": tiny_bundle.bundle_id, "runtime_key": "new"},
                 env=killing_env(tmp_path, "os.symlink", root / ".current.tmp-"))
    assert cut.returncode == -9, cut.stdout + cut.stderr
    assert current_id(root) == second.bundle_id
    pruned = helper("prune", {"keep": 3})
    assert pruned.returncode == 0, pruned.stdout
    assert os.readlink(root / "runtime" / "current") == "old"  # the runtime that runs the current release
    assert current_id(root) == second.bundle_id
    assert link(root, "previous") == tiny_bundle.bundle_id
    assert not (root / ".switch.json").exists()


def test_a_killed_switch_to_the_current_release_adds_no_switch_to_the_history(tiny_bundle, tmp_path):
    """The same bundle deployed again switches nothing (current already is it) and writes no history line;
    killed before it dropped its journal, the next prune took it for a switch that moved current."""
    root = tmp_path / "board"
    assert edgesdk("deploy", tiny_bundle.path, "--to", root).returncode == 0
    history = (root / "history.jsonl").read_text()
    cut = edgesdk("deploy", tiny_bundle.path, "--to", root, timeout=300, start_new_session=True,
                  env=killing_env(tmp_path, "os.remove", root / ".switch.json"))
    assert cut.returncode == -9, cut.stderr
    again = edgesdk("deploy", tiny_bundle.path, "--to", root)
    assert again.returncode == 0, again.stderr
    assert (root / "history.jsonl").read_text() == history
    assert not (root / ".switch.json").exists()
