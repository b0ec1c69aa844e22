"""Scoring of llama-perplexity's accuracy tasks (edgesdk/accuracy.py) on the tiny bundle and its PyTorch source,
checked against the log-probabilities computed here from the model's own logits by llama.cpp's rules
(hellaswag_score, winogrande_score, multiple_choice_score in tools/perplexity/perplexity.cpp)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesdk.accuracy import (
    HELLASWAG,
    MULTIPLE_CHOICE,
    WINOGRANDE,
    ChoiceTask,
    agreement,
    bundle_accuracy,
    hellaswag_score,
    multiple_choice_score,
    parse_hellaswag,
    parse_winogrande,
    reference_accuracy,
    winogrande_score,
)
from edgesdk.errors import EdgeSDKError
from edgesdk.evaluate import bundle_scorer
from tests.unit.test_accuracy_files39 import HELLASWAG_TEXT

torch = pytest.importorskip("torch")

WINOGRANDE_ROWS = (
    # the blank mid-sentence: more than 3 tokens follow each choice, the words after the blank are scored
    "0,Sarah was a much better surgeon than Maria so _ always got the easier cases.,Sarah,Maria,2\n"
    "1,The fox jumps over the dog because _ is quick.,fox,dog,1\n"
    # the blank at the end: few tokens follow, the choice itself is scored from the common prefix
    "2,The quick brown fox jumps over the lazy _.,dog,cat,1\n"
)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(tiny_model_dir)), progress=False).model.eval()


def _encode(runtime):
    return lambda text: runtime.tokenizer.encode(text, add_special_tokens=False)


def _logprobs(logits: np.ndarray, tokens: list[int]) -> list[float]:
    """log P(tokens[p] | tokens[:p]) for p = 1 .. len - 1, from logits whose row t predicts token t + 1."""
    out = []
    for p in range(1, len(tokens)):
        row = logits[p - 1].astype(np.float64)
        out.append(row[tokens[p]] - row.max() - math.log(np.exp(row - row.max()).sum()))
    return out


def _bundle_logits(runtime, tokens: list[int]) -> np.ndarray:
    runtime.backend.reset()
    return runtime.backend.prefill(np.asarray(tokens, np.int64), keep_logits=len(tokens))


def _torch_logits(model, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()


def _expected_choice(logits_of, encode, tasks, lead=()):
    """Per task: each ending's mean log-probability over its tokens past the prefix all endings share (the first
    predicted from the prefix's last token), and the first best ending."""
    out = []
    for task in tasks:
        sequences = [list(lead) + encode(f"{task.context} {ending}") for ending in task.endings]
        prefix = 0
        while all(len(s) > prefix and s[prefix] == sequences[0][prefix] for s in sequences):
            prefix += 1
        means = [float(np.mean(_logprobs(logits_of(s), s)[prefix - 1:])) for s in sequences]
        out.append((means, means.index(max(means))))
    return out


def _check(result, expected, tasks, kind):
    assert result.task == kind
    assert result.tasks == len(tasks)
    for (means, pick), got_means, got_pick in zip(expected, result.scores, result.picks, strict=True):
        assert got_means == pytest.approx(means, abs=1e-9)
        assert got_pick == pick
    correct = sum(task.labels[pick] == 1 for task, (_, pick) in zip(tasks, expected, strict=True))
    assert result.correct == correct
    assert result.accuracy == correct / len(tasks)


def test_hellaswag_scores_each_ending_by_its_mean_token_logprob(runtime):
    tasks = parse_hellaswag(HELLASWAG_TEXT * 2)
    encode = _encode(runtime)
    result = hellaswag_score(bundle_scorer(runtime), encode, tasks)
    _check(result, _expected_choice(lambda s: _bundle_logits(runtime, s), encode, tasks), tasks, HELLASWAG)
    assert result.random_chance == 0.25
    assert bundle_accuracy(runtime, HELLASWAG, tasks) == result  # the tiny tokenizer adds no BOS


