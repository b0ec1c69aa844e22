"""Thermal telemetry and report on inputs a board user can have: a ``--out`` format whose writer needs a TeX
system that is not installed, and a telemetry file saved with a byte order mark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.thermal.telemetry import load, records

META = {"type": "meta", "version": 2, "profile": "rpi5", "mode": "board", "guarded": True, "ambient_c": 31.0,
        "label": "fan off", "limits": {"resume_c": 70.0, "soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0,
                                       "shutdown_c": 110.0}}


def step(t: float, temp_c: float) -> dict:
    return {"type": "step", "t": t, "kind": "decode", "tokens": 1, "duration_s": 0.1, "wait_s": 0.0, "tok_s": 10.0,
            "temp_c": temp_c, "zones": {"cpu-thermal": temp_c}, "level": "normal", "budget": 1.0, "sensor_ok": True}


def lines(run: list[dict]) -> str:
    return "".join(json.dumps(record) + "\n" for record in run)


def test_a_meta_record_after_a_byte_order_mark_is_read(tmp_path):
    """A file saved with a BOM (a Windows editor, PowerShell's Set-Content) keeps its meta record: json refused
    the first line, and the run lost its profile, limits and label."""
    path = tmp_path / "run.jsonl"
    path.write_text("\ufeff" + lines([META, step(0.5, 61.0), step(1.0, 61.5)]), encoding="utf-8")
    meta, steps = load(path)
    assert meta["profile"] == "rpi5"
    assert meta["label"] == "fan off"
    assert [s["t"] for s in steps] == [0.5, 1.0]


def test_each_joined_files_byte_order_mark_is_ignored(tmp_path):
    """Files joined by a tool that writes a BOM at each file's start: every run keeps its meta record."""
    second = {**META, "label": "fan on", "ambient_c": 25.0}
    path = tmp_path / "joined.jsonl"
    path.write_text("\ufeff" + lines([META, step(1.0, 60.0)]) + "\ufeff" + lines([second, step(1.0, 55.0)]),
                    encoding="utf-8")
    metas = [record["label"] for record in records(path) if record.get("type") == "meta"]
    assert metas == ["fan off", "fan on"]


def test_report_reads_the_limits_of_a_file_with_a_byte_order_mark(tmp_path):
    pytest.importorskip("matplotlib")
    from edgesdk.thermal.report import _read_runs

    path = tmp_path / "run.jsonl"
    path.write_text("\ufeff" + lines([META, step(1.0, 60.0)]), encoding="utf-8")
    (meta, steps), = _read_runs(path)
    assert meta["limits"]["throttle_c"] == 80.0
    assert len(steps) == 1


def test_pgf_out_without_its_tex_system_is_refused_before_plotting(tmp_path, monkeypatch):
    """matplotlib lists .pgf among the formats it writes, but its pgf backend runs the TeX system (xelatex by
    default) to measure every text: with none on PATH, the report ended in a RuntimeError traceback once the
    whole figure was drawn. It is refused up front, naming the option, the TeX system and the fix."""
    matplotlib = pytest.importorskip("matplotlib")
    from edgesdk.thermal.report import render

    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))  # no TeX system on it
    path = tmp_path / "run.jsonl"
    path.write_text(lines([META, step(1.0, 60.0), step(2.0, 61.0)]), encoding="utf-8")
    out = tmp_path / "run.pgf"
    with matplotlib.rc_context({"pgf.texsystem": "xelatex"}), pytest.raises(EdgeSDKError) as caught:
        render([path], out)
    message = str(caught.value)
    assert str(out) in message
    assert "xelatex" in message
    assert "not on PATH" in message
    assert ".png" in caught.value.fix
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "run.jsonl"]  # no partial file left behind


def test_other_formats_are_still_written_without_a_tex_system(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    from edgesdk.thermal.report import render

    monkeypatch.setenv("PATH", str(tmp_path))
    path = tmp_path / "run.jsonl"
    path.write_text(lines([META, step(1.0, 60.0), step(2.0, 61.0)]), encoding="utf-8")
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        written = render([path], tmp_path / "run.svg")
    assert "fan off" in Path(written).read_text()


@pytest.mark.parametrize(("argument", "value"), [("decode_tok_s", 0.0), ("decode_tok_s", -5.0),
                                                 ("decode_tok_s", float("nan")), ("prefill_tok_s", 0.0),
                                                 ("prefill_tok_s", -1.0), ("minutes", float("inf")),
                                                 ("minutes", 0.0)])
@pytest.mark.timeout(60)  # the refusal is at once; before, these never ended
def test_simulate_refuses_a_rate_or_length_that_never_ends(argument, value):
    """A decode rate of 0 (or a negative or NaN one) made every step take no simulated time: the run never
    reached its horizon and hung, its records filling memory (an infinite ``minutes`` too; a prefill rate of 0
    was silently replaced by the default). Each is refused, naming the argument and its value."""
    from edgesdk.profile import get_profile
    from edgesdk.thermal.plan import simulate

    arguments = {"minutes": 0.5, "decode_tok_s": 35.0, "prefill_tok_s": None, argument: value}
    with pytest.raises(EdgeSDKError) as caught:
        simulate(get_profile("rpi5"), arguments["minutes"], 25.0, False, arguments["decode_tok_s"],
                 prefill_tok_s=arguments["prefill_tok_s"])
    assert f"{argument}={value!r}" in str(caught.value)
    assert "finite number above 0" in str(caught.value)


def test_simulate_takes_numpy_rates():
    import numpy as np

    from edgesdk.profile import get_profile
    from edgesdk.thermal.plan import simulate

    run = simulate(get_profile("rpi5"), np.float32(0.2), 25.0, False, np.float32(35.0))
    assert run.summary.tokens > 0


def test_the_thermal_report_leaves_a_python_caller_s_backend_and_figures_as_they_were(tmp_path):
    """render called matplotlib.use("Agg") and drew with pyplot: a notebook that drew a report lost its backend (its
    later figures no longer showed) and a figure of its own was no longer pyplot's current one."""
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from edgesdk.thermal.report import render

    telemetry = tmp_path / "run.jsonl"
    telemetry.write_text("".join(json.dumps(record) + "\n" for record in [
        {"type": "meta", "version": 2, "profile": "rpi5", "mode": "board", "guarded": True},
        *({"type": "step", "kind": "decode", "tokens": 1, "level": "normal", "t": t, "temp_c": 60.0 + t}
          for t in (0.5, 1.0, 1.5))]), encoding="utf-8")
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        mine = plt.figure()
        shown = plt.get_fignums()
        assert render([telemetry], tmp_path / "report") == tmp_path / "report.png"
        assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == shown
        assert plt.gcf() is mine
    finally:
        plt.close("all")
        matplotlib.use(before)
