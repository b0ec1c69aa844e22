"""Streamed events as llama-server and Ollama send them, over real HTTP against the tiny bundle."""

from __future__ import annotations

import json

PROMPT = "The quick brown fox"


def _sse(served, path: str, body: dict) -> list[dict]:
    status, headers, payload = served.request("POST", path, body)
    assert status == 200, payload
    assert headers["Content-Type"] == "text/event-stream"
    return [json.loads(block[len("data: "):]) for block in payload.decode().split("\n\n")
            if block and block != "data: [DONE]"]


def test_completion_partial_events_carry_llama_server_s_token_counts(served):
    """llama-server's every partial result carries ``tokens_predicted`` (its n_decoded so far) and
    ``tokens_evaluated`` (the prompt's tokens): server-task.cpp ``to_json_non_oaicompat``."""
    events = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 6, "stream": True})
    *pieces, last = events
    assert pieces
    assert last["stop"] is True
    sent = 0
    for event in pieces:
        sent += len(event["tokens"])
        assert (event["stop"], event["id_slot"], event["index"]) == (False, 0, 0)
        assert event["tokens_predicted"] == sent
        assert event["tokens_evaluated"] == last["tokens_evaluated"]
    assert pieces[-1]["tokens_predicted"] == last["tokens_predicted"] == 6


def test_each_prompt_of_several_counts_its_own_tokens(served):
    events = _sse(served, "/completion", {"prompt": [PROMPT, "Edge boards run"], "n_predict": 3, "stream": True})
    finals = [event for event in events if event["stop"]]
    assert [event["index"] for event in finals] == [0, 1]
    for index, final in enumerate(finals):
        pieces = [event for event in events if not event["stop"] and event["index"] == index]
        counts, sent = [], 0
        for event in pieces:
            sent += len(event["tokens"])
            counts.append(sent)
        assert [event["tokens_predicted"] for event in pieces] == counts
        assert counts[-1] == final["tokens_predicted"]
        assert {event["tokens_evaluated"] for event in pieces} == {final["tokens_evaluated"]}
    assert finals[0]["tokens_evaluated"] != finals[1]["tokens_evaluated"]


def test_timings_per_token_puts_the_timings_so_far_on_every_event(served):
    """``timings_per_token``: each partial result carries the slot's timings (server-context.cpp
    ``send_partial_response``), counted as the last event's are."""
    plain = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 5, "stream": True})
    assert not any("timings" in event or "prompt_progress" in event for event in plain[:-1])
    *pieces, last = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 5, "stream": True,
                                                 "timings_per_token": True, "cache_prompt": False})
    assert pieces
    for event in pieces:
        timings = event["timings"]
        assert timings["predicted_n"] == event["tokens_predicted"]
        assert timings["prompt_n"] + timings["cache_n"] == event["tokens_evaluated"]
        assert timings["prompt_ms"] > 0
        assert timings["predicted_ms"] > 0
        assert timings["predicted_per_second"] > 0
    assert pieces[-1]["timings"]["predicted_n"] == last["timings"]["predicted_n"] == 5
    assert pieces[-1]["timings"]["prompt_ms"] <= last["timings"]["prompt_ms"] * 1.5 + 5
    assert [event["timings"]["predicted_ms"] for event in pieces] == \
        sorted(event["timings"]["predicted_ms"] for event in pieces)


def test_return_progress_sends_the_prompt_s_progress_before_the_answer(served):
    """``return_progress``: a partial result with ``prompt_progress`` (total, cache, processed, time_ms) and no text
    or token, ahead of the answer's (server-context.cpp ``send_partial_response(slot, {}, true)``)."""
    first = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 3, "stream": True})[-1]
    # the same prompt again: the KV cache serves all but its last token
    events = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 3, "stream": True, "return_progress": True})
    progress, *pieces, last = events
    assert (progress["content"], progress["tokens"], progress["stop"]) == ("", [], False)
    assert progress["tokens_predicted"] == 0
    assert progress["tokens_evaluated"] == first["tokens_evaluated"] == last["tokens_evaluated"]
    shown = progress["prompt_progress"]
    assert shown["total"] == shown["processed"] == last["tokens_evaluated"]
    assert shown["cache"] == last["timings"]["cache_n"] > 0
    assert shown["time_ms"] >= 0
    assert "timings" not in progress
    assert all("prompt_progress" not in event for event in pieces)
    assert "".join(event["content"] for event in pieces) == \
        "".join(event["content"] for event in _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 3,
                                                                           "stream": True})[:-1])
    # no answer token (n_predict 0): the progress, then the last event
    progress, last = _sse(served, "/completion", {"prompt": "Edge boards", "n_predict": 0, "stream": True,
                                                  "return_progress": True, "timings_per_token": True})
    assert progress["prompt_progress"]["processed"] == last["tokens_evaluated"]
    assert progress["timings"]["predicted_n"] == 0
    assert last["stop"] is True


def test_stream_flags_that_are_not_booleans_are_refused_by_name(served):
    for name in ("timings_per_token", "return_progress"):
        status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "stream": True, name: "yes"})
        assert status == 400, body
        assert f"'{name}' must be true or false" in body["error"]["message"]
