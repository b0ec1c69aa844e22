"""edgesdk/api.py and edgesdk/api_checks.py as a caller of llama-cpp-python's ``Llama`` sends a field to the wrong
completion method: a chat field given to ``create_completion`` and a completion field given to
``create_chat_completion`` name the method that takes it, in the Python API's terms. The route's parser refused some
of them naming HTTP routes and fields Python has not (chat's ``suffix``: "send the text after the cursor to /infill
as 'input_suffix'", completions' ``tools``: "they belong to /v1/chat/completions"), and ``refuse_unread`` told others
the field closest by spelling (``reasoning_format``: "did you mean 'response_format'?"), or a field the method then
refuses (chat's ``input_suffix``: "did you mean 'suffix'?")."""

from __future__ import annotations

import re

import pytest

import edgesdk
from edgesdk.api import RequestError

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=2) as loaded:
        yield loaded


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("field", "value"), [("tools", TOOLS), ("tool_choice", "auto"), ("reasoning_format", "none"),
                                              ("chat_template_kwargs", {"enable_thinking": False}),
                                              ("parallel_tool_calls", False)])
def test_a_chat_field_given_to_create_completion_names_create_chat_completion(model, field, value, stream):
    with pytest.raises(RequestError) as refused:
        model.create_completion("Once", stream=stream, **{field: value})
    message = str(refused.value)
    assert f"create_completion() takes no field '{field}' (create_chat_completion's field: " in message
    assert "/v1/" not in message  # no HTTP route
    assert "did you mean" not in message  # no field by spelling
    assert refused.value.param == field
    assert refused.value.fix == f"send {field} to create_chat_completion, or leave {field} out of create_completion"
    assert not model._completer.busy


@pytest.mark.parametrize("field", ["functions", "function_call"])
def test_openai_legacy_functions_given_to_create_completion_are_sent_to_chat_as_tools(model, field):
    value = [TOOLS[0]["function"]] if field == "functions" else "auto"
    with pytest.raises(RequestError) as refused:
        model.create_completion("Once", **{field: value})
    assert f"takes no field '{field}' (OpenAI's legacy chat field: call create_chat_completion(messages, " \
           "tools=[...]" in str(refused.value)
    assert "/v1/completions" not in str(refused.value)
    assert refused.value.fix == f"send tools (and tool_choice) to create_chat_completion, or leave {field} out of " \
                                "create_completion"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("field", "value", "call"), [("suffix", "end", "create_completion(prompt, suffix)"),
                                                      ("echo", True, "create_completion(prompt, echo=True)")])
def test_a_completion_field_given_to_create_chat_completion_names_create_completion(model, field, value, call, stream):
    with pytest.raises(RequestError) as refused:
        model.create_chat_completion(MESSAGES, stream=stream, **{field: value})
    message = str(refused.value)
    assert f"create_chat_completion() takes no field '{field}' (create_completion's field: call {call}" in message
    assert not [words for words in ("/infill", "input_suffix", "/v1/") if words in message]
    assert refused.value.param == field
    assert refused.value.fix == f"send {field} to create_completion, or leave {field} out of create_chat_completion"


def test_a_misspelt_chat_field_is_not_told_a_field_chat_refuses(model):
    # llama-server's /infill field: its closest chat field by spelling was suffix, which chat then refuses
    with pytest.raises(RequestError) as refused:
        model.create_chat_completion(MESSAGES, input_suffix="end")
    assert "takes no field 'input_suffix'" in str(refused.value)
    assert "did you mean 'suffix'" not in str(refused.value)
    listed = re.search(r"reads them \((.*)\)$", refused.value.fix).group(1).split(", ")
    assert {"messages", "tools"} <= set(listed)
    assert not {"suffix", "echo", "prompt"} & set(listed)


def test_the_other_methods_fields_at_values_that_do_nothing_are_taken(model):
    # what a wrapper forwarding every keyword of its own signature sends
    assert list(model.create_chat_completion(MESSAGES, echo=False, suffix=None, stream=True))
    assert model.create_completion("Once", tools=None, tool_choice=None, functions=None, reasoning_format=None)
    assert model.create_completion("Once", tools=[], function_call="none")["choices"][0]["finish_reason"] == "length"
