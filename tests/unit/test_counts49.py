"""Token counts the server's routes report, against the reference tools' (49th review).

* The end-of-text token an answer stopped at is sampled and counted: llama-server bumps ``n_decoded`` before
  ``process_token`` sees the end of text (tools/server/server-context.cpp), and reports it as ``tokens_predicted``,
  ``timings.predicted_n``, OpenAI's ``usage.completion_tokens``, Anthropic's ``usage.output_tokens`` and the
  Responses API's ``usage.output_tokens`` (server-task.cpp); Ollama's runner bumps ``numDecoded`` / ``numPredicted``
  before its ``TokenIsEog`` check and reports it as ``eval_count`` (runner/llamarunner/runner.go,
  runner/ollamarunner/runner.go).
* ``/completion``'s ``tokens_cached`` after a context shift is the KV cache's length (``slot.prompt.n_tokens()``),
  the discarded tokens left out.
* With a cached prefix, the prompt counts are the reference's: the whole prompt in ``prompt_tokens`` /
  ``tokens_evaluated`` / Ollama's ``prompt_eval_count`` (``numPromptInputs``: every prompt input), the evaluated
  ones in ``timings.prompt_n``, the reused ones in ``timings.cache_n`` / ``cached_tokens``, and Anthropic's
  ``input_tokens`` without the ``cache_read_input_tokens``.
"""

from __future__ import annotations

import pytest

from edgesdk.serve import anthropic, llama_native, response_events
from edgesdk.serve.api import parse_chat_request
from edgesdk.serve.completion import Completion, ServeDefaults
from tests.unit.test_serve import Served, runtime  # noqa: F401 (the module's runtime fixture)

PROMPT = "The quick brown fox"
NAME = "tiny-host:latest"


@pytest.fixture
def served(runtime):  # noqa: F811
    server = Served(runtime, ServeDefaults(max_tokens=16))
    yield server
    server.close()


def _eos(served) -> int:
    return min(served.completer.runtime.tokenizer.eos_token_ids)


def _bias(served) -> dict:
    """A logit bias that makes the end-of-text token the first one sampled: an answer of that one token."""
    return {"logit_bias": [[_eos(served), 100.0]], "temperature": 0}


def _picked(served) -> int:
    """Every token the server has sampled so far, the end-of-text ones included (the metrics count each pick)."""
    return served.completer.metrics.predicted_tokens


# ------------------------------------------------------------------ the end-of-text token is counted


def test_completion_counts_the_end_of_text_token(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 8, "return_tokens": True,
                                               **_bias(served)})
    assert status == 200, body
    assert (body["content"], body["stop_type"], body["tokens"]) == ("", "eos", [_eos(served)])
    # llama-server: n_decoded 1, the end-of-text token sampled (and never fed back: the cache holds the prompt)
    assert body["tokens_predicted"] == body["timings"]["predicted_n"] == 1
    assert body["tokens_cached"] == body["tokens_evaluated"]


def test_openai_routes_count_the_end_of_text_token(served):
    status, body = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, **_bias(served)})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 1
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 1
    status, chat = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                        "max_tokens": 8, **_bias(served)})
    assert status == 200, chat
    assert chat["usage"]["completion_tokens"] == chat["timings"]["predicted_n"] == 1


def test_openai_stream_usage_counts_the_end_of_text_token(served):
    events = served.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                    "max_tokens": 8, "stream_options": {"include_usage": True},
                                                    **_bias(served)})
    usage = [event["usage"] for event in events[:-1] if event.get("usage")]
    assert usage
    assert usage[-1]["completion_tokens"] == 1


def test_responses_count_the_end_of_text_token(served):
    status, response = served.post("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 16,
                                                     "logit_bias": {str(_eos(served)): 100.0}, "temperature": 0})
    assert status == 200, response
    assert response["status"] == "completed"
    assert response["usage"]["output_tokens"] == 1
    assert response["usage"]["total_tokens"] == response["usage"]["input_tokens"] + 1


def test_anthropic_output_tokens_count_the_end_of_text_token(served):
    # Anthropic's Messages API takes no logit bias: the answer the chat route makes, put as /v1/messages puts it
    request = parse_chat_request({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                                  **_bias(served)})
    completion = served.completer.complete(request)
    assert (completion.text, completion.finish_reason) == ("", "stop")
    message = anthropic.message_body(request, "msg_1", "m", completion)
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["output_tokens"] == 1  # llama-server's to_json_anthropic: n_decoded
    (_, delta), _ = anthropic.end_events(request, completion)[-2:]
    assert delta["usage"]["output_tokens"] == 1
    assert response_events.usage(completion)["output_tokens"] == 1


def test_ollama_eval_count_counts_the_end_of_text_token(served):
    # Ollama's runner bumps numDecoded before its TokenIsEog check: eval_count is every token sampled, as the
    # metrics count the picks
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    before = _picked(served)
    status, body = served.post("/api/generate", {"model": NAME, "prompt": PROMPT, "stream": False, "format": schema,
                                                 "options": {"temperature": 0, "num_predict": 200,
                                                             "repeat_penalty": 1.5}})
    assert status == 200, body
    assert body["done_reason"] == "stop", body
    # the metrics count the end-of-text token llama.cpp samples once the JSON is closed, as the answer does
    assert body["eval_count"] == _picked(served) - before


