"""Mends to the serve and power-gate changes (63rd review).

* The server's metrics counted a complete grammar's end-of-text token by a rule of their own, which the answer did not
  follow where the vocabulary has no end-of-text token: ``predicted_tokens`` one more than the answer's
  ``tokens_predicted``. The metrics count it where the answer appends it.
* ``Model.set_compute_budget`` with an int too large for a float let a bare OverflowError out; it is a RequestError
  naming ``budget``.
* A gate option refused on a bundle without gates was quoted rounded to six digits (``--compute-budget 0.123457``
  for 0.1234567); it is quoted whole.
* A function_call in ``input`` with the call_id of the previous response's unanswered call was told it "repeats"
  that call even where it calls another function or other arguments; it is told it reuses the call_id.
* ``edgesdk.load(plain_bundle, compute_budget=0.5)`` said "this one has none" without naming the bundle.

Real tiny bundles (one built with the power stage), a real server on a free port.
"""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.api_checks import gate_options_given
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.api import ApiError
from edgesdk.serve.response_store import ResponseStore, kept_items
from edgesdk.serve.responses import parse_responses_request
from tests.unit.test_power_export import power_bundle  # noqa: F401  (the fixture: a tiny power-gated bundle)
from tests.unit.test_serve import Served

ASK = {"role": "user", "content": "Weather in Oslo?"}
TOOLS = [{"type": "function", "name": name, "parameters": {"type": "object"}} for name in ("weather", "delete_file")]


def test_metrics_count_the_tokens_the_answer_counts_where_the_vocabulary_has_no_end_of_text_token(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.eos_token_ids = set()  # a vocabulary without an end-of-text token: none is sampled or counted
    server = Served(runtime)
    try:
        before = server.completer.metrics.predicted_tokens
        status, answer = server.post("/completion", {"prompt": "The quick brown fox", "n_predict": 8,
                                                     "grammar": 'root ::= "ab"', "temperature": 0,
                                                     "return_tokens": True})
        assert status == 200, answer
        assert answer["content"] == "ab"
        assert answer["tokens_predicted"] == len(answer["tokens"])
        assert server.completer.metrics.predicted_tokens - before == answer["tokens_predicted"]
    finally:
        server.close()


def test_a_budget_too_large_for_a_float_is_refused_naming_it(power_bundle):  # noqa: F811
    with edgesdk.load(power_bundle.path, threads=1, gating=True) as model:
        with pytest.raises(RequestError) as refused:
            model.set_compute_budget(10**400)
        assert refused.value.param == "budget"
        assert "set_compute_budget (budget): budget is 1000" in refused.value.problem
        assert "0 < B <= 1" in refused.value.fix


def test_gate_options_are_quoted_whole():
    assert gate_options_given(1.2345678, 0.1234567, True) == ["--entropy-target 1.2345678",
                                                              "--compute-budget 0.1234567", "--gating"]


def _store_with_a_call() -> ResponseStore:
    store = ResponseStore(4, 1 << 20)
    made = {"type": "function_call", "call_id": "call_0", "name": "weather", "arguments": '{"city": "Oslo"}',
            "id": "fc_1", "status": "completed"}
    store.put({"id": "resp_1", "status": "completed", "output": [made]}, tuple(kept_items([ASK])))
    return store


def _refusal(call: dict) -> ApiError:
    call = {"type": "function_call", "call_id": "call_0", **call}
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"previous_response_id": "resp_1", "tools": TOOLS,
                                 "input": [call, {"type": "function_call_output", "call_id": "call_0",
                                                  "output": "12 C"}]}, _store_with_a_call())
    assert (caught.value.status, caught.value.param) == (400, "input[0].call_id")
    return caught.value


def test_the_previous_response_s_call_sent_again_is_told_it_repeats_it():
    message = _refusal({"name": "weather", "arguments": '{"city": "Oslo"}'}).message
    assert "repeats the function_call of the response previous_response_id names" in message


@pytest.mark.parametrize(("call", "differs"), [
    ({"name": "delete_file", "arguments": '{"city": "Oslo"}'}, 'calls "delete_file", that call "weather"'),
    ({"name": "weather", "arguments": '{"city": "Rome"}'}, 'calls "weather" with other arguments than that call\'s'),
], ids=["name", "arguments"])
def test_another_call_with_the_previous_response_s_call_id_is_told_it_reuses_the_id(call, differs):
    message = _refusal(call).message
    assert "repeats" not in message
    assert 'Duplicate function call id: input[0].call_id = "call_0" is the call_id of the function_call of the ' \
           "response previous_response_id names" in message
    assert differs in message
    assert "give this call a new call_id" in message


def test_load_names_the_bundle_without_gates(tiny_bundle):
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tiny_bundle.path, threads=1, compute_budget=0.5)
    assert refused.value.problem.startswith("load(): compute_budget=0.5: needs a bundle with power gates, and "
                                            f"{tiny_bundle.path} has none")
    assert "edgesdk build --target T --recipe power" in refused.value.fix
