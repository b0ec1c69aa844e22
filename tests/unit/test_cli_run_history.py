"""``edgesdk run``'s conversation (``--history``): each line a turn after the earlier ones, their
tokens taken from the KV cache, ``/clear`` starting over, the oldest exchanges left out when the
context is full. Answers are checked against ``generate`` on the rendered conversation."""

from __future__ import annotations

import pytest

from edgesdk.runtime.conversation import Conversation
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from tests.unit.test_cli import assert_ok, invoke


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


def answer(runtime, messages: list[dict], n: int) -> str:
    """The greedy answer to ``messages`` rendered whole, from an empty cache."""
    tokenizer = runtime.tokenizer
    ids = tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False)
    tokens, _ = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=n), tokenizer.eos_token_ids)
    return tokenizer.decode(tokens)


def turns(*pairs: tuple[str, str]) -> list[dict]:
    messages = []
    for user, assistant in pairs:
        messages += [{"role": "user", "content": user}] + ([{"role": "assistant", "content": assistant}]
                                                             if assistant is not None else [])
    return messages


def test_history_answers_each_line_after_the_earlier_turns(tiny_bundle, runtime):
    result = invoke("run", tiny_bundle.path, "-n", 6, "--history", "--stats", "--threads", 1,
                    input="hello there\nwhat next\n")
    assert_ok(result)
    first = answer(runtime, turns(("hello there", None)), 6)
    second = answer(runtime, turns(("hello there", first), ("what next", None)), 6)
    assert result.stdout == f"{first}\n{second}\n"
    tokenizer = runtime.tokenizer
    whole = tokenizer.encode(tokenizer.render_chat(turns(("hello there", first), ("what next", None))),
                             add_special_tokens=False)
    stats = [line for line in result.stderr.splitlines() if line.startswith("[ort-cpu] prompt")]
    assert len(stats) == 2
    # The second turn's prompt is the whole conversation; the first turn's tokens were not prefilled again.
    assert stats[1].startswith(f"[ort-cpu] prompt {len(whole)} tok (")
    assert "from the cache)" in stats[1]


def test_piped_lines_stay_separate_conversations_by_default(tiny_bundle, runtime):
    result = invoke("run", tiny_bundle.path, "-n", 6, "--threads", 1, input="hello there\nwhat next\n")
    assert_ok(result)
    assert result.stdout.endswith("\n" + answer(runtime, turns(("what next", None)), 6) + "\n")


def test_clear_starts_a_new_conversation(tiny_bundle, runtime):
    result = invoke("run", tiny_bundle.path, "-n", 6, "--history", "--threads", 1,
                    input="hello there\n/clear\nwhat next\n")
    assert_ok(result)
    first = answer(runtime, turns(("hello there", None)), 6)
    assert result.stdout == f"{first}\n{answer(runtime, turns(('what next', None)), 6)}\n"
    assert "conversation cleared" in result.stderr


def test_a_conversation_that_outgrows_the_context_leaves_out_its_oldest_exchanges(tiny_bundle, runtime):
    """The tiny bundle holds 256 tokens; with room for 150 new ones, three turns do not fit."""
    lines = ["the quick brown fox jumps over the lazy dog " * 3, "and then what happened next", "tell me more"]
    result = invoke("run", tiny_bundle.path, "-n", 150, "--history", "--threads", 1, input="\n".join(lines) + "\n")
    assert_ok(result)
    assert "left out its 1 oldest exchange(s)" in result.stderr
    # The same conversation through the API: each answer from the conversation the CLI kept.
    kept = Conversation(runtime.tokenizer, None, runtime.backend.max_context, answer_room=150)
    expected = []
    for line in lines:
        ids = kept.prompt_ids(line)
        tokens, _ = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=150), runtime.tokenizer.eos_token_ids)
        expected.append(runtime.tokenizer.decode(tokens))
        kept.answered(line, expected[-1])
    assert kept.dropped == result.stderr.count("left out its 1 oldest exchange(s)") >= 1
    assert result.stdout == "".join(text + "\n" for text in expected)


@pytest.mark.parametrize(("options", "why"), [(("--prompt", "hi"), "--prompt answers one prompt")])
def test_history_says_when_it_is_not_used(tiny_bundle, options, why):
    result = invoke("run", tiny_bundle.path, "-n", 3, "--history", "--threads", 1, *options, input="hi\n")
    assert_ok(result)
    assert f"--history is not used: {why}" in result.stderr


def test_conversation_keeps_the_system_message_when_it_drops_exchanges(runtime):
    conversation = Conversation(runtime.tokenizer, "be brief", max_context=256, answer_room=0)
    conversation.answered("word " * 90, "answer " * 60)
    ids = conversation.prompt_ids("short")
    assert conversation.dropped == 1
    assert conversation.exchanges == []
    text = runtime.tokenizer.decode(ids)
    assert "be brief" in text
    assert "short" in text


def test_a_terminal_keeps_the_conversation_by_default(tiny_bundle):
    """At a terminal (stdin a real pty) history is on without the flag: the second turn's prompt comes
    largely from the cache. Ctrl-D at the prompt ends the session."""
    import os
    import subprocess
    import sys

    leader, follower = os.openpty()
    process = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "run", str(tiny_bundle.path), "-n", "4",
                                "--stats", "--threads", "1"], stdin=follower, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    os.close(follower)
    try:
        os.write(leader, b"hello there\nwhat next\n\x04")
        _, stderr = process.communicate(timeout=120)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr.decode()
    stats = [line for line in stderr.decode().splitlines() if "[ort-cpu] prompt" in line]
    assert len(stats) == 2, stderr.decode()
    import re

    first_prompt = int(re.search(r"prompt (\d+) tok", stats[0]).group(1))
    cached = int(re.search(r"\((\d+) from the cache\)", stats[1]).group(1))
    assert cached >= first_prompt  # the whole first turn, not only the system prompt both turns share



def test_a_large_answer_room_keeps_the_history(runtime):
    """-n at the context size (256) reserves half the context for the answer, not all of it: a short
    exchange stays in the conversation."""
    conversation = Conversation(runtime.tokenizer, None, max_context=256, answer_room=256)
    conversation.answered("hello there", "hi")
    conversation.prompt_ids("what next")
    assert conversation.dropped == 0
    assert conversation.exchanges == [("hello there", "hi")]
