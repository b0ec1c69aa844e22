"""The prompt cache and ``edgesdk run``'s conversation at their edges: a line too long for the context,
the interactive defaults, and what the cache holds after each way an answer can end."""

from __future__ import annotations

import pytest

from edgesdk.runtime.conversation import Conversation
from edgesdk.runtime.session import open_runtime


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


def test_a_line_too_long_for_the_context_leaves_the_conversation_as_it_was(runtime):
    """Generation refuses a turn longer than the context on its own; the exchanges before it stay, so
    the next line still follows them (they were all dropped before the refusal)."""
    conversation = Conversation(runtime.tokenizer, "be brief", max_context=256, answer_room=16)
    conversation.answered("hello there", "hi")
    ids = conversation.prompt_ids("word " * 300)
    assert len(ids) > 256  # generate() refuses it by name
    assert conversation.exchanges == [("hello there", "hi")]
    assert conversation.dropped == 0
    assert "hello there" in runtime.tokenizer.decode(conversation.prompt_ids("what next"))


def _at_a_terminal(bundle, typed: bytes, *options: str) -> tuple[int, str]:
    """(exit code, stderr) of ``edgesdk run`` with stdin a real pty and ``typed`` written to it."""
    import os
    import subprocess
    import sys

    leader, follower = os.openpty()
    process = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "run", str(bundle), "-n", "3", "--threads", "1",
                                *options], stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    os.close(follower)
    try:
        os.write(leader, typed)
        _, stderr = process.communicate(timeout=120)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
    return process.returncode, stderr.decode()


def test_a_terminal_with_raw_does_not_warn_about_a_history_nobody_asked_for(tiny_bundle):
    """History is on by default at a terminal; --raw turns it off without a word about --history,
    which the user never typed (the warning is for an explicit --history)."""
    code, stderr = _at_a_terminal(tiny_bundle.path, b"hello there\n\x04", "--raw")
    assert code == 0, stderr
    assert "--history" not in stderr


@pytest.mark.parametrize("chat", [True, False])
def test_cache_prompt_null_means_the_default_as_every_other_field(chat):
    """A client that writes every field, unset ones as null, gets the prompt cache (llama-server's
    default for a null cache_prompt) instead of a 400; false still turns it off and a string is refused."""
    from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request

    def parse(value):
        body = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
        return (parse_chat_request if chat else parse_text_request)({**body, "cache_prompt": value})

    assert parse(None).cache_prompt is True
    assert parse(False).cache_prompt is False
    with pytest.raises(ApiError, match="'cache_prompt' must be true or false, got"):
        parse("yes")
