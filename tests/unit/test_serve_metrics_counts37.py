"""GET /metrics: llama-server's ``prompt_tokens_cached_total`` and ``n_tokens_max`` (server_task_result_metrics::
to_metrics in tools/server/server-task.cpp) counted for every answer whatever ended it (its length, a stop string, the
client leaving), and the ``Process-Start-Time-Unix`` header llama-server sends with the exposition."""

from __future__ import annotations

import http.client
import time

import pytest

from edgesdk.serve.api import parse_text_request
from edgesdk.serve.completion import ClientGone, Completer, ServeDefaults
from edgesdk.serve.llama_native import parse_completion_request
from tests.unit.test_serve_metrics import ask, samples, start
from tests.unit.test_serve_metrics_parity37 import read_exposition

PROMPT = "The quick brown fox jumps over"


def _values(completer: Completer) -> dict[str, float]:
    return read_exposition(completer.metrics.render(0, 0, None))[1]


def test_cached_prompt_tokens_and_the_longest_sequence_are_counted(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    first = completer.complete(parse_text_request({"prompt": PROMPT, "max_tokens": 4, "temperature": 0}))
    # The same prompt again: the KV cache serves all of it but its last token, which is prefilled for its logits.
    second = completer.complete(parse_text_request({"prompt": PROMPT, "max_tokens": 6, "temperature": 0}))
    assert (first.finish_reason, second.finish_reason) == ("length", "length")
    assert (first.cached_tokens, second.cached_tokens) == (0, first.prompt_tokens - 1)
    values = _values(completer)
    assert values["edgesdk_prompt_tokens_cached_total"] == second.cached_tokens
    assert values["edgesdk_prompt_tokens_total"] == first.prompt_tokens + 1
    # An answer of n tokens cut at max_tokens leaves the prompt and n - 1 of them in the KV cache: its last token
    # was picked, never fed back (llama-server's slot does not decode it either).
    longest = second.prompt_tokens + second.completion_tokens - 1
    assert values["edgesdk_n_tokens_max"] == longest == runtime.backend.position


def test_an_answer_ended_by_a_stop_string_is_counted(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    whole = completer.complete(parse_text_request({"prompt": PROMPT, "max_tokens": 8, "temperature": 0}))
    stop = whole.text[len(whole.text) // 2:][:2]
    assert stop.strip(), whole.text  # a stop string the same greedy answer reaches halfway
    cut = completer.complete(parse_text_request({"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                 "stop": [stop]}))
    assert (cut.finish_reason, cut.stop_string) == ("stop", stop)
    assert cut.completion_tokens < whole.completion_tokens
    values = _values(completer)
    # Each pass counted as it ran: the prefill and a decode step per later token, for both answers.
    assert values["edgesdk_tokens_predicted_total"] == whole.completion_tokens + cut.completion_tokens
    assert values["edgesdk_n_decode_total"] == whole.completion_tokens + cut.completion_tokens
    assert values["edgesdk_prompt_tokens_cached_total"] == whole.cached_tokens + cut.cached_tokens == \
        whole.prompt_tokens - 1
    assert values["edgesdk_n_tokens_max"] == whole.prompt_tokens + whole.completion_tokens - 1
    assert values['edgesdk_requests_finished_total{finish_reason="stop"}'] == 1


def test_an_answer_whose_client_left_is_counted(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    warm = completer.complete(parse_text_request({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}))
    asked = []

    def gone() -> bool:  # asked when the turn comes, then after every token: the client leaves after the third
        asked.append(True)
        return len(asked) == 4

    with pytest.raises(ClientGone):
        completer.complete(parse_text_request({"prompt": PROMPT, "max_tokens": 12, "temperature": 0}),
                           client_gone=gone)
    values = _values(completer)
    assert values['edgesdk_requests_finished_total{finish_reason="cancelled"}'] == 1
    assert values["edgesdk_tokens_predicted_total"] == warm.completion_tokens + 3
    assert values["edgesdk_prompt_tokens_cached_total"] == warm.prompt_tokens - 1
    assert values["edgesdk_n_tokens_max"] == warm.prompt_tokens + 3 - 1 == runtime.backend.position


def test_a_prefill_only_request_counts_its_cached_tokens_and_sequence(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    first = completer.complete(parse_completion_request({"prompt": PROMPT, "n_predict": 0}))
    again = completer.complete(parse_completion_request({"prompt": PROMPT + " the", "n_predict": 0}))
    assert (first.completion_tokens, again.cached_tokens) == (0, first.prompt_tokens)
    values = _values(completer)
    assert values["edgesdk_prompt_tokens_cached_total"] == first.prompt_tokens
    assert values["edgesdk_n_tokens_max"] == again.prompt_tokens == runtime.backend.position


def test_metrics_carry_the_server_s_start_as_process_start_time_unix(runtime):
    before = int(time.time())
    server = start(runtime, metrics=True)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        text = response.read().decode()
        connection.close()
    finally:
        server.shutdown()
        server.server_close()
    assert response.status == 200
    header = response.getheader("Process-Start-Time-Unix")
    assert header is not None
    assert header.isdigit()
    assert before <= int(header) <= int(time.time())
    assert "edgesdk_n_tokens_max" in samples(text)


def test_metrics_stay_off_without_the_flag(runtime):
    server = start(runtime, metrics=False)
    try:
        status, _, text = ask(server, "GET", "/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 501  # llama-server's answer where the endpoint is off (not_supported_error)
    assert "--metrics" in text
