"""Evaluation review 53 (edgesdk/cli_eval.py, edgesdk/evaluate.py, edgesdk/cli_llama.py, edgesdk/runtime/bench.py);
each test failed before its fix.

- ``edgesdk eval --chunks N`` failed with click's "No such option", where llama-perplexity's --chunks N scores the
  first N chunks of the text (-1: all). It now does, under either method, for the bundle and the divergence alike;
  beside an accuracy task it is refused as the other perplexity options are, and 0 (no chunk) by name.
- ``--ppl-stride N`` (llama-perplexity's strided perplexity) failed with "No such option" and click suggested
  --stride, which measures something else; it is now refused by its own name, with the difference and the nearest
  edgesdk option, in every command that reads llama.cpp's options.
- bench's size label (llama-bench's model_type) read "1e+03M" for 999.5M-1B parameters and "1e+03K" just under 1M:
  the three-digit rounding now carries to the next unit.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.evaluate import PerplexityConfig, bundle_scorer, divergence, perplexity
from edgesdk.runtime.bench import _count_label
from tests.unit.test_cli import flat, invoke

CONTEXT = 32
WORDS = ("the river ran past the old mill where seven ravens sat on a gate and watched the farmers bring in "
         "their autumn wheat").split()


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def text_file(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(WORDS * 12), encoding="utf-8")  # several chunks of 32 tokens and a tail
    return text


def _ids(runtime, text: str, method: str) -> list[int]:
    from edgesdk.evaluate import _scored_ids

    return _scored_ids(runtime, text, PerplexityConfig(context=CONTEXT, max_chars=None, method=method))


@pytest.mark.parametrize("method", ["llama-perplexity", "windows"])
def test_eval_chunks_scores_exactly_the_first_n_chunks(tiny_bundle, runtime, text_file, method):
    ids = _ids(runtime, text_file.read_text(encoding="utf-8"), method)
    assert len(ids) >= 5 * CONTEXT  # more chunks than the two asked for
    result = invoke("eval", tiny_bundle.path, "--text", text_file, "--context", CONTEXT, "--method", method,
                    "--max-chars", 0, "--chunks", 2, "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    # the text cut to two chunks, scored whole: the same tokens, the same figure
    config = PerplexityConfig(context=CONTEXT, max_chars=None, method=method)
    expected = perplexity(bundle_scorer(runtime), ids[:2 * CONTEXT], config)
    assert found["chunks"] == 2
    assert found["bundle"]["windows"] == expected.windows == 2
    assert found["bundle"]["tokens_scored"] == expected.tokens_scored
    assert found["bundle"]["perplexity"] == pytest.approx(expected.perplexity, abs=2e-6)
    # -1, llama-perplexity's default, scores every chunk
    whole = json.loads(invoke("eval", tiny_bundle.path, "--text", text_file, "--context", CONTEXT, "--method", method,
                              "--max-chars", 0, "--chunks", -1, "--json").stdout)
    assert whole["bundle"]["windows"] > 2
    assert "chunks" not in whole


def test_chunks_limit_the_divergence_to_the_same_chunks(runtime, text_file):
    ids = _ids(runtime, text_file.read_text(encoding="utf-8"), "llama-perplexity")
    score = bundle_scorer(runtime)
    config = PerplexityConfig(context=CONTEXT, max_chars=None, method="llama-perplexity")
    limited = divergence(score, score, ids, PerplexityConfig(context=CONTEXT, max_chars=None,
                                                             method="llama-perplexity", chunks=3))
    assert limited.tokens_scored == divergence(score, score, ids[:3 * CONTEXT], config).tokens_scored
    assert limited.tokens_scored == 3 * (CONTEXT - CONTEXT // 2 - 1)


def test_chunks_past_the_text_score_every_chunk_and_the_text_is_still_checked_whole(runtime, text_file):
    ids = _ids(runtime, text_file.read_text(encoding="utf-8"), "llama-perplexity")
    score = bundle_scorer(runtime)
    many = perplexity(score, ids, PerplexityConfig(context=CONTEXT, method="llama-perplexity", chunks=10_000))
    assert many.windows == len(ids) // CONTEXT  # llama-perplexity: min(N, n_chunk_max)
    from edgesdk.errors import EdgeSDKError

    with pytest.raises(EdgeSDKError, match="at least 2 x the context"):  # one chunk asked, 2 x n_ctx still needed
        perplexity(score, ids[:CONTEXT + 5], PerplexityConfig(context=CONTEXT, method="llama-perplexity", chunks=1))


def test_eval_chunks_zero_and_beside_a_task_are_refused_by_name(tiny_bundle, text_file):
    for extra in (("--chunks", 0), ("--hellaswag", "--chunks", 2)):
        result = invoke("eval", tiny_bundle.path, "--text", text_file, "--context", CONTEXT, *extra)
        assert result.exit_code == 2
        assert "Traceback" not in result.output
        said = flat(result.stderr)
        assert "Invalid value for --chunks" in said, said
        assert ("0 scores no chunk" in said and "-1" in said) if extra[0] == "--chunks" else "--hellaswag" in said
    with pytest.raises(ValueError, match="chunks 0"):
        PerplexityConfig(chunks=0)


@pytest.mark.parametrize("spelling", [("--ppl-stride", "256"), ("--ppl-stride=256",), ("--ppl_stride", "256")])
def test_eval_ppl_stride_is_read_in_each_spelling_llama_perplexity_reads(tiny_bundle, text_file, spelling):
    # eval now computes llama-perplexity's strided perplexity (test_eval54.py): beside --method windows it is refused
    # by name, whatever the spelling, never as an option click does not know
    result = invoke("eval", tiny_bundle.path, "--text", text_file, *spelling)
    assert result.exit_code == 2
    said = flat(result.output)
    assert "No such option" not in said
    assert "Did you mean" not in said
    assert "Invalid value for --ppl-stride" in said, said
    assert "add --method llama-perplexity" in said


@pytest.mark.parametrize("command", ["run", "embed", "bench", "serve"])
def test_ppl_stride_is_refused_by_name_in_the_other_llama_commands(tiny_bundle, command):
    result = invoke(command, tiny_bundle.path, "--ppl-stride", "256")
    assert result.exit_code != 0
    said = flat(result.output)
    assert f"llama.cpp's --ppl-stride, which edgesdk {command} does not have" in said, said
    assert "edgesdk eval" in said


def test_eval_ppl_output_type_is_refused_by_name(tiny_bundle, text_file):
    result = invoke("eval", tiny_bundle.path, "--text", text_file, "--ppl-output-type", "1")
    assert "llama.cpp's --ppl-output-type, which edgesdk eval does not have" in flat(result.output)
    assert "--json" in result.output


@pytest.mark.parametrize(("params", "label"), [
    (999, "999"), (1000, "1K"), (999_499, "999K"), (999_500, "1M"), (999_999, "1M"), (134_515_008, "135M"),
    (999_499_999, "999M"), (999_500_000, "1B"), (999_999_999, "1B"), (1_711_376_384, "1.71B"),
    (70_553_706_496, "70.6B")])
def test_count_label_carries_to_the_next_unit(params, label):
    assert _count_label(params) == label
