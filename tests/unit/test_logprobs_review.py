"""Log-probabilities and echo through serve (edgesdk/serve/completion.py, edgesdk/serve/api.py), at the
edges: one-token prompts, an answer ended by its end-of-text token, stop strings, multi-byte
characters, alternatives whose texts are alike."""

from __future__ import annotations

import pytest

from tests.unit import test_logprobs

runtime, served = test_logprobs.runtime, test_logprobs.served  # the same fixtures: a tiny bundle's runtime and server


def test_echo_of_a_one_token_prompt_lists_that_token(served, runtime):
    assert len(runtime.tokenizer.encode("The")) == 1
    status, body = served.post("/v1/completions", {"prompt": "The", "max_tokens": 2, "echo": True, "logprobs": 1})
    assert status == 200, body
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 1 + body["usage"]["completion_tokens"]
    assert logprobs["tokens"][0] == "The"
    assert logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None
    assert logprobs["text_offset"][:2] == [0, 3]


def test_an_echo_whose_answer_is_its_end_of_text_token_still_lists_one_generated_entry(served, runtime, monkeypatch):
    """lm-evaluation-harness' local-completions takes token_logprobs[ctxlen:-1] for the continuation: the last
    entry must be the generated token's even when the model's pick is end-of-text, or the continuation's last
    token is dropped from its score."""
    prompt = "The quick brown fox"
    ids = runtime.tokenizer.encode(prompt)
    request = {"prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    _, plain = served.post("/v1/completions", request)
    expected = plain["choices"][0]["logprobs"]
    assert len(expected["tokens"]) == len(ids) + 1
    # the token the model picks, by id: its text alone may be a byte piece that reads U+FFFD (so it is not encoded back)
    _, native = served.post("/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0, "return_tokens": True})
    (picked,) = native["tokens"]
    monkeypatch.setattr(runtime.tokenizer, "eos_token_ids", runtime.tokenizer.eos_token_ids | {picked})
    status, body = served.post("/v1/completions", request)
    assert status == 200, body
    choice = body["choices"][0]
    # the end-of-text token is the one token sampled: llama-server's usage.completion_tokens (n_decoded) counts it
    assert (choice["text"], choice["finish_reason"], body["usage"]["completion_tokens"]) == (prompt, "stop", 1)
    logprobs = choice["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(ids) + 1
    assert logprobs["token_logprobs"] == pytest.approx(expected["token_logprobs"])
    events = served.stream("/v1/completions", request)
    streamed = [value for event in events[:-1] if event["choices"] and event["choices"][0]["logprobs"]
                for value in event["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == logprobs["token_logprobs"]
    _, unechoed = served.post("/v1/completions", {**request, "echo": False})
    assert unechoed["choices"][0]["logprobs"]["tokens"] == []  # without echo, only the answer's tokens


def test_alternatives_that_read_alike_keep_the_likelier_logprob():
    from edgesdk.runtime.logprobs import TokenLogprob
    from edgesdk.serve.api import CompletionRequest, logprobs_body

    pieces = {1: b"\xc3", 2: b"\xe2", 3: b"a"}  # two byte pieces that each read U+FFFD on their own
    entry = TokenLogprob(1, -0.7, ((3, -0.5), (1, -0.7), (2, -3.0)))
    body = logprobs_body(CompletionRequest(chat=False, prompt="x"), [entry], pieces.__getitem__, 1)
    assert body["top_logprobs"] == [{"a": -0.5, "\ufffd": -0.7}]  # the chosen token's own logprob among them


@pytest.mark.parametrize("echo", [True, False])
def test_text_offsets_count_the_characters_of_multi_byte_text(served, runtime, echo):
    """Byte pieces of one character each read U+FFFD alone; text_offset must still index the returned text."""
    prompt = "héllo wörld ✓ 😀 cool"  # byte pieces in the prompt, whole-text tokens in the answer ("gu", "ery")
    table = runtime.tokenizer.token_bytes()
    ids = runtime.tokenizer.encode(prompt)
    assert any(len(table[i].decode("utf-8", "replace")) != len(table[i].decode("utf-8", "ignore")) for i in ids)
    request = {"prompt": prompt, "max_tokens": 4, "echo": echo, "logprobs": 2}
    status, body = served.post("/v1/completions", request)
    assert status == 200, body
    choice = body["choices"][0]
    text = choice["text"] if echo else prompt + choice["text"]
    answer = choice["logprobs"]["tokens"][-body["usage"]["completion_tokens"]:]
    assert "".join(answer).isascii()  # the tiny model's greedy answer: each token its own text
    pieces = [table[i] for i in ids] + [token.encode() for token in answer]
    before = [len(b"".join(pieces[:i]).decode("utf-8", "ignore")) for i in range(len(pieces))]  # whole characters
    offsets = choice["logprobs"]["text_offset"]
    assert offsets == before[len(pieces) - len(offsets):]
    assert all(text[at:].encode().startswith(piece) for at, piece in zip(before, pieces, strict=True)
               if piece[0] < 0x80)
    events = served.stream("/v1/completions", request)
    streamed = [o for event in events[:-1] if event["choices"] and event["choices"][0]["logprobs"]
                for o in event["choices"][0]["logprobs"]["text_offset"]]
    assert streamed == offsets


@pytest.mark.parametrize("echo", [True, False])
def test_tokens_cut_off_with_a_stop_string_are_not_listed_whole_or_streamed(served, echo):
    request = {"prompt": "The quick brown fox", "max_tokens": 12, "logprobs": 1, "echo": echo,
               "frequency_penalty": 2.0, "repeat_last_n": -1}  # varied tokens from the tiny model
    _, plain = served.post("/v1/completions", request)
    answer = plain["choices"][0]["logprobs"]["tokens"][-plain["usage"]["completion_tokens"]:]
    assert len(answer) >= 6
    stop = "".join(answer[3:5])
    status, body = served.post("/v1/completions", {**request, "stop": [stop]})
    assert status == 200, body
    choice = body["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert choice["finish_reason"] == "stop"
    assert "".join(tokens) == choice["text"]
    assert len(tokens) == len(choice["logprobs"]["text_offset"]) == len(choice["logprobs"]["token_logprobs"])
    assert tokens[-3:] == answer[:3]  # the stop string's tokens and those after it are left out
    events = served.stream("/v1/completions", {**request, "stop": [stop]})
    chunks = [event["choices"][0] for event in events[:-1] if event["choices"]]
    assert "".join(chunk["text"] for chunk in chunks) == choice["text"]
    assert [t for chunk in chunks if chunk["logprobs"] for t in chunk["logprobs"]["tokens"]] == tokens
