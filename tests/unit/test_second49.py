"""A second reading of the 49th review's serve and runtime changes.

* The end-of-text token is counted in the generated tokens (llama-server's ``n_decoded``, Ollama's
  ``numDecoded``), and the one llama-server samples after a grammar that is complete too, but only below the
  token limit: a grammar completed by the limit's last token ends at the limit there (server-context.cpp
  ``process_token``: ``has_budget`` stops the slot before another token is sampled), so ``tokens_predicted`` /
  ``usage.completion_tokens`` / ``eval_count`` never pass the limit asked for.
* An answer whose first pick is the end-of-text token has that pick for its generation time's start and end
  (llama-server sets ``t_start_generation`` at ``n_decoded`` 1): the time a hook held the prefill back (the
  thermal guard's pause) is not reported as generation time (``timings.predicted_ms``, Ollama's
  ``eval_duration``).
"""

from __future__ import annotations

import time

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served, runtime  # noqa: F401 (the module's runtime fixture)

PROMPT = "The quick brown fox"
NAME = "tiny-host:latest"
GRAMMAR = 'root ::= "ab"'


@pytest.fixture
def served(runtime):  # noqa: F811
    server = Served(runtime, ServeDefaults(max_tokens=16))
    yield server
    server.close()


def _grammar_tokens(served) -> int:
    """The tokens the grammar's answer takes, the end-of-text token apart."""
    status, answer = served.post("/completion", {"prompt": PROMPT, "n_predict": 8, "grammar": GRAMMAR,
                                                 "temperature": 0, "return_tokens": True})
    assert status == 200, answer
    assert (answer["content"], answer["stop_type"]) == ("ab", "eos")
    # below the limit llama-server samples the end-of-text token after the grammar's end: counted and listed
    assert answer["tokens_predicted"] == len(answer["tokens"])
    return len(answer["tokens"]) - 1


def test_a_grammar_completed_at_the_limit_counts_no_token_past_it(served):
    limit = _grammar_tokens(served)
    status, answer = served.post("/completion", {"prompt": PROMPT, "n_predict": limit, "grammar": GRAMMAR,
                                                 "temperature": 0, "return_tokens": True})
    assert status == 200, answer
    assert answer["content"] == "ab"
    assert answer["tokens_predicted"] == answer["timings"]["predicted_n"] == limit  # not limit + 1
    # the KV cache holds the prompt and every token but the last, as at any limit
    assert answer["tokens_cached"] == answer["tokens_evaluated"] + limit - 1


def test_openai_counts_stay_within_max_tokens_at_a_grammar_s_end(served):
    limit = _grammar_tokens(served)
    status, body = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": limit, "grammar": GRAMMAR,
                                                   "temperature": 0})
    assert status == 200, body
    assert body["choices"][0]["text"] == "ab"
    assert body["usage"]["completion_tokens"] == limit
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + limit
    status, chat = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": limit, "grammar": GRAMMAR, "temperature": 0})
    assert status == 200, chat
    assert chat["choices"][0]["message"]["content"] == "ab"
    assert chat["usage"]["completion_tokens"] <= limit


def test_ollama_eval_count_stays_within_num_predict_at_a_format_s_end(served):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}

    def generate(limit: int) -> dict:
        status, body = served.post("/api/generate", {"model": NAME, "prompt": PROMPT, "stream": False,
                                                     "format": schema, "options": {"temperature": 0,
                                                                                   "num_predict": limit,
                                                                                   "repeat_penalty": 1.5}})
        assert status == 200, body
        return body

    free = generate(200)
    assert free["done_reason"] == "stop", free
    used = free["eval_count"] - 1  # the object's tokens; the end-of-text token llama.cpp samples after it counted
    at_limit = generate(used)
    assert at_limit["response"] == free["response"]
    assert at_limit["eval_count"] == used  # Ollama's runner stops at numPredict: no token past it is counted


class _PausedPrefill:
    """A step hook that holds the prefill back, as the thermal guard pauses a hot board."""

    PAUSE_S = 0.3

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        pass

    def before_step(self, kind: str) -> float:
        if kind != "prefill":
            return 0.0
        time.sleep(self.PAUSE_S)
        return self.PAUSE_S

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        pass

    def end(self, stats) -> None:
        pass


@pytest.fixture
def paused(runtime):  # noqa: F811
    server = Served(runtime, ServeDefaults(max_tokens=16), hook=_PausedPrefill())
    yield server
    server.close()


def test_a_pause_before_an_end_of_text_first_pick_is_not_generation_time(paused):
    eos = min(paused.completer.runtime.tokenizer.eos_token_ids)
    bias = {"logit_bias": [[eos, 100.0]], "temperature": 0}
    status, answer = paused.post("/completion", {"prompt": PROMPT, "n_predict": 8, **bias})
    assert status == 200, answer
    assert (answer["content"], answer["stop_type"], answer["tokens_predicted"]) == ("", "eos", 1)
    held_ms = _PausedPrefill.PAUSE_S * 1e3
    assert answer["timings"]["predicted_ms"] < held_ms / 3, answer["timings"]
    assert answer["timings"]["prompt_ms"] < held_ms / 3, answer["timings"]  # the pause is neither's
    status, chat = paused.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 8, **bias})
    assert status == 200, chat
    assert chat["timings"]["predicted_n"] == 1
    assert chat["timings"]["predicted_ms"] < held_ms / 3, chat["timings"]


def test_a_one_token_answer_has_a_generation_time_a_rate_can_divide_by(served):
    """A one-token answer's generation time was 0 (its first pick is also its last), so ``predicted_per_second``
    and a client's ``eval_count / eval_duration`` divided by zero; llama-server's is at least 1 µs."""
    status, body = served.post("/completion", {"prompt": "hello", "n_predict": 1, "ignore_eos": True})
    assert status == 200, body
    timings = body["timings"]
    assert timings["predicted_n"] == 1
    assert timings["predicted_ms"] > 0
    assert timings["predicted_per_second"] > 0
    status, body = served.post("/api/generate", {"model": "tiny-host", "prompt": "hello", "stream": False,
                                                 "raw": True, "options": {"num_predict": 1}})
    assert status == 200, body
    assert body["eval_count"] == 1
    assert body["eval_duration"] > 0
