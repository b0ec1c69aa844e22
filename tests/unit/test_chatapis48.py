"""serve's chat APIs (edgesdk/serve/anthropic.py) against what real clients send: Claude Code's billing header, whose
cch stamp changes with every request, written as llama-server writes it (tools/server,
``normalize_anthropic_billing_header``, ggml-org/llama.cpp PR 21793) so that the prompt cache reuses the prompt past
it."""

from __future__ import annotations

import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4))
    yield server
    server.close()


# ------------------------------------------------------------------------------------------------ Claude Code's header


def _claude_code_system(stamp: str) -> list[dict]:
    """The system blocks Claude Code sends: its billing header first, its cch stamp new in every request."""
    return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; "
                                     f"cch={stamp};"},
            {"type": "text", "text": "You are Claude Code, a CLI.", "cache_control": {"type": "ephemeral"}}]


def test_the_billing_header_s_stamp_does_not_change_the_prompt():
    """Claude Code's cch stamp changes with every request; llama-server writes it as fffff (ggml-org/llama.cpp PR
    21793), so two turns of one conversation render the same system prompt. The rest of the text is kept."""
    first, second = (parse_messages_request({"max_tokens": 4, "system": _claude_code_system(stamp),
                                             "messages": MESSAGES}).messages[0]["content"]
                     for stamp in ("a5145", "0b7e2"))
    assert first == second == ("x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=fffff;"
                               "You are Claude Code, a CLI.")
    as_string = "x-anthropic-billing-header: cc_version=2.1.101.e51; cch=9c1d2;\nBe brief."
    assert parse_messages_request({"max_tokens": 4, "system": as_string, "messages": MESSAGES}).messages[0] == \
        {"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1.101.e51; cch=fffff;\nBe brief."}
    # only the header's stamp: a cch= elsewhere, or a header without one, is the client's text
    for text in ("Remember cch=a5145; here.", "x-anthropic-billing-header: cc_version=2.1.101.e51;"):
        assert parse_messages_request({"max_tokens": 4, "system": text, "messages": MESSAGES}).messages[0] == \
            {"role": "system", "content": text}


def test_a_new_stamp_still_reads_the_prompt_from_the_cache(served):
    """The next turn of a Claude Code conversation, its stamp new, reads its whole prompt from the prompt cache, as
    the stamp no longer splits it (left as sent, the cache ended at the stamp)."""
    body = {"model": "m", "max_tokens": 1, "messages": MESSAGES}
    status, first = served.post("/v1/messages", {**body, "system": _claude_code_system("a5145")})
    assert status == 200, first
    status, second = served.post("/v1/messages", {**body, "system": _claude_code_system("0b7e2")})
    assert status == 200, second
    used = second["usage"]
    prompt = used["input_tokens"] + used["cache_read_input_tokens"]
    assert prompt == first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"]
    assert used["cache_read_input_tokens"] >= prompt - 1, used
