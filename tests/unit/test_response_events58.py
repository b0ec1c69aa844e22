"""The Responses API's streamed events (edgesdk/serve/response_events.py): review 58.

* Under tools, a thinking model's text answer gave its message's ``output_text`` logprobs every token of the answer,
  its ``<think>`` block's too (``<think>``, the reasoning, ``</think>``, the whitespace after it), streamed and whole,
  although those tokens are the reasoning item's (an answer without tools leaves them out). The message now carries
  the tokens of the answer's text alone, as without a block (the JSON around the text is the tool wrapper's, which
  no route lists as logprobs).
"""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import Completion
from edgesdk.serve.response_events import Output
from edgesdk.serve.responses import parse_responses_request

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
JSON = ['{"', "response", '":', ' "', "Sunny", " in", " Par", "is", '"}']
BLOCKS = [  # (the tokens before the JSON, whether the prompt opened the block)
    (["<think>", "\n", "The", " user", "\n", "</think>", "\n\n"], False),
    (["The", " user", "</think>", "\n\n"], True),
    ([], False),
]


def _entry(token: str) -> dict:
    data = list(token.encode())
    return {"token": token, "logprob": -0.25, "bytes": data, "top_logprobs": [
        {"token": token, "logprob": -0.25, "bytes": data}]}


def _output(opened: bool) -> Output:
    asked = parse_responses_request({"model": "m", "input": "Weather?", "tools": [TOOL],
                                     "include": ["message.output_text.logprobs"]})
    return Output(asked, "m", 0.0, 1.0, count_tokens=len, think_opened=opened)


@pytest.mark.parametrize(("thought", "opened"), BLOCKS)
def test_a_text_answer_under_tools_leaves_its_block_s_tokens_to_the_reasoning_item(thought, opened):
    tokens = [*thought, *JSON]
    completion = Completion("".join(tokens), "stop", 10, len(tokens), 0, {"content": [_entry(t) for t in tokens]})
    whole = _output(opened).whole(completion)
    message = whole["output"][-1]
    assert [item["type"] for item in whole["output"]] == ["reasoning"] * bool(thought) + ["message"]
    assert message["content"][0]["text"] == "Sunny in Paris"
    assert [entry["token"] for entry in message["content"][0]["logprobs"]] == JSON[4:8]

    output = _output(opened)  # token by token, each with its logprobs
    events = output.start()
    for token in tokens:
        events += output.push(token, {"content": [_entry(token)]})
    events += output.end(completion)
    streamed = events[-1][1]["response"]["output"][-1]["content"][0]
    assert [entry["token"] for entry in streamed["logprobs"]] == JSON[4:8]
    deltas = [entry["token"] for name, data in events if name == "response.output_text.delta"
              for entry in data["logprobs"]]
    assert deltas == JSON[4:8]
    done = [data for name, data in events if name == "response.output_text.done"]
    assert [entry["token"] for entry in done[0]["logprobs"]] == JSON[4:8]
