"""serve's /api/chat keeps a conversation that outgrows the context as Ollama does (server/prompt.go, ``chatPrompt``):
its oldest messages are dropped one at a time, its system messages and its last message kept, a tool result never
without its call. On a real server over the tiny bundle (256 tokens of context), driven by the ``ollama`` client;
each answer is compared with the chat route's answer to the messages Ollama's rule keeps."""

from __future__ import annotations

import pytest

ollama = pytest.importorskip("ollama")

from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from edgesdk.serve.tools import tool_result_text  # noqa: E402
from tests._utils.tiny import CHAT_TEMPLATE  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402
from tests.unit.test_serve_ollama39 import NAME, _client  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a voice assistant for a house. Be brief and answer in English."}
EXCHANGES = [m for n in range(9) for m in (
    {"role": "user", "content": f"Question {n}: what is the state of the kitchen lamp and the hall heater now?"},
    {"role": "assistant", "content": f"Answer {n}: the kitchen lamp is on and the hall heater is at twenty."})]
LAST = {"role": "user", "content": "Turn the lamp off."}
PREDICT = 8


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def _count(server: Served, messages: list) -> int:
    """The tokens of the prompt the chat route renders ``messages`` to (llama-server's /apply-template, /tokenize)."""
    status, rendered = server.post("/apply-template", {"messages": messages})
    assert status == 200, rendered
    status, tokens = server.post("/tokenize", {"content": rendered["prompt"]})
    assert status == 200, tokens
    return len(tokens["tokens"])


def _kept(server: Served, messages: list, window: int, room: int) -> list:
    """Ollama's rule (no tool turns here): the fewest oldest messages dropped, the dropped part's system messages
    kept in front, for the prompt and ``room`` tokens of answer to fit in ``window``."""
    for start in range(len(messages)):
        kept = [m for m in messages[:start] if m["role"] == "system"] + messages[start:]
        if _count(server, kept) + room <= window:
            return kept
    raise AssertionError("nothing fits")


def _reference(server: Served, messages: list, max_tokens: int) -> dict:
    status, body = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens})
    assert status == 200, body
    return body


def _same_answer(server: Served, messages: list, kept: list, **options) -> ollama.ChatResponse:
    """/api/chat's answer to ``messages``, whole and streamed, is the chat route's answer to ``kept``."""
    reference = _reference(server, kept, PREDICT)
    client = _client(server)
    whole = client.chat(model=NAME, messages=messages, stream=False, options={"num_predict": PREDICT, **options})
    assert whole.prompt_eval_count == reference["usage"]["prompt_tokens"] == _count(server, kept)
    # the Ollama routes end an answer cut mid-character without U+FFFD, as Ollama's runner trims it
    assert whole.message.content == reference["choices"][0]["message"]["content"].rstrip("\ufffd")
    assert (whole.eval_count, whole.done_reason) == (reference["usage"]["completion_tokens"],
                                                     reference["choices"][0]["finish_reason"])
    parts = list(client.chat(model=NAME, messages=messages, stream=True, options={"num_predict": PREDICT, **options}))
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert (parts[-1].done, parts[-1].prompt_eval_count, parts[-1].eval_count) == (True, whole.prompt_eval_count,
                                                                                   whole.eval_count)
    return whole


def test_a_conversation_past_the_context_drops_its_oldest_messages_and_keeps_the_system_ones(served):
    later_system = {"role": "system", "content": "The user is in the kitchen."}
    messages = [SYSTEM, *EXCHANGES[:4], later_system, *EXCHANGES[4:], LAST]
    assert _count(served, messages) > 256  # the whole conversation is past the bundle's context
    kept = _kept(served, messages, 256, PREDICT)
    assert kept[:2] == [SYSTEM, later_system]  # both system messages, the later one moved in front with the first
    assert messages.index(kept[2]) > messages.index(later_system)
    assert kept[-1] == LAST
    whole = _same_answer(served, messages, kept)
    assert whole.prompt_eval_count + PREDICT <= 256  # the answer's num_predict has its room


def test_a_long_last_message_keeps_only_the_system_message_with_it(served):
    last = {"role": "user", "content": "Read this back to me: " + "the lamp, the heater, the door; " * 6}
    messages = [SYSTEM, *EXCHANGES, last]
    kept = _kept(served, messages, 256, PREDICT)
    assert kept == [SYSTEM, last]
    _same_answer(served, messages, kept)


