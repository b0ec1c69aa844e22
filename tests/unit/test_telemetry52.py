"""A run's --telemetry file is appended to: a serve unit restarted on the same file (systemd after a crash) kept
none of the records of the run that crashed, the ones that show what happened; a line that run left cut is
ended before the new run's first record."""

from __future__ import annotations

import json

from edgesdk.thermal.watch import _open_telemetry


def lines_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_restarted_on_its_telemetry_file_keeps_the_records_of_the_run_before(tmp_path):
    path = tmp_path / "serve.jsonl"
    first = _open_telemetry(str(path), {"run": 1})
    first.step(t=0.0, temp_c=70.0)
    first.close()
    second = _open_telemetry(str(path), {"run": 2})
    second.step(t=0.0, temp_c=60.0)
    second.close()
    records = lines_of(path)
    assert [(r["type"], r.get("run", r.get("temp_c"))) for r in records] == [
        ("meta", 1), ("step", 70.0), ("meta", 2), ("step", 60.0)]


def test_a_line_a_killed_run_left_cut_is_ended_before_the_next_run(tmp_path):
    path = tmp_path / "serve.jsonl"
    first = _open_telemetry(str(path), {"run": 1})
    first.step(t=0.0, temp_c=70.0)
    first.close()
    with open(path, "a") as handle:  # a kill in the middle of a record
        handle.write('{"type":"step","t":1.0,"temp')
    second = _open_telemetry(str(path), {"run": 2})
    second.close()
    lines = path.read_text().splitlines()
    assert lines[2] == '{"type":"step","t":1.0,"temp'
    assert json.loads(lines[3])["run"] == 2  # its own line, readable


def test_load_reads_the_last_run_of_a_file_several_runs_appended_to(tmp_path):
    from edgesdk.thermal.telemetry import load

    path = tmp_path / "run.jsonl"
    for run, temp in ((1, 70.0), (2, 60.0)):
        telemetry = _open_telemetry(str(path), {"run": run})
        telemetry.step(t=0.0, temp_c=temp)
        telemetry.close()
    meta, steps = load(path)
    assert meta["run"] == 2
    assert [step["temp_c"] for step in steps] == [60.0]
