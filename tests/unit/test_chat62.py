"""``edgesdk run``'s chat against llama-cli's: a system message that fills the context is refused by name before the
chat starts, and -r's texts through the chat template are stop strings (llama-cli's chat, tools/cli, runs on
llama-server's slots, which cut a stop string from the text sent and kept), while --raw shows and keeps them as
llama-completion does. Driven with piped stdin, as a user drives them."""

from __future__ import annotations

import subprocess

import pytest

from tests.unit.test_cli import flat
from tests.unit.test_cli_run_interactive37 import (
    ENV,
    _argv,
    _assistant,
    _prompt_tokens,
    _stats_prompts,
    _user,
)

pytest.importorskip("torch")

GRAMMAR = 'root ::= "one two three four"'
LONG_SYSTEM = " ".join(["You are a careful assistant who answers briefly."] * 40)  # past the tiny bundle's 256


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def _piped(bundle, stdin: str, *options) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(bundle, *options), input=stdin, env=ENV, capture_output=True, text=True, timeout=300)


# --- a system message that fills the context ---------------------------------------------------------------------


@pytest.mark.parametrize("as_file", [False, True])
def test_a_system_message_past_the_context_is_refused_by_name_before_the_chat(tiny_bundle, runtime, tmp_path,
                                                                              as_file):
    """Every line was refused as "the prompt has N tokens ... shorten the prompt", even "hi", --system never named:
    the option is refused before any line is read, with its tokens, the context and the fix."""
    tokenizer = runtime.tokenizer
    tokens = len(tokenizer.prompt_ids("", raw=False, system=LONG_SYSTEM))
    assert tokens > runtime.backend.max_context
    if as_file:
        path = tmp_path / "system.txt"
        path.write_text(LONG_SYSTEM + "\n", encoding="utf-8")
        options, named = ("-sysf", str(path)), "--system-prompt-file"
    else:
        options, named = ("--system", LONG_SYSTEM), "--system"
    result = _piped(tiny_bundle.path, "hi\nhello\n", "-i", "-n", "4", "--stats", *options)
    assert result.returncode == 2, result.stderr
    text = flat(result.stderr)
    assert f"the system message is {tokens} tokens in the chat template" in text, text
    assert f"the bundle's max_context is {runtime.backend.max_context}" in text
    assert f"shorten {named}" in text
    assert named in text.split("Invalid value for")[1]
    assert "the prompt has" not in text
    assert result.stdout == ""
    # with -p, answered alone, too
    alone = _piped(tiny_bundle.path, "", "-p", "hi", "-n", "4", *options)
    assert alone.returncode == 2, alone.stderr
    assert f"the system message is {tokens} tokens" in flat(alone.stderr)


def test_a_system_message_that_leaves_room_is_answered(tiny_bundle, runtime):
    """A system message that fits goes on as before, and --raw (which does not use it) is not refused."""
    result = _piped(tiny_bundle.path, "hi\n", "-i", "-n", "2", "--stats", "--system", "Be brief.")
    assert result.returncode == 0, result.stderr
    assert len(_stats_prompts(result.stderr)) == 1
    raw = _piped(tiny_bundle.path, "hi\n", "-i", "--raw", "-n", "2", "--system", LONG_SYSTEM)
    assert raw.returncode == 0, raw.stderr
    assert "--system is not used" in raw.stderr


# --- -r in the templated chat: a stop string -----------------------------------------------------------------------


def test_a_reverse_prompt_in_the_chat_is_cut_from_the_answer_shown_and_kept(tiny_bundle, runtime):
    """The answer stops at the reverse prompt, which is neither shown nor kept: the next turn's prompt holds the
    answer without it (it held "one two")."""
    result = _piped(tiny_bundle.path, "hello\nwhat next\n", "-i", "-n", "32", "--stats", "--grammar", GRAMMAR,
                    "-r", "nothing", "-r", "two")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "one ", repr(result.stdout)
    assert "two" not in result.stdout
    assert "three" not in result.stdout
    assert "stop: reverse_prompt" in result.stderr
    assert _stats_prompts(result.stderr)[1] == _prompt_tokens(runtime, [_user("hello"), _assistant("one "),
                                                                        _user("what next")]), result.stderr


def test_text_that_begins_a_stop_string_is_held_back_then_shown_where_it_is_not_one(tiny_bundle, runtime):
    """'two thr' begins with 'two t', the start of the stop string 'two tx': held back until 'h' tells it is not
    one, then shown; the answer goes on to its end and is kept whole."""
    result = _piped(tiny_bundle.path, "hello\nwhat next\n", "-i", "-n", "32", "--stats", "--grammar", GRAMMAR,
                    "-r", "two tx", "-r", "four!")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "one two three four", repr(result.stdout)
    assert "stop: reverse_prompt" not in result.stderr
    assert _stats_prompts(result.stderr)[1] == _prompt_tokens(runtime, [_user("hello"),
                                                                        _assistant("one two three four"),
                                                                        _user("what next")]), result.stderr


def test_a_reverse_prompt_ends_a_templated_prompt_answer_cut(tiny_bundle):
    """--prompt through the chat template: the stop string ends the answer and is not shown."""
    result = _piped(tiny_bundle.path, "", "-p", "hello", "-n", "32", "--grammar", GRAMMAR, "-r", "two\\x20")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "one \n"


def test_a_reverse_prompt_with_raw_is_still_shown_and_kept(tiny_bundle):
    """--raw feeds the text as it is, as llama-completion: the reverse prompt is shown and control comes back."""
    result = _piped(tiny_bundle.path, "hello\n", "--raw", "-n", "32", "--grammar", GRAMMAR, "-r", "two")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "one two", repr(result.stdout)
