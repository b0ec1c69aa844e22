"""serve's Anthropic Messages API (edgesdk/serve/anthropic.py, edgesdk/serve/http_server.py) against Anthropic's
reference: structured outputs (``output_config.format``, the beta's ``output_format``), a failed tool result
(``is_error``), the 529 ``overloaded_error`` of a full queue with its ``Retry-After``, ``mcp_servers`` and
``container`` refused, a tool's required ``input_schema``, and the model cards Anthropic's SDK reads."""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime
from pathlib import Path

import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import PROMPT, HeldHook, Served

MESSAGES = [{"role": "user", "content": "Invent a person."}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def _refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_messages_request({"max_tokens": 8, "messages": MESSAGES, **body})
    assert caught.value.status == 400
    return caught.value


def test_output_config_format_shapes_the_answer_to_its_schema(served):
    """Before, output_config was ignored: the answer was free text that messages.parse could not validate."""
    status, body = served.post("/v1/messages", {"max_tokens": 24, "messages": MESSAGES, "temperature": 0,
                                                "output_config": {"format": {"type": "json_schema",
                                                                             "schema": SCHEMA}}})
    assert status == 200, body
    answer = json.loads(body["content"][0]["text"])
    assert set(answer) == {"ok"}
    assert isinstance(answer["ok"], bool)
    assert body["stop_reason"] == "end_turn"


@pytest.mark.parametrize("field", ["output_config", "output_format"])
def test_both_names_of_the_format_give_the_schema(field):
    fmt = {"type": "json_schema", "schema": SCHEMA}
    body = {"output_config": {"format": fmt, "effort": "low"}} if field == "output_config" else {"output_format": fmt}
    request = parse_messages_request({"max_tokens": 8, "messages": MESSAGES, **body})
    assert request.json_schema is not None
    assert request.schema_param == ("output_config.format" if field == "output_config" else "output_format")


@pytest.mark.parametrize(("body", "param", "named"), [
    ({"output_config": {"format": {"type": "text"}}}, "output_config.format", '"text"'),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "frob"}}}}, "output_config.format.schema",
     "frob"),
    ({"output_config": {"effort": "huge"}}, "output_config.effort", '"huge"'),
    ({"output_config": "json"}, "output_config", '"json"'),
])
def test_a_bad_output_config_is_refused_by_name(body, param, named):
    error = _refused(body)
    assert error.param == param
    assert named in error.message
    assert "response_format" not in error.message


def test_effort_alone_changes_nothing():
    plain = parse_messages_request({"max_tokens": 8, "messages": MESSAGES})
    assert parse_messages_request({"max_tokens": 8, "messages": MESSAGES, "output_config": {"effort": "max"}}) == plain


def _after_call(result: dict) -> list:
    return [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": [CALL]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", **result}]}]


def _result(request) -> str:
    """The tool result's text in the prompt's last message (wrapped in its {"tool_response": ...} object where the
    chat template has no tool role)."""
    content = request.messages[-1]["content"]
    return json.loads(content)["tool_response"]["content"] if content.startswith("{") else content


def test_a_failed_tool_result_reads_as_failed(served):
    """Before, is_error was dropped: a failed call's result read as a success (the same prompt, the same count)."""
    failed = parse_messages_request({"max_tokens": 8, "tools": [TOOL],
                                     "messages": _after_call({"content": "down", "is_error": True})})
    worked = parse_messages_request({"max_tokens": 8, "tools": [TOOL],
                                     "messages": _after_call({"content": "down", "is_error": False})})
    assert _result(failed) == "Error: down"
    assert _result(worked) == "down"
    counts = [served.post("/v1/messages/count_tokens", {"tools": [TOOL], "messages": _after_call(
        {"content": "down", "is_error": value})}) for value in (True, False)]
    assert all(status == 200 for status, _ in counts), counts
    assert counts[0][1]["input_tokens"] > counts[1][1]["input_tokens"]


