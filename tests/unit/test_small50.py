"""Review 50 of the small serve routes: /v1/responses, Ollama's /api/*, llama-server's /completion.

* /v1/responses passes llama.cpp's ``xtc_threshold``, ``dry_penalty_last_n`` and ``adaptive_target`` to the chat
  request it builds, so the "off" forms of the samplers this server lacks (api.py ``sampler_off`` / ``_samplers``)
  read as on /v1/chat/completions: XTC with a threshold above 0.5, DRY with ``dry_penalty_last_n`` 0, adaptive-p
  with a target below 0. They were dropped, and such requests refused.
* Ollama's ``options.num_predict``: every number below 0 is no limit, -2 too (llm/server.go reads any
  ``NumPredict < 0`` as ten contexts); the error no longer offers -2 as "until the context fills".
* /completion's ``generation_settings.seed`` (and /slots' params) shows a random seed as llama-server does:
  4294967295, LLAMA_DEFAULT_SEED, its ``uint32_t`` ``params.sampling.seed`` (common/common.h), not -1.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.ollama import parse_chat
from edgesdk.serve.responses import parse_responses_request

ASK = [{"role": "user", "content": "Tell me about the fox."}]
OFF_FORMS = [
    {"xtc_probability": 0.5, "xtc_threshold": 0.6},  # XTC does nothing for a threshold above 0.5
    {"dry_multiplier": 0.8, "dry_penalty_last_n": 0},  # DRY scans no tokens
    {"samplers": ["top_k", "temperature", "adaptive_p"], "adaptive_target": -0.01},  # SillyTavern's default
]


@pytest.mark.parametrize("fields", OFF_FORMS)
def test_responses_reads_the_samplers_off_forms_as_the_chat_route(fields):
    chat = parse_chat_request({"messages": ASK, **fields})
    responses = parse_responses_request({"input": ASK, **fields}).request
    assert responses.samplers == chat.samplers


def test_responses_refuses_adaptive_p_turned_on_naming_adaptive_target():
    fields = {"samplers": ["top_k", "adaptive_p"], "adaptive_target": 0.3}
    with pytest.raises(ApiError) as chat:
        parse_chat_request({"messages": ASK, **fields})
    with pytest.raises(ApiError) as responses:
        parse_responses_request({"input": ASK, **fields})
    assert responses.value.param == chat.value.param == "adaptive_target"
    with pytest.raises(ApiError) as xtc:  # a threshold that leaves XTC on is still refused
        parse_responses_request({"input": ASK, "xtc_probability": 0.5, "xtc_threshold": 0.3})
    assert xtc.value.param == "xtc_probability"


def test_responses_answers_with_the_off_forms_over_the_server(served):
    plain = {"model": "m", "input": ASK, "max_output_tokens": 4, "temperature": 0}
    status, expected = served.post("/v1/responses", plain)
    assert status == 200, expected
    for fields in OFF_FORMS:
        status, answer = served.post("/v1/responses", {**plain, **fields})
        assert status == 200, (fields, answer)
        assert answer["output"][-1]["content"][0]["text"] == expected["output"][-1]["content"][0]["text"]


@pytest.mark.parametrize("predict", ["10", True, float("inf")])
def test_ollama_num_predict_error_offers_no_minus_two_of_its_own(predict):
    body = {"model": "m", "messages": ASK, "options": {"num_predict": predict}}
    with pytest.raises(ApiError) as refused:
        parse_chat(body, "m")
    assert refused.value.param == "options.num_predict"
    message = refused.value.message
    assert "until the context fills" not in message
    assert "-2" not in message
    assert "whole number" in message
    assert "-1 (any number below 0, or 0) for no limit" in message


def test_ollama_num_predict_minus_two_is_minus_one():
    def limit(predict):
        body = {"model": "m", "messages": ASK, "options": {"num_predict": predict}}
        return parse_chat(body, "m").request.max_tokens

    assert limit(-2) == limit(-1) == limit(-7) == limit(0)


def test_completion_shows_a_random_seed_as_llama_server_does(served):
    for seed in ({}, {"seed": -1}, {"seed": 4294967295}):
        status, body = served.post("/completion", {"prompt": "The quick brown fox", "n_predict": 2, **seed})
        assert status == 200, body
        assert body["generation_settings"]["seed"] == 4294967295, seed
    status, body = served.post("/completion", {"prompt": "The quick brown fox", "n_predict": 2, "seed": 7})
    assert status == 200, body
    assert body["generation_settings"]["seed"] == 7
    status, _, payload = served.request("GET", "/slots")  # idle: the settings a request that sets none gets
    assert status == 200, payload
    assert json.loads(payload)[0]["params"]["seed"] == 4294967295
