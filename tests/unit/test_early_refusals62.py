"""What can be refused before the work is refused before it: ``eval --reference-model`` of another model than the
bundle's before the bundle is scored (minutes on a real model), and ``--pooling rank`` (llama.cpp's reranker pooling)
on embed and serve with its reason, not click's "'rank' is not one of ..."."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from tests.unit.test_accuracy_files39 import HELLASWAG_TEXT


def invoke(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk", env=env)


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    """A tiny model of another shape than the one the tiny bundle was built from (3 layers, not 2)."""
    pytest.importorskip("transformers")
    from tests._utils.tiny import save_tiny_model_dir

    return save_tiny_model_dir(tmp_path_factory.mktemp("other") / "other", layers=3)


def test_eval_reference_model_of_another_model_is_refused_before_the_bundle_is_scored(tiny_bundle, other_model,
                                                                                         tmp_path):
    """The shape was checked once the reference model loaded, after the bundle's perplexity had been computed (its
    progress bar ran through every window): a wrong --reference-model cost the whole scoring first."""
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    result = invoke("eval", tiny_bundle.path, "--text", text, "--reference-model", other_model, "--threads", "1",
                    "--context", "64")
    assert result.exit_code == 3, result.output
    said = flat(result.output)
    assert f"--reference-model {other_model} is not the model {tiny_bundle.path} was built from" in said
    assert "layers 3 where the manifest records 2" in said
    assert "window" not in result.stderr, result.stderr  # the bundle's perplexity bar never ran
    assert "perplexity:" not in result.stderr
    assert "perplexity" not in result.stdout


def test_eval_task_with_a_reference_model_of_another_model_is_refused_before_the_tasks_are_scored(
        tiny_bundle, other_model, tmp_path):
    tasks = tmp_path / "hellaswag.txt"
    tasks.write_text(HELLASWAG_TEXT, encoding="utf-8")
    result = invoke("eval", tiny_bundle.path, "--hellaswag", "-f", tasks, "--reference-model", other_model,
                    "--threads", "1")
    assert result.exit_code == 3, result.output
    assert f"--reference-model {other_model} is not the model" in flat(result.output)
    assert "hellaswag:" not in result.stderr, result.stderr  # the bundle's task bar never ran
    assert "hellaswag (bundle)" not in result.output


def test_eval_reference_model_of_the_same_model_still_scores_both(tiny_bundle, tiny_model_dir, tmp_path):
    text = tmp_path / "text.txt"
    paragraph = " ".join(["the quick brown fox jumps over the lazy dog"] * 5) + " ."
    text.write_text(f" {paragraph} \n\n {paragraph} \n")
    result = invoke("eval", tiny_bundle.path, "--text", text, "--reference-model", tiny_model_dir, "--threads", "1",
                    "--context", "64", "--last-word", "--kl-divergence")
    assert result.exit_code == 0, result.output
    assert "reference (PyTorch)" in result.stdout
    assert "KL divergence" in result.stdout
    assert "last word (PyTorch)" in result.stdout
    # the shape is checked (and said) before the bundle's scoring starts
    assert result.stderr.index("has the shape of the model") < result.stderr.index("perplexity:")


RANK_REASON = ("rank is llama.cpp's pooling for a reranker, which scores a query and a document together through the "
               "model's classification head (llama-server --reranking's /v1/rerank); edgesdk serves no reranker, "
               "its embeddings pool a model's hidden states: pass last, mean, cls or none, or leave --pooling out "
               "for the pooling the model declares (else mean)")


@pytest.mark.parametrize("command", ["embed", "serve"])
def test_pooling_rank_is_refused_with_its_reason(tiny_bundle, command):
    """click said "'rank' is not one of 'last', 'mean', 'cls', 'none'", where llama.cpp takes rank for rerankers."""
    result = invoke(command, tiny_bundle.path, "--pooling", "rank")
    assert result.exit_code == 2, result.output
    said = flat(result.output)
    assert f"Invalid value for '--pooling': {RANK_REASON}" in said, said
    assert "is not one of" not in said


@pytest.mark.parametrize("command", ["embed", "serve"])
def test_llama_arg_pooling_rank_is_refused_with_its_reason_and_the_variable(tiny_bundle, command):
    result = invoke(command, tiny_bundle.path, env={"LLAMA_ARG_POOLING": "rank"})
    assert result.exit_code == 2, result.output
    said = flat(result.output)
    assert RANK_REASON in said, said
    assert "read from the environment, LLAMA_ARG_POOLING='rank'" in said
    assert "is not one of" not in said


@pytest.mark.parametrize("command", ["embed", "serve"])
def test_other_unknown_poolings_keep_click_s_list(tiny_bundle, command):
    result = invoke(command, tiny_bundle.path, "--pooling", "max")
    assert result.exit_code == 2, result.output
    assert "'max' is not one of 'last', 'mean', 'cls', 'none'" in flat(result.output)
