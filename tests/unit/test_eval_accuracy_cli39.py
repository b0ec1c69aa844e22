"""`edgesdk eval --hellaswag / --winogrande / --multiple-choice`: llama-perplexity's accuracy tasks from the command
line, on the tiny bundle, with the same figures as edgesdk.accuracy computes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from tests.unit.test_accuracy_files39 import HELLASWAG_TEXT, MC_TASKS, WINOGRANDE_TEXT, multiple_choice_file


def run_eval(*args) -> tuple[int, str]:
    """The exit code and stdout of ``edgesdk eval ARGS`` (stderr, with the progress bars, apart), or for a usage
    error its message."""
    result = CliRunner().invoke(main, ["eval", *map(str, args)], prog_name="edgesdk")
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    (root / "hellaswag.txt").write_text(HELLASWAG_TEXT, encoding="utf-8")
    (root / "winogrande.csv").write_text(WINOGRANDE_TEXT, encoding="utf-8")
    (root / "mc.bin").write_bytes(multiple_choice_file(MC_TASKS))
    return root


@pytest.mark.parametrize(("flag", "name", "kind"), [("--hellaswag", "hellaswag.txt", "hellaswag"),
                                                    ("--winogrande", "winogrande.csv", "winogrande"),
                                                    ("--multiple-choice", "mc.bin", "multiple-choice")])
def test_each_task_scores_its_file_as_edgesdk_accuracy_does(tiny_bundle, task_files, flag, name, kind):
    from edgesdk.accuracy import bundle_accuracy, read_task_file
    from edgesdk.runtime.session import open_runtime

    code, output = run_eval(tiny_bundle.path, flag, "-f", task_files / name, "--json", "-t", "1")
    assert code == 0, output
    result = json.loads(output)
    expected = bundle_accuracy(open_runtime(tiny_bundle.path, threads=1), kind,
                               read_task_file(kind, task_files / name, None))
    assert result == {"task": kind, "bundle": expected.to_json(), "backend": "ort-cpu", "backend_reasons": {}}
    code, output = run_eval(tiny_bundle.path, flag, "--text", task_files / name, "-t", "1")
    assert code == 0, output
    assert output.startswith(f"{kind} (bundle)")
    assert expected.summary() in output


def test_task_options_are_refused_where_they_do_nothing(tiny_bundle, task_files):
    hellaswag = task_files / "hellaswag.txt"
    code, output = run_eval(tiny_bundle.path, "--hellaswag", "--winogrande", "-f", hellaswag)
    assert code == 2
    assert "--winogrande" in output
    assert "one task file a run" in output
    code, output = run_eval(tiny_bundle.path, "--winogrande-tasks", "3", "-f", hellaswag)
    assert code == 2
    assert "add --winogrande" in output
    # --context is not refused beside a task: it is llama-perplexity's -c there too (tests/unit/test_cli2_51.py)
    code, output = run_eval(tiny_bundle.path, "--hellaswag", "--stride", "64", "-f", hellaswag)
    assert code == 2
    assert "--stride" in output
    assert "applies to perplexity" in output


def test_a_malformed_task_file_is_named_before_the_bundle_loads(tmp_path, task_files):
    broken = tmp_path / "broken.txt"
    broken.write_text("a context\nonly one line\n", encoding="utf-8")
    code, output = run_eval(tmp_path / "no-bundle", "--hellaswag", "-f", broken)
    assert code != 0
    assert str(broken) in output
    assert "no-bundle" not in output