def test_a_bos_leads_every_sequence_where_the_tokenizer_adds_one(runtime):
    tasks = parse_hellaswag(HELLASWAG_TEXT)
    bos = runtime.tokenizer.token_id("<|im_start|>")
    score, seen = bundle_scorer(runtime), []

    def recording(window):
        seen.append(window.copy())
        return score(window)

    result = hellaswag_score(recording, _encode(runtime), tasks, bos_id=bos)
    assert len(seen) == 8
    assert all(window[0] == bos for window in seen)
    expected = _expected_choice(lambda s: _bundle_logits(runtime, s), _encode(runtime), tasks, lead=[bos])
    _check(result, expected, tasks, HELLASWAG)


def test_multiple_choice_scores_like_hellaswag_over_any_number_of_answers(runtime):
    tasks = [ChoiceTask("Which animal is quick?", ("The fox.", "The lazy dog.", "Neither of them."), (1, 0, 0),
                        "task 1"),
             ChoiceTask("Edge boards run", ("small language models.", "large language models."), (0, 1), "task 2")]
    encode = _encode(runtime)
    result = multiple_choice_score(bundle_scorer(runtime), encode, tasks)
    _check(result, _expected_choice(lambda s: _bundle_logits(runtime, s), encode, tasks), tasks, MULTIPLE_CHOICE)
    assert result.random_chance == 2 / 5  # tasks / answers offered


def _expected_winogrande(logits_of, encode, tasks):
    """llama.cpp's winogrande_score, written out: the positions scored in each sequence, their mean log-prob."""
    out = []
    for task in tasks:
        sequences = [encode(task.first + choice + task.second) for choice in task.choices]
        prefix = 0
        while prefix < min(map(len, sequences)) and sequences[0][prefix] == sequences[1][prefix]:
            prefix += 1
        skip_choice = len(sequences[0]) - prefix > 3 and len(sequences[1]) - prefix > 3
        means = []
        for sequence, choice in zip(sequences, task.choices, strict=True):
            start = len(encode(task.first + choice)) if skip_choice else prefix
            end = len(sequence) - (1 if len(sequence) - start > 1 else 0)  # the last token left out
            lp = _logprobs(logits_of(sequence), sequence)  # lp[p - 1] predicts token p
            means.append(float(np.mean(lp[start - 1:end - 1])))
        out.append((means, 0 if means[0] > means[1] else 1, skip_choice))
    return out


def test_winogrande_scores_the_words_after_the_blank_or_the_choice(runtime):
    tasks = parse_winogrande(WINOGRANDE_ROWS)
    encode = _encode(runtime)
    result = winogrande_score(bundle_scorer(runtime), encode, tasks)
    expected = _expected_winogrande(lambda s: _bundle_logits(runtime, s), encode, tasks)
    assert [skip for *_, skip in expected] == [True, True, False]  # both of llama.cpp's cases are exercised
    for (means, pick, _), got_means, got_pick in zip(expected, result.scores, result.picks, strict=True):
        assert got_means == pytest.approx(means, abs=1e-9)
        assert got_pick == pick
    correct = sum(pick + 1 == task.answer for task, (_, pick, _) in zip(tasks, expected, strict=True))
    assert (result.task, result.tasks, result.correct) == (WINOGRANDE, 3, correct)
    assert result.random_chance == 0.5


