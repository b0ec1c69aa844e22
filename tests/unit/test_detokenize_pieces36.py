"""llama-server's ``POST /detokenize`` joins the tokens' pieces (``tokens_to_str``), so a SentencePiece tokenizer's
first token keeps its leading space, as llama.cpp's pieces do; byte-level and Gemma tokenizers read as before."""

from __future__ import annotations

import pytest

from edgesdk.runtime.text import pieces_text

pytest.importorskip("transformers")


@pytest.mark.parametrize("text", ["The tower was built", "naïve café 東京 done", "x\n\ny  two  spaces"])
def test_the_text_is_the_tokens_pieces_joined(tokenizer, text):
    """Each token's own bytes (the table JSON mode reads, ▁ as a space) joined are the text, for every suffix of the
    ids that starts at a character boundary: " tower was built" for the ids after "The", where the plain decode
    of Llama 2's tokenizer gave "tower was built"."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    table = tokenizer.token_bytes()
    for start in range(len(ids)):
        joined = b"".join(table[token] for token in ids[start:])
        try:
            expected = joined.decode("utf-8")
        except UnicodeDecodeError:
            continue  # the suffix starts inside a character
        assert pieces_text(tokenizer, ids[start:]) == expected, (text, start)


@pytest.fixture
def tokenizer(kind_tokenizer):
    return kind_tokenizer


def test_special_tokens_are_written_out(tokenizer):
    specials = [token for token, data in enumerate(tokenizer.token_bytes()) if data is None
                and tokenizer.tokenizer.id_to_token(token)]
    assert specials
    word = tokenizer.encode(" tower", add_special_tokens=False)
    text = pieces_text(tokenizer, [specials[0], *word])
    assert text.startswith(tokenizer.tokenizer.id_to_token(specials[0]))


def test_serve_detokenize_keeps_the_first_space(runtime):
    """The bundle's byte-level tokenizer: /detokenize's content is the pieces joined."""
    from edgesdk.serve.completion import Completer

    ids = runtime.tokenizer.encode(" The tower", add_special_tokens=False)
    assert Completer(runtime).detokenize(tuple(ids)) == {"content": " The tower"}
