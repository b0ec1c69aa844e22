"""Embeddings across their surfaces on real runtimes of tiny bundles: the same text gives the same vector and token
count through ``edgesdk embed``, ``Model.embed`` / ``create_embedding`` and the server's OpenAI, llama-server and
Ollama routes; truncation keeps the end token a tokenizer appends; text that is not UTF-8 and numpy arguments are
taken or refused by name; a p-norm with a large p stays finite."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from click.testing import CliRunner

import edgesdk
from edgesdk.api import RequestError
from edgesdk.cli import main
from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens, normalize, text_ids, truncated
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

TEXT = "The quick brown fox jumps over the lazy dog."
OTHER = "Edge boards run small models."
SMALL_CONTEXT = 32
LONG = "The quick brown fox jumps over the lazy dog. " * 6  # past SMALL_CONTEXT tokens


def _close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), np.asarray(want, dtype=np.float32), rtol=0,
                               atol=1e-6)


def _cli(bundle_path, *args) -> str:
    result = CliRunner().invoke(main, ["embed", str(bundle_path), "--threads", "1", *args])
    assert result.exit_code == 0, result.output + result.stderr
    return result.stdout


# ------------------------------------------------------------------------------------------------ one text, every surface


@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
def test_every_surface_gives_the_same_unit_vector_and_token_count(tiny_bundle, runtime, pooling):
    ids = runtime.tokenizer.encode(TEXT)
    want = embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling=pooling, normalize=2)).vectors
    server = Served(runtime, ServeDefaults(max_tokens=8, pooling=pooling))
    try:
        status, openai = server.post("/v1/embeddings", {"input": [TEXT, OTHER]})
        assert status == 200, openai
        status, native = server.post("/embedding", {"content": TEXT, "embd_normalize": 2})
        assert status == 200, native
        status, ollama = server.post("/api/embed", {"model": "tiny-host", "input": TEXT})
        assert status == 200, ollama
    finally:
        server.close()
    cli = json.loads(_cli(tiny_bundle.path, "-p", TEXT, "--pooling", pooling, "--embd-output-format", "json"))
    with edgesdk.load(tiny_bundle.path, threads=1, pooling=pooling) as model:
        created = model.create_embedding(TEXT)
        raw, count = model.embed(TEXT, normalize=True, return_count=True)
    for vector in (openai["data"][0]["embedding"], native[0]["embedding"][0], ollama["embeddings"][0],
                   cli["data"][0]["embedding"], created["data"][0]["embedding"], raw):
        _close(vector, want)
    other = runtime.tokenizer.encode(OTHER)
    assert openai["usage"]["prompt_tokens"] == len(ids) + len(other)
    assert cli["usage"]["prompt_tokens"] == created["usage"]["prompt_tokens"] == ollama["prompt_eval_count"] \
        == count == len(ids)


# ------------------------------------------------------------------------------------------------ truncation


@pytest.fixture(scope="module")
def eos_bundle(tmp_path_factory):
    """A tiny bundle of a 32-token context whose tokenizer appends <|endoftext|> to every text (a post-processor
    as Qwen3-Embedding's tokenizer has)."""
    from tokenizers import Tokenizer, processors

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny-eos")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|endoftext|>")
    tokenizer.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>",
                                                             special_tokens=[("<|endoftext|>", eos)])
    tokenizer.save(str(model_dir / "tokenizer.json"))
    out = tmp_path_factory.mktemp("bundles") / "tiny-eos"
    return build(BuildConfig(target="host", model=str(model_dir), out=out,
                             export=ExportConfig(max_context=SMALL_CONTEXT), progress=False))


