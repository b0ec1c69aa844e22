"""``edgesdk embed`` (edgesdk/cli_embed.py): llama-embedding's inputs and its four output forms, each parsed back
and compared with the runtime's own embeddings of the same bundle."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.runtime.embedding import POOLINGS, EmbeddingConfig, embed_tokens

TEXTS = ["The quick brown fox", "A cold winter night", "The quick brown dog"]
LINE = re.compile(r"embedding (\d+): (.*)$")


@pytest.fixture(scope="module")
def reference(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def vectors(runtime, texts, pooling="mean", norm=2) -> np.ndarray:
    """The runtime's embeddings of ``texts``: one row per text, or per token with pooling none."""
    rows = [embed_tokens(runtime.backend, runtime.tokenizer.encode(text), EmbeddingConfig(pooling, norm)).vectors
            for text in texts]
    return np.concatenate(rows) if pooling == "none" else np.stack(rows)


def embed(bundle, *args, ok=True):
    result = CliRunner().invoke(main, ["embed", str(bundle.path), "--threads", "1", *args])
    if ok:
        assert result.exit_code == 0, result.output + result.stderr
    return result


def prompts(texts) -> list[str]:
    return [option for text in texts for option in ("-p", text)]


def plain_rows(stdout: str) -> list[list[float]]:
    return [[float(value) for value in LINE.match(line).group(2).replace("...", " ").split()]
            for line in stdout.splitlines() if LINE.match(line)]


def test_plain_output_of_one_text_is_its_whole_unit_vector(tiny_bundle, reference):
    result = embed(tiny_bundle, "-p", TEXTS[0])
    lines = result.stdout.splitlines()
    assert lines[0].startswith("embedding 0: ")
    (row,) = plain_rows(result.stdout)
    np.testing.assert_allclose(row, vectors(reference, TEXTS[:1])[0], atol=6e-7)  # printed with %9.6f
    assert "cosine similarity matrix" not in result.stdout


def test_plain_output_of_several_shows_16_values_and_the_cosine_matrix(tiny_bundle, reference):
    result = embed(tiny_bundle, *prompts(TEXTS))
    want = vectors(reference, TEXTS)
    rows = plain_rows(result.stdout)
    assert [len(row) for row in rows] == [16, 16, 16]
    np.testing.assert_allclose(rows, want[:, :16], atol=6e-7)
    matrix_part = result.stdout.split("cosine similarity matrix:\n\n", 1)[1].splitlines()
    assert matrix_part[0] == "".join(f"{text[:6]:>6} " for text in TEXTS)
    similar = [[float(value) for value in line.split()[:3]] for line in matrix_part[1:4]]
    np.testing.assert_allclose(similar, want @ want.T, atol=0.006)  # unit vectors: the dot product, %6.2f
    assert [line[-10:] for line in matrix_part[1:4]] == [text[:10] for text in TEXTS]


def test_array_output(tiny_bundle, reference):
    result = embed(tiny_bundle, *prompts(TEXTS), "--embd-output-format", "array")
    assert result.stdout.startswith("[[")
    np.testing.assert_allclose(json.loads(result.stdout), vectors(reference, TEXTS), atol=6e-8)  # %1.7f


def test_json_output_is_openais_embeddings_answer(tiny_bundle, reference):
    from openai.types import CreateEmbeddingResponse

    result = embed(tiny_bundle, *prompts(TEXTS[:2]), "--embd-output-format", "json")
    body = json.loads(result.stdout)
    answer = CreateEmbeddingResponse.model_validate(body)  # the openai client's own type reads it
    assert [item.index for item in answer.data] == [0, 1]
    assert answer.object == "list"
    tokens = sum(len(reference.tokenizer.encode(text)) for text in TEXTS[:2])
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens
    np.testing.assert_allclose([item.embedding for item in answer.data], vectors(reference, TEXTS[:2]), atol=6e-8)
    assert "cosineSimilarity" not in body


def test_json_plus_adds_the_cosine_similarity_matrix_for_several_inputs(tiny_bundle, reference):
    body = json.loads(embed(tiny_bundle, *prompts(TEXTS), "--embd-output-format", "json+").stdout)
    want = vectors(reference, TEXTS)
    np.testing.assert_allclose(body["cosineSimilarity"], want @ want.T, atol=0.006)
    assert len(body["data"]) == 3
    one = json.loads(embed(tiny_bundle, "-p", TEXTS[0], "--embd-output-format", "json+").stdout)
    assert "cosineSimilarity" not in one  # as llama-embedding: a matrix only for several inputs


def test_pooling_none_gives_every_tokens_vector(tiny_bundle, reference):
    want = vectors(reference, TEXTS[:2], pooling="none")
    array = json.loads(embed(tiny_bundle, *prompts(TEXTS[:2]), "--pooling", "none",
                             "--embd-output-format", "array").stdout)
    np.testing.assert_allclose(array, want, atol=6e-8)
    rows = plain_rows(embed(tiny_bundle, *prompts(TEXTS[:2]), "--pooling", "none").stdout)
    assert len(rows) == len(want)
    np.testing.assert_allclose(rows, np.concatenate([want[:, :3], want[:, -3:]], axis=1), atol=6e-7)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooling_option(tiny_bundle, reference, pooling):
    array = json.loads(embed(tiny_bundle, *prompts(TEXTS), "--pooling", pooling,
                             "--embd-output-format", "array").stdout)
    np.testing.assert_allclose(array, vectors(reference, TEXTS, pooling=pooling), atol=6e-8)