def test_the_pytorch_reference_scores_the_same_tasks_the_same_way(runtime, model):
    from edgesdk.evaluate import reference_scorer

    encode = _encode(runtime)
    tasks = parse_hellaswag(HELLASWAG_TEXT)
    ours = reference_accuracy(model, runtime, HELLASWAG, tasks)
    _check(ours, _expected_choice(lambda s: _torch_logits(model, s), encode, tasks), tasks, HELLASWAG)
    bundle = bundle_accuracy(runtime, HELLASWAG, tasks)
    assert agreement(ours, bundle) == 1.0  # a float32 bundle picks what its source picks
    for a, b in zip(ours.scores, bundle.scores, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    wino = parse_winogrande(WINOGRANDE_ROWS)
    theirs = winogrande_score(reference_scorer(model), encode, wino)
    expected = _expected_winogrande(lambda s: _torch_logits(model, s), encode, wino)
    assert [m for m, *_ in expected] == [pytest.approx(list(s), abs=1e-9) for s in theirs.scores]
    assert reference_accuracy(model, runtime, WINOGRANDE, wino) == theirs


LONG_CONTEXT = " ".join(["extraordinarily complicated"] * 30)  # past the tiny bundle's max_context of 256


def test_a_task_longer_than_the_bundle_is_refused_before_any_scoring(runtime, model):
    tasks = parse_hellaswag(HELLASWAG_TEXT + f"{LONG_CONTEXT}\n1\na.\nb.\nc.\nd.\n")
    assert len(_encode(runtime)(tasks[-1].context)) > runtime.backend.max_context
    score, calls = bundle_scorer(runtime), []

    def counting(window):
        calls.append(len(window))
        return score(window)

    counting.max_tokens = score.max_tokens
    with pytest.raises(EdgeSDKError, match=r"hellaswag task at line 13 needs \d+ tokens .* more than the 256 the "
                                           r"model takes \(max_context\)") as caught:
        hellaswag_score(counting, _encode(runtime), tasks)
    assert calls == []
    assert "--max-context" in caught.value.fix
    with pytest.raises(EdgeSDKError, match="line 13 needs"):  # the reference refuses what the bundle refuses
        reference_accuracy(model, runtime, HELLASWAG, tasks)
    wino = parse_winogrande(f"0,{LONG_CONTEXT} _ is it.,a,b,1\n")
    with pytest.raises(EdgeSDKError, match="winogrande task at line 1 needs"):
        bundle_accuracy(runtime, WINOGRANDE, wino)


def test_a_task_with_nothing_to_score_is_refused(runtime):
    same = [ChoiceTask("Pick one", ("the same", "the same"), (1, 0), "task 4")]
    with pytest.raises(EdgeSDKError, match=r"task at task 4: ending 1 adds no token past the \d+ all its endings "
                                           "share"):
        multiple_choice_score(bundle_scorer(runtime), _encode(runtime), same)
    with pytest.raises(EdgeSDKError, match="share no first token"):  # no BOS and nothing in common
        multiple_choice_score(bundle_scorer(runtime), lambda text: [ord(text[-1]) % 300], [
            ChoiceTask("Q", ("a", "b"), (1, 0), "task 1")])


def test_the_figures_llama_cpp_prints(runtime):
    tasks = parse_hellaswag(HELLASWAG_TEXT * 3)
    result = hellaswag_score(bundle_scorer(runtime), _encode(runtime), tasks)
    n, p, z = 6, result.accuracy, 1.959963984540054
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)  # the Wilson score interval in its textbook form
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert result.interval == pytest.approx((centre - half, centre + half), abs=1e-9)
    assert result.uncertainty == pytest.approx(math.sqrt(p * (1 - p) / (n - 1)))
    body = result.to_json()
    assert body == {"task": "hellaswag", "tasks": 6, "correct": result.correct, "accuracy": round(p, 6),
                    "accuracy_uncertainty": round(result.uncertainty, 6),
                    "interval_95": [round(v, 6) for v in result.interval], "random_chance": 0.25}
    one = hellaswag_score(bundle_scorer(runtime), _encode(runtime), tasks[:1])
    assert one.uncertainty is None
    assert one.to_json()["accuracy_uncertainty"] is None


def test_the_summary_line_reads_as_llama_perplexitys_final_figure():
    from edgesdk.accuracy import _result

    hellaswag = _result(HELLASWAG, 3, [2, 0, 2, 0], [(0.0,) * 4] * 4, 16)
    low, high = hellaswag.interval
    assert hellaswag.summary() == (f"acc_norm 75.0000 % [{100 * low:.4f} %, {100 * high:.4f} %] "
                                   "(4 tasks, 95 % interval)")
    assert 0.0 < low < 0.75 < high < 1.0
    winogrande = _result(WINOGRANDE, 2, [0, 1, 0, 1], [(0.0, 0.0)] * 4, 8)
    assert winogrande.summary() == f"50.0000 ± {100 * math.sqrt(0.25 / 3):.4f} % (4 tasks)"
    choice = _result(MULTIPLE_CHOICE, 1, [0], [(0.0, 0.0, 0.0)], 3)
    assert choice.summary() == "100.0000 % (1 task, random chance 33.3333 %)"
