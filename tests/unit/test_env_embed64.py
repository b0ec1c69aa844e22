"""``edgesdk env`` as a bug report needs it (CPU clocks and thermal zones; no traceback from a broken ONNX Runtime
install) and ``inspect``'s embeddings line for a bundle whose QDQ graph has no hidden-state output by design."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.envinfo import collect_env, format_env

REPO = Path(__file__).resolve().parents[2]


def test_inspect_says_why_a_qdq_bundle_does_not_embed_and_which_recipes_do(tiny_model_dir, tmp_path):
    """An int8-qdq build is a current build: "built before graphs gave one; rebuild the bundle" sent it back to the
    same recipe. The line names the QDQ graph, the recipe and the recipes that embed, as embed's refusal does."""
    from tests._utils.builds import QDQ_RECIPE, build_tiny_bundle

    bundle = build_tiny_bundle(tmp_path, QDQ_RECIPE, "host", model_dir=tiny_model_dir)
    shown = CliRunner().invoke(main, ["inspect", str(bundle.path)])
    assert shown.exit_code == 0, shown.output
    line = next(line for line in shown.output.splitlines() if line.startswith("embeddings "))
    assert "built before graphs gave one" not in line
    assert line.startswith("embeddings none: the QDQ graph (for TensorRT; recipe tiny-qdq) has no hidden-state output")
    assert "no block-sparse weights for the triton backend" in line
    assert "fused form (default, int8-only, int4, fp32-fused)" in line
    assert "fp32-standard" in line
    refused = CliRunner().invoke(main, ["embed", str(bundle.path), "-p", "the board runs cool"])
    assert refused.exit_code != 0
    assert "no 'hidden_states' output" in refused.output


def test_env_names_an_onnxruntime_that_cannot_list_its_providers(tmp_path):
    """What is left of onnxruntime after one of onnxruntime / onnxruntime-gpu is uninstalled beside the other: a
    package that imports and has no get_available_providers. env ended with an AttributeError's traceback."""
    broken = tmp_path / "site" / "onnxruntime"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    results = {}
    for args in (("env", "--json"), ("env",)):
        results[args] = subprocess.run([sys.executable, "-m", "edgesdk", *args], capture_output=True, text=True,
                                       env=env, cwd=REPO, timeout=300)
        assert results[args].returncode == 0, results[args].stderr
        assert "Traceback" not in results[args].stderr
    info = json.loads(results["env", "--json"].stdout)
    assert info["onnxruntime_providers"] == []
    error = info["onnxruntime_error"]
    assert error.startswith("AttributeError: ")
    assert "get_available_providers" in error
    assert str(broken / "__init__.py") in error
    assert "pip uninstall onnxruntime onnxruntime-gpu" in error
    assert "pip uninstall onnxruntime onnxruntime-gpu" in " ".join(results["env",].stdout.split())


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_env_shows_the_cpu_governor_clocks_and_thermal_zones(tmp_path):
    """A speed or throttling report needs the governor, the clock cap and the temperatures, as bench records them."""
    policy = tmp_path / "sys/devices/system/cpu/cpufreq/policy0"
    for name, value in (("affected_cpus", "0 1 2 3"), ("scaling_governor", "powersave"),
                        ("scaling_cur_freq", "600000"), ("scaling_max_freq", "1500000"),
                        ("cpuinfo_max_freq", "2400000"), ("scaling_driver", "cpufreq-dt")):
        _write(policy / name, value + "\n")
    zones = tmp_path / "sys/class/thermal"
    _write(zones / "thermal_zone0/type", "cpu-thermal\n")
    _write(zones / "thermal_zone0/temp", "61234\n")
    _write(zones / "thermal_zone1/type", "gpu-thermal\n")
    (zones / "thermal_zone1/temp").mkdir()  # a read that fails is no reading, not an error
    info = collect_env(tmp_path)
    assert info["cpufreq"] == {"driver": "cpufreq-dt", "policies": [
        {"policy": "policy0", "cpus": "0 1 2 3", "governor": "powersave", "cur_mhz": 600.0, "max_mhz": 1500.0,
         "hardware_max_mhz": 2400.0}]}
    assert info["thermal_zones"] == {"cpu-thermal": 61.234, "gpu-thermal": None}
    json.dumps(info)
    lines = format_env(info).splitlines()
    at = lines.index("cpu clocks:")
    assert lines[at + 1].split() == ["driver", ":", "cpufreq-dt"]
    assert " ".join(lines[at + 2].split()) == ("policy0 : cpus 0 1 2 3, governor powersave, 600 MHz now, max 1500 MHz "
                                              "(hardware 2400 MHz)")
    at = lines.index("thermal zones:")
    assert " ".join(lines[at + 1].split()) == "cpu-thermal : 61.2 °C"
    assert " ".join(lines[at + 2].split()) == "gpu-thermal : no reading"


def test_env_on_a_machine_without_cpufreq_or_thermal_zones(tmp_path):
    """A container or VM has neither: the keys stay (a script reading --json need not tell a missing key from none)
    and the rows say none."""
    info = collect_env(tmp_path)
    assert (info["cpufreq"], info["thermal_zones"]) == ({"driver": None, "policies": []}, {})
    lines = format_env(info).splitlines()
    assert lines[lines.index("cpu clocks:") + 1].split() == ["cpufreq", ":", "-"]
    assert lines[lines.index("thermal zones:") + 1].split() == ["zones", ":", "-"]