def test_is_error_must_be_a_boolean():
    error = _refused({"tools": [TOOL], "messages": _after_call({"content": "down", "is_error": "yes"})})
    assert error.param == "messages[2].content[0].is_error"
    assert '"yes"' in error.message


def test_a_full_queue_is_anthropic_s_529_with_retry_after(runtime):
    """Before: 503 overloaded_error without Retry-After; Anthropic's SDK raises OverloadedError on 529 alone."""
    hook = HeldHook()
    server = Served(runtime, ServeDefaults(max_tokens=4, max_waiting=0), hook=hook)
    try:
        results = {}
        first = threading.Thread(target=lambda: results.update(first=server.post(
            "/v1/completions", {"prompt": PROMPT})))
        first.start()
        assert hook.entered.wait(30)
        status, headers, payload = server.request("POST", "/v1/messages", {"max_tokens": 4, "messages": MESSAGES})
        assert status == 529, payload
        assert json.loads(payload)["error"]["type"] == "overloaded_error"
        assert headers.get("Retry-After") == "1"
        status, headers, payload = server.request("POST", "/v1/completions", {"prompt": PROMPT})
        assert status == 503, payload
        assert json.loads(payload)["error"]["code"] == "server_busy"
        assert headers.get("Retry-After") == "1"
        hook.release.set()
        first.join(60)
        assert results["first"][0] == 200
    finally:
        hook.release.set()
        server.close()


@pytest.mark.parametrize(("field", "value", "words"), [
    ("mcp_servers", [{"type": "url", "url": "https://mcp.example.com/sse", "name": "m"}], "no MCP connector"),
    ("container", "container_1", "no code container"),
])
def test_mcp_servers_and_container_are_refused_by_name(served, field, value, words):
    """Before, both were taken and ignored: the answer went on as if their tools or files were there."""
    status, body = served.post("/v1/messages", {"max_tokens": 4, "messages": MESSAGES, field: value})
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert f"'{field}'" in body["error"]["message"]
    assert words in body["error"]["message"]
    assert parse_messages_request({"max_tokens": 4, "messages": MESSAGES, field: None}).max_tokens == 4


def test_a_tool_without_input_schema_is_refused():
    """Before, it was taken as a tool without parameters; Anthropic answers 400 "Field required"."""
    error = _refused({"tools": [TOOL, {"name": "ping"}]})
    assert error.param == "tools[1].input_schema"
    assert "Field required" in error.message


def test_the_readme_says_tool_input_streams_in_pieces():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert "one `input_json_delta` holding a call's whole input" not in readme
    assert "`input_json_delta` pieces" in readme


def test_model_cards_carry_anthropic_s_model_info(served, tiny_bundle):
    """Before, Anthropic's SDK read type, display_name and created_at as None, and the page's has_more, first_id and
    last_id too; OpenAI's fields stay."""
    status, _, payload = served.request("GET", "/v1/models")
    assert status == 200
    page = json.loads(payload)
    assert page["object"] == "list"
    assert page["has_more"] is False
    card = page["data"][0]
    assert page["first_id"] == page["last_id"] == card["id"] == "tiny-host"
    assert card["object"] == "model"
    assert isinstance(card["created"], int)
    assert card["owned_by"] == "edgesdk"
    assert card["type"] == "model"
    assert card["display_name"] == "tiny-host"
    assert RFC3339.fullmatch(card["created_at"]), card["created_at"]
    built = datetime.fromisoformat(tiny_bundle.manifest["created"])
    assert datetime.fromisoformat(card["created_at"].replace("Z", "+00:00")) == built
    status, _, payload = served.request("GET", "/v1/models/tiny-host")
    assert status == 200
    assert {key: json.loads(payload)[key] for key in ("type", "display_name", "created_at")} == \
        {key: card[key] for key in ("type", "display_name", "created_at")}
