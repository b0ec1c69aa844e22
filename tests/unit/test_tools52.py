"""Tool calls, the Responses API and reasoning (review 52).

* deepseek-legacy streams a thinking block inside the content between its tags; llama-server closes a block the answer
  leaves open only where the model ended the answer (tools/server/server-context.cpp, ``update_chat_msg``: every
  answer not stopped at end-of-generation is parsed as partial, and common/chat-parser.cpp's ``try_parse_reasoning``
  writes the ``</think>`` of an open block with ``closed = !is_partial()``). A stream cut by max_tokens or a stop
  string ended with a ``</think>`` the model never wrote, as if its reasoning were done.
* A Responses request's ``tools`` that is no array but falsy (``{}``, ``false``, ``""``) was read as no tools, the
  answer text without a word; the chat route refuses it, and so does OpenAI.
* ``usage.output_tokens_details.reasoning_tokens`` counted the reasoning up to the first ``</think>``, though blocks
  that follow each other are all reasoning (edgesdk/serve/reasoning.py): the second block's tokens were left out.
"""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import Completion, ServeDefaults
from edgesdk.serve.reasoning import ReasoningSplitter
from edgesdk.serve.response_events import Output
from edgesdk.serve.responses import parse_responses_request
from tests.unit import test_serve_reasoning
from tests.unit.test_serve import Served
from tests.unit.test_serve_reasoning import ASK, no_whitespace

thinking_runtime = test_serve_reasoning.thinking_runtime  # the fixture: the tiny bundle with a thinking template


@pytest.fixture
def served(thinking_runtime):
    server = Served(thinking_runtime, ServeDefaults(max_tokens=6))
    yield server
    server.close()


def _streamed_content(server: Served, body: dict) -> tuple[str, str]:
    """The content deltas of a streamed chat answer joined, and its finish reason."""
    events = server.stream("/v1/chat/completions", body)
    chunks = [event for event in events if isinstance(event, dict) and event["choices"]]
    assert not any("reasoning_content" in chunk["choices"][0]["delta"] for chunk in chunks)
    content = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    return content, chunks[-1]["choices"][0]["finish_reason"]


def test_deepseek_legacy_leaves_a_block_cut_by_max_tokens_open(served, thinking_runtime):
    bias = no_whitespace(thinking_runtime)
    plain = served.post("/v1/chat/completions", {"messages": ASK, "reasoning_format": "none", "logit_bias": bias})[1]
    thought = plain["choices"][0]["message"]["content"].strip()  # the prompt opened the block: all of it is thinking
    assert thought
    assert "</think>" not in thought
    content, finish_reason = _streamed_content(served, {"messages": ASK, "reasoning_format": "deepseek-legacy",
                                                        "logit_bias": bias})
    assert finish_reason == "length"
    assert content == f"<think>{thought}"


def readable(runtime) -> dict[str, int]:
    """``logit_bias`` banning the tokens that are whitespace or no whole UTF-8 text: the thinking is readable."""
    tokenizer = runtime.tokenizer.tokenizer
    return {str(token): -100 for token in range(tokenizer.get_vocab_size())
            if not (text := tokenizer.decode([token])).strip() or "\ufffd" in text}


def test_deepseek_legacy_leaves_a_block_cut_by_a_stop_string_open(served, thinking_runtime):
    body = {"messages": ASK, "logit_bias": readable(thinking_runtime), "max_tokens": 12}
    plain = served.post("/v1/chat/completions", {**body, "reasoning_format": "none"})[1]
    thought = plain["choices"][0]["message"]["content"]
    # the first character the thinking writes after others, as a stop string: the answer stops just before it
    cut = next(index for index in range(1, len(thought)) if thought[index] not in thought[:index])
    stop, before = thought[cut], thought[:cut]
    content, finish_reason = _streamed_content(served, {**body, "reasoning_format": "deepseek-legacy",
                                                        "stop": [stop]})
    assert finish_reason == "stop"
    assert content == f"<think>{before.strip()}"


def test_a_block_the_model_ended_the_answer_in_is_closed():
    """The answer stopped at its end of generation: the open block is closed, as llama-server closes it."""
    splitter = ReasoningSplitter(opened=True, inline=True)
    assert splitter.push("The fox") == ("", "<think>The fox")
    assert splitter.flush() == ("", "</think>")
    cut = ReasoningSplitter(opened=True, inline=True)
    cut.push("The fox")
    assert cut.flush(closed=False) == ("", "")


@pytest.mark.parametrize("tools", [{}, False, "", 0])
def test_responses_tools_that_are_no_array_are_refused(tools):
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"model": "m", "input": "What time is it?", "tools": tools})
    assert caught.value.param == "tools"
    assert "'tools' must be an array of function tools" in caught.value.message
    assert "send null or [] for no tools" in caught.value.message
    for none in (None, []):  # no tools, as before
        assert parse_responses_request({"model": "m", "input": "hi", "tools": none}).request.tools is None


def test_reasoning_tokens_count_every_block_of_the_reasoning():
    text = "<think>The fox.</think>\n<think>It runs.</think>\n\nIt jumps."
    completion = Completion(text=text, finish_reason="stop", prompt_tokens=4, completion_tokens=len(text))
    asked = parse_responses_request({"model": "m", "input": "hi"})
    whole = Output(asked, "m", 0.0, 1.0, splitter=ReasoningSplitter(), count_tokens=len).whole(completion)
    reasoning, message = whole["output"]
    assert reasoning["content"][0]["text"] == "The fox.It runs."
    assert message["content"][0]["text"] == "It jumps."
    thought = "<think>The fox.</think>\n<think>It runs.</think>"
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == len(thought)
    # a block the limit cut: all of the answer is reasoning
    cut = Completion(text="<think>The fox", finish_reason="length", prompt_tokens=4, completion_tokens=20)
    whole = Output(asked, "m", 0.0, 1.0, splitter=ReasoningSplitter(), count_tokens=len).whole(cut)
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == len("<think>The fox")
