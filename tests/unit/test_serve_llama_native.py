"""llama-server's own ``POST /completion`` on ``edgesdk serve``, over real HTTP against the tiny bundle."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_serve import Served

PROMPT = "The quick brown fox"


def _openai_text(server: Served, **fields) -> dict:
    status, body = server.post("/v1/completions", {"prompt": PROMPT, **fields})
    assert status == 200, body
    return body


def test_an_answer_is_the_openai_route_s_text_with_llama_server_s_fields(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 8})
    assert status == 200, body
    expected = _openai_text(served, max_tokens=8)
    assert body["content"] == expected["choices"][0]["text"]
    assert (body["stop"], body["stop_type"], body["stopping_word"], body["truncated"]) == (True, "limit", "", False)
    assert body["tokens_predicted"] == 8
    assert body["tokens_evaluated"] == expected["usage"]["prompt_tokens"]
    assert body["generation_settings"]["n_predict"] == 8
    assert body["generation_settings"]["seed"] == 4294967295  # LLAMA_DEFAULT_SEED, as llama-server shows it
    timings = body["timings"]
    assert timings["predicted_n"] == 8
    assert timings["prompt_n"] + timings["cache_n"] == body["tokens_evaluated"]
    assert timings["prompt_ms"] > 0
    assert timings["predicted_ms"] > 0
    assert timings["predicted_per_second"] == pytest.approx(8 * 1e3 / timings["predicted_ms"], rel=1e-2)


def test_a_stream_is_content_events_then_one_with_the_whole_answer_s_fields(served):
    whole = served.post("/completion", {"prompt": PROMPT, "n_predict": 8})[1]
    status, headers, payload = served.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 8,
                                                                      "stream": True})
    assert status == 200, payload
    assert headers["Content-Type"] == "text/event-stream"
    events = [json.loads(block[len("data: "):]) for block in payload.decode().split("\n\n") if block]
    *pieces, last = events
    assert all(event["stop"] is False and event["content"] for event in pieces)
    assert "".join(event["content"] for event in pieces) == whole["content"]
    assert last["stop"] is True
    assert last["content"] == ""
    assert (last["stop_type"], last["tokens_predicted"], last["timings"]["predicted_n"]) == ("limit", 8, 8)
    assert b"[DONE]" not in payload


def test_stop_types_name_the_stop_string_and_the_end_of_the_answer(served, runtime):
    answer = served.post("/completion", {"prompt": PROMPT, "n_predict": 12})[1]["content"]
    word = answer[4:7]
    assert word
    assert answer.find(word) >= 0
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 12, "stop": [word]})
    assert status == 200, body
    assert (body["stop_type"], body["stopping_word"]) == ("word", word)
    assert body["content"] == answer[:answer.find(word)]
    # a grammar that ends the answer: the end-of-text token, with -1 meaning up to the context
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": -1, "grammar": 'root ::= "yes"'})
    assert status == 200, body
    assert (body["content"], body["stop_type"]) == ("yes", "eos")
    assert body["generation_settings"]["n_predict"] == -1  # as asked, as llama-server shows params.n_predict


def test_token_ids_are_a_prompt_too(served, runtime):
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)
    by_ids = served.post("/completion", {"prompt": ids, "n_predict": 6})[1]
    by_text = served.post("/completion", {"prompt": PROMPT, "n_predict": 6})[1]
    assert by_ids["content"] == by_text["content"]
    assert by_ids["prompt"] == by_text["prompt"] == PROMPT


@pytest.mark.parametrize(("field", "value", "message"), [
    ("mirostat", 2, "'mirostat' = 2 is not supported: this server does not have that sampler; leave 'mirostat' out or set it to 0"),
    ("typical_p", 0.9, "'typical_p' = 0.9 is not supported"),
    ("n_predict", -3, "'n_predict' must be the most tokens to generate (>= 1; 0 evaluates the prompt"),
    ("n_predict", -2, "got -2"),
    ("temperature", "hot", "'temperature' must be a finite number"),  # below 0 is greedy, no upper bound
])
def test_settings_this_runtime_cannot_honour_are_refused_by_name(served, field, value, message):
    status, body = served.post("/completion", {"prompt": PROMPT, field: value})
    assert status == 400, body
    assert body["error"]["param"] == field
    assert message in body["error"]["message"]


def test_off_values_and_llama_cpp_s_own_tuning_fields_are_accepted(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 4, "mirostat": 0, "n_probs": 0,
                                               "typical_p": 1.0, "n_keep": 8, "id_slot": -1, "cache_prompt": True})
    assert status == 200, body
    assert body["tokens_predicted"] == 4


def test_the_route_needs_the_key(runtime):
    server = Served(runtime, api_key="sesame")
    try:
        assert server.post("/completion", {"prompt": PROMPT, "n_predict": 2})[0] == 401
        status, body = server.post("/completion", {"prompt": PROMPT, "n_predict": 2},
                                   headers={"Authorization": "Bearer sesame"})
        assert status == 200, body
    finally:
        server.close()


def test_openai_answers_carry_llama_server_s_timings_too(served):
    """llama.cpp's web UI shows speed from the timings of the chat answer (its last chunk when streamed)."""
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6}
    status, chat = served.post("/v1/chat/completions", body)
    assert status == 200, chat
    assert chat["timings"]["predicted_n"] == chat["usage"]["completion_tokens"]
    assert chat["timings"]["prompt_n"] + chat["timings"]["cache_n"] == chat["usage"]["prompt_tokens"]
    chunks = served.stream("/v1/chat/completions", body)
    finished = [chunk for chunk in chunks[:-1] if chunk["choices"] and chunk["choices"][0]["finish_reason"]]
    assert len(finished) == 1
    assert finished[0]["timings"]["predicted_n"] == chat["usage"]["completion_tokens"]
    assert all("timings" not in chunk for chunk in chunks[:-1] if chunk is not finished[0])


def test_an_answer_stopped_by_a_full_context_is_truncated(served):
    """llama-server's process_token marks a slot that ran out of context ``truncated``, not only a shifted one."""
    context = served.completer.runtime.backend.max_context
    ids = [served.completer.runtime.tokenizer.encode("a", add_special_tokens=False)[0]] * (context - 3)
    status, body = served.post("/completion", {"prompt": ids, "n_predict": 50, "ignore_eos": True})
    assert status == 200, body
    assert body["truncated"] is True
    assert body["tokens_predicted"] < 50
    status, body = served.post("/completion", {"prompt": ids, "n_predict": 2, "ignore_eos": True})
    assert status == 200, body
    assert body["truncated"] is False
