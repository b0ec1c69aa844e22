"""The legacy completions' ``top_logprobs`` hold the token taken as well as the ``logprobs`` most likely: OpenAI's
reference for ``logprobs`` says "The API will always return the logprob of the sampled token, so there may be up to
logprobs+1 elements in the response", and llama-cpp-python adds it the same way."""

from __future__ import annotations

import pytest

from edgesdk.runtime.logprobs import TokenLogprob
from edgesdk.serve.api import CompletionRequest, logprobs_body

PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("top", [0, 1, 3])
def test_completions_top_logprobs_hold_the_token_taken(served, top):
    status, body = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "echo": True,
                                                    "logprobs": top, "temperature": 0})
    assert status == 200, body
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["top_logprobs"][0] is None  # the prompt's first token: nothing predicts it
    rows = list(zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True))[1:]
    for token, logprob, alternatives in rows:
        assert alternatives[token] == pytest.approx(logprob), (token, alternatives)
        assert len(alternatives) <= top + 1
        assert list(alternatives.values()) == sorted(alternatives.values(), reverse=True)  # most likely first
    if top == 0:
        assert all(alternatives == {token: logprob} for token, logprob, alternatives in rows)
    else:  # a prompt token the model would not have picked comes after the alternatives it preferred
        assert any(len(alternatives) == top + 1 for _, _, alternatives in rows)


def test_the_token_taken_is_not_listed_twice():
    pieces = {1: b" fox", 2: b" dog", 3: b"\xc3", 4: b"\xe2"}.__getitem__
    among = TokenLogprob(2, -0.9, ((1, -0.6), (2, -0.9)))
    reads_alike = TokenLogprob(4, -2.0, ((1, -0.6), (3, -1.1)))  # both byte pieces read U+FFFD alone
    body = logprobs_body(CompletionRequest(chat=False, prompt="x"), [among, reads_alike], pieces, 1)
    assert body["top_logprobs"] == [{" fox": -0.6, " dog": -0.9}, {" fox": -0.6, "\ufffd": -1.1}]