def test_embd_normalize(tiny_bundle, reference):
    raw = json.loads(embed(tiny_bundle, "-p", TEXTS[0], "--embd-normalize", "-1", "--embd-output-format",
                           "array").stdout)
    np.testing.assert_allclose(raw, vectors(reference, TEXTS[:1], norm=-1), atol=6e-8)
    result = embed(tiny_bundle, "-p", TEXTS[0], "--embd-normalize", "0", "--embd-output-format", "array")
    assert "." not in result.stdout  # %1.0f: whole numbers
    scaled = np.array(json.loads(result.stdout))
    assert np.abs(scaled).max() == 32760
    np.testing.assert_allclose(scaled, vectors(reference, TEXTS[:1], norm=0), atol=0.5)
    taxicab = json.loads(embed(tiny_bundle, "-p", TEXTS[0], "--embd-normalize", "1", "--embd-output-format",
                               "array").stdout)
    assert np.abs(taxicab).sum() == pytest.approx(1.0, abs=1e-4)


def test_file_lines_separator_and_prompts_first(tiny_bundle, reference, tmp_path):
    text_file = tmp_path / "passages.txt"
    text_file.write_text("\n".join(TEXTS[1:]) + "\n", encoding="utf-8")  # the trailing newline is dropped
    array = json.loads(embed(tiny_bundle, "-p", TEXTS[0], "-f", str(text_file), "--embd-output-format",
                             "array").stdout)
    np.testing.assert_allclose(array, vectors(reference, TEXTS), atol=6e-8)
    joined = "<#sep#>".join(TEXTS)
    split = json.loads(embed(tiny_bundle, "-p", joined, "--embd-separator", "<#sep#>", "--embd-output-format",
                             "array").stdout)
    np.testing.assert_allclose(split, array, atol=1e-7)


def test_an_input_past_the_context_is_refused_by_name_or_truncated(tiny_bundle, reference, tmp_path):
    long = " ".join(["word"] * 400)
    limit = reference.backend.max_context
    text_file = tmp_path / "long.txt"
    text_file.write_text(f"{TEXTS[0]}\n{long}\n", encoding="utf-8")
    refused = embed(tiny_bundle, "-f", str(text_file), ok=False)
    assert refused.exit_code == 1
    assert (f"line 2 of --file {text_file}: This model's maximum context length is {limit} tokens. However, your "
            "input resulted in") in refused.stderr
    assert f"pass --truncate to embed its first {limit} tokens" in refused.stderr
    cut = embed(tiny_bundle, "-f", str(text_file), "--truncate", "--embd-output-format", "json")
    assert f"note: line 2 of --file {text_file} is " in cut.stderr
    ids = reference.tokenizer.encode(long)[:limit]
    want = embed_tokens(reference.backend, ids, EmbeddingConfig()).vectors
    body = json.loads(cut.stdout)
    np.testing.assert_allclose(body["data"][1]["embedding"], want, atol=6e-8)
    assert body["usage"]["prompt_tokens"] == len(reference.tokenizer.encode(TEXTS[0])) + limit


def test_a_bad_bundle_path_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["embed", str(tmp_path / "missing"), "-p", "hello"])
    assert result.exit_code == 5  # BundleError
    assert "does not exist or is not a directory" in result.stderr
    assert "fix: pass the directory written by 'edgesdk build'" in result.stderr


@pytest.mark.parametrize(("args", "code", "message"), [
    ([], 2, "give the text to embed: --prompt TEXT (repeatable) or --file FILE"),
    (["-p", "one\n\nthree"], 1, "line 2 of --prompt is empty: there is nothing to embed"),
    (["-p", "a", "-p", ""], 1, "--prompt 2 is empty"),
    (["-p", "a", "--embd-separator", ""], 2, "an empty separator splits nothing"),
    (["-f", "no-such-file.txt"], 2, "'no-such-file.txt' is not a file (nothing exists at that path)"),
    (["-p", "a", "--pooling", "max"], 2, "'max' is not one of 'last', 'mean', 'cls', 'none'"),
    (["-p", "a", "--embd-normalize", "-2"], 2, "-2 is not in the range x>=-1"),
    (["-p", "a", "--embd-output-format", "csv"], 2, "'csv' is not one of '', 'array', 'json', 'json+'"),
])
def test_bad_options_and_inputs_are_named(tiny_bundle, args, code, message):
    result = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), *args])
    assert result.exit_code == code, result.output
    assert message in result.stderr


def test_a_file_that_is_not_utf8_is_named(tiny_bundle, tmp_path):
    text_file = tmp_path / "latin1.txt"
    text_file.write_bytes("caf\xe9\n".encode("latin-1"))
    result = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "-f", str(text_file)])
    assert result.exit_code == 1
    assert f"--file {text_file} is not UTF-8 text" in result.stderr


def test_embed_is_listed_and_its_module_stays_lean():
    listing = CliRunner().invoke(main, ["--help"]).output
    assert re.search(r"^  embed +Embeddings of texts through the bundle's runtime", listing, re.MULTILINE)
    from edgesdk import cli_embed

    assert cli_embed.POOLINGS == POOLINGS
    code = ("import json, sys; import edgesdk.cli_embed; print(json.dumps(sorted(m for m in sys.modules if m == "
            "'edgesdk.cli' or m.split('.')[0] in ('numpy', 'onnxruntime', 'torch', 'transformers'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(proc.stdout) == []
