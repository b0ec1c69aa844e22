"""The tokenizer (edgesdk/runtime/text.py), review 57: plain text and the tokens llama.cpp makes control tokens.

llama.cpp's vocab loader makes the FIM tokens and the end-of-generation tokens it finds by their text control tokens
whatever the model typed them (src/llama-vocab.cpp: "control-looking token ... its type will be overridden"), and
with ``parse_special`` false its tokenizer reads a control token's text as plain characters. Qwen2.5-Coder's
tokenizer.json marks its FIM tokens not special (``"special": false``), as Phi-3's marks ``<|end|>``.
"""

from __future__ import annotations

from pathlib import Path

QWEN_FIM = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]


def _tokenizer(folder: Path, not_special: list[str]):
    """A byte-level BPE tokenizer with <|endoftext|>, <|im_start|>, <|im_end|> special (ids 0-2) and ``not_special``
    added after its 300 as ordinary added tokens (``"special": false``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from edgesdk.runtime.text import ChatTokenizer
    from tests._utils.tiny import CORPUS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False) for text in not_special])
    tokenizer.save(str(folder / "tokenizer.json"))
    return ChatTokenizer(folder / "tokenizer.json", {"eos_token_ids": [2]}, None)


def test_fim_tokens_the_model_marks_not_special_are_plain_text_in_plain_text(tmp_path):
    tokenizer = _tokenizer(tmp_path, [*QWEN_FIM, "<tool_call>"])
    fim = tokenizer.fim_tokens()
    fim_ids = {fim.pre, fim.suf, fim.mid, fim.pad, fim.rep, fim.sep}
    assert None not in fim_ids
    for text in QWEN_FIM:
        code = f"x = '{text}'\n"
        ids = tokenizer.encode_plain(code)
        assert not fim_ids & set(ids), text
        assert tokenizer.decode(ids) == code
        assert tokenizer.token_id(text) in tokenizer.encode(code, add_special_tokens=False)  # parsed where asked
    # an ordinary added token that llama.cpp leaves user-defined is still split out of plain text
    assert tokenizer.encode_plain("<tool_call>") == [tokenizer.token_id("<tool_call>")]


def test_an_end_of_turn_token_the_model_marks_not_special_is_plain_text(tmp_path):
    """Phi-3's <|end|>: llama.cpp makes it a control token as it puts it among the tokens that end generation."""
    tokenizer = _tokenizer(tmp_path, ["<|end|>"])
    end = tokenizer.token_id("<|end|>")
    assert end in tokenizer.eos_token_ids
    assert end not in tokenizer.encode_plain("a <|end|> b")
    assert tokenizer.decode(tokenizer.encode_plain("a <|end|> b")) == "a <|end|> b"


def test_an_infill_prefix_holding_fim_text_keeps_one_of_each_fim_token(tmp_path):
    from edgesdk.runtime.fim import infill_ids

    tokenizer = _tokenizer(tmp_path, QWEN_FIM)
    fim = tokenizer.fim_tokens()
    prefix = tokenizer.encode_plain("s = '<|fim_suffix|><|fim_middle|>'\n")
    suffix = tokenizer.encode_plain("print(s)  # <|fim_prefix|>\n")
    ids = infill_ids(fim, prefix, suffix, [], [("a.py", "<|file_sep|><|repo_name|>")], tokenizer.encode_plain,
                     None, n_ctx=4096)
    assert [ids.count(token) for token in (fim.pre, fim.suf, fim.mid, fim.rep, fim.sep)] == [1, 1, 1, 1, 2]
    assert ids[-1] == fim.mid
