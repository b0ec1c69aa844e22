"""Evaluation review 54 (edgesdk/evaluate.py, edgesdk/cli_eval.py); each test failed before its change.

- llama-perplexity's strided perplexity (``--ppl-stride N``, perplexity_v2 in tools/perplexity/perplexity.cpp) was
  refused by ``edgesdk eval``, and the nearest option it named (--method windows --stride N) gives another figure. It
  is now computed as perplexity_v2 computes it: ``(n - n_ctx + N - 1) // N`` windows of n_ctx tokens started N apart,
  each decoded as it is (perplexity_v2 puts BOS in only after the decode), its last N tokens scored; --chunks keeps
  the first windows; a stride the windows cannot score, or one beside --method windows, is refused by name.
- eval's --context help said that 0 takes the bundle's context "as llama.cpp's -c 0 is the model's", and its
  docstring that llama-perplexity's -c 0 is read so: llama-perplexity refuses -c 0 ("perplexity tool requires
  '--ctx-size' > 0"); the help now says so.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, bundle_scorer, divergence, perplexity
from tests.unit.test_cli import flat, invoke

VOCAB, CONTEXT, STRIDE = 11, 12, 5
WORDS = ("the river ran past the old mill where seven ravens sat on a gate and watched the farmers bring in "
         "their autumn wheat").split()


def _scorer(seen: list):
    """Logits (T, VOCAB) that depend on each token and its position in the window, recording each window fed."""
    table = np.random.default_rng(0).normal(size=(VOCAB, VOCAB))

    def score(window: np.ndarray) -> np.ndarray:
        seen.append(window.tolist())
        return table[window] + 0.1 * np.arange(len(window))[:, None] * table[0]

    return score


def _perplexity_v2(score, tokens: list[int], n_ctx: int, stride: int) -> tuple[float, int, int]:
    """perplexity_v2's loop, as llama.cpp writes it: (ppl, tokens scored, windows)."""
    n_chunk = (len(tokens) - n_ctx + stride - 1) // stride
    nll, count = 0.0, 0
    for i in range(n_chunk):
        start = i * stride
        logits = score(np.asarray(tokens[start:start + n_ctx], np.int64))
        for j in range(n_ctx - stride - 1, n_ctx - 1):
            row = logits[j] - logits[j].max()
            nll -= row[tokens[start + j + 1]] - math.log(np.exp(row).sum())
            count += 1
    return math.exp(nll / count), count, n_chunk


@pytest.mark.parametrize("length", [2 * CONTEXT, 2 * CONTEXT + 1, 2 * CONTEXT + STRIDE, 47])
def test_ppl_stride_scores_what_perplexity_v2_scores(length):
    tokens = [int(t) for t in np.random.default_rng(length).integers(1, VOCAB, length)]
    config = PerplexityConfig(context=CONTEXT, method=LLAMA_PERPLEXITY, ppl_stride=STRIDE)
    seen: list = []
    found = perplexity(_scorer(seen), tokens, config, bos_id=0)
    ppl, count, windows = _perplexity_v2(_scorer([]), tokens, CONTEXT, STRIDE)
    assert (found.tokens_scored, found.windows) == (count, windows)
    assert count == windows * STRIDE
    assert found.perplexity == pytest.approx(ppl, rel=1e-12)
    # every window as the text has it: the BOS given is not put in, as perplexity_v2 decodes before it puts it
    assert seen == [tokens[i * STRIDE:i * STRIDE + CONTEXT] for i in range(windows)]


def test_ppl_stride_keeps_the_first_chunks_and_the_divergence_scores_the_same_tokens():
    tokens = [int(t) for t in np.random.default_rng(1).integers(1, VOCAB, 60)]
    config = PerplexityConfig(context=CONTEXT, method=LLAMA_PERPLEXITY, ppl_stride=STRIDE, chunks=3)
    found = perplexity(_scorer([]), tokens, config, bos_id=0)
    assert (found.windows, found.tokens_scored) == (3, 3 * STRIDE)
    first_three = tokens[:CONTEXT + 2 * STRIDE + 1]  # (n - n_ctx + N - 1) // N = 3 windows
    assert found.perplexity == pytest.approx(_perplexity_v2(_scorer([]), first_three, CONTEXT, STRIDE)[0], rel=1e-12)
    same = divergence(_scorer([]), _scorer([]), tokens, config, bos_id=0)
    assert same.tokens_scored == 3 * STRIDE
    assert same.ppl == pytest.approx(found.perplexity, rel=1e-9)


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"ppl_stride": 4}, "pass method 'llama-perplexity'"),
    ({"ppl_stride": CONTEXT, "method": LLAMA_PERPLEXITY}, f"outside 1 .. {CONTEXT - 1}"),
    ({"ppl_stride": 0, "method": LLAMA_PERPLEXITY}, f"outside 1 .. {CONTEXT - 1}")])
def test_a_ppl_stride_the_windows_cannot_score_is_refused(kwargs, said):
    with pytest.raises(ValueError, match=said):
        PerplexityConfig(context=CONTEXT, **kwargs)


@pytest.fixture
def text_file(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(WORDS * 12), encoding="utf-8")
    return text


def test_eval_ppl_stride_prints_llama_perplexity_s_strided_figure(tiny_bundle, text_file):
    from edgesdk.evaluate import _scored_ids
    from edgesdk.runtime.session import open_runtime

    context, stride = 32, 8
    result = invoke("eval", tiny_bundle.path, "--text", text_file, "--method", "llama-perplexity", "--context",
                    context, "--ppl-stride", stride, "--max-chars", 0, "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    runtime = open_runtime(tiny_bundle.path, threads=1)
    config = PerplexityConfig(context=context, max_chars=None, method=LLAMA_PERPLEXITY)
    ids = _scored_ids(runtime, text_file.read_text(encoding="utf-8"), config)
    ppl, count, windows = _perplexity_v2(bundle_scorer(runtime), ids, context, stride)
    assert found["ppl_stride"] == stride
    assert (found["bundle"]["tokens_scored"], found["bundle"]["windows"]) == (count, windows)
    assert found["bundle"]["perplexity"] == pytest.approx(ppl, rel=1e-5)
    text = invoke("eval", tiny_bundle.path, "--text", text_file, "--method", "llama-perplexity", "--context",
                  context, "--ppl-stride", stride, "--max-chars", 0)
    assert f"windows of {context} tokens, {stride} apart" in text.stdout


@pytest.mark.parametrize(("extra", "said"), [
    (("--ppl-stride", 8), "add --method llama-perplexity"),
    (("--method", "llama-perplexity", "--ppl-stride", 32), "outside 1 .. 31"),
    (("--hellaswag", "--ppl-stride", 8), "--hellaswag")])
def test_eval_ppl_stride_is_refused_where_it_cannot_apply(tiny_bundle, text_file, extra, said):
    result = invoke("eval", tiny_bundle.path, "--text", text_file, "--context", 32, *extra)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    message = flat(result.stderr)
    assert "--ppl-stride" in message, message
    assert said in message


def test_eval_help_says_llama_perplexity_refuses_c_0():
    result = invoke("eval", "--help")
    assert result.exit_code == 0
    said = "".join(result.output.split())  # click wraps the help inside "llama-perplexity" too
    assert "llama-perplexityitselfrefuses-c0" in said
