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