def test_a_grammar_s_end_counts_the_end_of_text_token_llama_server_samples(served):
    # llama-server samples on after the grammar is complete, which allows only the end-of-text token then
    body = {"prompt": PROMPT, "n_predict": 8, "grammar": 'root ::= "ab"', "temperature": 0, "return_tokens": True}
    status, answer = served.post("/completion", body)
    assert status == 200, answer
    assert (answer["content"], answer["stop_type"]) == ("ab", "eos")
    # and lists it in tokens, as process_token pushes every sampled id; it is never decoded into the cache
    assert answer["tokens_predicted"] == answer["timings"]["predicted_n"] == len(answer["tokens"])
    assert answer["tokens_cached"] == answer["tokens_evaluated"] + len(answer["tokens"]) - 1


def test_counts_of_an_answer_cut_at_its_limit_or_a_stop_string_are_unchanged(served):
    before = _picked(served)
    status, answer = served.post("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0})
    assert status == 200, answer
    assert answer["stop_type"] == "limit"
    assert answer["tokens_predicted"] == answer["timings"]["predicted_n"] == 6 == _picked(served) - before
    assert answer["tokens_cached"] == answer["tokens_evaluated"] + 6 - 1


# ------------------------------------------------------------------ tokens_cached after a context shift


MAX_CONTEXT = 32
IDS = [5, 17, 99, 3, 250, 41, 8, 77, 120, 64]


@pytest.fixture(scope="module")
def shifting(tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.runtime.session import open_runtime
    from tests._utils.builds import build_lively_bundle

    path = build_lively_bundle(tmp_path_factory.mktemp("counts49"), seed=5, max_context=MAX_CONTEXT).path
    server = Served(open_runtime(path, threads=1), ServeDefaults(max_tokens=16, context_shift=True))
    yield server
    server.close()


@pytest.mark.parametrize("keep", [0, 4])
def test_tokens_cached_after_a_context_shift_is_the_kv_cache_s_length(shifting, keep):
    status, answer = shifting.post("/completion", {"prompt": IDS, "n_predict": 3 * MAX_CONTEXT, "n_keep": keep,
                                                   "ignore_eos": True, "cache_prompt": False})
    assert status == 200, answer
    assert answer["truncated"]
    assert answer["tokens_predicted"] == 3 * MAX_CONTEXT
    # llama-server: slot.prompt.n_tokens() after its shifts dropped n_discard tokens each, never past n_ctx
    assert answer["tokens_cached"] == shifting.completer.runtime.backend.position
    assert answer["tokens_cached"] <= MAX_CONTEXT


def test_tokens_cached_leaves_out_the_discarded_tokens():
    shifted = Completion("x" * 40, "length", prompt_tokens=10, completion_tokens=40, context_shifts=2,
                         context_discarded=22)
    assert llama_native.tokens_cached(shifted) == 10 + 40 - 1 - 22


# ------------------------------------------------------------------ prompt counts with a cached prefix


def test_prompt_counts_with_a_cached_prefix_on_each_route(served):
    chat = {"messages": [{"role": "user", "content": "Tell me about foxes"}], "max_tokens": 2, "temperature": 0}
    served.post("/v1/chat/completions", chat)
    status, again = served.post("/v1/chat/completions", chat)
    assert status == 200, again
    whole, cached = again["usage"]["prompt_tokens"], again["usage"]["prompt_tokens_details"]["cached_tokens"]
    # llama-server: prompt_tokens the whole prompt, cached_tokens the reused ones (all but the last, prefilled for
    # its logits), timings.prompt_n those evaluated and cache_n the reused
    assert cached == whole - 1
    assert (again["timings"]["prompt_n"], again["timings"]["cache_n"]) == (1, cached)
    status, message = served.post("/v1/messages", {"model": "m", "max_tokens": 2, "temperature": 0,
                                                   "messages": chat["messages"]})
    assert status == 200, message
    # llama-server's to_json_anthropic: input_tokens = n_prompt_tokens - n_prompt_tokens_cache
    assert (message["usage"]["input_tokens"], message["usage"]["cache_read_input_tokens"]) == (1, whole - 1)
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "temperature": 0})
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "temperature": 0})
    assert status == 200, body
    assert (body["tokens_evaluated"], body["timings"]["prompt_n"], body["timings"]["cache_n"]) == \
        (body["timings"]["prompt_n"] + body["timings"]["cache_n"], 1, body["tokens_evaluated"] - 1)
    ollama = {"model": NAME, "prompt": PROMPT, "stream": False, "options": {"temperature": 0, "num_predict": 2}}
    _, first = served.post("/api/generate", ollama)
    reused = served.completer.metrics.prompt_cached_tokens
    status, second = served.post("/api/generate", ollama)
    assert status == 200, second
    assert served.completer.metrics.prompt_cached_tokens - reused == second["prompt_eval_count"] - 1
    # Ollama's prompt_eval_count is numPromptInputs: every prompt input, those its cache held too
    assert second["prompt_eval_count"] == first["prompt_eval_count"]
