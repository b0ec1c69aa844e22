"""Ollama's routes (edgesdk/serve/ollama.py) where they answered otherwise than Ollama:

* /api/chat with an ``options.num_predict`` longer than any kept conversation leaves room for (above the context's
  tokens less the last message's): every try of :func:`trimmed` failed and the one with the fewest tokens was
  taken, so the whole conversation but its last message was dropped, where ``num_predict`` -1 (no limit) kept it
  all and Ollama's ``chatPrompt`` keeps every message that fits ``num_ctx``;
* ``options.num_ctx`` below 4 (0, -1, 2): a 400 "'options.num_ctx' must be ... >= 1" (0, -1) or "leaving no room
  for an answer" (2), where Ollama's scheduler reads any num_ctx below 4 as 4 and answers."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.ollama import parse_chat, parse_embed, parse_generate, windowed
from tests._utils.ollama_calls import post_error, post_ok

NAME = "tiny-host"


def _conversation(turns: int) -> list[dict]:
    messages = []
    for turn in range(turns):
        messages += [{"role": "user", "content": f"Question {turn} about cats?"},
                     {"role": "assistant", "content": f"Answer {turn} ok."}]
    return messages + [{"role": "user", "content": "Last?"}]


def _kept(completer: Completer, messages: list[dict], num_predict: int) -> tuple:
    asked = parse_chat({"model": NAME, "messages": messages, "options": {"num_predict": num_predict}}, NAME)
    return windowed(completer, asked).messages


@pytest.mark.parametrize("beyond", [1, 44, 1000])
def test_a_num_predict_no_conversation_leaves_room_for_keeps_what_fits(runtime, beyond):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    messages = _conversation(4)
    context = runtime.backend.max_context
    whole = _kept(completer, messages, -1)
    assert len(whole) == len(messages)  # the whole conversation fits the context, with room for one token
    assert len(completer.prompt_ids(windowed(completer, parse_chat({"model": NAME, "messages": messages}, NAME)))) \
        < context
    # a limit longer than the context less the last message's prompt leaves no try room for it
    last = len(completer.prompt_ids(windowed(completer, parse_chat({"model": NAME, "messages": messages[-1:]},
                                                                   NAME))))
    kept = _kept(completer, messages, context - last + beyond)
    assert kept == whole


def test_a_num_predict_some_try_leaves_room_for_still_drops_the_oldest(runtime):
    """Unchanged: where dropping the oldest messages makes the answer's room, they are dropped."""
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    messages = _conversation(4)
    kept = _kept(completer, messages, 200)
    assert 1 < len(kept) < len(messages)
    assert kept[-1] == messages[-1]


@pytest.mark.parametrize("num_ctx", [0, -1, 2, 3.0, 0.5])
def test_a_num_ctx_below_4_is_4_as_ollama_s_scheduler_reads_it(num_ctx):
    body = {"model": NAME, "options": {"num_ctx": num_ctx}}
    chat = parse_chat({**body, "messages": [{"role": "user", "content": "Hi"}]}, NAME)
    generate = parse_generate({**body, "prompt": "Hi", "raw": True}, NAME)
    assert chat.num_ctx == generate.num_ctx == parse_embed({**body, "input": "a"}, NAME).num_ctx == 4


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_a_served_answer_with_num_ctx_0_shifts_within_4_tokens(served, route):
    body = {"model": NAME, "stream": False, "options": {"num_ctx": 0, "num_predict": 3, "seed": 1}}
    ask = {"messages": [{"role": "user", "content": "Say something."}]} if route == "/api/chat" else \
        {"prompt": "Say something."}
    answer = post_ok(served, route, {**body, **ask})
    assert answer["done"]
    assert answer["prompt_eval_count"] <= 3  # the prompt cut to leave one token of the 4
    assert 1 <= answer["eval_count"] <= 3


@pytest.mark.parametrize("wrong", ["2048", True, [4]])
def test_a_num_ctx_that_is_no_whole_number_is_still_refused_naming_it(served, wrong):
    status, error = post_error(served, "/api/chat", {"model": NAME, "stream": False,
                                                     "messages": [{"role": "user", "content": "Hi"}],
                                                     "options": {"num_ctx": wrong}})
    assert status == 400
    assert "'options.num_ctx'" in error
