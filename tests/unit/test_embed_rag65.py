"""Embeddings as a retrieval (RAG) pipeline's clients call them: token ids that are another tokenizer's (LangChain's
``OpenAIEmbeddings`` sends tiktoken's by default), ``edgesdk embed -f -`` in a pipe, ``Model.embed([])`` from a
vector store with no documents, and llama-cpp-python's numeric ``pooling_type``; on a real server and runtime over
the tiny bundle."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import edgesdk
from edgesdk.api import RequestError
from edgesdk.cli import main
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens
from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.embeddings import parse_embedding_request
from tests.unit.test_serve import Served

TEXTS = ["The cat sat on the mat.", "Edge boards run small models."]
LANGCHAIN_FIX = "check_embedding_ctx_length=False"
HELLO = 9906  # tiktoken cl100k_base's id of "Hello", past the tiny model's vocabulary


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4))
    yield server
    server.close()


def _ids(runtime, text: str) -> list[int]:
    return runtime.tokenizer.encode(text)


def _error(server: Served, path: str, body: dict) -> tuple[int, dict]:
    status, payload = server.post(path, body)
    assert set(payload) == {"error"}, payload
    return status, payload["error"]


# --------------------------------------------- 1: ids sent with an OpenAI embedding model's name are tiktoken's


@pytest.mark.parametrize("model", ["text-embedding-ada-002", "text-embedding-3-small"])
def test_token_ids_sent_for_an_openai_embedding_model_are_refused_with_the_langchain_fix(served, runtime, model):
    """LangChain's OpenAIEmbeddings (check_embedding_ctx_length=True, its default) sends each document as tiktoken
    ids with model text-embedding-ada-002, through the openai client. The ids below the vocabulary's size were read
    as the bundle's own tokens and embedded as other text, with a 200."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="none", max_retries=0)
    ids = [[token % 200 + 1 for token in _ids(runtime, text)] for text in TEXTS]  # in range: taken before
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=model, input=ids, encoding_format="float")
    error = caught.value.body
    assert error["code"] == "token_ids_of_another_tokenizer"
    assert error["param"] == "input"
    assert f"'model' is \"{model}\"" in error["message"]
    assert "tiktoken" in error["message"]
    assert LANGCHAIN_FIX in error["message"]
    assert "send the texts" in error["message"]
    assert "name the served model in 'model'" in error["message"]


def test_the_ways_around_the_refusal_embed_as_before(served, runtime):
    """The texts under an OpenAI model's name, and this model's own ids under the served model's name or none, are
    embedded; the ids give the vectors of their texts."""
    ids = [_ids(runtime, text) for text in TEXTS]
    want = [embed_tokens(runtime.backend, each, EmbeddingConfig("mean", 2)).vectors for each in ids]
    for body in ({"model": "text-embedding-ada-002", "input": TEXTS}, {"model": "tiny-host", "input": ids},
                 {"input": ids}):
        status, answer = served.post("/v1/embeddings", {**body, "encoding_format": "float"})
        assert status == 200, answer
        for index, vector in enumerate(want):
            np.testing.assert_allclose(answer["data"][index]["embedding"], vector, atol=1e-6)


def test_a_single_id_list_or_one_mixed_with_text_is_refused_too():
    for given in ([12, 34], [[12, 34]], ["a text", [12, 34]], [12, "a text"]):
        with pytest.raises(ApiError) as caught:
            parse_embedding_request({"model": "text-embedding-ada-002", "input": given})
        assert caught.value.status == 400
        assert caught.value.code == "token_ids_of_another_tokenizer"
        assert LANGCHAIN_FIX in caught.value.fix


# -------------------------------------------------- 2: an id past the vocabulary says where such ids come from


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/embeddings", {"model": "tiny-host", "input": [[HELLO, 1]]}),
    ("/embedding", {"content": [HELLO, 1]}),
])
def test_an_embedding_id_past_the_vocabulary_names_the_fix(served, path, body):
    status, error = _error(served, path, body)
    assert status == 400
    size = served.completer.token_id_limit()
    assert HELLO >= size
    assert f"holds token id {HELLO}; this model's vocabulary has ids 0 to {size - 1};" in error["message"]
    assert "POST /tokenize" in error["message"]
    assert "tiktoken" in error["message"]
    assert LANGCHAIN_FIX in error["message"]
    assert error["code"] == "token_out_of_vocabulary"


