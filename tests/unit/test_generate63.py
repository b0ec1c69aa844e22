"""Counts and sampling fields against llama-server's:

* ``edgesdk_tokens_predicted_total`` counts what the answers report (``tokens_predicted``), also the end-of-text token
  a complete grammar leaves, which no pass picks (llama-server adds each answer's ``n_decoded``);
* the OpenAI routes take any finite ``temperature``, below 0 greedy, as llama-server takes it on all its routes."""

from __future__ import annotations

import math

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.llama_native import parse_completion_request
from tests.unit.test_serve_metrics_parity37 import read_exposition

GRAMMAR = 'root ::= "yes!"'


def _predicted(completer: Completer) -> float:
    return read_exposition(completer.metrics.render(0, 0, None))[1]["edgesdk_tokens_predicted_total"]


@pytest.mark.parametrize("n_probs", [0, 2])
def test_the_predicted_tokens_counter_counts_a_grammar_s_end_of_text_token(runtime, n_probs):
    """Without n_probs the grammar's end is taken with no pass: its end-of-text token was counted by the answer (5
    tokens for "yes!") but not by /metrics (4). With n_probs a pass picks it, counted by both."""
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    answer = completer.complete(parse_completion_request({"prompt": "Zebra", "n_predict": 20, "grammar": GRAMMAR,
                                                          "n_probs": n_probs}, completer))
    assert (answer.text, answer.finish_reason) == ("yes!", "stop")
    assert answer.tokens[-1] in runtime.tokenizer.eos_token_ids  # the end-of-text token, counted in the answer
    assert _predicted(completer) == answer.completion_tokens
    # an answer ended by its limit counts the same in both, as it did
    limited = completer.complete(parse_text_request({"prompt": "Zebra", "max_tokens": 3, "temperature": 0}))
    assert limited.finish_reason == "length"
    assert _predicted(completer) == answer.completion_tokens + limited.completion_tokens


def test_a_grammar_completed_by_the_limit_s_last_token_counts_no_end_of_text_token(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    answer = completer.complete(parse_completion_request({"prompt": "Zebra", "n_predict": 1,
                                                          "grammar": 'root ::= "y"'}, completer))
    assert (answer.finish_reason, answer.completion_tokens) == ("length", 1)
    assert _predicted(completer) == 1


@pytest.mark.parametrize(("given", "read"), [(-1, 0.0), (-0.5, 0.0), (0, 0.0), (2.5, 2.5), (5, 5.0), (None, None)])
def test_the_openai_routes_take_the_temperature_llama_server_takes(given, read):
    chat = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "temperature": given})
    text = parse_text_request({"prompt": "hi", "temperature": given})
    native = parse_completion_request({"prompt": "hi", "temperature": given})
    assert chat.temperature == text.temperature == native.temperature == read


@pytest.mark.parametrize("wrong", ["hot", True, [1], math.nan, math.inf])
def test_a_temperature_that_is_no_finite_number_is_still_refused(wrong):
    for parse, body in ((parse_chat_request, {"messages": [{"role": "user", "content": "hi"}]}),
                        (parse_text_request, {"prompt": "hi"}), (parse_completion_request, {"prompt": "hi"})):
        with pytest.raises(ApiError) as refused:
            parse({**body, "temperature": wrong})
        assert refused.value.param == "temperature"
        assert "'temperature' must be a finite number (0 or below: greedy)" in refused.value.message
