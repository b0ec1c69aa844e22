"""Review 51 of the embed area.

- edgesdk/runtime/embedding.py: a model whose tokenizer.json sets a ``truncation`` or a ``padding`` (as a
  sentence-transformers model's often does: cut at ``max_length``, padded to a ``Fixed`` length) has them copied into
  the bundle, and ``text_ids`` encoded with them: a text was silently cut (no refusal past the context, no
  ``truncated``, too few ``prompt_tokens``) and padded with pad tokens that the pooling read and that truncation kept
  as appended special tokens. llama.cpp's tokenizer has neither (a GGUF carries no such setting): llama-server embeds
  every token of a text and refuses one past the context.
- edgesdk/serve/embeddings.py: ``/v1/embeddings`` on a server pooling with ``none`` answered a ``not_supported_error``
  in its own words, where llama-server answers an ``invalid_request_error`` saying "Pooling type 'none' is not OAI
  compatible. Please use a different pooling type" (tools/server/server-context.cpp, ``handle_embeddings_impl``),
  which clients of llama-server match on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

TEXT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def cut_and_padded(tmp_path_factory):
    """(runtime, tokenizer without the settings) of a bundle built through the real pipeline from a model whose
    tokenizer.json truncates to 8 tokens and pads to 12."""
    pytest.importorskip("torch")
    import tokenizers

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("cut")
    model = save_tiny_model_dir(root / "model")
    plain = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    settings = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    settings["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    settings["padding"] = {"strategy": {"Fixed": 12}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                           "pad_type_id": 0, "pad_token": plain.id_to_token(0)}
    (model / "tokenizer.json").write_text(json.dumps(settings), encoding="utf-8")
    bundle = build(BuildConfig(target="host", model=str(model), out=root / "b", export=ExportConfig(max_context=64),
                               progress=False))
    runtime = open_runtime(bundle.path, threads=1)
    kept = json.loads((bundle.path / runtime.bundle.manifest["tokenizer"]["file"]).read_text(encoding="utf-8"))
    assert kept["truncation"] is not None  # the build kept the file's settings
    assert kept["padding"] is not None
    return runtime, plain


def test_a_text_is_embedded_whole_without_the_tokenizer_json_s_truncation_and_padding(cut_and_padded):
    from edgesdk.runtime.embedding import text_ids

    runtime, plain = cut_and_padded
    whole = plain.encode(TEXT, add_special_tokens=True).ids
    assert len(whole) > 12
    assert text_ids(runtime.tokenizer, TEXT) == (whole, 0)  # was the first 8 ids and 4 pads, the pads counted as end
    # the runtime reads every token of any text, prompts too (runtime/text.py load_tokenizer), as llama.cpp does
    assert runtime.tokenizer.tokenizer.truncation is None
    assert runtime.tokenizer.tokenizer.padding is None
    assert runtime.tokenizer.encode(TEXT, add_special_tokens=False) == plain.encode(TEXT, add_special_tokens=False).ids


def test_the_served_embedding_reads_every_token_and_refuses_a_text_past_the_context(cut_and_padded):
    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens

    runtime, plain = cut_and_padded
    whole = plain.encode(TEXT, add_special_tokens=True).ids
    want = embed_tokens(runtime.backend, whole, EmbeddingConfig(pooling="last")).vectors
    server = Served(runtime, ServeDefaults(max_tokens=4, pooling="last"))
    try:
        status, answer = server.post("/v1/embeddings", {"input": TEXT})
        assert status == 200, answer
        assert answer["usage"]["prompt_tokens"] == len(whole)  # was 12: 8 of the text's tokens and 4 pads
        np.testing.assert_allclose(answer["data"][0]["embedding"], want, atol=1e-5)
        long_text = " ".join([TEXT] * 4)
        assert len(plain.encode(long_text).ids) > 64
        status, refused = server.post("/v1/embeddings", {"input": long_text})
        assert (status, refused["error"]["code"]) == (400, "context_length_exceeded")  # was embedded, cut to 8
    finally:
        server.close()


def test_v1_embeddings_refuses_pooling_none_as_llama_server_does(runtime):
    from edgesdk.serve.embeddings import POOLING_NONE_REFUSAL

    assert POOLING_NONE_REFUSAL == "Pooling type 'none' is not OAI compatible. Please use a different pooling type"
    server = Served(runtime, ServeDefaults(max_tokens=4, pooling="none"))
    try:
        status, answer = server.post("/v1/embeddings", {"input": "x"})
        assert status == 400
        assert answer["error"]["type"] == "invalid_request_error"  # was not_supported_error
        assert answer["error"]["message"].startswith(POOLING_NONE_REFUSAL)
        assert "--pooling last, mean or cls" in answer["error"]["message"]
        status, native = server.post("/embedding", {"content": "x"})  # llama-server's own route takes it
        assert status == 200, native
    finally:
        server.close()