@pytest.fixture(scope="module")
def eos_runtime(eos_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(eos_bundle.path, threads=1)


def test_text_ids_counts_the_tokens_the_tokenizer_appends(eos_runtime, runtime):
    ids, end = text_ids(eos_runtime.tokenizer, TEXT)
    assert end == 1
    assert ids[-1] == eos_runtime.tokenizer.token_id("<|endoftext|>")
    assert ids == eos_runtime.tokenizer.encode(TEXT)
    assert text_ids(runtime.tokenizer, TEXT) == (runtime.tokenizer.encode(TEXT), 0)
    assert truncated([1, 2, 3, 4, 5, 9], 4, end=1) == [1, 2, 3, 9]
    assert truncated([1, 2, 3, 4, 5, 9], 4) == [1, 2, 3, 4]
    assert truncated([1, 2, 9], 4, end=1) == [1, 2, 9]


def test_truncation_keeps_the_end_token_the_tokenizer_appends_on_every_surface(eos_bundle, eos_runtime):
    ids = eos_runtime.tokenizer.encode(LONG)
    eos = eos_runtime.tokenizer.token_id("<|endoftext|>")
    assert len(ids) > SMALL_CONTEXT
    assert ids[-1] == eos
    kept = ids[:SMALL_CONTEXT - 1] + [eos]  # as Ollama cuts: the text's first tokens, then the EOS again
    want = embed_tokens(eos_runtime.backend, kept, EmbeddingConfig(normalize=2)).vectors
    cut_plain = embed_tokens(eos_runtime.backend, ids[:SMALL_CONTEXT], EmbeddingConfig(normalize=2)).vectors
    assert not np.allclose(want, cut_plain, atol=1e-3)  # the last token's state tells the two cuts apart
    with edgesdk.load(eos_bundle.path, threads=1) as model:
        vector, count = model.embed(LONG, normalize=True, return_count=True)
    assert count == SMALL_CONTEXT
    _close(vector, want)
    server = Served(eos_runtime)
    try:
        status, answer = server.post("/api/embed", {"model": "tiny-host", "input": LONG})
        assert status == 200, answer
        assert answer["prompt_eval_count"] == SMALL_CONTEXT
        _close(answer["embeddings"][0], want)
        status, window = server.post("/api/embed", {"model": "tiny-host", "input": LONG, "options": {"num_ctx": 8}})
        assert status == 200, window
        _close(window["embeddings"][0],
               embed_tokens(eos_runtime.backend, ids[:7] + [eos], EmbeddingConfig(normalize=2)).vectors)
    finally:
        server.close()
    result = CliRunner().invoke(main, ["embed", str(eos_bundle.path), "--threads", "1", "-p", LONG, "--truncate",
                                       "--embd-output-format", "json"])
    assert result.exit_code == 0, result.output
    assert "and the end token the tokenizer appends were embedded" in result.stderr
    _close(json.loads(result.stdout)["data"][0]["embedding"], want)


def test_token_ids_given_as_such_are_cut_as_they_are(eos_bundle, eos_runtime):
    ids = eos_runtime.tokenizer.encode(LONG)
    with edgesdk.load(eos_bundle.path, threads=1) as model:
        vector = model.embed(ids, normalize=True)
    _close(vector, embed_tokens(eos_runtime.backend, ids[:SMALL_CONTEXT], EmbeddingConfig(normalize=2)).vectors)


# ------------------------------------------------------------------------------------------------ bad input


SURROGATE = b'"\\ud800 a lone surrogate"'


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/embeddings", b'{"input": ' + SURROGATE + b"}", "input"),
    ("/v1/embeddings", b'{"input": ["fine", ' + SURROGATE + b"]}", "input[1]"),
    ("/embedding", b'{"content": ' + SURROGATE + b"}", "content"),
    ("/embeddings", b'{"input": ' + SURROGATE + b"}", "input"),
])
def test_text_that_is_not_utf8_is_a_400_naming_it_on_the_openai_and_llama_server_routes(served, path, body, param):
    status, _, payload = served.request("POST", path, raw=body)
    error = json.loads(payload)["error"]
    assert status == 400, payload
    assert error["param"] == param
    assert "not valid UTF-8 (U+D800" in error["message"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/api/embed", b'{"model": "tiny-host", "input": ' + SURROGATE + b"}", "'input'"),
    ("/api/embed", b'{"model": "tiny-host", "input": ' + SURROGATE + b', "options": {"num_ctx": 4}}', "'input'"),
    ("/api/embeddings", b'{"model": "tiny-host", "prompt": ' + SURROGATE + b"}", "'prompt'"),
])
def test_text_that_is_not_utf8_is_a_400_naming_it_on_the_ollama_routes(served, path, body, param):
    status, _, payload = served.request("POST", path, raw=body)
    assert status == 400, payload
    error = json.loads(payload)["error"]
    assert error.startswith(param)
    assert "not valid UTF-8" in error


def test_text_that_is_not_utf8_is_refused_by_the_python_api_and_the_cli(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        for call in (model.embed, model.create_embedding):
            with pytest.raises(RequestError, match="not valid UTF-8") as caught:
                call(["fine", "\ud800"])
            assert caught.value.param == "input[1]"
    result = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "--threads", "1", "-p", "caf\udce9"])
    assert result.exit_code != 0
    assert "--prompt: the text to embed is not valid UTF-8 (byte 0xe9" in result.output + result.stderr
    assert not isinstance(result.exception, TypeError)


