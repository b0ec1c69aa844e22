"""Compatibility details of ``edgesdk serve``, on real servers over tiny bundles:

* ``POST /v1/responses`` streamed: ``response.function_call_arguments.done`` carries the function's ``name`` beside
  ``item_id``, ``output_index``, ``arguments`` and ``sequence_number``, as OpenAI's API sends it (its reference's
  ``ResponseFunctionCallArgumentsDoneEvent``), and the call's ``response.output_item.added`` / ``.done`` items carry
  ``call_id``, ``name``, ``arguments`` and ``status`` as OpenAI's do; the openai client's typed stream reads them.
* llama-server's per-request ``speculative.n_max`` / ``speculative.n_min``: a negative value is clamped to 0 as
  llama-server clamps it (tools/server/server-task.cpp, params_from_json_cmpl: n_min = min(n_max, n_min), then both
  at least 0), not refused; what is no whole number is still refused by name.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("torch")

from openai.types.responses import ResponseStreamEvent  # noqa: E402 (after the skips)

from edgesdk.runtime.speculative import DraftConfig, DraftModel  # noqa: E402
from edgesdk.serve.completion import Completer, ServeDefaults  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402
from tests.unit.test_serve_responses_strict38 import TIME, events_of  # noqa: E402
from tests.unit.test_serve_speculative61 import ROUTES, _open, _Server, _text  # noqa: E402

server, client, no_whitespace = shared.server, shared.client, shared.no_whitespace
runtime = shared.runtime  # the server's bundle (2,048 tokens of context: room for the tool's description)

QUESTION = "What time is it in Oslo?"
FORCED = {"model": "tiny", "input": QUESTION, "tools": [TIME], "tool_choice": "required",
          "parallel_tool_calls": False}
EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


# ------------------------------------------------------------------------------------------- Responses events


def test_a_streamed_call_s_arguments_done_event_names_its_function_as_openai_s(server, no_whitespace):
    events = events_of(server, {**FORCED, "logit_bias": no_whitespace})
    for _, data in events:  # every event still the client's type
        EVENT.validate_json(json.dumps(data))
    (added,) = [data for name, data in events if name == "response.output_item.added"]
    (done,) = [data for name, data in events if name == "response.function_call_arguments.done"]
    (item_done,) = [data for name, data in events if name == "response.output_item.done"]
    call = item_done["item"]
    assert set(done) == {"type", "sequence_number", "item_id", "output_index", "name", "arguments"}
    assert (done["item_id"], done["output_index"], done["name"], done["arguments"]) == \
        (call["id"], 0, "get_time", call["arguments"])
    assert json.loads(done["arguments"]).keys() == {"city"}
    assert added["item"] == {"id": call["id"], "type": "function_call", "status": "in_progress",
                             "call_id": call["call_id"], "name": "get_time", "arguments": ""}
    assert call == {**added["item"], "status": "completed", "arguments": done["arguments"]}
    assert call["call_id"].startswith("call_")
    assert events[-1][1]["response"]["output"] == [call]


def test_the_client_s_typed_stream_reads_the_call_s_name_on_its_arguments_done_event(client, no_whitespace):
    asked = {key: value for key, value in FORCED.items()}
    with client.responses.stream(**asked, extra_body={"logit_bias": no_whitespace}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    (done,) = [event for event in events if event.type == "response.function_call_arguments.done"]
    (call,) = final.output
    assert (done.name, done.arguments, done.item_id) == (call.name, call.arguments, call.id)
    assert (call.name, call.status) == ("get_time", "completed")


# ------------------------------------------------------------------------------------------- speculative.*


SERVER_DRAFT = DraftConfig(max_draft=3, min_draft=1, p_min=0.0)  # serve --draft-max 3 --draft-min 1


@pytest.fixture(scope="module")
def drafting(tiny_bundle):
    """serve --draft (the same bundle), -n 16."""
    model = DraftModel(_open(tiny_bundle).backend, SERVER_DRAFT)
    served = _Server(Completer(_open(tiny_bundle), ServeDefaults(max_tokens=16), draft=model))
    yield served, model
    served.close()


# (the request's fields, the (n_max, n_min) its answer drafts with: llama-server's clamp)
CLAMPED = [
    ({"speculative.n_max": -1}, (0, 0)),
    ({"speculative.n_max": -3, "speculative.n_min": 2}, (0, 0)),
    ({"speculative.n_min": -2}, (3, 0)),
    ({"speculative.n_max": 2, "speculative.n_min": -5.0}, (2, 0)),
    ({"speculative.n_max": -(10 ** 30), "speculative.n_min": -(10 ** 30)}, (0, 0)),
]


@pytest.mark.parametrize(("fields", "expected"), CLAMPED)
def test_a_negative_n_max_or_n_min_is_clamped_to_0_as_llama_server_clamps_it(drafting, fields, expected):
    served, model = drafting
    status, plain = served.request("POST", "/completion", {**ROUTES["/completion"], "speculative.n_max": 0})
    assert status == 200, plain
    before = model.drafted
    status, answer = served.request("POST", "/completion", {**ROUTES["/completion"], **fields})
    assert status == 200, answer
    settings = answer["generation_settings"]
    assert (settings["speculative.n_max"], settings["speculative.n_min"]) == expected
    assert (model.drafted > before) == (expected[0] > 0)  # n_max 0: nothing drafted for this answer
    assert _text("/completion", answer) == _text("/completion", plain)  # a draft changes no token


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_negative_n_max_is_taken_on_every_route(drafting, path):
    served, model = drafting
    before = model.drafted
    status, answer = served.request("POST", path, {**ROUTES[path], "speculative.n_max": -1,
                                                   "speculative.n_min": -1})
    assert status == 200, answer
    assert model.drafted == before


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("speculative.n_max", "-1", "a whole number up to 64 (below 0 taken as 0"),
    ("speculative.n_max", -1.5, "a whole number up to 64 (below 0 taken as 0"),
    ("speculative.n_max", 65, "a whole number up to 64 (below 0 taken as 0"),
    ("speculative.n_min", "2", "a whole number (below 0 taken as 0"),
    ("speculative.n_min", False, "a whole number (below 0 taken as 0"),
    ("speculative.n_min", {"n": 1}, "a whole number (below 0 taken as 0"),
])
def test_what_is_no_whole_number_is_still_refused_naming_field_and_value(drafting, field, value, expected):
    status, body = drafting[0].request("POST", "/completion", {**ROUTES["/completion"], field: value})
    assert status == 400, body
    error = body["error"]
    assert error["param"] == field
    assert f"'{field}' must be {expected}" in error["message"]
    assert "below 0 taken as 0" in error["message"]
    assert f"got {json.dumps(value)}" in error["message"]
