"""Review fixes in edgesdk/serve/api.py and edgesdk/serve/completion.py: a ``suffix`` without the space a
SentencePiece tokenizer puts in front of it (as llama-cpp-python's), logit_bias ids the model has no logit for
refused before a stream opens, and ServeDefaults' counts whole numbers."""

from __future__ import annotations

import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import tiny_llama, tiny_llama2_tokenizer, tiny_tokenizer

pytest.importorskip("torch")

RECIPE = "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
CODELLAMA_FIM = ["\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", "\u2581<EOT>"]


# ------------------------------------------------------------------------------------------------ suffix


@pytest.fixture(scope="module")
def codellama_completer(tmp_path_factory):
    """A tiny bundle with a Llama 2 tokenizer (a space put in front of every text) and CodeLlama's FIM tokens."""
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import Completer, ServeDefaults

    root = tmp_path_factory.mktemp("codellama")
    tokenizer = tiny_llama2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": CODELLAMA_FIM})
    tiny_llama(layers=1, hidden=32, heads=2, kv_heads=1, vocab_size=len(tokenizer)).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    bundle = build_tiny_bundle(root, RECIPE, "host", model_dir=root / "model")
    return Completer(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=4))


def test_a_suffix_loses_the_space_a_sentencepiece_tokenizer_puts_in_front_as_llama_cpp_python_s(
        codellama_completer):
    from edgesdk.serve.api import parse_text_request

    tokenizer = codellama_completer.runtime.tokenizer
    fim = tokenizer.fim_tokens()
    assert fim.can_infill
    request = parse_text_request({"prompt": "the cat", "suffix": "the end"}, completer=codellama_completer)
    ids = list(request.prompt_tokens)
    suffix = ids[ids.index(fim.suf) + 1:ids.index(fim.mid)]
    pieces = "".join(tokenizer.tokenizer.id_to_token(token) for token in suffix)
    # llama-cpp-python tokenizes "\u263a" + suffix and drops the sentinel's tokens: no space in front of the suffix
    assert pieces == "the\u2581end", pieces
    assert tokenizer.encode_plain("the end") != suffix  # the plain ids have the space in front
    prefix = ids[ids.index(fim.pre) + 1:ids.index(fim.suf)]
    assert prefix == tokenizer.encode_plain("the cat")  # the prompt keeps its space, as llama-cpp-python's


def test_a_byte_level_tokenizer_s_suffix_is_its_plain_ids(tmp_path):
    from edgesdk.serve.api import unprefixed_ids
    from tests.unit.test_serve_infill40 import QWEN, _chat_tokenizer

    tokenizer = _chat_tokenizer(tmp_path, QWEN)
    for text in ("the end", " x", "\u263a!", ""):
        assert unprefixed_ids(tokenizer, text) == tokenizer.encode_plain(text)


# ------------------------------------------------------------------------------------------------ logit_bias


@pytest.fixture(scope="module")
def short_rows_server(tmp_path_factory):
    """A server whose model has 300 embedding rows and whose tokenizer has 320 tokens."""
    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_serve import Served

    root = tmp_path_factory.mktemp("rows")
    tiny_llama(vocab_size=300).save_pretrained(root / "model")
    tiny_tokenizer(320).save_pretrained(root / "model")
    bundle = build_tiny_bundle(root, RECIPE, "host", model_dir=root / "model")
    server = Served(open_runtime(bundle.path, threads=1))
    yield server
    server.close()


def test_a_logit_bias_id_past_the_model_s_rows_is_a_400_before_a_stream_opens(short_rows_server):
    body = {"prompt": "hi", "max_tokens": 2, "logit_bias": {"310": 5}}
    status, headers, payload = short_rows_server.request("POST", "/v1/completions", {**body, "stream": True})
    assert status == 400, payload
    assert headers["Content-Type"] == "application/json"
    status, answer = short_rows_server.post("/v1/completions", body)
    assert status == 400, answer
    assert answer["error"]["param"] == "logit_bias"
    assert "token id 310" in answer["error"]["message"]
    assert "0 to 299" in answer["error"]["message"]
    status, answer = short_rows_server.post("/v1/completions", {**body, "logit_bias": {"299": 5}})
    assert status == 200, answer


# ------------------------------------------------------------------------------------------------ ServeDefaults


@pytest.mark.parametrize(("field", "value"), [("max_waiting", 1.5), ("max_waiting", True), ("max_waiting", "3"),
                                              ("cache_ram_mib", 1.5), ("cache_ram_mib", True),
                                              ("reasoning_budget", 0.0)])
def test_serve_defaults_counts_must_be_whole_numbers(field, value):
    from edgesdk.serve.completion import ServeDefaults

    with pytest.raises(ValueError, match=rf"{field} must be .* got {value!r}"):
        ServeDefaults(**{field: value})


def test_a_whole_max_waiting_still_bounds_the_queue():
    from edgesdk.serve.completion import ServeDefaults

    assert ServeDefaults(max_waiting=0).max_waiting == 0
    assert ServeDefaults(cache_ram_mib=-1).cache_ram_mib == -1