def test_numpy_arguments_are_taken_as_python_ones(tiny_bundle, runtime):
    ids = runtime.tokenizer.encode(TEXT)
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        _close(model.create_embedding(TEXT, dimensions=np.int64(8))["data"][0]["embedding"],
               model.create_embedding(TEXT, dimensions=8)["data"][0]["embedding"])
        _close(model.embed(TEXT, normalize=np.int32(2)), model.embed(TEXT, normalize=2))
        mixed = model.embed([np.array(ids, dtype=np.int64), TEXT])
        _close(mixed[0], mixed[1])
        assert model.embed(TEXT, normalize=np.bool_(True)) == model.embed(TEXT, normalize=True)  # as truncate's


# ------------------------------------------------------------------------------------------------ normalisation


def test_a_large_p_norm_stays_finite_and_tends_to_the_max_norm():
    vector = np.array([3.0, -4.0, 0.5, 12.0], dtype=np.float32)
    _close(normalize(vector, 3), vector / np.sum(np.abs(vector.astype(np.float64)) ** 3) ** (1 / 3))
    _close(normalize(vector, 1), vector / np.abs(vector).sum())
    large = normalize(vector, 100000)
    assert np.all(np.isfinite(large))
    _close(large, vector / 12.0)
    small = normalize(vector * 1e-3, 100000)  # |x| < 1: pow(|x|, p) underflows to 0 summed as it is
    _close(small, vector / 12.0)
    assert not np.any(normalize(np.zeros(4, np.float32), 7))


# ------------------------------------------------------------------------------------------------ concurrency


def test_an_embedding_while_a_stream_generates_waits_its_turn_and_changes_neither(runtime):
    ids = runtime.tokenizer.encode(TEXT)
    want = embed_tokens(runtime.backend, ids, EmbeddingConfig(normalize=2)).vectors
    server = Served(runtime, ServeDefaults(max_tokens=24))
    body = {"model": "x", "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 24,
            "temperature": 0}
    try:
        alone = server.post("/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
        streamed, embedded = [], []
        stream = threading.Thread(target=lambda: streamed.extend(server.stream("/v1/chat/completions", body)))
        stream.start()
        for _ in range(3):
            status, answer = server.post("/v1/embeddings", {"input": TEXT})
            assert status == 200, answer
            embedded.append(answer["data"][0]["embedding"])
        stream.join(timeout=120)
    finally:
        server.close()
    text = "".join(event["choices"][0]["delta"].get("content") or "" for event in streamed[:-1] if event["choices"])
    assert text == alone
    for vector in embedded:
        _close(vector, want)


# ------------------------------------------------------------------------------------------------ fuzzed bodies


FIELDS = ("input", "content", "prompt", "model", "encoding_format", "dimensions", "embd_normalize", "truncate",
          "options", "keep_alive", "user")


def _json_values():
    from hypothesis import strategies as st

    text = st.text(alphabet=st.characters(codec=None, categories=("L", "N", "P", "Z", "Cs", "Cc")), max_size=12)
    scalars = st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats() | text \
        | st.sampled_from(["float", "base64", "tiny-host", "", "num_ctx"])
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.sampled_from(FIELDS + ("num_ctx",)), inner, max_size=3), max_leaves=8)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embedding", "/api/embed", "/api/embeddings"])
def test_fuzzed_bodies_are_answered_or_refused_never_a_server_error(runtime, path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    server = Served(runtime)
    values = _json_values()
    texts = st.text(alphabet=st.sampled_from(["a", " ", "\u00e9", "\U0001f642", "\ud800", "\udcff"]), max_size=6)
    inputs = texts | st.lists(texts, max_size=3) | values  # lone surrogates, as JSON escapes carry them
    bodies = st.fixed_dictionaries({}, optional={"model": st.just("tiny-host") | values,
                                                 **{name: inputs for name in ("input", "content", "prompt")},
                                                 **{name: values for name in FIELDS[4:]}}) | values

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(bodies)
    def check(body):
        status, _, payload = server.request("POST", path, raw=json.dumps(body).encode())
        assert status in (200, 400, 404), (body, payload)

    try:
        check()
    finally:
        server.close()
