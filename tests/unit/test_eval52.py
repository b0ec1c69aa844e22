"""Evaluation review 52 (edgesdk/accuracy.py, edgesdk/evaluate.py, edgesdk/cli_eval.py); each test failed before its
fix.

- A model whose logits were NaN scored its accuracy tasks as if it had chosen: a NaN score compares false with
  everything, so the pick fell on the first ending (Winogrande: the second choice) and the run reported the share of
  tasks whose answer is that one, 100 % on a file whose answers all are. Such a task is now refused, naming it.
- ``eval --hellaswag -c N`` (--winogrande, --multiple-choice) took a task whose longest sequence fits N, where
  llama-perplexity -c N packs a task's sequences into its context, the prefix they share once and each one's tokens
  past it (``required_tokens``), and stops at a task they do not fit: a run llama-perplexity refuses gave a figure.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.accuracy import (
    HELLASWAG,
    ChoiceTask,
    TaskTooLong,
    WinograndeTask,
    hellaswag_score,
    multiple_choice_score,
    winogrande_score,
)
from edgesdk.errors import EdgeSDKError
from tests.unit.test_cli import flat, invoke

VOCAB = 64


def _encode(text: str) -> list[int]:
    """One token a character: a tokenizer whose counts the tests can read off the text."""
    return [ord(char) % VOCAB for char in text]


def _nan_scorer(window: np.ndarray) -> np.ndarray:
    """A model that gives NaN logits (a float16 engine's overflow) for every position."""
    return np.full((len(window), VOCAB), np.nan, np.float32)


def _choice_tasks(gold: int) -> list[ChoiceTask]:
    return [ChoiceTask(f"Task {i}: a man walks to the", ("store.", "river bank.", "old mill.", "car."),
                       tuple(int(j == gold) for j in range(4)), f"line {6 * i + 1}") for i in range(6)]


@pytest.mark.parametrize("score", [hellaswag_score, multiple_choice_score])
def test_nan_logits_are_refused_not_scored_as_the_first_ending(score):
    with pytest.raises(EdgeSDKError) as caught:
        score(_nan_scorer, _encode, _choice_tasks(gold=0))
    assert "task at line 1" in caught.value.problem
    assert "ending 1 of 4 is NaN" in caught.value.problem
    assert caught.value.fix


def test_nan_logits_are_refused_not_scored_as_the_second_winogrande_choice():
    tasks = [WinograndeTask("The dog chased ", " up the tall tree in the yard.", ("Tom", "Jerry"), 2, f"line {i + 2}")
             for i in range(6)]
    with pytest.raises(EdgeSDKError) as caught:
        winogrande_score(_nan_scorer, _encode, tasks)
    assert "winogrande task at line 2" in caught.value.problem
    assert "choice 1 of 2 is NaN" in caught.value.problem


def test_a_score_of_minus_inf_still_ranks_last():
    """A token of probability 0 (a logit of -inf) is a score, not a broken model: the task is scored."""

    def scorer(window: np.ndarray) -> np.ndarray:
        logits = np.zeros((len(window), VOCAB), np.float32)
        logits[:, ord("s") % VOCAB] = -np.inf  # "store." (ending 1) starts with it: probability 0
        return logits

    result = hellaswag_score(scorer, _encode, _choice_tasks(gold=0))
    assert result.correct == 0
    assert all(scores[0] == -np.inf for scores in result.scores)


def _packed_and_longest(task: ChoiceTask, lead: list[int]) -> tuple[int, int]:
    """(tokens the task takes packed as llama-perplexity packs it, tokens of its longest sequence)."""
    sequences = [lead + _encode(f"{task.context} {ending}") for ending in task.endings]
    prefix = 0
    while all(len(s) > prefix and s[prefix] == sequences[0][prefix] for s in sequences):
        prefix += 1
    return prefix + sum(len(s) - prefix for s in sequences), max(len(s) for s in sequences)


def test_a_task_is_measured_in_the_context_as_llama_perplexity_packs_it():
    task = _choice_tasks(gold=1)[0]
    packed, longest = _packed_and_longest(task, [])
    assert longest < packed  # the endings differ past a shared prefix

    def scorer(window: np.ndarray) -> np.ndarray:
        return np.zeros((len(window), VOCAB), np.float32)

    with pytest.raises(TaskTooLong) as caught:
        hellaswag_score(scorer, _encode, [task], context=packed - 1)
    assert caught.value.packed
    assert (caught.value.longest, caught.value.limit) == (packed, packed - 1)
    assert HELLASWAG in caught.value.problem
    assert f"needs {packed} tokens" in caught.value.problem
    assert hellaswag_score(scorer, _encode, [task], context=packed).tasks == 1  # it fits: scored


def test_eval_c_refuses_a_task_whose_packed_endings_do_not_fit(runtime, tiny_bundle, tmp_path):
    """llama-perplexity --hellaswag -c N stops at a task whose sequences, packed, need more than N tokens, even where
    each fits N alone; eval -c N scored it."""
    from edgesdk.runtime.fim import leading_bos

    context, endings = "Baking cookies: A woman mixes flour and sugar in a bowl. She", (
        "throws the bowl at the wall.", "sings to the dog.", "adds eggs and stirs the dough.", "drives away.")
    path = tmp_path / "hellaswag.txt"
    path.write_text("\n".join([context, "2", *endings]) + "\n", encoding="utf-8")
    bos = leading_bos(runtime.tokenizer)
    sequences = [([] if bos is None else [bos]) + runtime.tokenizer.encode_plain(f"{context} {ending}")
                 for ending in endings]
    prefix = 0
    while all(len(s) > prefix and s[prefix] == sequences[0][prefix] for s in sequences):
        prefix += 1
    packed, longest = prefix + sum(len(s) - prefix for s in sequences), max(len(s) for s in sequences)
    assert longest < packed <= runtime.backend.max_context
    refused = invoke("eval", tiny_bundle.path, "--hellaswag", "-c", longest, "-f", path, "-t", "1")
    assert refused.exit_code == 1, refused.output
    said = flat(refused.stderr)
    assert f"needs {packed} tokens" in said, said
    assert f"more than --context {longest} (llama-perplexity's -c) lets a task have" in said
    assert "Traceback" not in refused.output
    fits = invoke("eval", tiny_bundle.path, "--hellaswag", "-c", packed, "-f", path, "-t", "1", "--json")
    assert fits.exit_code == 0, fits.output
    unset = invoke("eval", tiny_bundle.path, "--hellaswag", "-f", path, "-t", "1", "--json")
    assert unset.exit_code == 0, unset.output  # without -c each ending has the bundle's context
    assert fits.stdout == unset.stdout


def test_eval_c_0_packs_a_task_into_the_bundles_context(runtime, tiny_bundle, tmp_path):
    """-c 0 is the bundle's context, which llama-perplexity -c 0 would pack a task into as it packs -c N; eval
    skipped the packing for 0, so a task that -c <max_context> refused was scored under -c 0."""
    from edgesdk.runtime.fim import leading_bos

    limit, context = runtime.backend.max_context, "A story about four friends. Then"
    bos = leading_bos(runtime.tokenizer)
    for repeat in range(1, 200):
        endings = [" ".join([word] * repeat) + "." for word in ("red", "green", "blue", "gold")]
        sequences = [([] if bos is None else [bos]) + runtime.tokenizer.encode_plain(f"{context} {ending}")
                     for ending in endings]
        prefix = 0
        while all(len(s) > prefix and s[prefix] == sequences[0][prefix] for s in sequences):
            prefix += 1
        packed = prefix + sum(len(s) - prefix for s in sequences)
        if packed > limit:
            break
    assert max(len(s) for s in sequences) <= limit < packed
    path = tmp_path / "hellaswag.txt"
    path.write_text("\n".join([context, "1", *endings]) + "\n", encoding="utf-8")
    for given in (0, limit):
        refused = invoke("eval", tiny_bundle.path, "--hellaswag", "-c", given, "-f", path, "-t", "1")
        assert refused.exit_code == 1, (given, refused.output)
        assert f"needs {packed} tokens" in flat(refused.stderr)
    unset = invoke("eval", tiny_bundle.path, "--hellaswag", "-f", path, "-t", "1", "--json")
    assert unset.exit_code == 0, unset.output  # without -c each ending has the bundle's context
