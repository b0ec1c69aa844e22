"""llama.cpp's environment variables for ``embed`` and ``eval`` (common/arg.cpp reads each option's ``set_env``
variable for every tool that has the option: llama-embedding and llama-perplexity read LLAMA_ARG_THREADS,
LLAMA_ARG_MODEL, LLAMA_ARG_CTX_SIZE, llama-embedding LLAMA_ARG_POOLING too), serve's LLAMA_ARG_CTX_SIZE checked as
its ``-c``, and the sampler names llama.cpp does not know left out of run's and serve's chain with a warning, as
common/sampling.cpp's ``common_sampler_types_from_names`` / ``..._from_chars`` leave them out."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_cli import invoke

pytest.importorskip("torch")

TEXT = "The quick brown fox jumps over the lazy dog. " * 60


def _embed(*args, env=None):
    result = invoke("embed", *args, "-p", "hello world", "--embd-output-format", "raw", env=env or {})
    assert result.exit_code == 0, result.output
    return result


# --- embed -----------------------------------------------------------------------------------------------------


def test_embed_reads_llama_embedding_s_environment(tiny_bundle):
    """LLAMA_ARG_MODEL is the BUNDLE, LLAMA_ARG_POOLING the pooling, LLAMA_ARG_THREADS the threads: they were
    ignored silently (the default pooling's vectors, 'Missing argument BUNDLE')."""
    by_option = _embed(tiny_bundle.path, "--pooling", "cls", "-t", "1")
    default = _embed(tiny_bundle.path, "-t", "1")
    assert by_option.stdout != default.stdout  # the pooling shows in the vectors
    by_env = _embed(env={"LLAMA_ARG_MODEL": str(tiny_bundle.path), "LLAMA_ARG_POOLING": "cls",
                         "LLAMA_ARG_THREADS": "1"})
    assert by_env.stdout == by_option.stdout
    assert "not read" not in by_env.stderr, by_env.stderr
    # the command line goes over the variable, as llama.cpp's
    over = _embed(tiny_bundle.path, "--pooling", "mean", env={"LLAMA_ARG_POOLING": "cls"})
    assert over.stdout == _embed(tiny_bundle.path, "--pooling", "mean").stdout
    assert "LLAMA_ARG_POOLING is set, but --pooling on the command line goes over it" in over.stderr


def test_embed_and_eval_say_the_bundle_on_the_command_line_goes_over_llama_arg_model(tiny_bundle, tmp_path):
    env = {"LLAMA_ARG_MODEL": str(tmp_path / "absent")}
    result = _embed(tiny_bundle.path, env=env)
    assert "LLAMA_ARG_MODEL is set, but the BUNDLE on the command line goes over it" in result.stderr
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    result = invoke("eval", tiny_bundle.path, "-f", text, "--context", 64, env=env)
    assert result.exit_code == 0, result.output
    assert "LLAMA_ARG_MODEL is set, but the BUNDLE on the command line goes over it" in result.stderr


def test_embed_refuses_a_pooling_variable_it_cannot_take(tiny_bundle):
    result = invoke("embed", tiny_bundle.path, "-p", "hello", env={"LLAMA_ARG_POOLING": "rank"})
    assert result.exit_code == 2, result.output
    assert "LLAMA_ARG_POOLING='rank'" in result.stderr


def test_embed_names_the_variables_it_does_not_read_and_a_context_unlike_the_bundle_s(tiny_bundle):
    result = _embed(tiny_bundle.path, env={"LLAMA_ARG_N_PREDICT": "7", "LLAMA_ARG_CTX_SIZE": "4096"})
    assert "edgesdk embed: not read: LLAMA_ARG_N_PREDICT (llama-embedding's" in result.stderr, result.stderr
    assert "not read: LLAMA_ARG_CTX_SIZE," not in result.stderr
    assert "LLAMA_ARG_CTX_SIZE='4096' is not read" in result.stderr
    assert "'edgesdk build --max-context 512', the most the model's" in result.stderr  # it holds 512 positions
    quiet = _embed(tiny_bundle.path, env={"LLAMA_ARG_CTX_SIZE": "0"})  # llama.cpp's 0: the model's own
    assert "LLAMA_ARG_CTX_SIZE" not in quiet.stderr, quiet.stderr


# --- eval ------------------------------------------------------------------------------------------------------


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return path


def _eval(*args, env=None):
    result = invoke("eval", *args, "--json", env=env or {})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_eval_reads_llama_perplexity_s_environment(tiny_bundle, text_file):
    """LLAMA_ARG_CTX_SIZE is llama-perplexity's -c, --context here (as -c is); LLAMA_ARG_MODEL the BUNDLE."""
    by_option = _eval(tiny_bundle.path, "-f", text_file, "--context", 64, "-t", 1)
    by_env = _eval("-f", text_file, env={"LLAMA_ARG_MODEL": str(tiny_bundle.path), "LLAMA_ARG_CTX_SIZE": "64",
                                         "LLAMA_ARG_THREADS": "1"})
    assert by_env["context"] == 64
    assert by_env["bundle"] == by_option["bundle"]


def test_eval_takes_context_0_as_the_bundle_s(tiny_bundle, text_file):
    """-c 0 is the model's context, as in llama.cpp's other tools (common/arg.cpp: "0 = loaded from model";
    llama-perplexity itself refuses it); it was refused ('need context >= 2')."""
    max_context = 256  # tests/conftest.py's tiny_bundle
    whole = _eval(tiny_bundle.path, "-f", text_file, "--context", max_context)
    assert _eval(tiny_bundle.path, "-f", text_file, "-c", 0)["bundle"] == whole["bundle"]
    assert _eval(tiny_bundle.path, "-f", text_file, env={"LLAMA_ARG_CTX_SIZE": "0"})["context"] == max_context


def test_eval_names_a_context_variable_longer_than_the_bundle_s_and_variables_it_does_not_read(tiny_bundle,
                                                                                            text_file):
    result = invoke("eval", tiny_bundle.path, "-f", text_file, env={"LLAMA_ARG_CTX_SIZE": "4096"})
    assert result.exit_code == 2, result.output
    assert "4096 (from LLAMA_ARG_CTX_SIZE, llama.cpp's -c) is longer than the bundle's max_context 256" \
        in result.stderr
    result = invoke("eval", tiny_bundle.path, "-f", text_file, "--context", 64, env={"LLAMA_ARG_TOP_K": "5"})
    assert result.exit_code == 0, result.output
    assert "edgesdk eval: not read: LLAMA_ARG_TOP_K (llama-perplexity's" in result.stderr


# --- serve: LLAMA_ARG_CTX_SIZE as -c ---------------------------------------------------------------------------


def test_serve_checks_the_context_variable_as_it_checks_c(tiny_bundle):
    """It was listed as not read while -c is checked against the bundle's context: another size is refused with
    the rebuild command, 0 and the bundle's own size are taken (the run then stops at the empty --host)."""
    refused = invoke("serve", tiny_bundle.path, "--host", "", env={"LLAMA_ARG_CTX_SIZE": "4096"})
    assert refused.exit_code == 2, refused.output
    assert "LLAMA_ARG_CTX_SIZE (llama.cpp's -c / --ctx-size): is '4096', and the context of" in refused.stderr
    assert "is 256 tokens, fixed when it was built" in refused.stderr
    assert "'edgesdk build --max-context 512', the most the model's" in refused.stderr  # it holds 512 positions
    for size in ("0", "256"):
        taken = invoke("serve", tiny_bundle.path, "--host", "", env={"LLAMA_ARG_CTX_SIZE": size})
        assert taken.exit_code == 2, taken.output
        assert "LLAMA_ARG_CTX_SIZE" not in taken.stderr, taken.stderr
        assert "--host" in taken.stderr
    over = invoke("serve", tiny_bundle.path, "-c", 256, "--host", "", env={"LLAMA_ARG_CTX_SIZE": "4096"})
    assert "LLAMA_ARG_CTX_SIZE is set, but -c on the command line goes over it" in over.stderr, over.stderr
    assert "fixed when it was built" not in over.stderr


# --- run and serve: --samplers / --sampling-seq names llama.cpp does not know ----------------------------------


def _run(bundle, *options):
    result = invoke("run", bundle, "-p", "hello", "--raw", "-n", 6, "-t", 1, "--temperature", 0.8, "--seed", 3,
                    "--top-k", 5, *options)
    assert result.exit_code == 0, result.output
    return result


def test_run_leaves_unknown_sampler_names_out_with_a_warning(tiny_bundle):
    """llama-cli skips them (common_sampler_types_from_names: "unable to match sampler by name"); run refused."""
    kept = _run(tiny_bundle.path, "--samplers", "top_k;temperature")
    skipped = _run(tiny_bundle.path, "--samplers", "top_k;tfs_z;temperature")
    assert skipped.stdout == kept.stdout
    assert "--samplers: 'tfs_z': no sampler llama.cpp knows by name, left out of the chain" in skipped.stderr
    letters = _run(tiny_bundle.path, "--sampling-seq", "kft")
    assert letters.stdout == kept.stdout
    assert "--sampling-seq: 'f': no sampler letter llama.cpp knows" in letters.stderr


def test_run_with_only_unknown_sampler_names_runs_an_empty_chain_and_says_so(tiny_bundle):
    """Every name unknown: llama.cpp's chain is 'logits -> dist' (the draw from the model's own distribution), as an
    empty --samplers is here."""
    empty = _run(tiny_bundle.path, "--samplers", ";")
    unknown = _run(tiny_bundle.path, "--samplers", "greedy")
    assert unknown.stdout == empty.stdout
    assert "'greedy'" in unknown.stderr
    assert "no sampler is left" in unknown.stderr


def test_run_still_refuses_adaptive_p(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-p", "hi", "--samplers", "top_k;adaptive_p")
    assert result.exit_code == 2, result.output
    assert "adaptive_p" in result.stderr


def test_serve_leaves_unknown_sampler_names_out_with_a_warning(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "--samplers", "top_k;typical_q", "--host", "")
    assert result.exit_code == 2, result.output
    assert "--samplers: 'typical_q': no sampler llama.cpp knows by name" in result.stderr
    assert "--host" in result.stderr  # refused for the empty host, not for the sampler
