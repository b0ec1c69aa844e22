"""Ctrl-C while a deploy without ``--service`` restarts the unit an earlier ``deploy --service`` installed, and
while it puts the release the unit served back after the unit did not come up on the new one.

The deploys go ``--to`` a local directory; ``tests/_utils/fake_systemd.py`` stands in for systemctl and runs the
real ``edgesdk serve``. A systemctl in front of it holds the Nth ``restart`` (writes a marker, then sleeps), so
the SIGINT, sent to the command's process group as a terminal does, lands there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests._utils.deploy import bundle_variant, current_id, edgesdk, interrupt_once_held
from tests._utils.sshd import free_port

HOLD = """#!{python}
import os, sys, time
from pathlib import Path
if sys.argv[1:2] == ["restart"] or sys.argv[1:3] == ["--user", "restart"]:
    count = Path({count!r})
    n = int(count.read_text()) + 1 if count.exists() else 1
    count.write_text(str(n))
    if n == int(os.environ.get("HOLD_RESTART", "0")):
        Path({marker!r}).touch()
        time.sleep(600)
os.execv({fake!r}, [{fake!r}, *sys.argv[1:]])
"""


def holding(tmp_path: Path, env: dict) -> tuple[dict, Path]:
    """The environment whose systemctl holds the restart HOLD_RESTART names, and the marker it writes."""
    bin_dir, marker = tmp_path / "hold-bin", tmp_path / "held"
    bin_dir.mkdir()
    fake = str(tmp_path / "bin" / "systemctl")  # the systemd fixture's
    (bin_dir / "systemctl").write_text(HOLD.format(python=sys.executable, count=str(tmp_path / "restarts"),
                                                   marker=str(marker), fake=fake))
    (bin_dir / "systemctl").chmod(0o755)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}, marker


def interrupt_when_held(argv: list, env: dict, marker: Path) -> subprocess.CompletedProcess:
    return interrupt_once_held(argv, marker, env)


def test_ctrl_c_while_the_release_the_unit_served_is_put_back_says_current_went_back(tiny_bundle, tmp_path,
                                                                                     systemd):
    env, _ = systemd
    env, marker = holding(tmp_path, env)
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr  # restart 1
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")

    # restart 2: the server exits on the new release (serve refuses a blank EDGESDK_API_KEY, the smoke test's
    # 'edgesdk run' never reads it); current goes back, and restart 3, onto the old release, is held
    cut = interrupt_when_held(["deploy", newer.path, "--to", root],
                              {**env, "EDGESDK_API_KEY": " ", "HOLD_RESTART": "3"}, marker)
    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert (f"after switching current on local directory {root} back to releases/{tiny_bundle.bundle_id}, as the unit an earlier "
            f"deploy --service installed did not come up on releases/{newer.bundle_id}") in cut.stderr
    assert "the release is live" not in cut.stderr
    assert "fix: restart the unit so it serves current (systemctl restart edgesdk-serve" in cut.stderr

    again = edgesdk("deploy", tiny_bundle.path, "--to", root, env=env)  # the next deploy works
    assert again.returncode == 0, again.stderr
    assert current_id(root) == tiny_bundle.bundle_id


def test_ctrl_c_while_the_unit_restarts_onto_the_new_release_says_it_is_live(tiny_bundle, tmp_path, systemd):
    env, _ = systemd
    env, marker = holding(tmp_path, env)
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")

    cut = interrupt_when_held(["deploy", newer.path, "--to", root], {**env, "HOLD_RESTART": "2"}, marker)
    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    assert current_id(root) == newer.bundle_id
    assert (f"after switching local directory {root} to releases/{newer.bundle_id} (was releases/{tiny_bundle.bundle_id})"
            in cut.stderr)
    assert "fix: the release is live; if an earlier deploy --service installed a unit" in cut.stderr


def test_ctrl_c_while_a_service_deploy_puts_the_unit_back_says_current_went_back(tiny_bundle, tmp_path, systemd):
    env, _ = systemd
    env, marker = holding(tmp_path, env)
    root, port = tmp_path / "board", free_port()
    service = ["--service", "--service-port", port]
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, *service, env=env)
    assert first.returncode == 0, first.stderr  # restart 1
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")

    # restart 2: the installed unit's server exits on the new release; current goes back, and restart 3, of
    # the unit put back as it was, is held
    cut = interrupt_when_held(["deploy", newer.path, "--to", root, *service],
                              {**env, "EDGESDK_API_KEY": " ", "HOLD_RESTART": "3"}, marker)
    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert (f"after switching current on local directory {root} back to releases/{tiny_bundle.bundle_id}, as the "
            f"service did not come up on releases/{newer.bundle_id}") in cut.stderr
    assert "run the same deploy again to finish it" not in cut.stderr

    again = edgesdk("deploy", tiny_bundle.path, "--to", root, *service, env=env)  # the next deploy works
    assert again.returncode == 0, again.stderr
    assert current_id(root) == tiny_bundle.bundle_id