def test_num_ctx_below_the_context_is_the_window_the_conversation_is_kept_to(served):
    messages = [SYSTEM, *EXCHANGES[:2], LAST]
    assert 150 < _count(served, messages) <= 256  # within the bundle's context, past num_ctx
    kept = _kept(served, messages, 150, PREDICT)
    assert SYSTEM in kept
    assert kept[-1] == LAST
    assert len(kept) < len(messages)
    _same_answer(served, messages, kept, num_ctx=150)


def test_the_answer_s_num_predict_has_its_room_and_without_a_limit_one_token(served):
    messages = [SYSTEM, *EXCHANGES[:2], LAST]
    fuller = [SYSTEM, EXCHANGES[1], LAST]
    window = _count(served, fuller) + 4  # the fuller cut leaves 4 tokens: too few for num_predict 8, some for -1
    _same_answer(served, messages, [SYSTEM, LAST], num_ctx=window)
    client = _client(served)
    for predict in (-1, -2):  # no limit (here: until the context fills): the fuller cut, as Ollama's prompt-only fit
        status, answer = served.post("/api/chat", {"model": NAME, "messages": messages, "stream": False,
                                                   "shift": False, "options": {"num_predict": predict,
                                                                               "num_ctx": window}})
        assert status == 200, answer
        assert answer["prompt_eval_count"] == _count(served, fuller)
        assert answer["eval_count"] <= 4  # without the shift (Ollama's default) it stops where num_ctx fills
    # no num_predict: the server's limit for an answer (--max-new-tokens, 24 here) has its room
    answer = client.chat(model=NAME, messages=messages, stream=False, options={"num_ctx": window})
    assert answer.prompt_eval_count == _count(served, [SYSTEM, LAST])


def test_a_last_message_past_the_context_is_cut_and_with_truncate_false_refused(served):
    """Ollama's chatPrompt keeps the last message with the system messages whatever their length and its runner
    cuts the prompt (runner.go ``NewSequence``); only ``truncate`` false refuses it (tests/unit/test_ollama49c.py
    checks what the model reads)."""
    last = {"role": "user", "content": "Read this back to me: " + "the lamp, the heater, the door; " * 40}
    messages = [SYSTEM, *EXCHANGES[:2], last]
    assert _count(served, [SYSTEM, last]) > 256
    status, answer = served.post("/api/chat", {"model": NAME, "messages": messages, "stream": False,
                                               "options": {"num_predict": PREDICT}})
    assert status == 200, answer
    assert answer["prompt_eval_count"] == 255  # cut to leave the answer's first token its room
    for stream in (False, True):
        status, payload = served.post("/api/chat", {"model": NAME, "messages": messages, "stream": stream,
                                                    "truncate": False})
        assert status == 400, payload
        assert set(payload) == {"error"}
        assert payload["error"].startswith("the input length exceeds the context length: ")
        assert "within this model's context of 256" in payload["error"]
    status, answer = served.post("/api/chat", {"model": NAME, "messages": [SYSTEM, *EXCHANGES[:2], LAST],
                                               "stream": False, "options": {"num_ctx": 40, "num_predict": 2}})
    assert status == 200, answer
    assert answer["prompt_eval_count"] == 39
    status, payload = served.post("/api/chat", {"model": NAME, "messages": [SYSTEM, *EXCHANGES[:2], LAST],
                                                "truncate": False, "options": {"num_ctx": 40}})
    assert status == 400
    assert "'options.num_ctx' 40" in payload["error"]
    assert "raise num_ctx (this model's context holds 256)" in payload["error"]


CALL = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "set_light", "arguments": {"on": True}}}]}
RESULT = {"role": "tool", "tool_name": "set_light", "content": "done"}
CALL_OPENAI = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_2_0", "type": "function", "function": {"name": "set_light", "arguments": "{\"on\": true}"}}]}
RESULT_OPENAI = {"role": "tool", "tool_call_id": "call_2_0", "content": "done"}


