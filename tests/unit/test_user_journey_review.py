"""The README's commands as a user first tries them: a short run's telemetry report, ``thermal sensors``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgesdk.cli import main


def invoke(*args, env=None):
    return CliRunner(env=env).invoke(main, [str(a) for a in args], prog_name="edgesdk")


def assert_ok(result):
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"


def short_run_telemetry(path: Path) -> Path:
    """What 'edgesdk run --simulate-thermal --telemetry F -n 8' writes: a prefill, 7 decode steps, 0.2 s."""
    meta = {"type": "meta", "version": 1, "profile": "rpi5", "mode": "simulated", "guarded": True,
            "ambient_c": 25.0, "limits": {"soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0}}
    steps = [{"type": "step", "t": round(0.1 + 0.015 * i, 6), "kind": "prefill" if i == 0 else "decode",
              "tokens": 1, "duration_s": 0.015, "wait_s": 0.0, "tok_s": 66.0, "temp_c": 51.6,
              "level": "normal"}
             for i in range(8)]
    path.write_text("".join(json.dumps(record) + "\n" for record in [meta, *steps]))
    return path


def test_report_of_a_short_run_draws_its_rate(tmp_path):
    """A run shorter than two rate bins has one tok/s value; drawn as a line of one point it was invisible,
    and the report's tokens/s panel stayed empty for the README's first telemetry file."""
    pytest.importorskip("matplotlib")
    import matplotlib.image

    out = tmp_path / "short.png"
    assert_ok(invoke("thermal", "report", short_run_telemetry(tmp_path / "short.jsonl"), "-o", out))
    pixels = (matplotlib.image.imread(out)[..., :3] * 255).astype(int)
    height = pixels.shape[0]
    rate_panel = pixels[int(0.70 * height):int(0.93 * height)]  # the bottom panel (tokens / s)
    line_color = np.array([31, 119, 180])  # the first run's colour (matplotlib's C0), as in the panels above
    assert (np.abs(rate_panel - line_color).sum(axis=-1) < 30).any(), "nothing drawn in the tokens/s panel"


def test_thermal_sensors_reads_the_zones_the_guard_reads(tmp_path):
    """'What the guard would read on this machine': with $EDGESDK_THERMAL_ROOT set (a container whose /sys
    is mounted elsewhere) the guard of run and serve reads that tree; 'thermal sensors' read
    /sys/class/thermal whatever it said, and reported no zone where the guard had one."""
    from tests._utils.sysfs import make_zone

    root = tmp_path / "thermal"
    make_zone(root, 0, "cpu-thermal", "51000\n", trips=[("critical", 105000, None)])
    result = invoke("thermal", "sensors", "--target", "rpi5", "--json",
                    env={"EDGESDK_THERMAL_ROOT": str(root)})
    assert_ok(result)
    info = json.loads(result.stdout)
    assert info["reading"]["zones"] == {"cpu-thermal": 51.0}
    assert info["limits"]["shutdown_c"] == 105  # the zone's own critical trip


def test_thermal_sensors_on_a_pi_uses_the_pis_limits(tmp_path, monkeypatch):
    """On a Raspberry Pi 5, 'edgesdk thermal sensors' (no --target) showed the host profile's limits
    (throttle 95 °C) and looked for x86 zone types, where the guard of a Pi's bundle uses rpi5's (80 °C)."""
    import edgesdk.board
    from tests._utils.sysfs import make_zone

    board_root = tmp_path / "pi"
    (board_root / "proc" / "device-tree").mkdir(parents=True)
    (board_root / "proc" / "device-tree" / "model").write_bytes(b"Raspberry Pi 5 Model B Rev 1.0\x00")
    real_detect = edgesdk.board.detect_board
    monkeypatch.setattr(edgesdk.board, "detect_board", lambda root="/": real_detect(board_root))
    thermal = tmp_path / "thermal"
    make_zone(thermal, 0, "cpu-thermal", "51000\n")
    result = invoke("thermal", "sensors", "--root", thermal, "--json")
    assert_ok(result)
    info = json.loads(result.stdout)
    assert info["profile"] == "rpi5"
    assert info["limits"]["throttle_c"] == 80
    text = invoke("thermal", "sensors", "--root", thermal)
    assert_ok(text)
    assert text.stdout.splitlines()[0] == "profile  rpi5"  # which profile's limits these are
    assert "throttle_c 80" in text.stdout



@pytest.mark.parametrize(("name", "magic", "mode"), [
    ("b.tar.gz", b"\x1f\x8b", "r:gz"), ("b.TGZ", b"\x1f\x8b", "r:gz"), ("b.tar.xz", b"\xfd7zXZ", "r:xz"),
    ("b.tar", b"", "r:"),
])
def test_pack_compresses_as_the_archive_name_says(tiny_bundle, tmp_path, name, magic, mode):
    """'edgesdk pack BUNDLE b.tar.gz' wrote a plain tar under that name: 'tar xzf b.tar.gz' on the board
    failed ('not in gzip format'). The archive is now what its name says, and unpacks."""
    import tarfile

    archive = tmp_path / name
    result = invoke("pack", tiny_bundle.path, archive)
    assert_ok(result)
    assert result.stdout.strip() == str(archive)
    assert archive.read_bytes().startswith(magic)
    with tarfile.open(archive, mode) as tar:
        assert f"{tiny_bundle.path.name}/manifest.json" in tar.getnames()
    assert not list(tmp_path.glob("*.partial"))
    unpacked = invoke("unpack", archive, tmp_path / "out")
    assert_ok(unpacked)
    assert unpacked.stdout.strip() == str(tmp_path / "out" / tiny_bundle.path.name)
