"""``run --stats`` under the thermal guard, and the rate the guard paces at without a sensor.

* The stats line left the guard's waits out: with a zone at 76 °C the status line said "limit 55.1 tok/s" while
  --stats said "decode 1813.88 tok/s", the rate while computing (the telemetry held 2.2 s of waits against 0.045 s
  of compute). It now says the decode rate with the waits in, the waits, and the rate while computing; on a simulated
  board the waits are simulated seconds and the rates the board's.
* With no sensor the guard "paces at a conservative fixed rate" without saying which: it is ``fallback_fraction`` of
  the unpaced token rate.
"""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_run import _pacing, _stats_line
from edgesdk.cli_thermal import no_sensor_note
from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.thermal.guard import Guard, GuardConfig, Limits
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import ThermalHook, open_session
from tests._utils.deploy import bundle_variant
from tests._utils.sysfs import make_zone

PROFILE = get_profile("rpi5")  # hot from 71.5 °C, soft 75 °C, hard 78 °C
ZONE = PROFILE.thermal.zones[0]


@pytest.fixture(scope="module")
def pi_bundle(tiny_bundle, tmp_path_factory):
    return bundle_variant(tiny_bundle.path, tmp_path_factory.mktemp("pi63") / "pi", "stats63", target="rpi5")


def _stats(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("[ort-cpu] prompt"))


def test_run_stats_on_a_hot_board_say_the_guards_waits_and_both_rates(pi_bundle, tmp_path):
    """A zone at 76 °C: the guard paces every decode step to a small share of the unpaced rate."""
    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "76000\n")
    result = CliRunner(env={"EDGESDK_THERMAL_ROOT": str(tmp_path / "thermal")}).invoke(
        main, ["run", str(pi_bundle.path), "--prompt", "Hello", "-n", "16", "--ignore-eos", "--watch-thermal",
               "--stats", "--ignore-target"], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    stats = _stats(result.stderr)
    found = re.search(r"decode ([\d.]+) tok/s with ([\d.]+) (m?s) of thermal pacing \(([\d.]+) tok/s computing; "
                      r"steps after the first\), p95 [\d.]+ ms computing", stats)
    assert found, stats  # before: "decode 1813.88 tok/s (steps after the first), p95 0.43 ms"
    paced, waited, computing = float(found[1]), float(found[2]), float(found[4])
    assert waited > 0
    assert paced < computing
    assert "simulated" not in stats


def test_a_simulated_boards_waits_are_simulated_seconds_and_its_rates_the_boards(runtime):
    """A board at 76 °C whose decode takes 0.1 simulated s a token: the stats give the board's rate with the waits
    (its decode tokens over their simulated compute plus the waits, as the telemetry books them) and while computing
    (10 tok/s), beside this machine's."""
    board = SimulatedBoard.from_profile(PROFILE, 25.0, start_c=76.0,
                                        work=WorkModel(decode_tok_s=10.0, prefill_tok_s=100.0))
    sensor = SimulatedSensor(board, ZONE)
    guard = Guard(Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, ZONE))[0], PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(board, sensor.read, guard, board, telemetry)
    ids = runtime.tokenizer.encode("Hello there")
    _, result = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=12), stop_ids=set(), hook=hook)
    decodes = [r for r in telemetry.records if r["kind"] == "decode"]
    compute, waited = sum(r["duration_s"] for r in decodes), sum(r["wait_s"] for r in decodes)
    assert waited > 0
    pacing = _pacing(result, hook)
    assert pacing is not None
    assert pacing.simulated
    assert pacing.decode_wait_s == pytest.approx(waited, abs=1e-5)
    assert pacing.decode_tok_s == pytest.approx(len(decodes) / (compute + waited), rel=1e-4)
    assert pacing.board_tok_s == pytest.approx(10.0, rel=1e-3)
    line = _stats_line("ort-cpu", result.to_json(), False, pacing)
    assert f"decode {round(pacing.decode_tok_s, 2)} tok/s on the simulated board with {waited:.2f} simulated s of " \
           f"thermal pacing (10.0 tok/s computing there, {result.to_json()['decode_tok_s']} tok/s here; " in line


def test_an_answer_the_guard_never_held_keeps_the_plain_figures(runtime):
    """A cool simulated board: no waits, the stats line as without the guard."""
    board = SimulatedBoard.from_profile(PROFILE, 25.0, start_c=40.0, work=WorkModel(decode_tok_s=10.0))
    sensor = SimulatedSensor(board, ZONE)
    guard = Guard(Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, ZONE))[0], PROFILE.thermal_model)
    hook = ThermalHook(board, sensor.read, guard, board)
    _, result = generate(runtime.backend, runtime.tokenizer.encode("Hi"), SamplingConfig(max_new_tokens=4),
                         stop_ids=set(), hook=hook)
    assert _pacing(result, hook) is None
    line = _stats_line("ort-cpu", result.to_json(), False, None)
    assert "thermal pacing" not in line
    assert f"decode {result.to_json()['decode_tok_s']} tok/s (steps after the first)" in line


def test_without_a_sensor_the_guard_says_the_rate_it_paces_at(tmp_path):
    session = open_session(PROFILE, guard=True, status=False, sysfs_root=str(tmp_path / "none"),
                           config=GuardConfig(fallback_fraction=0.25))
    try:
        note = next(n for n in session.notes if n.startswith("no thermal sensor found"))
    finally:
        session.close()
    assert note.endswith("the guard paces at a conservative fixed rate, 25% of the unpaced token rate")
    assert "would pace at a conservative fixed rate, 50% of the unpaced token rate, and --telemetry" in \
        no_sensor_note(str(tmp_path / "none"))
