"""Accuracy tasks (edgesdk/accuracy.py) on inputs llama-perplexity's task files hold, checked against llama.cpp's
rules (tools/perplexity/perplexity.cpp) computed here from the tiny bundle's own logits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesdk.accuracy import (
    MULTIPLE_CHOICE,
    ChoiceTask,
    multiple_choice_score,
    parse_winogrande,
    winogrande_score,
)
from edgesdk.errors import EdgeSDKError
from edgesdk.evaluate import bundle_scorer

pytest.importorskip("torch")


def _encode(runtime):
    return runtime.tokenizer.encode_plain


def _mean_logprob(runtime, tokens: list[int], start: int) -> float:
    """The mean of log P(tokens[p] | tokens[:p]) for p = start .. len - 1, from the bundle's logits."""
    runtime.backend.reset()
    logits = runtime.backend.prefill(np.asarray(tokens, np.int64), keep_logits=len(tokens)).astype(np.float64)
    values = []
    for p in range(start, len(tokens)):
        row = logits[p - 1]
        values.append(row[tokens[p]] - row.max() - math.log(np.exp(row - row.max()).sum()))
    return float(np.mean(values))


def test_an_answer_whose_tokens_lead_the_others_is_scored_not_refused(runtime):
    # MMLU-style numeric answers: the tiny tokenizer (as SmolLM2's) splits "100" into digits, so "1"'s tokens are
    # the start of "10"'s and "100"'s: every token of the first sequence is shared by all
    encode = _encode(runtime)
    task = ChoiceTask("How many zeros are in a thousand?", ("1", "10", "100"), (0, 0, 1), "task 1")
    sequences = [encode(f"{task.context} {answer}") for answer in task.endings]
    assert all(s[:len(sequences[0])] == sequences[0] for s in sequences)  # the case under test
    result = multiple_choice_score(bundle_scorer(runtime), encode, [task])
    start = len(sequences[0]) - 1  # each answer's tokens from the shortest one's last on
    expected = [_mean_logprob(runtime, s, start) for s in sequences]
    assert result.task == MULTIPLE_CHOICE
    assert result.scores[0] == pytest.approx(expected, abs=1e-9)
    assert result.picks == (expected.index(max(expected)),)
    assert result.random_chance == 1 / 3


def test_a_task_with_nothing_to_choose_between_is_still_refused(runtime):
    encode = _encode(runtime)
    for endings, why in ((("the same", "the same"), "its endings are all the same tokens"),
                         (("only one",), "it has one ending")):
        task = ChoiceTask("Pick one", endings, (1,) + (0,) * (len(endings) - 1), "task 2")
        with pytest.raises(EdgeSDKError, match=f"task at task 2: ending 1 adds no token .*: {why}") as caught:
            multiple_choice_score(bundle_scorer(runtime), encode, [task])
        assert "two endings or more" in caught.value.fix


ROW_2 = "1,The fox jumps over the dog because _ is quick.,fox,dog,1\n"


def test_a_first_row_without_its_answer_is_refused_not_taken_for_a_header():
    # a header is passed over (llama.cpp drops it as a row whose answer does not parse) ...
    header = parse_winogrande("index,sentence,option1,option2,answer\r\n" + ROW_2)
    assert [task.where for task in header] == ["line 2"]
    # ... but a task's row, with its blank, that lost its answer is bad data, named as on any other line
    with pytest.raises(EdgeSDKError, match=r"line 1: the answer \(5th field\) must be 1 or 2, got ''"):
        parse_winogrande("0,Sarah was a better surgeon than Maria so _ got the easier cases.,Sarah,Maria,\n" + ROW_2)


def _counting(runtime):
    score, calls = bundle_scorer(runtime), []

    def counting(window):
        calls.append(len(window))
        return score(window)

    counting.max_tokens = score.max_tokens
    return counting, calls


def test_a_task_with_nothing_to_score_is_refused_before_any_task_is_scored(runtime):
    # llama.cpp's multiple_choice_score prepares (checks) every task before its first batch: a bad task at the end
    # of a long run on a board must not cost the run
    encode = _encode(runtime)
    good = ChoiceTask("Edge boards run", ("small models.", "large models."), (1, 0), "task 1")
    same = ChoiceTask("Pick one", ("the same", "the same"), (1, 0), "task 3")
    counting, calls = _counting(runtime)
    with pytest.raises(EdgeSDKError, match="task at task 3: ending 1 adds no token"):
        multiple_choice_score(counting, encode, [good, good, same])
    assert calls == []
    rows = parse_winogrande("0,The fox jumps over the dog because _ is quick.,fox,dog,1\n"
                            "1,The quick brown fox jumps over the lazy dog and _,the cat,the cat too,2\n")
    counting, calls = _counting(runtime)
    with pytest.raises(EdgeSDKError, match="winogrande task at line 2: a choice leaves no token to score"):
        winogrande_score(counting, encode, rows)
    assert calls == []
