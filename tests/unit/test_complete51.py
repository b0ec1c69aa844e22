"""Review 51 of the completer's streams: prompt progress per prefill step, a grammar's end-of-text token in the
ids, and llama-server's timings_per_token / return_progress on the OpenAI routes, over real HTTP against the tiny
bundle."""

from __future__ import annotations

import time

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_stream51 import _sse

PROMPT = "The quick brown fox jumps over the lazy dog and runs far away"
YES = {"grammar": 'root ::= "yes"'}


class Steps:
    """A real step hook (generate's StepHook) that prefills a prompt ``size`` tokens a step, as the thermal guard's
    ``prefill_chunk`` asks; it records the steps it was told of."""

    def __init__(self, size: int):
        self.size, self.steps = size, []

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        self.steps = []

    def prefill_chunk(self, prompt_left: int) -> int:
        return self.size

    def before_step(self, kind: str) -> float:
        return 0.0

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        self.steps.append(kind)

    def end(self, stats) -> None:
        pass


@pytest.fixture
def stepped(runtime):
    from tests.unit.test_serve import Served

    hook = Steps(4)
    server = Served(runtime, ServeDefaults(max_tokens=16, prompt_cache=False), hook=hook)
    server.hook = hook
    yield server
    server.close()


def _progress(events: list[dict]) -> list[dict]:
    return [event["prompt_progress"] for event in events if "prompt_progress" in event]


def test_return_progress_sends_one_event_per_prefill_step(stepped):
    """llama-server sends a prompt_progress partial result after each batch of the prompt it decodes
    (server-context.cpp update_slots: ``send_partial_response(slot, {}, true)`` for a slot processing its prompt),
    ``processed`` the prompt's tokens held so far."""
    events = _sse(stepped, "/completion", {"prompt": PROMPT, "n_predict": 2, "stream": True, "return_progress": True,
                                           "timings_per_token": True})
    total = events[-1]["tokens_evaluated"]
    shown = _progress(events)
    prefills = stepped.hook.steps.count("prefill")
    assert prefills == -(-total // 4) > 1
    assert [each["processed"] for each in shown] == [min(4 * step, total) for step in range(1, prefills + 1)]
    assert {each["total"] for each in shown} == {total}
    assert {each["cache"] for each in shown} == {0}
    assert [each["time_ms"] for each in shown] == sorted(each["time_ms"] for each in shown)
    first = events.index(next(event for event in events if event["tokens_predicted"]))
    assert first == prefills  # every progress event before the answer's first token
    assert all(event["timings"]["predicted_n"] == 0 for event in events[:first])
    assert all(event["tokens"] == [] and event["content"] == "" for event in events[:first])


def test_n_predict_0_sends_its_prefill_steps_too(stepped):
    events = _sse(stepped, "/completion", {"prompt": PROMPT, "n_predict": 0, "stream": True, "return_progress": True})
    total = events[-1]["tokens_evaluated"]
    assert [each["processed"] for each in _progress(events)] == list(range(4, total, 4)) + [total]
    assert events[-1]["stop"] is True


def test_a_one_step_prompt_keeps_one_progress_event(served):
    events = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 2, "stream": True, "return_progress": True})
    shown = _progress(events)
    assert len(shown) == 1
    assert shown[0]["processed"] == shown[0]["total"] == events[-1]["tokens_evaluated"]


def test_a_completed_grammar_lists_the_end_of_text_token_it_counts(served, runtime):
    """A grammar that can only end leaves llama-server nothing to sample but an end-of-generation token: it is
    sampled as any token (n_decoded counts it, its id goes out in ``tokens``, stop_type eos)."""
    eos = runtime.tokenizer.eos_token_ids
    events = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 40, "stream": True, **YES})
    *pieces, last = events
    ids = [token for event in pieces for token in event["tokens"]]
    assert "".join(event["content"] for event in pieces) == "yes"
    assert len(ids) == last["tokens_predicted"] == last["timings"]["predicted_n"]
    assert ids[-1] in eos
    assert not set(ids[:-1]) & eos
    assert [event["tokens_predicted"] for event in pieces] == list(range(1, len(ids) + 1))
    assert last["stop_type"] == "eos"
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 40, "return_tokens": True, **YES})
    assert status == 200, body
    assert body["tokens"] == ids
    assert body["tokens_predicted"] == len(ids)


