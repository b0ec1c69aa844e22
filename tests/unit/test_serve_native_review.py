"""serve: llama-server's own POST /completion, assistant prefill and timings, at their edges, over real HTTP
against the tiny bundle."""

from __future__ import annotations

import time

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served
from tests.unit.test_tools import ROOM
from tests.unit.test_tools import server as tools_server  # noqa: F401 (a fixture: room for the tools' description)

PROMPT = "The quick brown fox"


def test_completion_takes_seed_minus_one_as_llama_server_s_random_seed(served):
    """llama-server's README: 'seed ... Default: -1, which is a random seed'; clients send its default."""
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 4, "seed": -1})
    assert status == 200, body
    assert body["generation_settings"]["seed"] == 4294967295  # LLAMA_DEFAULT_SEED, as llama-server shows it
    assert body["content"] == served.post("/completion", {"prompt": PROMPT, "n_predict": 4})[1]["content"]
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 4, "seed": -2})
    assert status == 400, body
    assert body["error"]["param"] == "seed"


def test_completion_reads_max_tokens_where_n_predict_is_not_given(served):
    """llama-server takes max_tokens for the limit where n_predict is absent (n_predict wins over it)."""
    status, body = served.post("/completion", {"prompt": PROMPT, "max_tokens": 3})
    assert status == 200, body
    assert (body["tokens_predicted"], body["stop_type"], body["generation_settings"]["n_predict"]) == (3, "limit", 3)
    status, body = served.post("/completion", {"prompt": PROMPT, "max_tokens": 3, "n_predict": 5})
    assert status == 200, body
    assert body["tokens_predicted"] == 5
    status, body = served.post("/completion", {"prompt": PROMPT, "max_tokens": 0})  # as n_predict 0: prompt only
    assert status == 200, body
    assert (body["tokens_predicted"], body["content"]) == (0, "")
    status, body = served.post("/completion", {"prompt": PROMPT, "max_tokens": -2})
    assert status == 400, body
    assert body["error"]["param"] == "max_tokens"
    assert "'max_tokens' must be" in body["error"]["message"]


def test_completion_takes_any_number_of_stop_strings(served):
    """llama-server's 'stop' is an array of any length; OpenAI's limit of 4 is not its own."""
    answer = served.post("/completion", {"prompt": PROMPT, "n_predict": 12})[1]["content"]
    word = answer[4:7]
    stops = ["\u2603", "\u2604", "\u2605", "\u2606", word]
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 12, "stop": stops})
    assert status == 200, body
    assert (body["stop_type"], body["stopping_word"]) == ("word", word)
    assert body["content"] == answer[:answer.find(word)]
    assert body["generation_settings"]["stop"] == stops
    status, body = served.post("/completion", {"prompt": PROMPT, "stop": ["a", 5]})
    assert status == 400, body
    assert body["error"]["param"] == "stop"


@pytest.mark.parametrize("begun", ["|", ">", "<|", "end"])
def test_a_prefill_that_the_end_of_turn_text_also_holds_is_cut_where_the_message_ends(runtime, begun):
    """The template writes '<|im_end|>' after each message: a begun answer of '|' (a table) or '>' (a quote) is
    the message's text, not the last '|' or '>' of the turn's end."""
    tokenizer = runtime.tokenizer
    question = [{"role": "user", "content": "Make a table of the planets."}]
    continued = tokenizer.render_chat([*question, {"role": "assistant", "content": begun}], continue_final=True)
    assert continued == tokenizer.render_chat(question) + begun


class HoldingHook:
    """A StepHook that holds the prefill and the third decode step back, as the thermal guard's pause does."""

    def __init__(self, hold_s: float):
        self.hold_s, self.decodes, self.held_s = hold_s, 0, 0.0

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        self.decodes = 0

    def before_step(self, kind: str) -> float:
        self.decodes += kind == "decode"
        if kind == "prefill" or self.decodes == 3:
            time.sleep(self.hold_s)
            self.held_s += self.hold_s
            return self.hold_s
        return 0.0

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        pass

    def end(self, stats) -> None:
        pass


def test_timings_leave_out_the_time_the_guard_held_the_steps_back(runtime):
    """llama-server's timings are its prefill and decode time, the figures its metrics' seconds add up; the
    serve metrics leave the thermal guard's waits out of those seconds, and the timings do so too."""
    hook = HoldingHook(hold_s=1.0)
    server = Served(runtime, ServeDefaults(max_tokens=16), hook=hook)
    try:
        started = time.perf_counter()
        status, body = server.post("/completion", {"prompt": PROMPT, "n_predict": 8, "cache_prompt": False})
        elapsed_ms = (time.perf_counter() - started) * 1e3
        assert status == 200, body
        assert hook.held_s == 2.0
        assert elapsed_ms > 2000
        timings = body["timings"]
        assert timings["predicted_n"] == 8
        # each phase's own time stays under the 1 s of one hold, which it would pass had a hold been counted (a
        # 500 ms bound also measured the machine: a loaded one can take that long for the steps themselves)
        held_ms = hook.hold_s * 1e3
        assert 0 < timings["prompt_ms"] < held_ms
        assert 0 < timings["predicted_ms"] < held_ms
        assert timings["predicted_per_second"] > 7 / hook.hold_s
    finally:
        server.close()


def test_a_streamed_answer_with_tools_carries_the_timings_on_its_finishing_chunk(tools_server):  # noqa: F811
    """The README: OpenAI answers carry llama-server's timings, whole or on a stream's finishing chunk; an answer
    under tools is streamed once whole, and its finishing chunk carries them as the one without tools does."""
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": ROOM,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                "required": ["city"]}}}],
            "tool_choice": "required"}
    status, whole = tools_server.post("/v1/chat/completions", body)
    assert status == 200, whole
    assert whole["timings"]["predicted_n"] == whole["usage"]["completion_tokens"]
    chunks = tools_server.stream("/v1/chat/completions", body)[:-1]
    finished = [chunk for chunk in chunks if chunk["choices"] and chunk["choices"][0]["finish_reason"]]
    assert len(finished) == 1
    assert finished[0]["choices"][0]["finish_reason"] == "tool_calls"
    assert finished[0]["timings"]["predicted_n"] == whole["usage"]["completion_tokens"]
    assert finished[0]["timings"]["prompt_n"] + finished[0]["timings"]["cache_n"] == whole["usage"]["prompt_tokens"]


def test_a_refusal_on_completion_names_that_route_not_the_openai_one(served):
    """A field /completion cannot honour is refused naming /completion, the route the client called."""
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "suffix": "end"})
    assert status == 400, body
    assert "/completion here gives no suffix" in body["error"]["message"]
    status, body = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "suffix": "end"})
    assert status == 400, body
    assert "'suffix' needs a fill-in-the-middle model" in body["error"]["message"]
