"""The power-gated bundle on the command line: eval's --budgets refused by the bad entry, the curve's thresholds
told apart, inspect's power lines, run's help and its [power] line with gating off, the compute budget in the
thermal report and the per-stage perplexity axis of report.png."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from edgesdk.cli import main  # noqa: E402
from tests._utils.tiny import CORPUS  # noqa: E402
from tests.unit.test_lean_import import assert_ok, run_blocked  # noqa: E402


@pytest.fixture(scope="module")
def power_bundle(tiny_model_dir, tmp_path_factory):
    """A power-gated bundle built through the ``power`` recipe, as tests/unit/test_power_export.py builds one."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from tests.unit.test_power_export import TINY_POWER

    text = tmp_path_factory.mktemp("text") / "train.txt"
    text.write_text(" ".join(CORPUS), encoding="utf-8")
    return build(BuildConfig(target="rpi5", model=str(tiny_model_dir), out=tmp_path_factory.mktemp("b") / "power",
                             recipe="power", progress=False, export=ExportConfig(max_context=256),
                             overrides=TINY_POWER,
                             data=DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=0)))


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("\n".join(CORPUS), encoding="utf-8")
    return path


def _eval(bundle: Path, text: Path, budgets: str, *extra: str):
    return CliRunner().invoke(main, ["eval", str(bundle), "--text", str(text), "--context", "64", "--stride", "64",
                                     "--ignore-target", "--budgets", budgets, *extra])


def _one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("budgets", "expected"), [
    ("1.5", ["'1.5' is outside (0, 1]", "largest mean fraction of FFN blocks", "e.g. --budgets 1.0,0.8,0.6"]),
    ("1,0.8,1.5", ["entry 3 ('1.5') of '1,0.8,1.5' is outside (0, 1]", "e.g. --budgets 1.0,0.8,0.6"]),
    ("", ["holds no compute budget (got '')", "one or more comma-separated numbers in (0, 1]"]),
    ("0.5,banana", ["entry 2 ('banana') of '0.5,banana' is not a number", "comma-separated numbers"]),
], ids=["one-out-of-range", "third-of-three", "empty", "not-a-number"])
def test_a_bad_budget_is_named_by_its_entry_with_the_range_and_a_fix(power_bundle, text_file, budgets, expected):
    result = _eval(power_bundle.path, text_file, budgets)
    assert result.exit_code == 2, result.output
    message = _one_line(result.stderr)
    for part in expected:
        assert part in message, message


def test_the_budget_curve_prints_thresholds_that_tell_its_points_apart(power_bundle, text_file, capsys):
    from edgesdk.cli_eval import _print_perplexity

    budgets = "1,0.8,0.6,0.59"
    found = _eval(power_bundle.path, text_file, budgets, "--json")
    assert found.exit_code == 0, found.output
    result = json.loads(found.stdout)
    shown = _eval(power_bundle.path, text_file, budgets)
    assert shown.exit_code == 0, shown.output
    printed = re.findall(r"budget \S+ +tau (\S+)", shown.stdout)
    taus = [point["tau"] for point in result["power"]["curve"]]
    assert len(printed) == len(taus)
    assert len(set(printed)) == len(set(taus))  # two thresholds --json tells apart are printed apart
    # the review's two points, 3e-4 apart, on the real result: both read 0.619 at three decimals
    result["power"]["curve"][1]["tau"], result["power"]["curve"][2]["tau"] = 0.61909, 0.61941
    _print_perplexity(result, "windows", 64, 1000, None)
    text = capsys.readouterr().out
    printed = re.findall(r"budget \S+ +tau (\S+)", text)
    assert printed[1] != printed[2], text
    assert float(printed[1]) == pytest.approx(0.61909, abs=6e-5)
    assert float(printed[2]) == pytest.approx(0.61941, abs=6e-5)


