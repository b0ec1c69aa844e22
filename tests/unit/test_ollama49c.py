"""Ollama's /api/chat (edgesdk/serve/ollama.py) with a last message that, with the system messages, is past the
context even once every older message is dropped, and ``truncate`` true, its default. Ollama's ``chatPrompt``
(server/prompt.go) always keeps the last message ("Must always include at least the last message") and the system
messages, whatever their length, and its runner cuts the prompt it is given (runner/ollamarunner/runner.go
``NewSequence``: the first ``numKeep`` tokens kept, the ``len(inputs) - numCtx`` after them dropped: "truncating
input prompt"); only ``truncate`` false is its 400 "the input length exceeds the context length". serve refused it
with a 400 naming the last message whatever ``truncate`` said.

A real server over the tiny bundle (256 tokens of context); the prompt the model read is checked by its first
token's log-probabilities, which POST /completion gives for the expected token ids."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import ServeDefaults
from tests._utils.ollama_calls import post_error as _error
from tests._utils.ollama_calls import post_ok as _ok
from tests.unit.test_ollama49b import _first_token, _read_by_the_model, _same
from tests.unit.test_serve import Served

NAME = "tiny-host"
CONTEXT = 256  # the tiny bundle's
SYSTEM = {"role": "system", "content": "You are a voice assistant for a house. Be brief and answer in English."}
EXCHANGES = [m for n in range(2) for m in (
    {"role": "user", "content": f"Question {n}: what is the state of the kitchen lamp and the hall heater now?"},
    {"role": "assistant", "content": f"Answer {n}: the kitchen lamp is on and the hall heater is at twenty."})]
LAST = {"role": "user", "content": "Read this back to me: " + "the lamp, the heater, the door; " * 40}
MESSAGES = [SYSTEM, *EXCHANGES, LAST]


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=8, prompt_cache=False))
    yield server
    server.close()


def _kept_ids(server: Served) -> list[int]:
    """The token ids of the prompt Ollama's chatPrompt keeps here: the system message and the last one, rendered by
    the chat template and tokenized as the chat route tokenizes a rendered prompt."""
    rendered = _ok(server, "/apply-template", {"messages": [SYSTEM, LAST]})["prompt"]
    return server.completer.runtime.tokenizer.chat_ids(rendered)


@pytest.mark.parametrize(("num_keep", "kept"), [(None, 4), (10, 10)])
def test_a_last_message_past_the_context_is_cut_as_ollama_s_runner_cuts_it(served, num_keep, kept):
    """The old answer: 400 "messages[3], which is always kept, renders ... to N tokens, leaving no room for an
    answer within this model's context of 256". Now the older messages are dropped and the prompt of the system
    message and the last one is cut to its first ``num_keep`` tokens and its end, ``CONTEXT - 1`` in all."""
    ids = _kept_ids(served)
    assert len(ids) > CONTEXT
    options = {"num_predict": 1, "temperature": 0, **({} if num_keep is None else {"num_keep": num_keep})}
    body = _ok(served, "/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False, "logprobs": True,
                                     "top_logprobs": 5, "options": options})
    assert body["done"]
    assert body["prompt_eval_count"] == CONTEXT - 1
    expected = ids[:kept] + ids[len(ids) - (CONTEXT - 1 - kept):]
    _same(_first_token(body["logprobs"]), _read_by_the_model(served, expected))


def test_streamed_and_within_num_ctx_it_is_cut_too(served):
    """Streamed, the answer is the same; a ``num_ctx`` below the context is the window it is cut to (with ``shift``
    true the answer goes on past it, as Ollama's runner shifts its num_ctx-long cache)."""
    whole = _ok(served, "/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False,
                                      "options": {"num_predict": 4, "temperature": 0}})
    status, _, payload = served.request("POST", "/api/chat", {"model": NAME, "messages": MESSAGES, "stream": True,
                                                              "options": {"num_predict": 4, "temperature": 0}})
    assert status == 200, payload
    parts = [json.loads(line) for line in payload.decode().splitlines() if line]
    assert "".join(part["message"]["content"] for part in parts) == whole["message"]["content"]
    assert (parts[-1]["done"], parts[-1]["prompt_eval_count"]) == (True, CONTEXT - 1)
    small = _ok(served, "/api/chat", {"model": NAME, "messages": [SYSTEM, *EXCHANGES, {"role": "user", "content":
                                      "Turn the lamp off."}], "stream": False,
                                      "options": {"num_ctx": 40, "num_predict": 4, "temperature": 0}})
    assert small["prompt_eval_count"] == 39
    assert small["eval_count"] == 4


def test_truncate_false_still_refuses_it(served):
    """``truncate`` false: Ollama's runner refuses the input (errorInputTooLong), a 400 here as there."""
    for stream in (False, True):
        status, error = _error(served, "/api/chat", {"model": NAME, "messages": MESSAGES, "stream": stream,
                                                     "truncate": False})
        assert status == 400
        assert error.startswith("the input length exceeds the context length: ")


def test_a_format_s_second_pass_past_the_context_is_cut_too(served):
    """A thinking model's answer to ``format`` goes on in a second request whose prompt is the messages and the
    thinking (Ollama's ChatHandler, ``structuredOutputsState``: ``chatPrompt`` over the messages and the thinking as
    the last message, which it always keeps, then its runner cuts the input). A thinking past the context was a 400
    naming 'format' ("send 'think': false"); now the second prompt is cut as the runner cuts it, its end, the
    thinking's last tokens, kept. Driven through serve's own second_pass on the real completer: a first pass that
    thinks past the context needs a model that writes a long <think> block, which the tiny random model does not."""
    from edgesdk.serve.ollama import parse_chat, second_pass, windowed

    completer = served.completer
    asked = parse_chat({"model": NAME, "messages": [SYSTEM, *EXCHANGES, {"role": "user", "content": "Hi."}],
                        "format": "json", "options": {"num_predict": 4}}, NAME)
    request = windowed(completer, asked)
    thought = "<think>\n" + "the lamp is on and the heater is at twenty; " * 40
    second = second_pass(completer, asked, request, request, thought)
    assert len(completer.prompt_ids(second)) == CONTEXT - 1
    tokenizer = completer.runtime.tokenizer
    whole = tokenizer.chat_ids(completer.rendered_chat(replace(request, messages=(SYSTEM,))) + thought)
    assert list(second.prompt_tokens) == whole[:4] + whole[len(whole) - (CONTEXT - 1 - 4):]
    refused = replace(asked, truncate=False)
    with pytest.raises(ApiError, match="^the input length exceeds the context length: "):
        second_pass(completer, refused, request, request, thought)
