"""A prompt of token ids is checked against the ids the model has rows for, not only the tokenizer's: a
tokenizer with more tokens than the model's embedding (added tokens past its rows) gets a 400 naming the id."""

from __future__ import annotations

import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import tiny_llama, tiny_tokenizer

pytest.importorskip("torch")


def test_a_prompt_id_past_the_model_s_rows_is_a_400_naming_it(tmp_path):
    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_serve import Served

    model_dir = tmp_path / "model"
    tiny_llama(vocab_size=300).save_pretrained(model_dir)
    tokenizer = tiny_tokenizer(320)
    assert len(tokenizer) > 300
    tokenizer.save_pretrained(model_dir)
    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    server = Served(open_runtime(bundle.path, threads=1))
    try:
        status, body = server.post("/v1/completions", {"prompt": [5, 310, 7], "max_tokens": 2})
        assert status == 400, body
        assert body["error"]["param"] == "prompt"
        assert "token id 310" in body["error"]["message"]
        assert "0 to 299" in body["error"]["message"]
        status, body = server.post("/v1/completions", {"prompt": [5, 299, 7], "max_tokens": 2})
        assert status == 200, body
    finally:
        server.close()