def test_a_prompt_id_past_the_vocabulary_has_the_embedding_s_code_and_a_fix(served):
    """The completion's refusal had no code and no fix."""
    status, error = _error(served, "/v1/completions", {"prompt": [HELLO, 1], "max_tokens": 1})
    assert status == 400
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "prompt"
    assert error["code"] == "token_out_of_vocabulary"
    assert f"'prompt' holds token id {HELLO}" in error["message"]
    assert "POST /tokenize" in error["message"]
    assert "send the prompt's text instead" in error["message"]


def test_the_python_api_keeps_its_own_fix_for_an_id_past_the_vocabulary(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        with pytest.raises(RequestError) as caught:
            model.create_completion([HELLO, 1], max_tokens=1)
        assert caught.value.param == "prompt"
        assert "send the prompt's text instead" in caught.value.fix


# ------------------------------------------------------------------------------- 3: edgesdk embed -f - reads stdin


def _plain(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("embedding ")]


def test_embed_file_dash_reads_stdin_as_a_file_is_read(tiny_bundle, tmp_path):
    """'-' was refused as "'-' is not a file (nothing exists at that path)", where run -f - reads stdin."""
    text = "\n".join(TEXTS) + "\n"  # one trailing newline, dropped as a file's
    piped = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "--threads", "1", "-f", "-"], input=text)
    assert piped.exit_code == 0, piped.output + piped.stderr
    passages = tmp_path / "passages.txt"
    passages.write_text(text)
    read = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "--threads", "1", "-f", str(passages)])
    assert read.exit_code == 0, read.output + read.stderr
    assert len(_plain(piped)) == 2
    assert _plain(piped) == _plain(read)


def test_embed_file_dash_refuses_empty_or_non_utf8_stdin_by_name(tiny_bundle):
    empty = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "-f", "-"], input="")
    assert empty.exit_code != 0
    assert "--file - is empty" in empty.output + empty.stderr
    assert "pipe the text to embed in" in empty.output + empty.stderr
    latin = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "-f", "-"], input="caf\xe9\n".encode("latin-1"))
    assert latin.exit_code != 0
    assert "--file - (stdin) is not UTF-8 text" in latin.output + latin.stderr
    assert "iconv" in latin.output + latin.stderr


def test_embed_help_says_dash_reads_stdin():
    result = CliRunner().invoke(main, ["embed", "--help"])
    assert result.exit_code == 0
    assert "'-' reads it from stdin" in " ".join(result.stdout.split())


# ------------------------------------------------------------------ 4: Model.embed([]) is [] as llama-cpp-python's


def test_embed_of_no_inputs_is_an_empty_list_and_create_embedding_still_refuses_it(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        assert model.embed([]) == []
        assert model.embed([], return_count=True) == ([], 0)
        assert model.embed(np.array([], dtype=np.int64)) == []
        with pytest.raises(RequestError, match="empty array") as caught:
            model.create_embedding([])
        assert caught.value.param == "input"
        with pytest.raises(RequestError, match="expected True or False"):
            model.embed([], return_count=1)  # the flags are checked still


# -------------------------------------------------------- 5: llama-cpp-python's pooling_type numbers are named


@pytest.mark.parametrize(("number", "word"), [(0, "none"), (1, "mean"), (2, "cls"), (3, "last")])
def test_load_pooling_type_names_the_pooling_its_number_is(tiny_bundle, number, word):
    """The old hint said "pass pooling='last', 'mean', 'cls' or 'none'", leaving pooling_type=1's user to guess."""
    with pytest.raises(EdgeSDKError) as caught:
        edgesdk.load(tiny_bundle.path, threads=1, pooling_type=number)
    assert f"{number} {word.upper()} (pooling='{word}')" in str(caught.value)


def test_load_pooling_type_rank_is_named_as_a_reranker_s(tiny_bundle):
    with pytest.raises(EdgeSDKError) as caught:
        edgesdk.load(tiny_bundle.path, threads=1, pooling_type=4)
    assert "4 RANK is a reranker's score" in str(caught.value)
