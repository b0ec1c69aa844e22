"""llama-server parity of ``logit_bias`` text keys, ``POST /tokenize``'s ``content`` and ``POST /v1/embeddings``'s
``model``, over real HTTP against the tiny host bundle.

- A ``logit_bias`` text key is tokenized as llama-server tokenizes it (``common_tokenize(vocab, text, false)``:
  ``parse_special`` false), so ``"<|im_end|>"`` is its plain-text pieces, not the end-of-text token; and each of
  its tokens gets the bias once per time it appears (llama-server pushes one bias entry per token, and its
  logit-bias sampler adds every entry).
- ``/tokenize``'s ``content`` is read by ``tokenize_mixed``: a string, or an array of token ids and strings.
- ``/v1/embeddings`` answers with the request's ``model`` (``json_value(request, "model", model_name)``).
"""

from __future__ import annotations

import math

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4))
    yield server
    server.close()


def _sampling(runtime, logit_bias):
    from edgesdk.serve.api import parse_text_request
    from edgesdk.serve.completion import Completer

    return Completer(runtime).sampling(parse_text_request({"prompt": "x", "logit_bias": logit_bias}))


def test_a_logit_bias_text_key_reads_special_token_text_as_plain_text(runtime):
    end = runtime.tokenizer.tokenizer.token_to_id("<|im_end|>")
    assert end in runtime.tokenizer.eos_token_ids
    plain = runtime.tokenizer.encode_plain("<|im_end|>")
    assert end not in plain
    assert len(plain) > 1
    for bias in ([["<|im_end|>", False]], {"<|im_end|>": False}):
        banned = _sampling(runtime, bias).logit_bias
        assert banned == tuple((token, -math.inf) for token in plain), bias


def test_a_logit_bias_on_special_token_text_does_not_end_the_answer_at_once(served, runtime):
    plain = set(runtime.tokenizer.encode_plain("<|im_end|>"))
    status, answer = served.post("/completion", {"prompt": "hello", "temperature": 0, "n_predict": 3,
                                                 "logit_bias": [["<|im_end|>", 100]], "return_tokens": True})
    assert status == 200, answer
    assert answer["tokens"], answer
    assert set(answer["tokens"]) <= plain, answer  # its pieces pushed up, not the end of text
    assert answer["content"], answer


def test_a_logit_bias_text_key_biases_a_repeated_token_once_per_time_it_appears(runtime):
    ids = runtime.tokenizer.encode_plain(" fox fox fox")
    assert len(set(ids)) < len(ids), "the text must repeat a token"
    sampling = _sampling(runtime, {" fox fox fox": -5, "12": 1})
    assert sampling.logit_bias == (*((token, -5.0) for token in ids), (12, 1.0))


def test_tokenize_takes_ids_mixed_with_strings_as_tokenize_mixed(served, runtime):
    plain = runtime.tokenizer.encode_plain("<|im_end|> hi")
    special = runtime.tokenizer.encode("<|im_end|> hi", add_special_tokens=False)
    assert plain != special
    assert served.post("/tokenize", {"content": [12, "<|im_end|> hi", 7]}) == (200, {"tokens": [12, *special, 7]})
    assert served.post("/tokenize", {"content": [12, "<|im_end|> hi"], "parse_special": False}) == \
        (200, {"tokens": [12, *plain]})
    assert served.post("/tokenize", {"content": [5, 6]}) == (200, {"tokens": [5, 6]})
    assert served.post("/tokenize", {"content": []}) == (200, {"tokens": []})
    status, body = served.post("/tokenize", {"content": [12, " hi"], "with_pieces": True})
    assert status == 200
    assert [entry["id"] for entry in body["tokens"]] == [12, *runtime.tokenizer.encode(" hi", False)]


def test_tokenize_refuses_a_bad_part_of_its_content_naming_it(served, runtime):
    vocabulary = runtime.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    for content, index, shown in (([12, 1.5], 1, "1.5"), ([12, True], 1, "true"), ([-1, "a"], 0, "-1"),
                                  (["a", None], 1, "null"), (["a", {"b": 1}], 1, '{"b": 1}')):  # shown as JSON
        status, body = served.post("/tokenize", {"content": content})
        assert (status, body["error"]["param"]) == (400, "content"), body
        assert f"'content[{index}]' must be a token id" in body["error"]["message"], body
        assert shown in body["error"]["message"], body
    status, body = served.post("/tokenize", {"content": ["a", vocabulary]})
    assert status == 400, body
    assert f"'content[1]' is {vocabulary}" in body["error"]["message"]
    assert f"0 to {vocabulary - 1}" in body["error"]["message"]
    status, body = served.post("/tokenize", {"content": ["a", "\ud800"]})  # a lone surrogate from a JSON escape
    assert (status, body["error"]["param"]) == (400, "content"), body
    assert "'content[1]'" in body["error"]["message"], body
    status, body = served.post("/tokenize", {"content": 12})
    assert status == 400, body
    assert "'content'" in body["error"]["message"], body


def test_v1_embeddings_answers_with_the_request_s_model(served):
    status, answer = served.post("/v1/embeddings", {"input": "hello", "model": "text-embedding-3-small"})
    assert status == 200, answer
    assert answer["model"] == "text-embedding-3-small"
    status, answer = served.post("/v1/embeddings", {"input": "hello"})
    assert status == 200, answer
    assert answer["model"] == "tiny-host"  # no model asked: the server's