def test_a_grammar_completed_at_the_limit_adds_no_token(served):
    plain = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": 40, "stream": True, **YES})
    ids = [token for event in plain[:-1] for token in event["tokens"]]
    events = _sse(served, "/completion", {"prompt": PROMPT, "n_predict": len(ids) - 1, "stream": True, **YES})
    assert [token for event in events[:-1] for token in event["tokens"]] == ids[:-1]
    assert events[-1]["tokens_predicted"] == len(ids) - 1
    assert events[-1]["stop_type"] == "limit"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_streams_carry_timings_per_token(served, path):
    """llama-server's OpenAI-compatible partial chunks carry ``timings`` with ``timings_per_token``
    (server-task.cpp ``to_json_oaicompat`` / ``to_json_oaicompat_chat``: the timings on each chunk's last delta)."""
    asked = {"messages": [{"role": "user", "content": PROMPT}]} if "chat" in path else {"prompt": PROMPT}
    events = _sse(served, path, {**asked, "max_tokens": 4, "stream": True, "timings_per_token": True})
    texts = [event for event in events if event["choices"] and event["choices"][0]["finish_reason"] is None
             and (event["choices"][0].get("text") or event["choices"][0].get("delta", {}).get("content"))]
    assert texts
    counts = [event["timings"]["predicted_n"] for event in texts]
    assert counts == sorted(counts)
    assert counts[0] >= 1
    assert all(event["timings"]["prompt_n"] + event["timings"]["cache_n"] > 0 for event in texts)
    assert "timings" in events[-1]
    plain = _sse(served, path, {**asked, "max_tokens": 4, "stream": True})
    assert ["timings" in event for event in plain] == [False] * (len(plain) - 1) + [True]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_streams_carry_prompt_progress(stepped, path):
    """``return_progress`` on the OpenAI routes: a chunk with ``prompt_progress`` per prefill step, the chat's with
    the assistant's role delta (server-task.cpp ``to_json_oaicompat_chat``: ``first || is_progress``), the text
    completion's with an empty text."""
    chat = "chat" in path
    asked = {"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT}
    events = _sse(stepped, path, {**asked, "max_tokens": 2, "stream": True, "return_progress": True,
                                  "stream_options": {"include_usage": True}})
    shown = [event for event in events if "prompt_progress" in event]
    prompt_tokens = events[-1]["usage"]["prompt_tokens"]
    assert [event["prompt_progress"]["processed"] for event in shown] == \
        list(range(4, prompt_tokens, 4)) + [prompt_tokens]
    for event in shown:
        choice = event["choices"][0]
        assert choice["finish_reason"] is None
        if chat:
            assert choice["delta"]["role"] == "assistant"
        else:
            assert choice["text"] == ""
    assert events.index(shown[-1]) < min(index for index, event in enumerate(events)
                                         if event["choices"] and (event["choices"][0].get("text") or
                                                                  event["choices"][0].get("delta", {}).get("content")))
    assert all("prompt_progress" not in event for event in _sse(stepped, path, {**asked, "max_tokens": 2,
                                                                                "stream": True}))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_stream_flags_that_are_not_booleans_are_refused_by_name(served, path):
    asked = {"messages": [{"role": "user", "content": PROMPT}]} if "chat" in path else {"prompt": PROMPT}
    for name in ("timings_per_token", "return_progress"):
        status, body = served.post(path, {**asked, "max_tokens": 2, "stream": True, name: "yes"})
        assert status == 400, body
        assert f"'{name}' must be true or false" in body["error"]["message"]


class SlowSteps(Steps):
    """Steps whose prefill steps each take ``seconds`` more (a slow board's prefill)."""

    def __init__(self, size: int, seconds: float):
        super().__init__(size)
        self.seconds = seconds

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        if kind == "prefill":
            time.sleep(self.seconds)
        super().after_step(kind, tokens, compute_s)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_openai_stream_progress_times_the_prompt_from_the_request_s_turn(runtime, path):
    """The OpenAI streams' ``prompt_progress.time_ms`` counts from the request's turn, as /completion's does: the
    clock started only at the end of the first prefill step, so the first event said 0 ms however slow that step."""
    from tests.unit.test_serve import Served

    server = Served(runtime, ServeDefaults(max_tokens=16, prompt_cache=False), hook=SlowSteps(4, 0.05))
    try:
        asked = {"messages": [{"role": "user", "content": PROMPT}]} if "chat" in path else {"prompt": PROMPT}
        events = _sse(server, path, {**asked, "max_tokens": 2, "stream": True, "return_progress": True})
    finally:
        server.close()
    times = [event["prompt_progress"]["time_ms"] for event in events if "prompt_progress" in event]
    assert times[0] >= 40, times
    assert times == sorted(times)
