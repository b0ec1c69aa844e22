"""Embeddings from Python (edgesdk/api.py): ``Model.embed`` as llama-cpp-python's ``Llama.embed`` and
``Model.create_embedding`` as its ``create_embedding`` (OpenAI's ``/v1/embeddings`` body), checked against the
runtime's own embeddings of the same bundle and against transformers' final hidden states."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens

TEXT = "The quick brown fox jumps over the lazy dog."
OTHER = "A cold winter night by the sea."
LONG = " ".join(["word"] * 400)  # more tokens than the tiny bundle's context of 256


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def reference(tiny_bundle):
    """The same bundle opened on its own: the runtime's embeddings, apart from the Python API."""
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def runtime_vectors(runtime, text_or_ids, pooling="mean", norm=-1, truncate=False) -> np.ndarray:
    ids = runtime.tokenizer.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
    return embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling=pooling, normalize=norm), truncate).vectors


def test_one_text_gives_a_list_of_floats_equal_to_the_runtimes(model, reference):
    vector = model.embed(TEXT)
    assert isinstance(vector, list)
    assert all(isinstance(value, float) for value in vector)
    np.testing.assert_allclose(vector, runtime_vectors(reference, TEXT), rtol=1e-6, atol=1e-6)


def test_the_vector_is_the_pytorch_models_last_hidden_state(model, tiny_model_dir):
    """The default pooling (mean, the tiny model declaring none), normalize False: the final norm's output averaged
    over the positions, as transformers gives it."""
    torch = pytest.importorskip("torch")
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    source = load_model(resolve_model(str(tiny_model_dir)), progress=False).model.eval()
    ids = model.tokenize(TEXT)
    with torch.no_grad():
        hidden = source(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].numpy()
    np.testing.assert_allclose(model.embed(ids), hidden.mean(0), atol=2e-5)


def test_every_input_form(model):
    one, other = model.embed(TEXT), model.embed(OTHER)
    ids = model.tokenize(TEXT)
    assert model.embed([TEXT, OTHER]) == [one, other]
    assert model.embed([TEXT]) == [one]  # a list gives a list, even of one
    assert model.embed(ids) == one  # token ids: one input, one vector
    assert model.embed(tuple(ids)) == one
    assert model.embed(np.array(ids)) == one
    assert model.embed([ids, model.tokenize(OTHER)]) == [one, other]
    assert model.embed(np.array([ids, ids])) == [one, one]
    assert model.embed([TEXT, ids]) == [one, one]


def test_normalize_false_true_and_llama_cpp_numbers(model, reference):
    raw = np.array(model.embed(TEXT))
    assert not np.isclose(np.linalg.norm(raw), 1.0)  # llama-cpp-python's default: as the model gives them
    unit = np.array(model.embed(TEXT, normalize=True))
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.embed(TEXT, normalize=2), unit, rtol=1e-6)
    assert model.embed(TEXT, normalize=-1) == raw.tolist()
    scaled = np.array(model.embed(TEXT, normalize=0))  # 0 is max-abs to int16, not False
    assert np.abs(scaled).max() == pytest.approx(32760, rel=1e-6)
    np.testing.assert_allclose(np.abs(model.embed(TEXT, normalize=1)).sum(), 1.0, rtol=1e-5)
    np.testing.assert_allclose(model.embed(TEXT, normalize=3), runtime_vectors(reference, TEXT, norm=3), rtol=1e-5)


def test_pooling_none_gives_every_tokens_vector_and_the_others_pool_them(tiny_bundle, model, reference):
    tokens = len(model.tokenize(TEXT))
    with edgesdk.load(tiny_bundle.path, threads=1, pooling="none") as unpooled:
        rows = unpooled.embed(TEXT)
        assert len(rows) == tokens
        assert all(len(row) == len(model.embed(TEXT)) for row in rows)
        np.testing.assert_allclose(rows, runtime_vectors(reference, TEXT, pooling="none"), rtol=1e-6, atol=1e-6)
        assert unpooled.embed([TEXT, OTHER])[0] == rows  # a list: one list of rows per input
        unit_rows = np.array(unpooled.embed(TEXT, normalize=True))
        np.testing.assert_allclose(np.linalg.norm(unit_rows, axis=1), 1.0, rtol=1e-5)
        with pytest.raises(RequestError, match="pooling='last'") as caught:
            unpooled.create_embedding(TEXT)
        assert caught.value.status == 400
    np.testing.assert_allclose(model.embed(TEXT), np.mean(rows, axis=0), rtol=1e-5, atol=1e-6)  # mean, the default
    for pooling, want in (("last", rows[-1]), ("cls", rows[0])):
        with edgesdk.load(tiny_bundle.path, threads=1, pooling=pooling) as pooled:
            np.testing.assert_allclose(pooled.embed(TEXT), want, rtol=1e-5, atol=1e-6)


