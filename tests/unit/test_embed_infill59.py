"""Embeddings' normalisation of a p past the float range, and the refusals of embedding and infill fields, which
show the value as the client wrote it in JSON (``true``, ``null``, ``"BASE64"``), not in Python's words."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.serve.api import ApiError

HUGE = 10 ** 400  # a whole number JSON can carry and a float cannot


def test_a_p_norm_past_the_float_range_is_the_largest_magnitude():
    from edgesdk.runtime.embedding import normalize

    vectors = np.array([[0.5, -2.0, 0.25], [0.0, 0.0, 0.0], [3.0, -3.0, 1.0]], np.float32)
    want = np.array([[0.25, -1.0, 0.125], [0.0, 0.0, 0.0], [1.0, -1.0, 1 / 3]], np.float32)
    np.testing.assert_allclose(normalize(vectors, HUGE), want, rtol=0, atol=1e-7)
    np.testing.assert_allclose(normalize(vectors, 10 ** 20), want, rtol=0, atol=1e-7)  # the same limit


@pytest.mark.parametrize("route", ["/embedding", "/v1/embeddings"])
def test_a_huge_embd_normalize_is_answered_not_a_500(served, runtime, route):
    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens

    raw = b'{"input": "The cat sat.", "embd_normalize": 1' + b"0" * 400 + b"}"
    status, _, payload = served.request("POST", route, raw=raw)
    assert status == 200, payload
    answer = json.loads(payload)
    vector = answer[0]["embedding"][0] if route == "/embedding" else answer["data"][0]["embedding"]
    pooled = embed_tokens(runtime.backend, runtime.tokenizer.encode("The cat sat."),
                          EmbeddingConfig(normalize=-1)).vectors
    np.testing.assert_allclose(vector, pooled / np.abs(pooled).max(), rtol=0, atol=1e-6)


def test_the_python_api_embeds_with_a_huge_normalize(tiny_bundle):
    import edgesdk

    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        vector = np.asarray(model.embed("The cat sat.", normalize=HUGE))
    assert np.abs(vector).max() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(("body", "shown"), [
    ({"input": "hi", "dimensions": True}, "got true"),
    ({"input": "hi", "dimensions": "4"}, 'got "4"'),
    ({"input": "hi", "encoding_format": "BASE64"}, 'got "BASE64"'),
    ({"input": "hi", "encoding_format": False}, "got false"),
    ({"input": "hi", "embd_normalize": "2"}, 'got "2"'),
    ({"input": "hi", "embd_normalize": [2]}, "got [2]"),
])
def test_embedding_field_refusals_show_the_value_in_json(body, shown):
    from edgesdk.serve.embeddings import parse_embedding_request, parse_native_embedding_request

    with pytest.raises(ApiError) as refused:
        parse_embedding_request(body)
    assert refused.value.message.endswith(shown), refused.value.message
    if "dimensions" not in body:  # the native route reads the same fields but dimensions
        with pytest.raises(ApiError) as native:
            parse_native_embedding_request(body, "mean")
        assert native.value.message.endswith(shown), native.value.message


@pytest.mark.parametrize(("body", "shown"), [
    ({"input_prefix": "a", "input_suffix": "b", "prompt": None}, None),  # null: no prompt, taken
    ({"input_prefix": "a", "input_suffix": "b", "prompt": True}, "got true"),
    ({"input_prefix": None, "input_suffix": "b"}, "got null"),
    ({"input_prefix": ["a", False], "input_suffix": "b"}, 'got ["a", false]'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": {"text": "x"}}, 'got {"text": "x"}'),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [None]}, "got null"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "x", "filename": None}]}, "got null"),
])
def test_infill_field_refusals_show_the_value_in_json(fim_completer, body, shown):
    from edgesdk.serve.infill import parse_infill_request

    if shown is None:
        parse_infill_request(body, fim_completer)
        return
    with pytest.raises(ApiError) as refused:
        parse_infill_request(body, fim_completer)
    assert refused.value.message.endswith(shown), refused.value.message


@pytest.fixture(scope="module")
def fim_completer(tmp_path_factory):
    """A completer over a tiny bundle whose tokenizer holds Qwen2.5-Coder's FIM tokens."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import Completer, ServeDefaults
    from tests._utils.tiny import tiny_llama
    from tests.unit.test_serve_infill40 import QWEN, _fim_tokenizer

    root = tmp_path_factory.mktemp("qwen-fim59")
    tokenizer = _fim_tokenizer(QWEN)
    tiny_llama(layers=1, hidden=32, heads=2, kv_heads=1, vocab_size=len(tokenizer)).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    bundle = build(BuildConfig(target="host", model=str(root / "model"), out=root / "b",
                               export=ExportConfig(max_context=256), progress=False))
    return Completer(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=8))
