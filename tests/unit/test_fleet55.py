"""Defects of the fleet / service / releases area: the unit deploy --service writes, its restarts, and the
fleet's summary."""

from __future__ import annotations

import configparser
import json
import os
import sys
from pathlib import Path

from edgesdk.deploy import board_service, fleet
from tests._utils import fake_systemd
from tests._utils.sshd import free_port

REPO = Path(__file__).resolve().parents[2]

# systemctl as systemd answers once the unit hit its start limit: every start is refused ("Start request repeated
# too quickly") until reset-failed clears the counter (systemd.unit(5) "StartLimitIntervalSec="). The rest is
# tests/_utils/fake_systemd.py.
START_LIMITED = """#!{python}
import os, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests._utils.fake_systemd import main
hit = Path(os.environ["FAKE_SYSTEMD_STATE"]) / "start-limit-hit"
args = [a for a in sys.argv[1:] if a != "--user"]
if args[:1] == ["reset-failed"]:
    hit.unlink(missing_ok=True)
    sys.exit(0)
if args[:1] in (["restart"], ["start"]) and hit.exists():
    print("Job for edgesdk-serve.service failed. See 'systemctl status edgesdk-serve.service' for details.",
          file=sys.stderr)
    sys.exit(1)
sys.exit(main("systemctl", sys.argv[1:]))
"""


def _unit_sections(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(text)
    return parser


def test_the_unit_stops_restarting_a_server_that_keeps_exiting():
    """Restart=on-failure with RestartSec=5 and systemd's default start limit (5 starts in 10 s) restarted a broken
    bundle's server every 5 s for ever: the limit never trips. The unit sets a start limit that does trip, in
    [Unit], where systemd reads it."""
    unit = _unit_sections(board_service.render_unit(["/usr/bin/edgesdk", "serve", "/srv/current"], "system"))
    interval = int(unit["Unit"]["StartLimitIntervalSec"])
    burst = int(unit["Unit"]["StartLimitBurst"])
    restart_sec = int(unit["Service"]["RestartSec"])
    assert unit["Service"]["Restart"] == "always"
    assert burst * restart_sec < interval  # a server that exits at once is started `burst` times, then left failed
    assert "StartLimitIntervalSec" not in unit["Service"]


def test_a_restart_clears_the_start_limit_a_broken_release_left(tmp_path, monkeypatch):
    """Once a broken release's server hit the unit's start limit, systemd refuses every start until reset-failed:
    the rollback's (or the next deploy's) restart of the unit failed though the release it serves now is sound."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    for name, value in fake_systemd.install(bin_dir, state).items():
        monkeypatch.setenv(name, value)
    (bin_dir / "systemctl").write_text(START_LIMITED.format(python=sys.executable, repo=str(REPO)))
    monkeypatch.setenv("EDGESDK_UNIT_DIR", str(tmp_path / "units"))
    root = tmp_path / "root"
    (root / "site").mkdir(parents=True)
    (root / "site" / "health").write_text("ok\n")
    os.symlink("site", root / "current")
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    # a server of current that answers 200 on /health: http.server serving current's files
    argv = [sys.executable, "-m", "http.server", "--directory", str(root / "current"), "--bind", "127.0.0.1",
            str(port)]
    try:
        installed = board_service.op_service({"root": str(root), "action": "install", "argv": argv,
                                              "health_url": url, "timeout_s": 60, "token": "t1", "fix": "fix"})
        assert installed["restarted"]
        fake_systemd.stop_all(state)  # the server kept exiting: systemd gave up on it
        (state / "start-limit-hit").touch()

        restarted = board_service.op_service({"root": str(root), "action": "restart", "argv": [], "timeout_s": 60,
                                              "during": "rollback", "fix": "fix"})
        assert restarted["restarted"], restarted
        assert board_service.healthy(url)
        assert json.loads((root / "service.json").read_text())["health_url"] == url
    finally:
        fake_systemd.stop_all(state)


def _fail_at(stage: str | None, **progress_keys):
    """A board's work that records its progress as orchestrate.deploy (``bundle_id``) or releases.rollback
    (``target``) does, up to ``stage``, and then fails as they do."""
    from edgesdk.deploy.transport import DeployError

    def work(board, report, progress):
        progress.update(where=board.host, current="r0", **progress_keys)
        if stage is not None:
            progress["stage"] = stage
        raise DeployError(f"{board.host}: the service did not come up", "fix what the journal shows")

    return work


def _release_after(work) -> tuple[str | None, list[str]]:
    outcomes, _ = fleet.run_fleet([fleet.FleetBoard(host="pi@b1", label="pi@b1")], work, lambda b: None,
                                  fleet.Console(write=lambda line: None), jobs=1)
    assert outcomes[0].state == fleet.FAILED
    return outcomes[0].release, fleet.summary("deploy", outcomes, 1.0)


def test_the_summary_names_the_release_a_failed_deploy_switched_back_to():
    """A deploy whose service did not come up switches current back: the board serves r0 again, and the summary
    said "-" (not known) for it, so a fleet's summary did not show that the failed boards kept the old bundle."""
    release, lines = _release_after(_fail_at("service switched back", bundle_id="r1"))
    assert release == "r0"
    assert lines[-1].split()[:3] == ["pi@b1", "failed", "r0"]
    assert _release_after(_fail_at("switched back", bundle_id="r1"))[0] == "r0"


def test_the_summary_names_the_release_a_failed_rollback_switched_to():
    """A rollback whose restart of the unit failed after the switch leaves current on the release rolled back to
    (releases.restart_service: "current was rolled back, but the service is not serving it")."""
    assert _release_after(_fail_at("switched", target="r-1"))[0] == "r-1"


def test_the_summary_does_not_guess_where_a_switch_may_or_may_not_have_happened():
    assert _release_after(_fail_at("switch", target="r-1"))[0] is None
    assert _release_after(_fail_at("service switch back", bundle_id="r1"))[0] is None
    assert _release_after(_fail_at(None, bundle_id="r1"))[0] == "r0"  # nothing switched: where it was


def test_the_summary_of_a_board_whose_error_has_no_text_is_written():
    """An exception with no message is the empty problem text: the summary took its first line and raised
    IndexError, so the fleet's whole summary was lost."""
    board = fleet.FleetBoard(host="pi@b1", label="pi@b1")
    lines = fleet.summary("deploy", [fleet.Outcome(board, state=fleet.FAILED, problem=""),
                                     fleet.Outcome(board, state=fleet.INTERRUPTED, problem="\ncut\n")], 1.0)
    assert lines[0].startswith("deploy of 2 boards: 0 of 2 boards ok, 1 failed, 1 interrupted")
    assert fleet.first_line("cut\nmore") == "cut"
    assert fleet.first_line(None) == ""
