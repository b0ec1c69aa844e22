"""The OpenAI chat/completions surface and llama-server's native endpoints (edgesdk/serve/api.py, llama_native.py)
against llama-server's own request schema (tools/server/server-schema.cpp, server-task.cpp ``params_from_json_cmpl``):
what a review found.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request
from edgesdk.serve.llama_native import parse_completion_request

USER = [{"role": "user", "content": "hi"}]
PARSERS = [
    ("/completion", lambda extra: parse_completion_request({"prompt": "a", **extra})),
    ("/v1/completions", lambda extra: parse_text_request({"prompt": "a", **extra})),
    ("/v1/chat/completions", lambda extra: parse_chat_request({"messages": USER, **extra})),
]


@pytest.fixture(scope="module")
def served(tiny_bundle):
    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_serve import Served

    server = Served(open_runtime(tiny_bundle.path, threads=1))
    yield server
    server.close()


# ------------------------------------------------------------------------------------------ n_cmpl


@pytest.mark.parametrize(("route", "parse"), PARSERS, ids=[route for route, _ in PARSERS])
@pytest.mark.parametrize("value", [2, 8, 0, True, "2"])
def test_n_cmpl_asking_for_other_than_one_completion_is_refused_by_name(route, parse, value):
    """llama-server reads ``n_cmpl`` (its name for OpenAI's ``n``, "Number of completions to generate") on every
    completion route; this server answers one completion per prompt and refuses ``n`` > 1, but took ``n_cmpl`` 2 and
    gave one completion where the client waits for two."""
    with pytest.raises(ApiError) as refused:
        parse({"n_cmpl": value})
    error = refused.value
    assert (error.status, error.param, error.code) == (400, "n_cmpl", "unsupported_parameter")
    assert f"'n_cmpl' = {json.dumps(value)} is not supported" in error.message
    assert f"{route} here gives one completion per prompt (n_cmpl = 1)" in error.message
    assert "leave 'n_cmpl' out" in error.message


@pytest.mark.parametrize(("route", "parse"), PARSERS, ids=[route for route, _ in PARSERS])
@pytest.mark.parametrize("value", [1, 1.0, None])
def test_n_cmpl_of_one_is_taken(route, parse, value):
    parse({"n_cmpl": value})


def test_n_cmpl_2_on_the_native_route_is_a_400_not_one_completion(served):
    status, body = served.post("/completion", {"prompt": "The quick", "n_predict": 2, "n_cmpl": 2})
    assert status == 400, body
    assert (body["error"]["param"], body["error"]["code"]) == ("n_cmpl", "unsupported_parameter")


# ------------------------------------------------------------------------------------------ logprobs on /completion


@pytest.mark.parametrize(("body", "expected"), [
    ({"logprobs": 3}, 3),
    ({"logprobs": True}, 1),  # llama-server's JSON reader turns true into 1
    ({"logprobs": 3, "n_probs": 0}, 3),  # n_probs at its default is "not provided" there
    ({"logprobs": 3, "n_probs": 2}, 2),  # n_probs given wins
    ({"logprobs": False}, None),
    ({"logprobs": None}, None),
    ({}, None),
])
def test_completion_reads_openai_logprobs_where_n_probs_is_not_given(body, expected):
    """llama-server's ``params_from_json_cmpl`` (tools/server/server-task.cpp): "Use OpenAI API logprobs only if
    n_probs wasn't provided". ``POST /completion`` here dropped ``logprobs`` without a word: no probabilities."""
    request = parse_completion_request({"prompt": "a", **body})
    assert request.logprobs == expected
    assert request.llama_probs is (expected is not None)


@pytest.mark.parametrize("bad", [-1, 1.5, "3"])  # no upper bound: llama-server lists min(n_probs, n_vocab)
def test_completion_logprobs_out_of_range_is_refused_naming_logprobs(bad):
    with pytest.raises(ApiError) as refused:
        parse_completion_request({"prompt": "a", "logprobs": bad})
    assert (refused.value.status, refused.value.param) == (400, "logprobs")
    assert "'logprobs'" in refused.value.message


def test_completion_logprobs_gives_the_completion_probabilities_n_probs_gives(served):
    body = {"prompt": "The quick", "n_predict": 3, "temperature": 0, "cache_prompt": False}
    status, by_n_probs = served.post("/completion", {**body, "n_probs": 2})
    assert status == 200, by_n_probs
    status, by_logprobs = served.post("/completion", {**body, "logprobs": 2})
    assert status == 200, by_logprobs
    assert "completion_probabilities" in by_logprobs, by_logprobs
    def shown(answer):
        return [(e["id"], [t["id"] for t in e["top_logprobs"]]) for e in answer["completion_probabilities"]]

    assert shown(by_logprobs) == shown(by_n_probs)
    assert [e["logprob"] for e in by_logprobs["completion_probabilities"]] == \
        pytest.approx([e["logprob"] for e in by_n_probs["completion_probabilities"]], abs=1e-6)
    assert [len(entry["top_logprobs"]) for entry in by_logprobs["completion_probabilities"]] == [2, 2, 2]
    assert by_logprobs["generation_settings"]["n_probs"] == 2


# ------------------------------------------------------------------------------------------ temperature on /completion


@pytest.mark.parametrize("value", [2.5, 3, 5.0])
def test_completion_takes_llama_server_s_temperatures_above_two(value):
    """llama-server's ``temperature`` has no upper bound (tools/server/server-schema.cpp: limits 0 to infinity);
    ``POST /completion`` here refused 2.5 with OpenAI's [0, 2], which belongs to the OpenAI routes."""
    assert parse_completion_request({"prompt": "a", "temperature": value}).temperature == float(value)


@pytest.mark.parametrize("bad", ["hot", True, float("nan"), float("inf")])
def test_completion_temperature_not_a_finite_number_is_refused(bad):
    with pytest.raises(ApiError) as refused:
        parse_completion_request({"prompt": "a", "temperature": bad})
    assert (refused.value.status, refused.value.param) == (400, "temperature")
    assert "'temperature' must be a finite number" in refused.value.message


@pytest.mark.parametrize("below", [-0.5, -1, -2.0])
def test_completion_temperature_below_zero_is_greedy_as_llama_server_reads_it(below):
    """llama-server clamps temperature, and its README documents one below 0 as greedy with n_probs reported."""
    assert parse_completion_request({"prompt": "a", "temperature": below}).temperature == 0.0


def test_completion_answers_a_temperature_of_3_5_with_it(served):
    status, body = served.post("/completion", {"prompt": "The quick", "n_predict": 3, "temperature": 3.5,
                                               "ignore_eos": True, "seed": 7})
    assert status == 200, body
    assert (body["generation_settings"]["temperature"], body["tokens_predicted"]) == (3.5, 3)
