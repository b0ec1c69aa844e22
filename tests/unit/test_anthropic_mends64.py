"""serve's Anthropic Messages API (edgesdk/serve/anthropic.py) mended: an MCP server's ``authorization_token`` is
not quoted back in the ``mcp_servers`` refusal, a ``tool_result`` answering no ``tool_use`` is refused at the
client's own block in Anthropic's words, and a bad ``output_config.format`` schema is named at its ``schema``."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import ApiError
from tests.unit.test_anthropic64 import CALL, TOOL, runtime, served  # noqa: F401 (runtime: served's fixture)

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOKEN = "sk-ant-SECRET-0123456789"


def _refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_messages_request({"max_tokens": 8, "messages": MESSAGES, **body})
    assert caught.value.status == 400
    return caught.value


def test_an_mcp_server_s_token_is_not_echoed_in_the_refusal(served):  # noqa: F811
    """Before, the refusal quoted the value: ``got [{"authorization_token": "sk-ant-SECRET...``, in the 400 and in
    the server's log."""
    servers = [{"authorization_token": TOKEN, "type": "url", "url": "https://mcp.example.com/sse", "name": "weather"},
               {"type": "url", "url": "https://mcp.example.com/other", "name": "files", "authorization_token": TOKEN}]
    status, headers, payload = served.request("POST", "/v1/messages", {"max_tokens": 8, "messages": MESSAGES,
                                                                      "mcp_servers": servers})
    assert status == 400, payload
    text = payload.decode() if isinstance(payload, bytes) else str(payload)
    assert "SECRET" not in text
    assert "mcp.example.com" not in text
    message = json.loads(text)["error"]["message"]
    assert "got 2 MCP servers" in message
    assert '"weather"' in message
    assert '"files"' in message


@pytest.mark.parametrize(("value", "words"), [
    ({"id": "container_1", "skills": [{"type": "custom", "skill_id": TOKEN}]}, 'fields "id", "skills"'),
    (TOKEN, "a string (a container id)"),
])
def test_a_container_is_described_by_its_type_alone(value, words):
    error = _refused({"container": value})
    assert error.param == "container"
    assert words in error.message
    assert "SECRET" not in error.message
    assert "container_1" not in error.message


def test_an_unknown_tool_use_id_is_refused_at_the_client_s_block_in_anthropic_s_words():
    """Before: ``messages[3].tool_call_id "toolu_X" names no call made before it (messages[2].tool_calls ...)``,
    OpenAI's field names at the converted message's index (the system prompt counted), not the block sent."""
    error = _refused({"system": "Be brief.", "tools": [TOOL], "messages": [
        MESSAGES[0], {"role": "assistant", "content": [CALL]},
        {"role": "user", "content": [{"type": "text", "text": "here:"},
                                     {"type": "tool_result", "tool_use_id": "toolu_X", "content": "sunny"}]}]})
    assert error.param == "messages[2].content[1].tool_use_id"
    assert error.message.startswith("messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: "
                                    '"toolu_X". Each `tool_result` block must have a corresponding `tool_use` block')
    assert '"toolu_1"' in error.message
    assert "tool_call" not in error.message


def test_a_known_tool_use_id_is_taken():
    request = parse_messages_request({"max_tokens": 8, "tools": [TOOL], "messages": [
        MESSAGES[0], {"role": "assistant", "content": [CALL]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]})
    assert "toolu_1" in json.dumps(request.messages[-1])
    assert "sunny" in json.dumps(request.messages[-1])


@pytest.mark.parametrize("field", ["output_config", "output_format"])
def test_a_bad_output_schema_is_named_at_its_schema(field):
    """Before: ``output_config.format: $.properties...``, but the schema is at ``output_config.format.schema``."""
    output = {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}
    error = _refused({"output_config": {"format": output}} if field == "output_config" else {"output_format": output})
    expected = "output_config.format.schema" if field == "output_config" else "output_format.schema"
    assert error.param == expected
    assert error.message.startswith(f"{expected}: $.properties.a.type")
