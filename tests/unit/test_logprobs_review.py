"""Log-probabilities and echo through serve (edgesdk/serve/completion.py, edgesdk/serve/api.py), at the
edges: one-token prompts, an answer ended by its end-of-text token, stop strings, multi-byte
characters, alternatives whose texts are alike."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(runtime, ServeDefaults(max_tokens=6))
    yield server
    server.close()


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
