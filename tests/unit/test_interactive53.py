"""``edgesdk run``'s interactive mode (edgesdk/cli_interactive.py) against llama.cpp: llama-completion's
(tools/completion/completion.cpp) Ctrl-C at the prompt of a plain-text session, and the --keep tokens of its
initial prompt that stay when the transcript outgrows the context; with the real tokenizer of tests/_utils/tiny.py."""

from __future__ import annotations

import errno
import os
import sys

import pytest

from edgesdk.cli_interactive import Chat, Transcript, TypedPrompt
from edgesdk.runtime.text import ChatTokenizer

pytest.importorskip("transformers")


def _chat_tokenizer(tmp_path) -> ChatTokenizer:
    from tests._utils import tiny

    tiny.tiny_tokenizer().save_pretrained(tmp_path)
    template = tmp_path / "chat_template.jinja"
    template.write_text(tiny.CHAT_TEMPLATE, encoding="utf-8")
    return ChatTokenizer(tmp_path / "tokenizer.json", {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
                         template)


def _transcript(tokenizer, max_context: int, keep: int) -> Transcript:
    from edgesdk.cli_run import _transcript_turn_ids

    return Transcript(_transcript_turn_ids(tokenizer, None), [], max_context, answer_room=4, keep=keep)


def _typed(text: str) -> TypedPrompt:
    return TypedPrompt("", (), text, "")


# --- Ctrl-C at the prompt ---------------------------------------------------------------------------------------


class _CtrlCAtThePrompt:
    """stdin at a terminal where the user presses Ctrl-C while the prompt waits for a line."""

    errors = "surrogateescape"

    def readline(self) -> str:
        raise KeyboardInterrupt


class _Answerer:
    """The answering side of a Chat (cli_run.Answerer's interface); no line reaches it here."""

    tokenizer = None

    def __init__(self, conversation):
        self.conversation = conversation

    def answer(self, text: str, regenerated: int = 0) -> None:
        raise AssertionError(f"nothing was typed, and {text!r} was answered")

    def take_back_last(self):
        return None


def test_ctrl_c_at_the_prompt_of_a_plain_text_session_ends_it_with_130(tmp_path, monkeypatch):
    """llama-completion's ``sigint_handler`` outside an answer (``is_interacting``) calls ``_exit(130)``: the
    KeyboardInterrupt goes on to the command line, which exits 130, not 0 as a finished session."""
    monkeypatch.setattr(sys, "stdin", _CtrlCAtThePrompt())
    from edgesdk.cli_run import _transcript_turn_ids

    transcript = Transcript(_transcript_turn_ids(_chat_tokenizer(tmp_path), None), [], 64, answer_room=4)
    chat = Chat(_Answerer(transcript), None, interactive=True, in_prefix="", in_suffix="", show_affixes=True)
    with pytest.raises(KeyboardInterrupt):
        chat.run()


def test_ctrl_c_at_the_prompt_of_a_chat_ends_it_as_llama_cli_does(monkeypatch):
    """llama-cli's tools/cli/cli.cpp breaks its loop at a Ctrl-C while reading and returns 0."""
    monkeypatch.setattr(sys, "stdin", _CtrlCAtThePrompt())
    Chat(_Answerer(None), None, interactive=True, in_prefix="", in_suffix="", show_affixes=False).run()


# --- --keep when the transcript outgrows the context ------------------------------------------------------------

PROMPT = "The quick brown fox jumps over the lazy dog."


def _fill(transcript: Transcript, tokenizer, lines: int) -> list[int]:
    """--prompt answered, then ``lines`` typed lines, each answered with a few tokens; the ids of the next line."""
    transcript.prompt_ids(PROMPT)
    transcript.answered(PROMPT, tokenizer.encode_plain(" Edge boards"))
    for index in range(lines):
        line = _typed(f"café {index}")
        transcript.prompt_ids(line)
        transcript.answered(line, tokenizer.encode_plain(" run small"))
    return transcript.prompt_ids(_typed("naïve"))


@pytest.mark.parametrize("keep", [-1, 3])
def test_the_first_keep_tokens_of_the_prompt_stay_when_its_exchange_is_left_out(tmp_path, keep):
    """llama-completion keeps ``n_keep`` tokens of its initial prompt (-1: all of it) when the context is full;
    the transcript left the --prompt exchange out whole, --keep and all."""
    tokenizer = _chat_tokenizer(tmp_path)
    prompt_ids = tokenizer.prompt_ids(PROMPT, raw=True)
    kept = prompt_ids if keep == -1 else prompt_ids[:keep]
    transcript = _transcript(tokenizer, 64, keep=keep)
    ids = _fill(transcript, tokenizer, lines=8)
    assert transcript.dropped >= 1  # the --prompt exchange is left out
    assert ids[:len(kept)] == kept
    assert len(ids) + transcript.answer_room <= 64
    assert ids[len(kept):len(kept) + len(transcript.exchanges[0][1])] == transcript.exchanges[0][1]


def test_keep_0_leaves_the_prompt_out_whole(tmp_path):
    """llama-completion's default --keep 0 keeps the BOS alone (this tokenizer adds none)."""
    tokenizer = _chat_tokenizer(tmp_path)
    transcript = _transcript(tokenizer, 64, keep=0)
    ids = _fill(transcript, tokenizer, lines=8)
    assert transcript.dropped >= 1
    assert ids[:len(transcript.exchanges[0][1])] == transcript.exchanges[0][1]


def test_the_kept_tokens_are_not_doubled_while_the_prompt_exchange_is_in_the_transcript(tmp_path):
    tokenizer = _chat_tokenizer(tmp_path)
    prompt_ids = tokenizer.prompt_ids(PROMPT, raw=True)
    transcript = _transcript(tokenizer, 512, keep=-1)
    ids = _fill(transcript, tokenizer, lines=1)
    assert transcript.dropped == 0
    assert ids[:len(prompt_ids) + 1] == prompt_ids + tokenizer.encode_plain(" Edge boards")[:1]
    # /regen of the --prompt answer: its prompt is answered again as it is, without the kept tokens before it
    transcript.take_last()
    assert transcript.take_last() == PROMPT
    assert transcript.prompt_ids(PROMPT) == prompt_ids


def test_clear_keeps_the_kept_tokens_as_a_chat_keeps_its_system_message(tmp_path):
    tokenizer = _chat_tokenizer(tmp_path)
    prompt_ids = tokenizer.prompt_ids(PROMPT, raw=True)
    transcript = _transcript(tokenizer, 512, keep=2)
    _fill(transcript, tokenizer, lines=1)
    transcript.clear()
    line = _typed("naïve")
    assert transcript.prompt_ids(line) == prompt_ids[:2] + transcript.turn_ids(line)


# --- --prompt-cache: a write that fails --------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "fix"), [(errno.ENOSPC, "free space on the disk that holds"),
                                           (errno.EROFS, "read-only file system"),
                                           (errno.EACCES, "a directory this user may write to")])
def test_a_failed_prompt_cache_write_names_the_fix_for_its_cause(tiny_bundle, tmp_path, monkeypatch, code, fix):
    """A full disk was told to pass a path in a directory this user may write to, which the directory was."""
    from tests.unit.test_cli import assert_error, invoke

    def failing(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing)  # the write fails as the disk makes it fail
    result = invoke("run", tiny_bundle.path, "--prompt", "The quick brown fox", "--raw", "-n", 4, "--threads", 1,
                    "--prompt-cache", tmp_path / "prompt.cache")
    assert_error(result, os.strerror(code), fix)
    if code != errno.EACCES:
        assert "may write to" not in result.output
