"""Log-probabilities (edgesdk/runtime/logprobs.py) through generate and serve, checked against the
backend's own logits: OpenAI's chat and completions shapes, echo of the prompt, streaming."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.logprobs import LogprobRecorder, log_softmax
from edgesdk.serve.api import _complete_characters


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def _reference(runtime, ids: list[int]) -> np.ndarray:
    """log-softmax of one prefill over ``ids``: row i scores token i + 1."""
    backend = runtime.backend
    backend.reset()
    return log_softmax(backend.prefill(np.array(ids), keep_logits=len(ids)))


def test_the_recorder_keeps_the_token_s_logprob_and_the_best_alternatives():
    logits = np.array([0.0, 2.0, 1.0, -1.0], np.float32)
    entry = LogprobRecorder(top=2).entry(logits, 2)
    expected = log_softmax(logits)
    assert entry.token == 2
    assert entry.logprob == pytest.approx(expected[2])
    assert [t for t, _ in entry.top] == [1, 2]
    assert entry.top[0][1] == pytest.approx(expected[1])
    assert LogprobRecorder(top=0).entry(logits, 0).top == ()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_records_each_answer_token_and_with_echo_the_prompt(runtime, temperature):
    prompt = runtime.tokenizer.encode("The quick brown fox")
    recorder = LogprobRecorder(top=3, prompt=True)
    answer, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=8, temperature=temperature, seed=5),
                         set(), logprobs=recorder)
    assert [entry.token for entry in recorder.answer] == answer
    reference = _reference(runtime, prompt + answer)
    for index, entry in enumerate(recorder.answer):
        row = reference[len(prompt) - 1 + index]
        assert entry.logprob == pytest.approx(row[entry.token], abs=1e-3)
        assert [t for t, _ in entry.top] == list(np.argsort(-row, kind="stable")[:3])
    assert recorder.prompt_entries[0].logprob is None
    assert [entry.token for entry in recorder.prompt_entries] == prompt
    for index, entry in enumerate(recorder.prompt_entries[1:], start=1):
        assert entry.logprob == pytest.approx(reference[index - 1][entry.token], abs=1e-3)
    if temperature == 0:
        assert all(entry.top[0][0] == entry.token for entry in recorder.answer)  # greedy takes the best


@pytest.fixture
def served(runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(runtime, ServeDefaults(max_tokens=6))
    yield server
    server.close()


def test_completions_echo_logprobs_score_a_continuation_as_an_evaluation_harness_does(served, runtime):
    """lm-evaluation-harness scores a continuation through /v1/completions with echo, logprobs and
    max_tokens 1: the prompt's token_logprobs after the context are the continuation's."""
    context, continuation = "The quick brown", " fox jumps"
    status, body = served.post("/v1/completions", {"prompt": context + continuation, "max_tokens": 1, "echo": True,
                                                    "logprobs": 2, "temperature": 0})
    assert status == 200, body
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    ids = runtime.tokenizer.encode(context + continuation)
    assert len(logprobs["tokens"]) == len(ids) + 1  # the prompt, then the one new token
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert choice["text"].startswith(context + continuation)
    assert logprobs["token_logprobs"][0] is None
    assert logprobs["text_offset"] == [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(len(ids) + 1)]
    reference = _reference(runtime, ids)
    context_tokens = len(runtime.tokenizer.encode(context))
    expected = sum(reference[i - 1][ids[i]] for i in range(context_tokens, len(ids)))
    assert sum(logprobs["token_logprobs"][context_tokens:len(ids)]) == pytest.approx(expected, abs=1e-3)
    assert all(len(top) <= 3 for top in logprobs["top_logprobs"][1:])  # logprobs + 1: the token taken too


def test_chat_logprobs_whole_and_streamed(served, runtime):
    request = {"messages": [{"role": "user", "content": "The quick brown fox"}], "logprobs": True, "top_logprobs": 3}
    status, body = served.post("/v1/chat/completions", request)
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])  # greedy
        assert _complete_characters(bytes(entry["bytes"])) == entry["token"]  # llama-server's validate_utf8 cut
    events = served.stream("/v1/chat/completions", request)
    streamed = [e for event in events[:-1] if (event["choices"][0].get("logprobs") or {}).get("content")
                for e in event["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in content][: len(streamed)]
    assert len(streamed) >= len(content) - 1  # a token held back at the end is the last one
    _, plain = served.post("/v1/chat/completions", {"messages": request["messages"]})
    assert plain["choices"][0]["logprobs"] is None


def test_streamed_completion_with_echo_carries_the_same_logprobs(served):
    request = {"prompt": "The quick brown fox", "max_tokens": 5, "echo": True, "logprobs": 1}
    _, whole = served.post("/v1/completions", request)
    events = served.stream("/v1/completions", request)
    chunks = [event["choices"][0] for event in events[:-1] if event["choices"]]
    assert "".join(chunk["text"] for chunk in chunks) == whole["choices"][0]["text"]
    tokens = [t for chunk in chunks if chunk["logprobs"] for t in chunk["logprobs"]["tokens"]]
    offsets = [o for chunk in chunks if chunk["logprobs"] for o in chunk["logprobs"]["text_offset"]]
    expected = whole["choices"][0]["logprobs"]
    assert tokens == expected["tokens"][: len(tokens)]
    assert offsets == expected["text_offset"][: len(offsets)]
    assert chunks[0]["text"] == request["prompt"]  # the echo comes first


def test_the_end_of_text_token_is_not_among_the_answer_s_logprobs(runtime):
    prompt = runtime.tokenizer.encode("The quick brown fox")
    sampling = SamplingConfig(max_new_tokens=24, frequency_penalty=2.0, repeat_last_n=-1)  # varied tokens
    plain, _ = generate(runtime.backend, prompt, sampling, set())
    stop = next(index for index in range(1, len(plain)) if plain[index] not in plain[:index])
    recorder = LogprobRecorder()
    answer, stats = generate(runtime.backend, prompt, sampling, {plain[stop]}, logprobs=recorder)
    assert stats.stop_reason == "eos"
    assert answer == plain[:stop]
    assert [entry.token for entry in recorder.answer] == answer


def test_a_prompt_of_token_ids_scores_as_its_text_does(served, runtime):
    """lm-evaluation-harness sends token ids by default (tokenized_requests): the same scores as the text."""
    text = "The quick brown fox jumps"
    ids = runtime.tokenizer.encode(text)
    request = {"max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    _, by_text = served.post("/v1/completions", {**request, "prompt": text})
    status, by_ids = served.post("/v1/completions", {**request, "prompt": ids})
    assert status == 200, by_ids
    assert by_ids["choices"][0]["logprobs"]["token_logprobs"] == by_text["choices"][0]["logprobs"]["token_logprobs"]
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    _, batch_of_one = served.post("/v1/completions", {**request, "prompt": [ids]})
    assert batch_of_one["choices"][0]["text"] == by_text["choices"][0]["text"]
    status, body = served.post("/v1/completions", {**request, "prompt": [1, 10**9]})
    assert (status, body["error"]["param"]) == (400, "prompt")
    assert "vocabulary" in body["error"]["message"]
