"""llama-server's POST /completion ``return_tokens`` and ``tokens``, and its prompts that mix token ids with strings
or hold several prompts (on /completion and as embedding inputs), over real HTTP against the tiny bundle
(tools/server/server-context.cpp process_token, send_partial_response, send_final_response; tools/server/utils.hpp
tokenize_input_prompts, tokenize_mixed; tools/server/tests/unit/test_completion.py in ggml-org/llama.cpp)."""

from __future__ import annotations

import json

import numpy as np


def events(served, path: str, body: dict) -> list[dict]:
    """A llama-server stream's events (no [DONE] ends it)."""
    status, headers, payload = served.request("POST", path, {**body, "stream": True})
    assert status == 200, payload
    assert headers["Content-Type"] == "text/event-stream"
    return [json.loads(block[len("data: "):]) for block in payload.decode().split("\n\n") if block]


GREEDY = {"temperature": 0, "n_predict": 6, "cache_prompt": False}


def test_return_tokens_lists_the_generated_ids_whole_and_streamed(served):
    status, plain = served.post("/completion", {"prompt": "Hello", **GREEDY})
    assert status == 200, plain
    assert plain["tokens"] == []  # return_tokens false: none, as llama-server's README says
    status, body = served.post("/completion", {"prompt": "Hello", **GREEDY, "return_tokens": True})
    assert status == 200, body
    ids = body["tokens"]
    assert len(ids) == body["tokens_predicted"] == 6
    assert all(type(token) is int for token in ids)
    status, text = served.post("/detokenize", {"tokens": ids})
    assert text["content"] == body["content"]
    # streamed: every partial event carries the ids of its tokens (llama-server's send_partial_response, whatever
    # return_tokens says); the last event carries none, its partials did
    stream = events(served, "/completion", {"prompt": "Hello", **GREEDY})
    partials, last = stream[:-1], stream[-1]
    assert last["stop"] is True
    assert last["tokens"] == []
    assert all(event["tokens"] for event in partials)
    assert [token for event in partials for token in event["tokens"]] == ids
    assert "".join(event["content"] for event in partials) == body["content"]


def test_tokens_hold_a_stop_string_s_tokens_as_llama_server_s_generated_tokens(served):
    status, whole = served.post("/completion", {"prompt": "Hello", **GREEDY, "return_tokens": True})
    first = whole["content"][:2]
    status, body = served.post("/completion", {"prompt": "Hello", **GREEDY, "return_tokens": True, "stop": [first]})
    assert status == 200, body
    assert body["stop_type"] == "word"
    assert body["content"] == ""
    # the text is cut before the stop string; the ids of the tokens that made it stay (process_token pushes each
    # sampled token before it looks for a stop string)
    count = len(body["tokens"])
    assert count == body["tokens_predicted"]
    assert count >= 1
    assert body["tokens"] == whole["tokens"][:count]
    stream = events(served, "/completion", {"prompt": "Hello", **GREEDY, "stop": [first]})
    assert [token for event in stream[:-1] for token in event["tokens"]] == body["tokens"]
    assert "".join(event["content"] for event in stream) == ""


def test_tokens_end_with_the_end_of_text_token_the_answer_stopped_at(served):
    eos = min(served.completer.runtime.tokenizer.eos_token_ids)
    request = {"prompt": "Hello", **GREEDY, "logit_bias": [[eos, 100]], "return_tokens": True}
    status, body = served.post("/completion", request)
    assert status == 200, body
    assert body["stop_type"] == "eos"
    assert body["content"] == ""
    assert body["tokens"] == [eos]
    stream = events(served, "/completion", request)
    assert [event["tokens"] for event in stream] == [[eos], []]
    assert stream[0]["content"] == ""
    assert stream[0]["stop"] is False