def test_truncate_embeds_the_first_max_context_tokens_or_refuses(model, reference):
    ids = model.tokenize(LONG)
    assert len(ids) > model.max_context
    vector, count = model.embed(LONG, return_count=True)  # on by default, as llama-cpp-python's
    assert count == model.max_context
    np.testing.assert_allclose(vector, runtime_vectors(reference, ids[:model.max_context]), rtol=1e-6, atol=1e-6)
    with pytest.raises(RequestError, match=rf"maximum context length is {model.max_context} tokens\. However, your "
                       rf"input\[1\] resulted in {len(ids)} tokens") as caught:
        model.embed([TEXT, LONG], truncate=False)
    assert (caught.value.param, caught.value.status) == ("input[1]", 400)
    assert "truncate=True" in caught.value.fix


def test_return_count_counts_the_tokens_read(model):
    vectors, count = model.embed([TEXT, OTHER], return_count=True)
    assert vectors == model.embed([TEXT, OTHER])
    assert count == len(model.tokenize(TEXT)) + len(model.tokenize(OTHER))


def test_create_embedding_is_openais_body_of_unit_vectors(model):
    answer = model.create_embedding([TEXT, OTHER])
    assert answer["object"] == "list"
    assert answer["model"] == model.model_name
    assert [item["object"] for item in answer["data"]] == ["embedding", "embedding"]
    assert [item["index"] for item in answer["data"]] == [0, 1]
    for item, text in zip(answer["data"], (TEXT, OTHER), strict=True):
        np.testing.assert_allclose(item["embedding"], model.embed(text, normalize=True), rtol=1e-6, atol=1e-7)
    tokens = len(model.tokenize(TEXT)) + len(model.tokenize(OTHER))
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert model.create_embedding(TEXT, "my-model")["model"] == "my-model"  # llama-cpp-python's model argument
    assert model.create_embedding(model.tokenize(TEXT))["data"] == model.create_embedding(TEXT)["data"]


def test_create_embedding_base64_and_dimensions(model):
    floats = model.create_embedding(TEXT)["data"][0]["embedding"]
    coded = model.create_embedding(TEXT, encoding_format="base64")["data"][0]["embedding"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(coded), "<f4"), np.float32(floats))
    short = model.create_embedding(TEXT, dimensions=8)["data"][0]["embedding"]
    assert len(short) == 8
    np.testing.assert_allclose(short, np.array(floats[:8]) / np.linalg.norm(floats[:8]), rtol=1e-5)
    before = model._completer.metrics.prompt_tokens
    with pytest.raises(RequestError, match=f"this model's embeddings have {len(floats)} values") as caught:
        model.create_embedding([TEXT, TEXT], dimensions=len(floats) + 1)
    assert caught.value.param == "dimensions"
    assert model._completer.metrics.prompt_tokens == before  # refused before any input ran


def test_create_embedding_refuses_a_long_input_as_the_http_route_does(model):
    with pytest.raises(RequestError, match=rf"maximum context length is {model.max_context} tokens\. However, your "
                       "input resulted in") as caught:
        model.create_embedding(LONG)
    assert caught.value.param == "input"
    assert "truncate=True" in caught.value.fix


