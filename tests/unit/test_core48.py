"""The completion routes' fields as llama-server reads them, against a real server of the tiny bundle.

- ``max_completion_tokens`` is the token limit on ``POST /completion`` too, as llama-server reads it on every
  completion route (tools/server/server-task.cpp, ``params_from_json_cmpl``: ``n_predict`` <-
  ``max_completion_tokens`` <- ``max_tokens``); it was ignored there, and the answer ran to the server's limit.
- ``/v1/completions`` takes any number of stop strings, as llama-server's does (server-common.cpp,
  ``oaicompat_completion_params_parse``); lm-evaluation-harness's ``local-completions`` sends a task's whole
  ``until`` list (HumanEval's five stops and the end-of-text text), which a limit of OpenAI's 4 refused with a 400.
- llama-server's ``min_keep`` (its top-p and min-p keep at least that many tokens: src/llama-sampling.cpp) was
  accepted and dropped without a word; this runtime's samplers keep one token, as min_keep 0 or 1 does, so a larger
  value is refused by name.
- ``POST /completion`` took no ``top_k`` below 0, which llama-server takes as the top-k sampler off (llama.cpp's
  ``llama_sampler_top_k_impl``: any k <= 0), as clients written for vLLM send -1: a 400 on a valid request.
"""

from __future__ import annotations

import pytest

PROMPT = "Hello there"  # the tiny bundle's greedy answer to it runs to any limit: never an end-of-text token


def test_max_completion_tokens_limits_the_answer_on_completion(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "max_completion_tokens": 3})
    assert status == 200, body
    assert body["tokens_predicted"] == 3  # not the server's 16
    assert body["generation_settings"]["n_predict"] == 3
    # it wins over max_tokens, as in llama-server
    status, body = served.post("/completion", {"prompt": PROMPT, "max_completion_tokens": 2, "max_tokens": 5})
    assert status == 200, body
    assert body["tokens_predicted"] == 2


def test_n_predict_wins_over_max_completion_tokens_on_completion(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 4, "max_completion_tokens": 2})
    assert status == 200, body
    assert body["tokens_predicted"] == 4
    assert body["generation_settings"]["n_predict"] == 4


def test_a_bad_max_completion_tokens_is_refused_by_name_on_completion(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "max_completion_tokens": "three"})
    assert status == 400, body
    assert body["error"]["param"] == "max_completion_tokens"
    assert "'max_completion_tokens' must be" in body["error"]["message"]


def test_text_completions_take_more_than_four_stop_strings(served):
    prompt = "Grouped-query attention"  # the tiny bundle's greedy answer to it is plain text ("w]w]w")
    _, plain = served.post("/v1/completions", {"prompt": prompt, "max_tokens": 5})
    answer = plain["choices"][0]["text"]
    assert answer.isascii(), answer
    assert len(answer) >= 2, answer
    stops = ["\nclass", "\ndef", "\n#", "\nif", "\nprint", answer[1]]  # HumanEval's until, and a stop the answer meets
    before = answer[:answer.index(answer[1])]  # the answer up to that stop
    assert before, answer  # a stop at the answer's very start would test the empty-text case instead
    status, body = served.post("/v1/completions", {"prompt": prompt, "max_tokens": 5, "stop": stops})
    assert status == 200, body
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (before, "stop")
    # streamed, the same
    events = served.stream("/v1/completions", {"prompt": prompt, "max_tokens": 5, "stop": stops})
    assert "".join(event["choices"][0]["text"] for event in events[:-1]) == before
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_chat_keeps_openai_s_four_stop_strings(served):
    status, body = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "stop": ["a", "b", "c", "d", "e"]})
    assert status == 400, body
    assert body["error"]["param"] == "stop"
    assert "at most 4 strings" in body["error"]["message"]


def test_text_completions_still_refuse_a_stop_that_is_not_strings(served):
    status, body = served.post("/v1/completions", {"prompt": PROMPT, "stop": ["a", 5]})
    assert status == 400, body
    assert body["error"]["param"] == "stop"
    assert "'stop' must be a string or an array of strings" in body["error"]["message"]


@pytest.mark.parametrize("route", ["/completion", "/v1/completions", "/v1/chat/completions"])
def test_a_min_keep_the_samplers_cannot_honour_is_refused_by_name(served, route):
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": PROMPT}
    status, answer = served.post(route, {**body, "max_tokens": 2, "min_keep": 5, "top_p": 0.5, "temperature": 1})
    assert status == 400, answer
    error = answer["error"]
    assert (error["param"], error["code"]) == ("min_keep", "unsupported_parameter")
    assert "'min_keep' = 5 is not supported" in error["message"]
    assert "leave 'min_keep' out" in error["message"]


@pytest.mark.parametrize("keep", [0, 1, None])
def test_a_min_keep_of_one_token_or_none_is_taken(served, keep):
    request = {"prompt": PROMPT, "n_predict": 2, "return_tokens": True}
    _, plain = served.post("/completion", request)  # the greedy answer without min_keep
    status, answer = served.post("/completion", {**request, "min_keep": keep})
    assert status == 200, answer
    assert (answer["content"], answer["tokens"]) == (plain["content"], plain["tokens"])
    assert len(answer["tokens"]) == 2


def test_completion_takes_a_negative_top_k_as_top_k_off(served):
    sampled = {"prompt": PROMPT, "n_predict": 6, "temperature": 1.5, "seed": 3, "return_tokens": True}
    status, off = served.post("/completion", {**sampled, "top_k": 0})
    assert status == 200, off
    for negative in (-1, -40, -1.0):
        status, answer = served.post("/completion", {**sampled, "top_k": negative})
        assert status == 200, answer
        assert answer["tokens"] == off["tokens"]
        assert answer["generation_settings"]["top_k"] == 0
    status, answer = served.post("/completion", {**sampled, "top_k": -1.5})  # not a whole number: still refused
    assert status == 400, answer
    assert answer["error"]["param"] == "top_k"


def test_the_openai_routes_take_a_negative_top_k_as_off_and_anthropic_s_refuses_it():
    """llama-server reads top_k <= 0 as the sampler off on every route (llama_sampler_top_k_impl), and clients written
    for vLLM send -1 for "off" to /v1/chat/completions and /v1/completions too; Anthropic's Messages API takes
    top_k >= 0 only, so /v1/messages still refuses it, naming its range."""
    from edgesdk.serve import anthropic
    from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request

    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for top_k in (-1, -40, -1.0):
        assert parse_chat_request({**chat, "top_k": top_k}).top_k == 0
        assert parse_text_request({"prompt": "hi", "top_k": top_k}).top_k == 0
    with pytest.raises(ApiError, match=r"'top_k' must be a whole number >= 0 \(Anthropic's range\)"):
        anthropic.parse_messages_request({**chat, "max_tokens": 4, "top_k": -1})
    with pytest.raises(ApiError, match="'top_k' must be a whole number"):
        parse_chat_request({**chat, "top_k": 1.5})
