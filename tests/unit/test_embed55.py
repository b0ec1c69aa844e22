"""Embeddings: what a pooled vector keeps alive, and the refusals of the embedding requests and the model's pooling."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens, pool


@pytest.mark.parametrize(("pooling", "row"), [("cls", 0), ("last", -1)])
def test_a_pooled_row_is_a_vector_of_its_own(pooling, row):
    """The old pool returned a view of the (T, D) hidden states: the vector kept every position's states alive."""
    hidden = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)  # (T, D)
    pooled = pool(hidden, pooling)
    np.testing.assert_array_equal(pooled, hidden[row])
    assert not np.shares_memory(pooled, hidden)


@pytest.mark.parametrize("pooling", ["cls", "last"])
def test_an_unnormalised_embedding_holds_its_vector_only(tiny_bundle, pooling):
    """/v1/embeddings pools with normalize -1 (openai_embedding_config) and holds every input's embedding until it
    answers: each held the backend's whole (1, T, D) output, T times the vector, before."""
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    ids = list(range(1, 41))
    hidden = runtime.backend.hidden_states(np.asarray(ids, dtype=np.int64))  # (T, D)
    embedding = embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling, -1))
    np.testing.assert_allclose(embedding.vectors, hidden[0 if pooling == "cls" else -1], rtol=1e-6, atol=1e-6)
    assert embedding.vectors.base is None
    assert embedding.vectors.nbytes == hidden.shape[1] * 4


def test_a_dimensions_past_the_width_says_what_to_pass():
    """The old 400 named the width but no fix."""
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.embeddings import check_dimensions, parse_embedding_request

    with pytest.raises(ApiError) as caught:
        check_dimensions(parse_embedding_request({"input": "a cat", "dimensions": 9}), 8)
    assert caught.value.param == "dimensions"
    assert "'dimensions' is 9; this model's embeddings have 8 values: pass at most 8, or leave 'dimensions' out" \
        in caught.value.message


def _pooling_module(directory, config: str | None):
    """A sentence-transformers model directory whose Pooling module's config.json holds ``config`` (None: none)."""
    (directory / "modules.json").write_text('[{"idx": 0, "name": "0", "path": "", "type": '
                                            '"sentence_transformers.models.Transformer"}, {"idx": 1, "name": "1", '
                                            '"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]')
    (directory / "1_Pooling").mkdir()
    if config is not None:
        (directory / "1_Pooling" / "config.json").write_text(config)
    return directory


@pytest.mark.parametrize(("config", "why"), [
    (None, "1_Pooling/config.json cannot be read (there is no such file)"),
    ('{"pooling_mode_lasttoken": true,}', "1_Pooling/config.json is not JSON text (Expecting property name"),
    ('["lasttoken"]', '1_Pooling/config.json holds ["lasttoken"], not a JSON object of the Pooling settings'),
])
def test_a_pooling_config_that_cannot_be_followed_is_named_by_its_path_and_why(config, why, tmp_path):
    """The old note named 'config.json' (the model's own file is config.json, beside modules.json) and no reason, and
    a config that is no JSON object declared nothing, without a note."""
    from edgesdk.models.pooling import sentence_transformers_pooling

    pooling, note = sentence_transformers_pooling(_pooling_module(tmp_path, config))
    assert pooling is None
    assert note is not None
    assert why in note


def test_embed_refuses_an_input_past_the_context_before_any_input_runs(tiny_bundle, monkeypatch):
    """llama-embedding tokenizes every input before its first batch. The old command embedded the inputs before a
    refused one on the board (minutes for a long file on a Pi) and then threw their embeddings away."""
    from click.testing import CliRunner

    from edgesdk.cli import main
    from edgesdk.runtime.ort_backend import OrtDecoderBase

    ran = []
    original = OrtDecoderBase.hidden_states

    def counted(backend, token_ids):
        ran.append(len(token_ids))
        return original(backend, token_ids)

    monkeypatch.setattr(OrtDecoderBase, "hidden_states", counted)
    long_text = " ".join(["word"] * 400)  # past the tiny bundle's 256-token context
    result = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "--threads", "1", "-p", "The quick brown fox",
                                       "-p", long_text])
    assert result.exit_code != 0
    assert ("--prompt 2: This model's maximum context length is 256 tokens. However, your input resulted in"
            in result.output + result.stderr)
    assert ran == []
    result = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "--threads", "1", "-p", "The quick brown fox",
                                       "-p", long_text, "--truncate"])
    assert result.exit_code == 0, result.output + result.stderr
    assert len(ran) == 2
    assert "note: --prompt 2 is " in result.stderr