def test_a_tool_result_is_never_kept_without_its_call(served):
    said = {"role": "assistant", "content": "The lamp is on."}
    messages = [SYSTEM, EXCHANGES[0], CALL, RESULT, said, LAST]
    with_call = [SYSTEM, CALL_OPENAI, RESULT_OPENAI, said, LAST]
    # the result as the model reads it (a user turn naming the tool), were it kept without its call
    orphan = [SYSTEM, {"role": "user", "content": tool_result_text("set_light", "done")}, said, LAST]
    # a window the orphaned result would fit in, and its call with it would not: both go
    window = _count(served, orphan) + PREDICT
    assert _count(served, with_call) + PREDICT > window
    _same_answer(served, messages, [SYSTEM, said, LAST], num_ctx=window)
    # the last message a tool result: its call is kept with it, even where that leaves less room than num_predict
    messages = [SYSTEM, *EXCHANGES[:2], CALL, RESULT]
    block = [SYSTEM, {**CALL_OPENAI, "tool_calls": [{**CALL_OPENAI["tool_calls"][0], "id": "call_3_0"}]},
             {**RESULT_OPENAI, "tool_call_id": "call_3_0"}]
    window = _count(served, block) + 2
    assert _count(served, [SYSTEM, {"role": "user", "content": tool_result_text("set_light", "done")}]) + PREDICT \
        <= window  # the result alone would have left num_predict its room
    status, answer = served.post("/api/chat", {"model": NAME, "messages": messages, "stream": False, "shift": False,
                                               "options": {"num_predict": PREDICT, "num_ctx": window}})
    assert status == 200, answer
    assert answer["prompt_eval_count"] == _count(served, block)
    assert answer["eval_count"] <= 2  # without the shift (Ollama's default) it stops where num_ctx fills


ALTERNATING = ("{% set rest = messages[1:] if messages[0]['role'] == 'system' else messages %}"
               "{% if rest and rest[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate "
               "user/assistant/user/assistant/...') }}{% endif %}" + CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def alternating(tiny_bundle):
    """A server whose chat template refuses a conversation that does not begin with a user turn (as Mistral's and
    Gemma's do)."""
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source = ALTERNATING
    runtime.tokenizer._template = None
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def test_a_cut_the_template_refuses_drops_one_more_message(alternating, served):
    first = {"role": "user", "content": "Tell me everything about the kitchen lamp, the hall heater and the door."}
    said = {"role": "assistant", "content": "Fine."}
    messages = [SYSTEM, first, said, LAST]
    status, refused = alternating.post("/apply-template", {"messages": [SYSTEM, said, LAST]})
    assert status == 400
    assert "alternate" in refused["error"]["message"]
    window = _count(served, [SYSTEM, said, LAST]) + PREDICT  # what that cut would render to, were it not refused
    assert _count(alternating, messages) + PREDICT > window
    _same_answer(alternating, messages, [SYSTEM, LAST], num_ctx=window)


def test_the_request_log_says_how_many_messages_were_dropped(served, capfd):
    """Ollama notes its truncation only in a debug log line; serve's request log says it."""
    served.server.log = True
    try:
        _client(served).chat(model=NAME, messages=[SYSTEM, *EXCHANGES, LAST], stream=False,
                             options={"num_predict": PREDICT})
    finally:
        served.server.log = False
    kept = _kept(served, [SYSTEM, *EXCHANGES, LAST], 256, PREDICT)
    dropped = len(EXCHANGES) + 2 - len(kept)
    assert f"/api/chat: {dropped} oldest message(s) dropped to fit the context" in capfd.readouterr().err


def test_truncate_false_refuses_a_conversation_that_does_not_fit(served):
    """Ollama's ``truncate``: on unless false (routes.go); false keeps every message, so one past the context is a
    400, and a conversation that fits answers as with trimming on."""
    messages = [SYSTEM, *EXCHANGES, LAST]
    assert _count(served, messages) > 256
    status, body = served.post("/api/chat", {"model": NAME, "messages": messages, "stream": False, "truncate": False,
                                             "options": {"num_predict": PREDICT}})
    assert status == 400, body
    assert "256" in body["error"]
    short = [SYSTEM, LAST]
    answers = [served.post("/api/chat", {"model": NAME, "messages": short, "stream": False, "truncate": truncate,
                                         "options": {"num_predict": PREDICT}}) for truncate in (False, True)]
    assert [status for status, _ in answers] == [200, 200]
    assert answers[0][1]["message"] == answers[1][1]["message"]
    status, body = served.post("/api/chat", {"model": NAME, "messages": short, "truncate": "no"})
    assert status == 400
    assert "'truncate' must be true or false" in body["error"]
