"""Serving leftovers: ``/slots?fail_on_no_slot`` read as llama-server reads it, a non-ASCII API key compared as bytes,
the Responses object's echoed request fields, a tool result's ``tool_call_id``."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.http_server import ApiServer
from tests.unit.test_serve import PROMPT, HeldHook, Served


def _raw_get(port: int, path: str, header: bytes) -> int:
    """The status of ``GET path`` sent with one header line written as raw bytes (as curl sends a UTF-8 key)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        connection.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + header +
                           b"\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("query", ["fail_on_no_slot=0", "fail_on_no_slot=false", "fail_on_no_slot=1"])
def test_slots_fail_on_no_slot_is_on_for_any_value_as_in_llama_server(runtime, query):
    """llama-server turns the 503 on wherever the parameter has a value (``!get_param(...).empty()``): ``=0`` too."""
    hook = HeldHook()
    server = Served(runtime, ServeDefaults(max_tokens=4), hook=hook)
    try:
        results = {}
        running = threading.Thread(target=lambda: results.update(answer=server.post("/completion",
                                                                                    {"prompt": PROMPT})))
        running.start()
        assert hook.entered.wait(30)
        status, _, payload = server.request("GET", f"/slots?{query}")
        assert status == 503, payload
        assert json.loads(payload)["error"]["type"] == "unavailable_error"
        for off in ("/slots", "/slots?fail_on_no_slot", "/slots?fail_on_no_slot="):  # no value: off
            assert server.request("GET", off)[0] == 200, off
        hook.release.set()
        running.join(60)
        assert results["answer"][0] == 200
    finally:
        hook.release.set()
        server.close()


def test_a_non_ascii_api_key_matches_the_utf8_bytes_a_client_sends(runtime):
    """llama-server compares the header's bytes with its --api-key's: a UTF-8 key sent as UTF-8 opens the routes."""
    server = Served(runtime, api_key="clé-secrète")
    try:
        assert _raw_get(server.port, "/v1/models/tiny-host", "Authorization: Bearer clé-secrète".encode()) == 200
        assert _raw_get(server.port, "/v1/models/tiny-host", "x-api-key: clé-secrète".encode()) == 200
        assert _raw_get(server.port, "/v1/models/tiny-host", "Authorization: Bearer clé-secrèt".encode()) == 401
        assert _raw_get(server.port, "/v1/models/tiny-host", "Authorization: Bearer clé-secrète".encode("latin-1")) \
            == 401  # other bytes, as in llama-server
    finally:
        server.close()


def test_an_ascii_api_key_still_matches_among_several(runtime):
    server = Served(runtime, api_key=("one", "twö"))
    try:
        assert _raw_get(server.port, "/v1/models/tiny-host", b"Authorization: Bearer one") == 200
        assert _raw_get(server.port, "/v1/models/tiny-host", "Authorization: Bearer twö".encode()) == 200
        assert _raw_get(server.port, "/v1/models/tiny-host", b"Authorization: Bearer three") == 401
    finally:
        server.close()


def test_a_key_without_a_utf8_form_is_refused_at_start_without_showing_it(runtime):
    from edgesdk.serve.completion import Completer

    with pytest.raises(EdgeSDKError) as caught:
        ApiServer(("127.0.0.1", 0), Completer(runtime, ServeDefaults(max_tokens=4)), "tiny-host",
                  api_key=("fine", "bad\ud800key"), log=False)
    assert "API key 2 of 2 has no UTF-8 form" in caught.value.problem
    assert "bad" not in str(caught.value)


IDENTIFIERS = {"user": "user-42", "safety_identifier": "sha-abc", "prompt_cache_key": "chat-7"}


def test_a_response_repeats_the_request_s_identifiers_and_service_tier(served):
    """OpenAI's Response object (the openai client's ``Response``) carries ``user``, ``safety_identifier``,
    ``prompt_cache_key`` and the ``service_tier`` that served it; whole, streamed and kept alike."""
    body = {"model": "tiny-host", "input": PROMPT, "max_output_tokens": 3, "service_tier": "auto", **IDENTIFIERS}
    status, whole = served.post("/v1/responses", body)
    assert status == 200, whole
    assert {name: whole[name] for name in IDENTIFIERS} == IDENTIFIERS
    assert whole["service_tier"] == "default"
    status, _, kept = served.request("GET", f"/v1/responses/{whole['id']}")
    assert status == 200
    assert {name: json.loads(kept)[name] for name in (*IDENTIFIERS, "service_tier")} == \
        {**IDENTIFIERS, "service_tier": "default"}
    status, _, payload = served.request("POST", "/v1/responses", {**body, "stream": True, "store": False})
    assert status == 200
    events = [json.loads(line[len("data: "):]) for line in payload.decode().splitlines() if line.startswith("data: ")]
    created, last = events[0]["response"], events[-1]["response"]
    for response in (created, last):
        assert {name: response[name] for name in IDENTIFIERS} == IDENTIFIERS
        assert response["service_tier"] == "default"


def test_a_response_without_identifiers_gives_them_null(served):
    status, whole = served.post("/v1/responses", {"model": "tiny-host", "input": PROMPT, "max_output_tokens": 3})
    assert status == 200, whole
    assert [whole[name] for name in IDENTIFIERS] == [None, None, None]
    assert whole["service_tier"] == "default"


@pytest.mark.parametrize(("field", "value"), [("user", 42), ("safety_identifier", {"id": 1}),
                                              ("prompt_cache_key", ["a"]), ("service_tier", 1)])
def test_an_identifier_the_response_cannot_repeat_is_refused_by_name(served, field, value):
    status, body = served.post("/v1/responses", {"model": "tiny-host", "input": PROMPT, field: value})
    assert status == 400, body
    assert body["error"]["param"] == field
    assert field in body["error"]["message"]


def test_a_tool_result_carries_the_id_of_the_call_it_answers():
    """llama.cpp's polyfill writes a tool result's ``tool_call_id`` into its ``tool_response``: two results of one
    tool (parallel calls) then say which call each answers; without an id the text is as before."""
    from edgesdk.serve.tools import is_tool_result, tool_result_text

    first, second = tool_result_text("get_time", "09:00", "call_a"), tool_result_text("get_time", "10:00", "call_b")
    assert json.loads(first) == {"tool_response": {"tool": "get_time", "content": "09:00", "tool_call_id": "call_a"}}
    assert json.loads(second)["tool_response"]["tool_call_id"] == "call_b"
    assert is_tool_result(first)
    assert is_tool_result(second)
    assert json.loads(tool_result_text("get_time", "09:00")) == {"tool_response": {"tool": "get_time",
                                                                                    "content": "09:00"}}


@pytest.mark.parametrize("key", ["voilà", "ÅÅ", "ключх"])
def test_a_key_whose_last_utf8_byte_reads_as_latin1_space_still_matches(runtime, key):
    """à is C3 A0 and х D1 85: read as ISO-8859-1, the header ends in NBSP or NEL, which str.strip took off."""
    server = Served(runtime, api_key=key)
    try:
        assert _raw_get(server.port, "/v1/models/tiny-host", f"Authorization: Bearer {key}".encode()) == 200
    finally:
        server.close()

