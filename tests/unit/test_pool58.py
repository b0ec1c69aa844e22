"""``edgesdk serve`` with several bundles (serve/model_pool.py): a model named by a value that is no name. Its 400
names the field the value came from: ``model``, or on Ollama's routes the older ``name`` a client sent instead.
Real bundles of two tiny models, a real server over HTTP."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from tests.unit.test_serve_models42 import CHAT, Server, build_named_lively

pytest.importorskip("torch")

A, B = "lively1-host", "lively2-host"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server([build_named_lively(tmp_path_factory.mktemp(f"pool58_{seed}"), seed).path for seed in (1, 2)])
    yield server
    server.close()


@pytest.mark.parametrize(("route", "body"), [
    ("/api/show", {"name": 5}),
    ("/api/chat", {"name": ["x"], "messages": CHAT, "stream": False}),
    ("/api/generate", {"model": "", "name": {"a": 1}, "prompt": "Once", "stream": False}),
])
def test_a_bad_name_in_ollamas_name_field_is_refused_naming_that_field(server, route, body):
    status, answer = server.post(route, body)
    assert status == 400, answer
    message = answer["error"]
    assert message.startswith("'name' must be the name of a served model, got "), message
    assert "'model'" not in message
    assert A in message
    assert B in message


@pytest.mark.parametrize(("route", "body"), [
    ("/api/show", {"model": 5, "name": A}),
    ("/api/chat", {"model": ["x"], "messages": CHAT, "stream": False}),
])
def test_a_bad_name_in_the_model_field_is_refused_naming_model(server, route, body):
    status, answer = server.post(route, body)
    assert status == 400, answer
    assert answer["error"].startswith("'model' must be the name of a served model, got "), answer


def test_the_openai_routes_name_model_as_before(server):
    status, answer = server.post("/v1/chat/completions", {"model": 5, "messages": CHAT})
    assert status == 400, answer
    assert answer["error"]["message"].startswith("'model' must be the name of a served model, got 5")
    assert answer["error"]["param"] == "model"


def test_resolve_names_the_field_in_its_message_and_param(server):
    with pytest.raises(ApiError) as raised:
        server.pool.resolve(5, lambda missing: AssertionError(missing), field="name")
    assert (raised.value.status, raised.value.param) == (400, "name")
    assert raised.value.message.startswith("'name' must be the name of a served model, got 5: one of ")


def test_a_model_that_is_no_name_is_shown_as_json(server):
    """``"model": true`` was told back as ``got True``; the client sent JSON."""
    for value, shown in ((True, "true"), ([None], "[null]"), ({"a": "b"}, '{"a": "b"}')):
        with pytest.raises(ApiError) as raised:
            server.pool.resolve(value, lambda missing: AssertionError(missing))
        assert f"must be the name of a served model, got {shown}: one of " in raised.value.message
