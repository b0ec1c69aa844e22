"""Evaluation review 50 (edgesdk/evaluate.py, edgesdk/cli_eval.py); each test failed before its fix.

- ``eval --hellaswag --kl-divergence`` (or --winogrande, --multiple-choice) without --reference was told to add
  --reference; with it, to drop --kl-divergence (a perplexity option beside a task). The task's refusal now comes
  first.
- A text too short for its measure was told to "raise --max-chars (0 scores the whole file)" where the whole text had
  been read (--max-chars 0, or a text shorter than --max-chars), a fix that cannot give one more token. The fix offers
  --max-chars only where it cut the text.
- ``eval --last-word`` gave its accuracy without an uncertainty, where lm-evaluation-harness gives acc with its
  acc_stderr (sqrt(p (1 - p) / (n - 1)) for 0/1 scores, the "+/-" llama-perplexity prints beside its Winogrande and
  multiple-choice accuracy): a bundle's and its source's accuracies could not be told apart from noise.
- ``eval --json`` under --method windows did not say the stride, so two runs with different strides (different
  figures) read as the same measure.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgesdk.accuracy import random_subset
from tests.unit.test_cli import assert_ok, invoke

WORDS = ("the river ran past an old mill where farmers brought grain each autumn and the miller kept a ledger of "
         "every sack that crossed his scale").split()


def _paragraph(count: int, last: str) -> str:
    body = [WORDS[i % len(WORDS)] for i in range(count - 1)]
    return " ".join([*body, last]) + " ."


@pytest.mark.parametrize("task", ["--hellaswag", "--winogrande", "--multiple-choice"])
def test_a_task_beside_kl_divergence_is_refused_as_a_perplexity_option_first(tmp_path, task):
    text = tmp_path / "tasks.txt"
    text.write_text("x\n", encoding="utf-8")
    found = invoke("eval", tmp_path / "no-bundle", "--text", text, task, "--kl-divergence")
    assert found.exit_code == 2, found.output
    assert "--kl-divergence" in found.stderr, found.stderr
    assert "applies to perplexity" in found.stderr, found.stderr
    assert "add --reference" not in found.stderr, found.stderr  # --reference then refuses --kl-divergence
    # without a task, --kl-divergence still asks for --reference
    plain = invoke("eval", tmp_path / "no-bundle", "--text", text, "--kl-divergence")
    assert plain.exit_code == 2, plain.output
    assert "add --reference" in plain.stderr, plain.stderr


def _fix(result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip().startswith("fix:")]
    assert lines, result.stderr
    return lines[0]


def test_too_short_a_text_is_told_to_raise_max_chars_only_where_it_cut_the_text(tiny_bundle, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("hello world\n", encoding="utf-8")
    llama = ("--method", "llama-perplexity", "--context", 32)
    for options in (("--max-chars", 0), ()):  # the whole file read: all of it, or shorter than the default 200,000
        fix = _fix(invoke("eval", tiny_bundle.path, "--text", short, *llama, *options))
        assert "--max-chars" not in fix, fix
        assert "pass a longer --text file" in fix, fix
        assert "lower --context" in fix, fix
    one = tmp_path / "one.txt"
    one.write_text("a", encoding="utf-8")
    fix = _fix(invoke("eval", tiny_bundle.path, "--text", one, "--context", 32, "--max-chars", 0))
    assert "--max-chars" not in fix, fix
    assert "pass a longer --text file" in fix, fix
    # where --max-chars cut the text, raising it is the fix
    long = tmp_path / "long.txt"
    long.write_text(" ".join(WORDS * 40) + "\n", encoding="utf-8")
    fix = _fix(invoke("eval", tiny_bundle.path, "--text", long, *llama, "--max-chars", 40))
    assert "raise --max-chars (0 scores the whole file)" in fix, fix
    fix = _fix(invoke("eval", tiny_bundle.path, "--text", long, "--context", 32, "--max-chars", 1))
    assert "raise --max-chars" in fix, fix


def test_the_library_s_fix_follows_whether_max_chars_cut_the_text(runtime):
    from edgesdk.errors import EdgeSDKError
    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, bundle_perplexity

    for max_chars, offered in ((None, False), (0, False), (1000, False), (5, True)):
        config = PerplexityConfig(context=32, max_chars=max_chars, method=LLAMA_PERPLEXITY)
        with pytest.raises(EdgeSDKError) as found:
            bundle_perplexity(runtime, "hello world, once more", config)
        assert ("--max-chars" in found.value.fix) is offered, (max_chars, found.value.fix)


def _oracle(right: set[tuple[int, ...]], vocab: int = 16):
    """``score(window) -> logits`` whose top token is the window's next token for the windows in ``right`` and
    token 0 (no word's) elsewhere: a scorer whose last-word accuracy is known."""

    def score(window: np.ndarray) -> np.ndarray:
        logits = np.zeros((len(window), vocab), np.float32)
        if tuple(int(t) for t in window) in right:
            logits[np.arange(len(window) - 1), window[1:]] = 5.0
        else:
            logits[:, 0] = 5.0
        return logits

    return score


def test_last_word_accuracy_comes_with_its_uncertainty():
    from edgesdk.evaluate import last_word_accuracy

    def encode(text: str) -> list[int]:  # one token a word, 1..15: no word is token 0
        return [1 + sum(map(ord, word)) % 15 for word in text.split()]

    documents = [(" ".join(WORDS[i:i + 40]), word) for i, word in enumerate(["alpha", "bravo", "delta", "omega"])]
    right = {tuple(encode(f"{documents[0][0]} {documents[0][1]}"))}
    result = last_word_accuracy(_oracle(right), encode, documents)
    assert (result.documents, result.accuracy) == (4, 0.25)
    assert result.accuracy_uncertainty == pytest.approx(math.sqrt(0.25 * 0.75 / 3))  # lm-eval's acc_stderr
    assert result.to_json()["accuracy_uncertainty"] == pytest.approx(0.25)
    one = last_word_accuracy(_oracle(right), encode, documents[:1])
    assert one.accuracy == 1.0
    assert one.accuracy_uncertainty is None  # no spread from one document
    assert one.to_json()["accuracy_uncertainty"] is None


def test_eval_last_word_prints_and_returns_the_uncertainty(tiny_bundle, tmp_path):
    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(f" {_paragraph(45, word)}" for word in ("harvest", "ledger", "scale")) + "\n",
                    encoding="utf-8")
    args = ("eval", tiny_bundle.path, "--text", text, "--context", 32, "--last-word")
    found = invoke(*args, "--json")
    assert_ok(found)
    last = json.loads(found.stdout)["last_word"]
    p = last["accuracy"]
    assert last["documents"] == 3
    assert last["accuracy_uncertainty"] == pytest.approx(math.sqrt(p * (1 - p) / 2), abs=1e-6)
    printed = invoke(*args)
    assert_ok(printed)
    line = next(line for line in printed.stdout.splitlines() if line.startswith("last word (bundle)"))
    assert f"accuracy {100 * p:.2f} ± {100 * last['accuracy_uncertainty']:.2f} %" in line, line


