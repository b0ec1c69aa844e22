"""Review 48 of the embed area: edgesdk/models/as_llama.py, edgesdk/cli_embed.py, edgesdk/serve/embeddings.py.

- as_llama under transformers 4.x (pyproject.toml allows >= 4.56): its configs keep ``rope_theta`` and
  ``rope_scaling`` as two attributes, which the converted Llama must take over (given as ``rope_parameters`` only, a
  4.x Llama rotates with theta 10000 and no scaling).
- ``edgesdk embed --embd-output-format raw``: llama-embedding's ``print_raw_embeddings``, one vector a line.
- Embedding requests: an array of token ids with a non-id among them names that item; whole numbers written as
  floats (``"dimensions": 8.0``, ``"embd_normalize": 2.0``) are taken, as llama-server takes them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

SHAPE = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "initializer_range": 0.5, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2}


def _rope_of(llama_config) -> dict:
    """(rope_theta, rope_type, factor) of a LlamaConfig as the installed transformers keeps them."""
    params = getattr(llama_config, "rope_parameters", None)
    if isinstance(params, dict):  # transformers 5
        return {"theta": params.get("rope_theta"), "type": params.get("rope_type"), "factor": params.get("factor")}
    scaling = llama_config.rope_scaling or {}
    return {"theta": llama_config.rope_theta, "type": scaling.get("rope_type", scaling.get("type", "default")),
            "factor": scaling.get("factor")}


def test_a_transformers_4_config_keeps_its_rope_theta_and_scaling():
    """A Granite config as transformers 4.x holds it (rope_theta and rope_scaling, no rope_parameters): the old
    conversion passed rope_parameters=None, so the Llama got theta 10000 and no scaling."""
    from edgesdk.models.as_llama import llama_config_of

    granite = SimpleNamespace(model_type="granite", **SHAPE, hidden_act="silu", max_position_embeddings=64,
                              rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=10_000_000.0,
                              rope_scaling={"rope_type": "linear", "factor": 4.0}, _name_or_path="granite-3.1")
    rope = _rope_of(llama_config_of(granite))
    assert rope == {"theta": 10_000_000.0, "type": "linear", "factor": 4.0}


@pytest.mark.parametrize("family", ["granite", "phi3", "phi3-longrope"])
def test_the_converted_llama_keeps_a_rope_theta_and_scaling_given_the_legacy_way(family):
    """Configs built with rope_theta / rope_scaling keywords (what transformers 4.x keeps; 5 turns them into
    rope_parameters): the converted Llama gives the original's logits on 40 tokens. Under transformers 4.57 the old
    conversion was off by more than the logits' own scale."""
    import copy

    from transformers import GraniteConfig, GraniteForCausalLM, Phi3Config, Phi3ForCausalLM

    from edgesdk.models.as_llama import as_llama

    torch.manual_seed(0)
    if family == "granite":
        config = GraniteConfig(**SHAPE, attention_multiplier=0.05, residual_multiplier=0.3, embedding_multiplier=3.0,
                               logits_scaling=4.0, rope_theta=500.0, rope_scaling={"rope_type": "linear", "factor": 4.0})
        model = GraniteForCausalLM(config).eval()
    elif family == "phi3":
        config = Phi3Config(**SHAPE, rope_theta=777.0, max_position_embeddings=64, original_max_position_embeddings=64)
        model = Phi3ForCausalLM(config).eval()
    else:  # Phi-3.5-mini's form: longrope past an original context of 16 (the 40 tokens take the long factors)
        config = Phi3Config(**SHAPE, max_position_embeddings=64, original_max_position_embeddings=16,
                            rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                                          "long_factor": [2.0 + 0.3 * i for i in range(8)]})
        model = Phi3ForCausalLM(config).eval()
    ids = torch.tensor([[5, 17, 120, 33, 250, 9] * 6 + [5, 17, 120, 33]])
    with torch.no_grad():
        expected = model(ids).logits
        got = as_llama(copy.deepcopy(model))(ids).logits
    assert float((got - expected).abs().max()) <= 1e-4 * max(float(expected.abs().max()), 1.0)


# ---------------------------------------------------------------------------------------------- edgesdk embed
def _embed(bundle, *args):
    from click.testing import CliRunner

    from edgesdk.cli import main

    result = CliRunner().invoke(main, ["embed", str(bundle.path), "--threads", "1", *args])
    assert result.exit_code == 0, result.output + result.stderr
    return result


@pytest.mark.parametrize(("pooling", "norm"), [("mean", 2), ("none", 0)])
def test_raw_output_is_one_vector_a_line_as_llama_embedding_prints_it(tiny_bundle, pooling, norm):
    """llama-embedding's ``--embd-output-format raw`` (print_raw_embeddings): each vector on a line of its own, its
    values '%1.7f' ('%1.0f' with --embd-normalize 0) separated by one space; with pooling none every token's. The
    old command refused 'raw' as no output format."""
    import numpy as np

    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens
    from edgesdk.runtime.session import open_runtime

    texts = ["The quick brown fox", "A cold winter night"]
    result = _embed(tiny_bundle, "-p", "\n".join(texts), "--pooling", pooling, "--embd-normalize", str(norm),
                    "--embd-output-format", "raw")
    runtime = open_runtime(tiny_bundle.path, threads=1)
    expected = np.concatenate([np.atleast_2d(embed_tokens(runtime.backend, runtime.tokenizer.encode(text),
                                                          EmbeddingConfig(pooling, norm)).vectors) for text in texts])
    lines = result.stdout.splitlines()
    assert len(lines) == len(expected)
    for line, row in zip(lines, expected, strict=True):
        assert line == " ".join((f"{value:1.0f}" if norm == 0 else f"{value:1.7f}") for value in row.tolist())


# ---------------------------------------------------------------------------------------------- request checks
@pytest.mark.parametrize(("value", "param", "shown"), [
    ([1, 2, True], "input[2]", "true"),
    ([1, 2.5], "input[1]", "2.5"),
    ([[5, 6], [7, None]], "input[1][1]", "null"),
])
def test_an_array_of_token_ids_names_the_item_that_is_no_token_id(value, param, shown):
    """The old 400 blamed the array's first item, a good token id ("'input[0]' must be a string or ... got int")."""
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.embeddings import embedding_inputs

    with pytest.raises(ApiError) as caught:
        embedding_inputs(value)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert f"'{param}' must be a token id (a whole number), got {shown}" in str(caught.value)


def test_whole_numbers_written_as_floats_are_taken_as_llama_server_takes_them():
    """``"dimensions": 8.0`` and ``"embd_normalize": 0.0`` (a client that writes every number as a float; llama-server's
    nlohmann get<int> takes them, and so do edgesdk's other integer fields) were refused with a 400; 8.5, NaN,
    inf and true still are."""
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.embeddings import parse_embedding_request, parse_native_embedding_request

    request = parse_embedding_request({"input": "x", "dimensions": 8.0, "embd_normalize": 0.0})
    assert (request.dimensions, request.normalize) == (8, 0)
    assert type(request.dimensions) is int
    assert type(request.normalize) is int
    assert parse_native_embedding_request({"content": "x", "embd_normalize": 3.0}, "mean").config.normalize == 3
    for field, value in (("dimensions", 8.5), ("dimensions", float("inf")), ("embd_normalize", float("nan")),
                         ("embd_normalize", True), ("embd_normalize", -2.0)):
        with pytest.raises(ApiError) as caught:
            parse_embedding_request({"input": "x", field: value})
        assert caught.value.param == field
        assert "must be a whole number" in str(caught.value)
