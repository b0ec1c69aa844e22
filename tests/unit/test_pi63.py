"""A Raspberry Pi 5 user's review: ``thermal report`` without matplotlib names the running interpreter's pip,
a plain-text file given to it is said to be no telemetry file, ``thermal plan`` notes a board that idles too hot
for the guard to do more than trickle, ``--minutes`` help states the step limit, and a bundle's report.md names
the LM head's real precision."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main

META = {"type": "meta", "version": 2, "profile": "rpi5", "mode": "board", "guarded": True, "ambient_c": None,
        "limits": {"resume_c": 70.0, "soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0, "shutdown_c": 110.0}}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


def telemetry(path: Path) -> Path:
    steps = [{"type": "step", "t": 0.5 * (i + 1), "kind": "decode", "tokens": 1, "duration_s": 0.5,
              "temp_c": 60.0 + i, "level": "normal"} for i in range(6)]
    path.write_text("".join(json.dumps(record) + "\n" for record in [META, *steps]))
    return path


def test_report_without_matplotlib_names_this_interpreters_pip(tmp_path, monkeypatch):
    """On a board the runtime is a venv made from the wheel the deploy sent: "pip install 'edgesdk[report]'" asked
    the index for an edgesdk it does not hold. The fix names the interpreter running edgesdk."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError, as where it is absent
    result = invoke("thermal", "report", telemetry(tmp_path / "tel.jsonl"))
    assert result.exit_code == 1, result.output
    assert "thermal report needs matplotlib" in result.stderr
    assert f"fix: {shlex.quote(sys.executable)} -m pip install matplotlib" in result.stderr
    assert "edgesdk[report]" not in result.stderr


def test_report_of_a_plain_text_file_says_it_is_no_telemetry_file(tmp_path):
    """A prompt file read as telemetry said "no step records (with a numeric t and tokens)"; it is now named as no
    telemetry file, with the first line that is not JSON, alone or beside a real telemetry file."""
    pytest.importorskip("matplotlib")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n\nWhat is the capital of France?\nTell me a joke.\n")
    result = invoke("thermal", "report", prompts)
    assert result.exit_code == 1, result.output
    assert (f"{prompts} is not a telemetry file: line 3 ('What is the capital of France?') is not JSON"
            in result.stderr)
    assert "no step records" not in result.stderr
    assert "--telemetry FILE" in result.stderr
    assert not (tmp_path / "prompts.png").exists()

    numbers = tmp_path / "numbers.txt"
    numbers.write_text("42\n")
    result = invoke("thermal", "report", telemetry(tmp_path / "tel.jsonl"), numbers, "-o", tmp_path / "both.png")
    assert result.exit_code == 1, result.output
    assert f"{numbers} is not a telemetry file: line 1 ('42') is JSON but not an object" in result.stderr
    assert not (tmp_path / "both.png").exists()

    torn = tmp_path / "torn.jsonl"  # a run killed in its first record: a telemetry file, with no step records
    torn.write_text('{"type":"step","t":0.5,"ki')
    result = invoke("thermal", "report", torn)
    assert result.exit_code == 1, result.output
    assert f"no step records (with a numeric t and tokens) in {torn}" in result.stderr


def plan_notes(ambient: int) -> list[str]:
    result = invoke("thermal", "plan", "--target", "rpi5", "--decode-tok-s", "35", "--minutes", "5",
                    "--ambient", ambient, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["notes"]


def test_plan_notes_a_board_that_idles_near_its_soft_limit():
    """A bare Pi 5 at 45 °C ambient idles at 71.6 °C, 3.4 °C under its 75 °C soft limit: the guard planned
    1.25 tok/s with no word why (a note came only at 55 °C, where the run ended paused). The note names the idle temperature,
    the soft limit and the fix; at 35 °C (idle 61.6 °C) there is none."""
    notes = [note for note in plan_notes(45) if "idles at" in note]
    assert len(notes) == 1, notes
    note = notes[0]
    assert "at 45 °C ambient the board idles at 71.6 °C" in note
    assert "3.4 °C under the soft limit 75 °C" in note
    assert "trickle" in note
    assert "heatsink and fan" in note
    assert "thermal_model.resistance_c_per_w" in note
    assert "9.5 °C/W now" in note
    assert "lower the ambient below 43.4 °C" in note
    assert "at or above the soft limit 75 °C" in next(note for note in plan_notes(50) if "idles at" in note)
    assert not [note for note in plan_notes(35) if "idles at" in note]


def test_minutes_help_states_the_step_limit_it_gives():
    """--minutes said "at most a day", but the 250,000 simulated steps a run end a plan first above a few tok/s: 133
    minutes at 35 tok/s. The help says so, and its figure is the limit check_plan_size applies."""
    from edgesdk.cli_thermal import check_plan_size, longest_plan_minutes
    from edgesdk.errors import EdgeSDKError
    from edgesdk.thermal.plan import Workload

    result = invoke("thermal", "plan", "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "at most 250,000 simulated steps a run" in text
    assert "(133 at 35 tok/s with the default requests)" in text
    assert f"{longest_plan_minutes(35, Workload(), 140):g}" == "133"
    check_plan_size(133, 35, "given")
    with pytest.raises(EdgeSDKError, match="a plan simulates at most 250,000"):
        check_plan_size(134, 35, "given")


@pytest.mark.parametrize(("recipe", "words"), [
    ("default", "the LM head at INT4, as the export stores it"),
    ("int8-head", "the LM head at INT8, as the export stores it"),
    ("int8-qdq", "the LM head in float32, as the export stores it"),
    ("fp32-fused", "the LM head in float32, as the export stores it"),
])
def test_report_names_the_recipes_head_precision(recipe, words):
    from edgesdk.build.recipes import load_recipe
    from edgesdk.build.report import head_words, markdown

    export = load_recipe(recipe).export
    assert head_words(export) == words
    text = " ".join(markdown([{"stage": "qat", "parameters": 10, "weight_bytes": 5}], None, export=export))
    assert f"(the weights, {words}, and the activations" in text


def test_rpi5_bundle_report_names_its_int4_head(tiny_model_dir, tmp_path):
    """The rpi5 default recipe stores an INT4 head (embedding_bits 4); the bundle's report.md said "an INT8 LM head
    the export stores" of it, as of every bundle."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import CORPUS

    text = tmp_path / "train.txt"
    text.write_text(" ".join(CORPUS * 20), encoding="utf-8")
    bundle = build(BuildConfig(target="rpi5", model=str(tiny_model_dir), out=tmp_path / "rpi5", progress=False,
                               export=ExportConfig(max_context=256), overrides=("qat.steps=1",),
                               data=DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=0)))
    report = " ".join((bundle.path / "report.md").read_text(encoding="utf-8").split())
    assert "(the weights, the LM head at INT4, as the export stores it, and the activations" in report
    assert "INT8 LM head" not in report