@pytest.mark.parametrize(("call", "param", "message"), [
    (lambda m: m.embed(5), "input", "must be a string"),
    (lambda m: m.create_embedding([]), "input", "got an empty array"),
    # the field, or the item in it (as the other inputs' errors name it)
    (lambda m: m.embed([TEXT, 3.5]), r"input(\[1\])?", "'input\\[1\\]' must be a string or a non-empty array of token ids"),
    (lambda m: m.embed(""), "input", "is empty"),
    (lambda m: m.embed([TEXT, ""]), r"input\[1\]", "is empty"),
    (lambda m: m.embed([1, 10**9]), "input", "token id 1000000000"),
    (lambda m: m.embed(TEXT, normalize="yes"), "normalize", "expected True"),
    (lambda m: m.embed(TEXT, normalize=-2), "normalize", "llama.cpp's --embd-normalize"),
    (lambda m: m.embed(TEXT, normalize=2.0), "normalize", "2.0"),
    (lambda m: m.embed(TEXT, truncate="no"), "truncate", "expected True or False"),
    (lambda m: m.embed(TEXT, return_count=1), "return_count", "expected True or False"),
    (lambda m: m.create_embedding(TEXT, encoding_format="hex"), "encoding_format", "float or base64"),
    (lambda m: m.create_embedding(TEXT, dimensions=0), "dimensions", "at least 1"),
    (lambda m: m.create_embedding(TEXT, dimensions=10**6), "dimensions", "this model's embeddings have"),
    (lambda m: m.create_embedding(TEXT, model=3), "model", "expected the name"),
    (lambda m: m.create_embedding(None), "input", "got null"),
])
def test_a_bad_argument_is_refused_by_name(model, call, param, message):
    with pytest.raises(RequestError, match=message) as caught:
        call(model)
    assert re.fullmatch(param, caught.value.param)
    assert caught.value.status == 400
    assert str(caught.value).startswith((f"embed ({caught.value.param}): ",
                                         f"create_embedding ({caught.value.param}): "))
    if param.startswith("input"):  # the fix is in Python's terms, not an HTTP body's fields (the forms these
        # methods take; an empty input's and an unknown id's their own: test_each_refused_input_gets_its_own_fix)
        assert "a list of str" in caught.value.fix or message in ("is empty", "token id 1000000000")


@pytest.mark.parametrize(("pooling", "expected"), [("max", "one of last, mean, cls, none"),
                                                    (1, "one of last, mean, cls, none")])
def test_load_refuses_an_unknown_pooling_by_name(tiny_bundle, pooling, expected):
    with pytest.raises(EdgeSDKError, match=f"load\\(\\): pooling={pooling!r}: expected {expected}") as caught:
        edgesdk.load(tiny_bundle.path, threads=1, pooling=pooling)
    assert "pooling" in caught.value.fix


def test_a_backend_without_hidden_states_is_refused_in_pythons_terms(tiny_bundle, monkeypatch):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        monkeypatch.setattr(loaded.runtime.backend, "hidden_states", None)  # as a TensorRT engine gives none
        for call in (loaded.embed, loaded.create_embedding):
            with pytest.raises(RequestError, match="gives no hidden states") as caught:
                call(TEXT)
            assert caught.value.status == 501
            assert "backend='ort-cpu'" in caught.value.fix


def test_a_closed_model_refuses_embeddings(tiny_bundle):
    loaded = edgesdk.load(tiny_bundle.path, threads=1)
    loaded.close()
    for call in (loaded.embed, loaded.create_embedding):
        with pytest.raises(RequestError, match="closed") as caught:
            call(TEXT)
        assert caught.value.status == 503


def test_an_embedding_between_two_answers_keeps_the_prompt_cache(model):
    chat = [{"role": "user", "content": "Tell me about the sea."}]
    first = model.create_chat_completion(chat, max_tokens=4)
    model.embed(LONG)
    follow = chat + [first["choices"][0]["message"], {"role": "user", "content": "And the sky?"}]
    second = model.create_chat_completion(follow, max_tokens=4)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


@pytest.mark.parametrize(("given", "fix"), [
    ("", "pass a non-empty text or list of token ids"),
    ([5, 10 ** 6], "pass token ids the model's vocabulary holds (tokenize() gives them)"),
    ("\ud800", "pass text that is valid UTF-8 (no lone surrogates)"),
])
def test_each_refused_input_gets_its_own_fix(model, given, fix):
    """An empty text, an id past the vocabulary and text that is not UTF-8 were told to 'pass a str, a list of str,
    token ids ...', which they had done."""
    with pytest.raises(RequestError) as caught:
        model.embed(given)
    assert caught.value.fix == fix
