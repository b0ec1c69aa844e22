"""llama-server's native ``POST /completion``: ``truncated`` where a one-token prompt's answer fills the context, and
the refusal of an ``n_discard`` past what follows the kept tokens named as ``n_discard``."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

FIELDS = ["truncated", "stop_type", "tokens_predicted", "tokens_evaluated", "tokens_cached"]


@pytest.mark.parametrize("no_limit", [False, True])
def test_a_one_token_prompt_whose_answer_fills_the_context_is_truncated(runtime, no_limit):
    """A limit past the context (the request's, or -1 on a server started with -n -1) is held to the context's size; a
    one-token prompt reaches that held limit exactly as the context fills, which is llama-server's ``truncated`` (the
    answer ran out of context, not of its limit)."""
    context = runtime.backend.max_context
    server = Served(runtime, ServeDefaults(max_tokens=UNTIL_THE_CONTEXT_FILLS if no_limit else 16))
    try:
        status, answer = server.post("/completion", {"prompt": "a", "n_predict": -1 if no_limit else context + 44,
                                                     "response_fields": FIELDS})
        assert status == 200, answer
        assert answer["tokens_evaluated"] == 1, answer
        assert answer["tokens_predicted"] == context, answer
        assert answer["tokens_cached"] == context  # the context is full
        assert answer["truncated"] is True
        assert answer["stop_type"] == "limit"
        status, answer = server.post("/completion", {"prompt": "a", "n_predict": 8, "response_fields": FIELDS})
        assert answer["tokens_predicted"] == 8
        assert answer["truncated"] is False  # its own limit: not truncated
    finally:
        server.close()


def test_a_discard_past_what_follows_the_kept_tokens_is_refused_naming_n_discard(runtime):
    """The 400 of an ``n_discard`` larger than what follows the kept tokens names ``n_discard``, not ``n_keep``; a kept
    span that leaves nothing to discard still names ``n_keep``."""
    context = runtime.backend.max_context
    server = Served(runtime, ServeDefaults(max_tokens=16, context_shift=True))
    try:
        status, answer = server.post("/completion", {"prompt": "a b c", "n_predict": context + 44, "n_keep": 0,
                                                     "n_discard": context + 1})
        assert status == 400, answer
        assert answer["error"]["param"] == "n_discard", answer
        assert answer["error"]["message"].startswith("'n_discard': ")
        assert f"discard at most {context}" in answer["error"]["message"]
        status, answer = server.post("/completion", {"prompt": [5] * context, "n_predict": 8, "n_keep": -1,
                                                     "n_discard": 4})
        assert status == 400, answer
        assert answer["error"]["param"] == "n_keep", answer
    finally:
        server.close()
