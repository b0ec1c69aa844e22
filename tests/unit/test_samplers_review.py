"""The logit bias against constraints and the server: a bias that leaves a constrained answer no token, or bans the
whole vocabulary, is the request's fault and named as such; logit_bias object keys that read as huge numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import LogitBiasError, Sampler, SamplingConfig, biased
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=8))
    yield server
    server.close()


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_a_bias_banning_every_token_the_constraint_allows_names_the_bias_and_the_ids(temperature):
    logits = np.array([0.0, 5.0, 4.0, 1.0], np.float32)
    config = SamplingConfig(temperature=temperature, seed=1, top_k=2, logit_bias={2: -math.inf, 3: -math.inf})
    with pytest.raises(LogitBiasError, match=r"logit_bias bans every token the constraint allows next \(ids 2, 3"):
        Sampler(config)(biased(logits, config), lambda token: token in (2, 3))
    # With no banned token among those allowed, the constraint alone is at fault: the bias is not blamed.
    with pytest.raises(EdgeSDKError, match="no token of the vocabulary") as caught:
        Sampler(config)(biased(logits, config), lambda token: False)
    assert not isinstance(caught.value, LogitBiasError)
    assert "logit_bias" not in str(caught.value)


@pytest.mark.parametrize("extra", [{}, {"temperature": 1.0, "top_k": 2, "seed": 4}])
def test_serve_answers_400_naming_logit_bias_when_it_bans_what_the_grammar_needs(served, runtime, extra):
    a = runtime.tokenizer.tokenizer.token_to_id("a")
    body = {"prompt": "hi", "grammar": 'root ::= "a"', "logit_bias": {str(a): False}, **extra}
    status, answer = served.post("/v1/completions", body)
    assert (status, answer["error"]["param"], answer["error"]["type"]) == (400, "logit_bias", "invalid_request_error")
    assert f"ids {a}" in answer["error"]["message"]
    # Streamed, the headers are out when the first token is picked: the error event says the same.
    status, _, payload = served.request("POST", "/v1/completions", {**body, "stream": True})
    assert status == 200
    events = [json.loads(line[len("data: "):]) for line in payload.decode().split("\n\n") if line]
    assert events[-1]["error"]["param"] == "logit_bias", events
    assert f"ids {a}" in events[-1]["error"]["message"]
    assert served.post("/v1/completions", {"prompt": "hi", "grammar": 'root ::= "a"', "max_tokens": 2})[0] == 200


@pytest.mark.parametrize("stream", [False, True])
def test_serve_refuses_a_bias_that_bans_the_whole_vocabulary_before_the_turn(served, runtime, stream):
    vocabulary = runtime.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    bias = {str(token): False for token in range(vocabulary)}
    status, _, payload = served.request("POST", "/v1/completions", {"prompt": "hi", "logit_bias": bias,
                                                                    "stream": stream})
    answer = json.loads(payload)
    assert (status, answer["error"]["param"]) == (400, "logit_bias"), answer
    assert "bans every token" in answer["error"]["message"]
    del bias["7"]
    assert served.post("/v1/completions", {"prompt": "hi", "logit_bias": bias, "max_tokens": 2})[0] == 200


@pytest.mark.parametrize("key", ["9" * 5000, "-" + "1" * 4400])
def test_a_logit_bias_key_of_thousands_of_digits_is_a_400_naming_the_field(served, key):
    status, answer = served.post("/v1/completions", {"prompt": "hi", "logit_bias": {key: 1}})
    assert (status, answer["error"]["param"]) == (400, "logit_bias"), answer
    assert "token ids >= 0" in answer["error"]["message"]


def test_a_logit_bias_key_reads_as_strtol_reads_it_leading_zeros_and_all():
    from edgesdk.serve.api import parse_text_request

    request = parse_text_request({"prompt": "x", "logit_bias": {"0" * 5000 + "7": 1, " +12": 2, "-0": 3, "000": 4,
                                                                "7a": 5}})
    assert request.logit_bias == ((7, 1.0), (12, 2.0), (0, 3.0), (0, 4.0), ("7a", 5.0))
