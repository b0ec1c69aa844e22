"""An untyped ``"nullable": true`` beside ``anyOf`` / ``oneOf`` admits null, on both chat routes.

voluptuous-openapi (Home Assistant's Ollama and OpenAI integrations) writes ``vol.Any(None, A, B)`` as
``{"anyOf": [A, B], "nullable": true}``: the writer means null to be admitted. OpenAPI 3.0.3 gives ``nullable`` no
say without a ``type``, so both the tools' reading (json_schema.openapi_nullable) and, since it shares that reading,
/api/chat's ``format`` refused the null the schema was written for.
"""

from __future__ import annotations

import json

from edgesdk.runtime.json_schema import lenient_schema, openapi_nullable
from edgesdk.serve import ollama
from edgesdk.serve.api import parse_chat_request
from tests.unit.test_ollama49 import NAME, _accepts

ANY_OF = {"type": "object", "properties": {"when": {"anyOf": [{"type": "string"}, {"type": "integer"}],
                                                    "nullable": True}},
          "required": ["when"], "additionalProperties": False}


def test_a_nullable_any_of_admits_null_in_a_tool_s_arguments():
    tools = [{"type": "function", "function": {"name": "f", "parameters": ANY_OF}}]
    chat = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "tools": tools})
    for when in (None, "noon", 12):
        assert _accepts(chat.tools.schema, json.dumps({"tool_call": {"name": "f", "arguments": {"when": when}}}))
    assert not _accepts(chat.tools.schema, json.dumps({"tool_call": {"name": "f", "arguments": {"when": 1.5}}}))


def test_a_nullable_one_of_admits_null_in_api_chat_s_format():
    schema = {"type": "object", "properties": {"x": {"oneOf": [{"type": "boolean"}], "nullable": True}},
              "required": ["x"]}
    asked = ollama.parse_chat({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "format": schema},
                              NAME)
    assert _accepts(asked.request.json_schema, '{"x":null}')
    assert _accepts(asked.request.json_schema, '{"x":true}')
    assert not _accepts(asked.request.json_schema, '{"x":1}')


def test_the_null_branch_is_added_once_and_other_untyped_schemas_are_left_as_they_are():
    already = {"anyOf": [{"type": "string"}, {"type": "null"}], "nullable": True}
    assert openapi_nullable(already) == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert openapi_nullable({"description": "free", "nullable": True}) == {"description": "free"}
    assert openapi_nullable({"$ref": "#/$defs/a", "nullable": True}) == {"$ref": "#/$defs/a"}
    assert openapi_nullable({"anyOf": [{"type": "string"}], "nullable": False}) == {"anyOf": [{"type": "string"}]}
    lenient = lenient_schema(ANY_OF)[0]["properties"]["when"]
    assert lenient == {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}