def test_eval_json_names_the_stride_of_its_windows(tiny_bundle, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(WORDS * 30) + "\n", encoding="utf-8")
    common = ("eval", tiny_bundle.path, "--text", text, "--context", 32, "--json")
    strided = json.loads(invoke(*common, "--stride", 16).stdout)
    plain = json.loads(invoke(*common).stdout)
    assert (strided["stride"], plain["stride"]) == (16, 32)
    assert strided["bundle"]["perplexity"] != plain["bundle"]["perplexity"]  # the stride changes the figure
    chunks = json.loads(invoke(*common, "--method", "llama-perplexity").stdout)
    assert "stride" not in chunks  # llama-perplexity's chunks have none


def _winogrande_csv(rows: int, end: str) -> str:
    lines = ["index,sentence,option1,option2,answer"]
    lines += [f"{i},The cup {i} fell because _ was heavy.,cup,table,{1 + i % 2}" for i in range(rows)]
    return "\n".join(lines) + end


@pytest.mark.parametrize(("end", "seen"), [("\n", 9), ("", 9), ("\n\n", 10)])
def test_winogrande_tasks_are_drawn_from_the_rows_llama_perplexity_reads(tmp_path, end, seen):
    """--winogrande-tasks N drew from every row, where llama-perplexity draws from the rows it reads: all but a last
    one that no newline ends after its -f drops one trailing newline. The same generator over another count gives
    other tasks, so the N tasks scored were not llama-perplexity's though the help said they were."""
    from edgesdk.accuracy import read_task_file, winogrande_rows_llama_drops

    path = tmp_path / "wino.csv"
    path.write_text(_winogrande_csv(10, end), encoding="utf-8")
    assert 10 - winogrande_rows_llama_drops(path.read_text(encoding="utf-8")) == seen
    every = read_task_file("winogrande", path)
    assert len(every) == 10  # every row is still scored where all are asked for
    drawn = read_task_file("winogrande", path, count=4)
    assert [every.index(task) for task in drawn] == random_subset(seen, 4)
    assert random_subset(9, 4) != random_subset(10, 4)  # so the count drawn from matters
