"""Evaluation review 57 (edgesdk/evaluate.py, edgesdk/accuracy.py); each test failed before its change.

- ``read_task_file`` took ``--winogrande-tasks 0`` ("all", the CLI's default) for "the rows llama-perplexity reads"
  where those are none: a Winogrande file of one row (llama-perplexity drops a last row no newline ends) gave no
  task, and the run was refused as "no winogrande task to score".
- A window whose logits held +inf (a float16 engine's overflow) gave a perplexity of NaN, where :func:`divergence`
  over the same logits gave its PPL(Q) at the softmax's limit: the two figures of one run disagreed.
- A Winogrande task too long for the model was refused as needing "BOS, context and its longest ending" (packed:
  "each ending's tokens"): a Winogrande task has a sentence and two choices, and BOS only where the model adds one.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.accuracy import WINOGRANDE, TaskTooLong, WinograndeTask, read_task_file, winogrande_score
from edgesdk.evaluate import PerplexityConfig, divergence, perplexity

ONE_ROW = "index,sentence,option1,option2,answer\n0,The cup fell because _ was heavy.,the cup,the table,1\n"


@pytest.mark.parametrize("count", [None, 0, 1, 5])
def test_a_winogrande_file_of_one_row_gives_its_task_for_every_count(tmp_path, count):
    path = tmp_path / "one.csv"
    path.write_text(ONE_ROW, encoding="utf-8")
    tasks = read_task_file(WINOGRANDE, path, count)
    assert [(task.choices, task.answer) for task in tasks] == [(("the cup", "the table"), 1)]


def _bigram(vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(vocab, vocab)).astype(np.float32)  # (V, V): row = last token


@pytest.mark.parametrize("target_overflows", [True, False])
def test_a_window_with_an_overflowed_logit_scores_as_divergence_scores_it(target_overflows):
    table, ids = _bigram(8, 3), [0, 1, 2, 3, 5, 6, 7, 1]
    overflowed = 5 if target_overflows else 4  # ids[4] is 5: the token the overflowed row predicts, or another

    def bundle(window: np.ndarray) -> np.ndarray:
        logits = table[window].copy()  # (T, V)
        logits[3, overflowed] = np.inf
        return logits

    config = PerplexityConfig(context=8)
    with np.errstate(invalid="ignore"):  # the spread of losses holding inf
        ours = perplexity(bundle, ids, config)
        theirs = divergence(bundle, lambda window: table[window], ids, config)
    if target_overflows:  # the token the overflowed row puts all probability on: a loss of 0 there
        assert np.isfinite(ours.perplexity)
        assert ours.perplexity == pytest.approx(theirs.ppl, rel=1e-12)
    else:  # another token: no probability left for it
        assert ours.perplexity == theirs.ppl == np.inf


def test_a_winogrande_task_too_long_is_named_by_its_sentence_not_by_endings():
    task = WinograndeTask("The cup fell because ", " was heavy.", ("the cup", "the table"), 1, "line 2")

    def score(window: np.ndarray) -> np.ndarray:
        return np.zeros((len(window), 128), np.float32)  # (T, V)

    def encode(text: str) -> list[int]:
        return [ord(char) % 128 for char in text]

    with pytest.raises(TaskTooLong) as raised:
        winogrande_score(score, encode, [task], max_tokens=10)
    assert "its sentence with its longer choice" in str(raised.value)
    assert "ending" not in str(raised.value)
    assert "BOS where the model adds one" in str(raised.value)
    with pytest.raises(TaskTooLong) as packed:
        winogrande_score(score, encode, [task], context=10)
    assert "ending" not in packed.value.packed_need()
