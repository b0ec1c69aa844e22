"""``edgesdk run``'s interactive layer (edgesdk/cli_interactive.py) and text layer (edgesdk/runtime/text.py,
edgesdk/runtime/conversation.py) against llama-cli (llama.cpp tools/cli/cli.cpp, tools/main/main.cpp) and
transformers' ``apply_chat_template``, with the real tokenizers of tests/_utils/tiny.py."""

from __future__ import annotations

import io
import sys

import pytest

from edgesdk.cli_interactive import Chat
from edgesdk.runtime.text import ChatTokenizer

pytest.importorskip("transformers")


def _chat_tokenizer(tmp_path, extra_special: tuple[str, ...] = ()) -> ChatTokenizer:
    from tests._utils import tiny

    hf = tiny.tiny_tokenizer()
    if extra_special:
        hf.add_special_tokens({"additional_special_tokens": list(extra_special)})
    hf.save_pretrained(tmp_path)
    template = tmp_path / "chat_template.jinja"
    template.write_text(tiny.CHAT_TEMPLATE, encoding="utf-8")
    return ChatTokenizer(tmp_path / "tokenizer.json", {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
                         template)


class _Recorder:
    """The answering side of a Chat (cli_run.Answerer's interface): keeps each text it is asked to answer."""

    def __init__(self, tokenizer):
        self.tokenizer, self.conversation, self.asked = tokenizer, None, []

    def answer(self, text: str, regenerated: int = 0) -> None:
        self.asked.append(text)

    def take_back_last(self):
        return self.asked[-1] if self.asked else None


def _chat(monkeypatch, tokenizer, stdin: str) -> _Recorder:
    answerer = _Recorder(tokenizer)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    Chat(answerer, None, interactive=False, in_prefix="", in_suffix="", show_affixes=False).run()
    return answerer


# --- /read -----------------------------------------------------------------------------------------------------


def test_read_writes_the_file_after_the_models_file_separator_token(tmp_path, monkeypatch):
    """llama-cli's /read (tools/cli/cli.cpp): where the vocabulary has FIM_SEP (<|file_sep|>, Qwen2.5-Coder's) the
    file goes in as ``<|file_sep|>NAME\\n`` and its text, the way the model saw files in training, not under a
    '--- File: NAME ---' line; the separator is the model's one special token."""
    tokenizer = _chat_tokenizer(tmp_path / "tok", ("<|file_sep|>",))
    notes = tmp_path / "notes.txt"
    notes.write_text("the fox\njumps\n", encoding="utf-8")
    asked = _chat(monkeypatch, tokenizer, f"/read {notes}\nwhat does it say\n").asked
    assert asked == [f"<|file_sep|>{notes}\nthe fox\njumps\nwhat does it say"]
    separator = tokenizer.token_id("<|file_sep|>")
    assert tokenizer.encode(asked[0], add_special_tokens=False)[0] == separator


def test_read_keeps_the_file_line_where_the_model_has_no_file_separator(tmp_path, monkeypatch):
    tokenizer = _chat_tokenizer(tmp_path / "tok")
    notes = tmp_path / "notes.txt"
    notes.write_text("the fox", encoding="utf-8")
    asked = _chat(monkeypatch, tokenizer, f"/read {notes}\nwhat\n").asked
    assert asked == [f"--- File: {notes} ---\nthe fox\nwhat"]


# --- streaming detokenization ----------------------------------------------------------------------------------


class _CountingTokenizer(ChatTokenizer):
    """A real ChatTokenizer that counts the ids it is asked to decode."""

    decoded = 0

    def decode(self, ids: list[int]) -> str:
        self.decoded += len(ids)
        return super().decode(ids)


@pytest.mark.parametrize("kind", ["byte-level", "gemma", "llama2"])
def test_a_streamed_step_decodes_a_window_not_the_whole_answer(tmp_path, kind):
    """An answer that --context-shift keeps going has no length bound, and llama.cpp hands out each token's piece
    at the same cost at every step. The stream re-decoded the whole answer at each token: 2,000 tokens cost
    about 2,000,000 decoded ids (0.7 ms a token at the 8,000th on a desktop CPU, and growing), now a few per
    token; the pieces are those of the one-shot decode."""
    from edgesdk.runtime.text import StreamDecoder
    from tests._utils import tiny

    make = {"byte-level": tiny.tiny_tokenizer, "gemma": tiny.tiny_gemma_tokenizer,
            "llama2": tiny.tiny_llama2_tokenizer}[kind]
    make().save_pretrained(tmp_path)
    tokenizer = _CountingTokenizer(tmp_path / "tokenizer.json", {}, None)
    text = " ".join(tiny.CORPUS)
    ids = tokenizer.encode(text, add_special_tokens=False)[:2000]
    whole = tokenizer.decode(ids)
    tokenizer.decoded = 0
    stream = StreamDecoder(tokenizer)
    pieces = [stream.push(token) for token in ids] + [stream.flush()]
    assert len(ids) == 2000
    assert tokenizer.decoded < 20 * len(ids), tokenizer.decoded
    assert "".join(pieces).lstrip() == whole.lstrip()
    assert not any("\ufffd" in piece for piece in pieces)
