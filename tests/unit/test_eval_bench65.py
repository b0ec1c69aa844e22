"""``edgesdk eval`` and ``bench`` as a llama-bench / llama-perplexity user reads them: --kl-divergence-base FILE
writes over no file it should not (the --text file, a bundle's file, another file); llama-perplexity's running
``[i]ppl`` values, its "Final estimate" and its tasks' final lines, which scripts grep; the --method windows figure
said to be another than llama-perplexity's; one format for the KL headline; bench's list-valued no-op options said to
run once, and -fa's values checked as llama-bench checks them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from edgesdk.cli_eval import _print_perplexity
from tests._utils.tiny import CORPUS
from tests.unit.test_accuracy_files39 import HELLASWAG_TEXT, MC_TASKS, WINOGRANDE_TEXT, multiple_choice_file
from tests.unit.test_cli import assert_error, assert_ok, flat, invoke

SETTINGS = ("--context", 64, "--max-chars", 3000, "-t", 1)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ev65") / "text.txt"
    path.write_text("\n".join(CORPUS * 30), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ 1. --kl-divergence-base FILE


def test_writing_over_the_text_file_is_refused_and_the_text_kept(tiny_bundle, tmp_path, text):
    mine = tmp_path / "text.txt"
    shutil.copy(text, mine)
    before = mine.read_bytes()
    result = invoke("eval", tiny_bundle.path, "--text", mine, *SETTINGS, "--kl-divergence-base", mine)
    assert_error(result, f"--kl-divergence-base {mine} is the --text file", "pass another path")
    assert mine.read_bytes() == before


def test_writing_inside_the_bundle_is_refused_and_the_bundle_still_verifies(tiny_bundle, tmp_path, text):
    bundle = Path(shutil.copytree(tiny_bundle.path, tmp_path / "bundle"))
    tokenizer = bundle / "tokenizer.json"
    before = tokenizer.read_bytes()
    result = invoke("eval", bundle, "--text", text, *SETTINGS, "--kl-divergence-base", tokenizer)
    assert_error(result, "is inside the bundle directory", "pass a path outside the bundle")
    assert tokenizer.read_bytes() == before
    assert_ok(invoke("verify", bundle))
    # a new file inside it too: the bundle's directory takes no file of eval's
    result = invoke("eval", bundle, "--text", text, *SETTINGS, "--kl-divergence-base", bundle / "base.kld")
    assert_error(result, "is inside the bundle directory")
    assert not (bundle / "base.kld").exists()


def test_an_existing_file_that_is_no_base_file_is_refused_by_name(tiny_bundle, tmp_path, text):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n", encoding="utf-8")
    result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence-base", notes)
    assert_error(result, f"--kl-divergence-base {notes} exists", "pass another path, or delete it first")
    assert notes.read_text(encoding="utf-8") == "my notes\n"


def test_an_earlier_base_file_is_written_again(tiny_bundle, tmp_path, text):
    path = tmp_path / "base.kld"
    for _ in range(2):  # the second run replaces the first one's file
        result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence-base", path, "--json")
        assert_ok(result)
        assert json.loads(result.stdout)["kl_divergence_base"]["written"] is True


def test_a_wrong_file_read_suggests_a_new_path_not_the_one_that_failed(tiny_bundle, tmp_path, text):
    """The fix of a refused read is a command to run on the host: with the path that failed (here the text itself)
    it would write over that file."""
    result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence-base", text,
                    "--kl-divergence")
    assert_error(result, f"--kl-divergence-base {text}")
    fix = flat(result.stderr.split("fix:", 1)[1])
    assert f"--kl-divergence-base {text}" not in fix
    assert "--kl-divergence-base base.kld" in fix


# ------------------------------------------------------------------------------ 2. llama-perplexity's lines


def test_llama_perplexity_prints_its_running_values_and_final_estimate(tiny_bundle, text):
    result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--method", "llama-perplexity")
    assert_ok(result)
    found = re.search(r"^Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})$", result.stdout, re.M)
    assert found, result.stdout
    running = re.findall(r"\[(\d+)\](\d+\.\d{4}),", result.stderr)
    assert running
    assert [int(i) for i, _ in running] == list(range(1, len(running) + 1))
    assert running[-1][1] == found.group(1)  # the last running value is the figure
    said = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--method", "llama-perplexity", "--json")
    assert_ok(said)
    bundle = json.loads(said.stdout)["bundle"]
    assert len(bundle["chunk_perplexities"]) == bundle["windows"] == len(running)
    assert bundle["chunk_perplexities"][-1] == pytest.approx(bundle["perplexity"], rel=1e-9)
    assert f"{bundle['perplexity']:.4f}" == found.group(1)
    assert f"{bundle['perplexity_uncertainty']:.5f}" == found.group(2)


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ev65-tasks")
    (root / "hellaswag.txt").write_text(HELLASWAG_TEXT, encoding="utf-8")
    (root / "winogrande.csv").write_text(WINOGRANDE_TEXT, encoding="utf-8")
    (root / "mc.bin").write_bytes(multiple_choice_file(MC_TASKS))
    return root


@pytest.mark.parametrize(("flag", "name", "pattern"), [
    ("--winogrande", "winogrande.csv", r"^Final Winogrande score\((\d+) tasks\): (\d+\.\d{4}) \+/- \S+$"),
    ("--multiple-choice", "mc.bin", r"^Final result: (\d+\.\d{4}) \+/- \S+\nRandom chance: \d+\.\d{4} \+/- \S+$"),
    ("--hellaswag", "hellaswag.txt", r"^(\d+)\t(\d+\.\d{8})%\t\[\d+\.\d{4}%, \d+\.\d{4}%\]$"),
])
def test_each_task_ends_with_llama_perplexity_s_lines(tiny_bundle, task_files, flag, name, pattern):
    said = invoke("eval", tiny_bundle.path, flag, "-f", task_files / name, "-t", 1, "--json")
    assert_ok(said)
    figures = json.loads(said.stdout)["bundle"]
    result = invoke("eval", tiny_bundle.path, flag, "-f", task_files / name, "-t", 1)
    assert_ok(result)
    found = re.search(pattern, result.stdout, re.M)
    assert found, result.stdout
    if flag == "--multiple-choice":
        assert float(found.group(1)) == pytest.approx(100 * figures["accuracy"], abs=1e-4)
    else:
        assert int(found.group(1)) == figures["tasks"]
        assert float(found.group(2)) == pytest.approx(100 * figures["accuracy"], abs=1e-4)


# ------------------------------------------------------------------------------ 3. --method windows said


def test_windows_says_it_is_not_llama_perplexity_s_figure_and_the_cut(tiny_bundle, text):
    result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS)
    assert_ok(result)
    note = flat(result.stderr)
    assert "--method windows" in note
    assert "--method llama-perplexity --max-chars 0" in note
    assert note.count("for llama-perplexity's figure") == 1  # one note
    assert re.search(r"scored the first 3,000 of [\d,]+ characters", result.stdout), result.stdout


# ------------------------------------------------------------------------------ 4. the KL headline


def test_kl_headline_gives_every_kld_figure_one_format(capsys):
    """With a format each (p99 %.4f, max %.3f), a max of 0.00036 read 0.000, below a p99 of 0.0003."""
    figure = {"perplexity": 10.0, "perplexity_uncertainty": 0.1, "tokens_scored": 100, "windows": 2}
    divergence = {"mean_kld": 0.00012, "median_kld": 0.0001, "p99_kld": 0.00034, "max_kld": 0.00036,
                  "same_top_token": 0.99, "tokens_scored": 100, "mean_kld_uncertainty": 0.00001,
                  "ppl_ratio": 1.0, "ppl_ratio_uncertainty": 0.001, "ln_ppl_ratio": 0.0,
                  "ln_ppl_ratio_uncertainty": 0.001, "rms_dp": 0.001, "rms_dp_uncertainty": 0.0001,
                  "same_top_token_uncertainty": 0.001}
    _print_perplexity({"bundle": figure, "reference": figure, "relative_difference": 0.0,
                       "divergence": divergence}, "windows", 64, 100, None)
    headline = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("KL divergence"))
    shown = dict(re.findall(r"(mean|median|p99|max) (\d+\.\d+)", headline))
    assert shown == {"mean": "0.000120", "median": "0.000100", "p99": "0.000340", "max": "0.000360"}


# ------------------------------------------------------------------------------ 5. bench's llama-bench options

BENCH = ("-p", 8, "-n", 0, "-r", 1, "-t", 1, "--no-warmup", "--ignore-target")


@pytest.mark.parametrize("value", ["2", "0,2", "yes"])
def test_bench_refuses_flash_attn_values_llama_bench_refuses(tiny_bundle, value):
    result = invoke("bench", tiny_bundle.path, "-fa", value, *BENCH)
    assert result.exit_code != 0
    assert "does not take" in result.output
    assert "on|off|auto" in result.output


def test_bench_says_a_list_of_a_no_op_option_runs_once_as_one_row(tiny_bundle):
    result = invoke("bench", tiny_bundle.path, "-fa", "0,1", "-ngl", "0,99", "-fa", "auto", *BENCH)
    assert_ok(result)
    notes = flat(result.stderr)
    assert "-fa 0,1 is accepted" in notes
    assert "-ngl 0,99 is accepted" in notes
    assert notes.count("its 2 values run once here, as one row, where llama-bench runs a test for each") == 2
    assert result.stdout.count("| pp8 |") == 1
