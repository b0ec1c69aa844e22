"""``edgesdk thermal sensors|plan|report``: a file name that is not UTF-8, a machine with no sensor at all, a bundle
whose copy of its profile cannot be read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main

STEPS = [{"type": "step", "t": t, "kind": "decode", "tokens": 1, "duration_s": 0.5, "wait_s": 0.0,
          "level": "normal", "temp_c": 50.0 + t} for t in (1.0, 2.0, 3.0)]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


def write_telemetry(path: Path, meta: dict) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in [{"type": "meta", **meta}, *STEPS]))
    return path


def latin1_named(directory: Path, name: bytes) -> Path:
    """A path under ``directory`` whose last part is the bytes ``name`` (not UTF-8), as Python names it."""
    path = Path(os.fsdecode(os.fsencode(directory) + b"/" + name))
    try:
        path.touch()
    except (OSError, UnicodeError):  # a file system that takes UTF-8 names only (macOS APFS)
        pytest.skip("this file system refuses a file name that is not UTF-8")
    return path


def test_report_of_a_file_whose_name_is_not_utf8_draws_it(tmp_path):
    """A telemetry file named in Latin-1 (``résultat.jsonl`` copied from an older system): its stem, the run's label,
    holds a lone surrogate, which FreeType refused, so the report ended in a TypeError once the figure was drawn."""
    pytest.importorskip("matplotlib")
    telemetry = write_telemetry(latin1_named(tmp_path, b"r\xe9sultat.jsonl"), {"profile": "rpi5"})
    out = tmp_path / "report.png"
    result = invoke("thermal", "report", telemetry, "-o", out)
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert out.read_bytes().startswith(b"\x89PNG")


def test_report_of_a_label_with_a_lone_surrogate_escape_draws_it(tmp_path):
    """A ``\\udce9`` escape in a label (or ``--title``) is valid JSON that decodes to a lone surrogate."""
    pytest.importorskip("matplotlib")
    from edgesdk.thermal.report import render

    telemetry = write_telemetry(tmp_path / "run.jsonl", {"profile": "rpi5", "label": "caf\udce9"})
    out = render([telemetry], tmp_path / "run.png", title="board \ud800 $x$")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_report_refuses_to_draw_over_a_telemetry_file_it_reads(tmp_path):
    """A telemetry file named ``run.png`` is its own default ``--out``: the figure replaced the records."""
    pytest.importorskip("matplotlib")
    telemetry = write_telemetry(tmp_path / "run.png", {"profile": "rpi5"})
    before = telemetry.read_bytes()
    for args in ((), ("-o", telemetry)):
        result = invoke("thermal", "report", telemetry, *args)
        assert result.exit_code != 0
        assert f"--out {telemetry} is the telemetry file" in result.output
        assert "run-report.png" in result.output
        assert telemetry.read_bytes() == before


@pytest.mark.parametrize(("state", "make"), [("does not exist", lambda root: None),
                                             ("holds no thermal zone", lambda root: root.mkdir())])
def test_sensors_with_no_sensor_at_all_says_what_the_guard_does_and_where_to_look(tmp_path, state, make):
    """"no thermal zones under ROOT" alone: a mistyped --root read as a board without sensors, and nothing said that
    the guard of run / serve then paces at a fixed rate."""
    if shutil.which("vcgencmd"):
        pytest.skip("vcgencmd is a sensor here")
    root = tmp_path / "thermal"
    make(root)
    result = invoke("thermal", "sensors", "--target", "rpi5", "--root", root, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["sensor"] is None
    note = next((n for n in info["notes"] if n.startswith("no thermal sensor found")), None)
    assert note is not None, info["notes"]
    assert f"{root} {state}" in note
    assert "fixed rate" in note
    assert "--root DIR or set EDGESDK_THERMAL_ROOT=DIR" in note
    text = invoke("thermal", "sensors", "--target", "rpi5", "--root", root)
    assert "note     no thermal sensor found" in text.stdout


def test_sensors_with_a_zone_adds_no_such_note(tmp_path):
    from tests._utils.sysfs import make_zone

    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "45000\n")
    result = invoke("thermal", "sensors", "--target", "rpi5", "--root", tmp_path / "thermal", "--json")
    assert result.exit_code == 0, result.output
    assert not any(n.startswith("no thermal sensor found") for n in json.loads(result.stdout)["notes"])


def rewrite_manifest(bundle: Path, edit) -> None:
    """Edit the bundle's manifest and write its digest again (a manifest edited by hand, or written by an edgesdk
    whose profile schema differed)."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True)
    (bundle / "manifest.json").write_text(text)
    (bundle / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")


def test_plan_of_a_bundle_whose_profile_copy_is_unreadable_offers_target(tiny_bundle, tmp_path):
    """The refusal's fix was run's ("... or leave the thermal guard off"), which a plan does not have; --target plans
    the same bundle on a shipped board."""
    bundle = Path(shutil.copytree(tiny_bundle.path, tmp_path / "bundle"))
    rewrite_manifest(bundle, lambda manifest: manifest["target"].pop("thermal"))
    result = invoke("thermal", "plan", bundle, "--minutes", "0.05")
    assert result.exit_code == 5, result.output
    assert "thermal: Field required" in result.output
    assert f"fix: pass the board to plan for, e.g. edgesdk thermal plan {bundle} --target rpi5" in result.output
    assert "leave the thermal guard off" not in result.output
    planned = invoke("thermal", "plan", bundle, "--target", "rpi5", "--minutes", "0.05", "--json")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["profile"] == "rpi5"


def test_render_of_a_missing_telemetry_file_beside_an_existing_out_names_the_file(tmp_path):
    """render() from Python, a telemetry path that does not exist and an --out that does: the overwrite check raised a
    bare FileNotFoundError from samefile instead of the report's own error naming the file."""
    pytest.importorskip("matplotlib")
    from edgesdk.errors import EdgeSDKError
    from edgesdk.thermal.report import render

    out = tmp_path / "report.png"
    out.write_bytes(b"")
    with pytest.raises(EdgeSDKError) as refused:
        render([tmp_path / "missing.jsonl"], out)
    assert "missing.jsonl" in str(refused.value)