def test_a_prompt_mixing_token_ids_and_strings_is_one_prompt(served):
    tokenizer = served.completer.runtime.tokenizer
    head = tokenizer.encode("Hello", add_special_tokens=False)
    # tokenize_mixed: ids as they are, a string after them tokenized without the special tokens
    ids = head + tokenizer.encode(" world", add_special_tokens=False)
    status, mixed = served.post("/completion", {"prompt": [*head, " world"], **GREEDY, "return_tokens": True})
    assert status == 200, mixed
    status, plain = served.post("/completion", {"prompt": ids, **GREEDY, "return_tokens": True})
    assert mixed["content"] == plain["content"]
    assert mixed["tokens"] == plain["tokens"]
    assert mixed["tokens_evaluated"] == len(ids)
    # a string first takes the special tokens a text prompt takes
    first = tokenizer.encode("Hello") + tokenizer.encode(" world", add_special_tokens=False)
    status, body = served.post("/completion", {"prompt": ["Hello", *tokenizer.encode(" world", add_special_tokens=False)],
                                               **GREEDY})
    assert status == 200, body
    assert body["tokens_evaluated"] == len(first)
    status, body = served.post("/completion", {"prompt": [*head, True, "x"], **GREEDY})
    assert status == 400
    assert body["error"]["param"] == "prompt"
    assert "prompt[" in body["error"]["message"]


def test_several_prompts_answer_an_array_in_their_order(served):
    tokenizer = served.completer.runtime.tokenizer
    ids = tokenizer.encode("World")
    answers = {}
    for prompt in ("Hello", "World"):
        status, body = served.post("/completion", {"prompt": prompt, **GREEDY})
        answers[prompt] = body["content"]
    status, body = served.post("/completion", {"prompt": ["Hello", ids], **GREEDY, "return_tokens": True})
    assert status == 200, body
    assert isinstance(body, list)
    assert [item["index"] for item in body] == [0, 1]
    assert [item["content"] for item in body] == [answers["Hello"], answers["World"]]
    assert all(len(item["tokens"]) == item["tokens_predicted"] for item in body)
    stream = events(served, "/completion", {"prompt": ["Hello", "World"], **GREEDY})
    for index, prompt in enumerate(("Hello", "World")):
        mine = [event for event in stream if event["index"] == index]
        assert mine[-1]["stop"] is True
        assert all(not event["stop"] for event in mine[:-1])
        assert "".join(event["content"] for event in mine) == answers[prompt]
    assert [event["stop"] for event in stream].count(True) == 2
    status, body = served.post("/completion", {"prompt": ["Hello", {"x": 1}], **GREEDY})
    assert status == 400, body
    assert body["error"]["param"] == "prompt"
    assert "'prompt[1]'" in body["error"]["message"]


def test_embedding_inputs_mixing_token_ids_and_strings(served):
    tokenizer = served.completer.runtime.tokenizer
    head = tokenizer.encode("Hello", add_special_tokens=False)
    ids = head + tokenizer.encode(" world", add_special_tokens=False)
    status, mixed = served.post("/embedding", {"input": [*head, " world"]})
    assert status == 200, mixed
    status, plain = served.post("/embedding", {"input": ids})
    assert len(mixed) == 1
    assert np.allclose(mixed[0]["embedding"], plain[0]["embedding"], atol=1e-6)
    status, body = served.post("/v1/embeddings", {"input": ["Hello", [*head, " world"]]})
    assert status == 200, body
    assert len(body["data"]) == 2
    assert np.allclose(body["data"][1]["embedding"], plain[0]["embedding"][0], atol=1e-5) or \
        np.allclose(np.asarray(body["data"][1]["embedding"]),
                    np.asarray(plain[0]["embedding"][0]) / np.linalg.norm(plain[0]["embedding"][0]), atol=1e-5)


def test_text_that_is_not_utf8_in_a_mixed_embedding_input_is_named_as_plain_text_is(served):
    """A lone surrogate (a JSON escape no UTF-8 can hold) in a mixed input gets the code a plain text's gets."""
    status, plain = served.post("/v1/embeddings", {"input": ["\ud800"]})
    assert status == 400, plain
    status, mixed = served.post("/v1/embeddings", {"input": [[5, "\ud800"]]})
    assert status == 400, mixed
    assert mixed["error"]["code"] == plain["error"]["code"] == "not_utf8"