def test_inspect_shows_the_power_gates_and_that_they_are_off_by_default(power_bundle):
    manifest = power_bundle.manifest
    power = manifest["graph"]["power"]
    heldout = next(s for s in manifest["stages"] if s["stage"] == "power")["metrics"]["heldout"]
    result = CliRunner().invoke(main, ["inspect", str(power_bundle.path)])
    assert result.exit_code == 0, result.output
    text = _one_line(result.stdout)
    assert f"entropy target {power['entropy_target']:g} nats per window of {power['window']} tokens" in text
    assert f"trained at tau {power['tau_init']:g}" in text
    assert "off unless a run turns them on (run --gating)" in text
    assert f"held-out perplexity {heldout['at_tau_train']['perplexity']:.3f} gated" in text
    assert f"vs {heldout['gating_off']['perplexity']:.3f} gating off" in text


def test_run_help_names_the_guards_budget_drop_and_the_entropy_targets_range():
    from edgesdk.power.distribution import FLOOR, WINDOW, least_entropy

    result = CliRunner().invoke(main, ["run", "--help"])
    assert result.exit_code == 0, result.output
    text = _one_line(result.stdout)
    watch = text[text.index("--watch-thermal Thermal guard"):text.index("--simulate-thermal")]
    assert "compute budget" in watch
    assert "--gating" in watch
    target = text[text.index("--entropy-target FLOAT"):text.index("--compute-budget FLOAT")]
    assert f"({least_entropy(WINDOW, FLOOR):.3f}, {math.log(WINDOW):.3f})" in target  # as the refusal says it


def test_the_power_line_with_gating_off_claims_no_target_or_budget(power_bundle, tmp_path):
    proc = run_blocked("run", power_bundle.path, "--prompt", "hello there", "-n", 8, "--stats", "--raw",
                       "--ignore-target", cwd=tmp_path)
    assert_ok(proc)
    line = next(line for line in proc.stderr.splitlines() if line.startswith("[power]"))
    assert "gating off" in line
    assert "every FFN block runs" in line
    assert "--gating" in line
    assert "target" not in line, line
    assert "compute budget" not in line, line


def _svg_texts(render, path: Path) -> list[str]:
    """The texts of a figure written as SVG with its text kept as text (matplotlib's svg.fonttype 'none')."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        render(path)
    return re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text(encoding="utf-8"))


def test_the_thermal_report_draws_the_compute_budget_of_a_gated_run(power_bundle, tmp_path):
    from edgesdk.thermal.report import render

    common = ("--prompt", "hello there", "-n", 12, "--raw", "--ignore-target", "--simulate-thermal")
    gated, plain = tmp_path / "gated.jsonl", tmp_path / "plain.jsonl"
    assert_ok(run_blocked("run", power_bundle.path, *common, "--gating", "--compute-budget", 0.7,
                          "--telemetry", gated, cwd=tmp_path))
    assert_ok(run_blocked("run", power_bundle.path, *common, "--telemetry", plain, cwd=tmp_path))
    budgets = {json.loads(line).get("budget") for line in gated.read_text().splitlines() if '"step"' in line}
    assert budgets == {0.7}
    assert "compute budget" in _svg_texts(lambda out: render([gated], out), tmp_path / "gated.svg")
    # every record's budget 1 (gating off): no panel of it
    assert "compute budget" not in _svg_texts(lambda out: render([plain], out), tmp_path / "plain.svg")


def test_report_png_perplexity_axis_has_no_offset_and_a_sensible_span(power_bundle, tmp_path):
    from edgesdk.build.report import plot, stage_rows

    manifest = power_bundle.manifest
    rows = stage_rows(manifest["baseline"], manifest["stages"])
    ppl = [row["heldout_perplexity"] for row in rows]
    assert len(ppl) == 2
    assert abs(ppl[0] - ppl[1]) < 1e-3 * ppl[0]
    texts = _svg_texts(lambda out: plot(rows, out), tmp_path / "report.svg")
    assert not [t for t in texts if t.startswith("+") or re.search(r"\de[+-]?\d", t)], texts  # no offset text
    end = len(texts) - 1 - texts[::-1].index("held-out perplexity")  # the twin axis's label follows its ticks
    ticks = []
    for label in reversed(texts[:end]):
        try:
            ticks.append(float(label.replace("\N{MINUS SIGN}", "-")))
        except ValueError:
            break
    assert min(ticks) <= min(ppl)
    assert max(ppl) <= max(ticks)
    assert max(ticks) - min(ticks) >= 0.04 * max(ppl)  # a 1e-4 difference drawn flat, not as a steep line
