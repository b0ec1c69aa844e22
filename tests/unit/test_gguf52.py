"""GGUF export, review 52: the written vocabulary and tensors checked against what llama.cpp does with them."""

from __future__ import annotations

import json

import pytest

from tests._utils.tiny import tiny_gemma_tokenizer

pytest.importorskip("gguf")

SPACE_MARK = "\u2581"


def _llama_cpp_spm_piece(text: str, kind: int) -> str | None:
    """The text llama.cpp's ``token_to_piece`` gives a token of a llama (SentencePiece) vocabulary
    (src/llama-vocab.cpp): a NORMAL token with each U+2581 as a space, a USER_DEFINED one as written; None for the
    other types (byte, control, unused), which this review does not compare."""
    from edgesdk.export.gguf_vocab import NORMAL, USER_DEFINED

    if kind == NORMAL:
        return text.replace(SPACE_MARK, " ")
    return text if kind == USER_DEFINED else None


def _gemma_tokenizer_json_with_added_pieces(tmp_path) -> list[int]:
    """A Gemma-style tokenizer.json at ``tmp_path`` whose added tokens also list (special false, normalized false)
    pieces of its own vocabulary that start with U+2581, as Gemma's lists its whitespace runs, and one added token
    beyond the vocabulary made of two U+2581; returns those tokens' ids."""
    spec = json.loads(tiny_gemma_tokenizer().backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    pieces = [token for token in vocab if token.startswith(SPACE_MARK) and len(token) > 2][:3]
    assert pieces, "the tiny tokenizer learned no piece that starts with U+2581"
    extra = {"content": SPACE_MARK * 2, "id": len(vocab)}
    assert extra["content"] not in vocab
    listed = [{"content": token, "id": vocab[token]} for token in pieces] + [extra]
    for token in listed:
        spec["added_tokens"].append({**token, "single_word": False, "lstrip": False, "rstrip": False,
                                     "normalized": False, "special": False})
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return [token["id"] for token in listed]


def test_added_sentencepiece_tokens_print_in_llama_cpp_as_the_bundle_decodes_them(tmp_path):
    """llama.cpp prints a USER_DEFINED token's text as it is and turns U+2581 into a space in NORMAL tokens only;
    the bundle's decoder turns every U+2581 into a space. The export wrote the non-special added tokens of a
    SentencePiece vocabulary (Gemma's whitespace runs) with their U+2581, so llama-cli printed "\u2581the" where the
    bundle writes " the". They are written with spaces, as llama.cpp's converter writes them."""
    from tokenizers import Tokenizer

    from edgesdk.export.gguf_vocab import USER_DEFINED, vocab_from_tokenizer_json

    added = _gemma_tokenizer_json_with_added_pieces(tmp_path)
    path = tmp_path / "tokenizer.json"
    bundle = Tokenizer.from_file(str(path))
    vocab = vocab_from_tokenizer_json(path, "<bos>", "<eos>", max(added) + 1)
    compared = set()
    for i, (text, kind) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True)):
        piece = _llama_cpp_spm_piece(text, kind)
        if piece is not None:
            assert piece == bundle.decode([i], skip_special_tokens=False), (i, text, kind)
            compared.add(i)
    assert set(added) <= compared
    assert len(compared) > 100
    assert all(vocab.token_types[i] == USER_DEFINED for i in added)


@pytest.mark.parametrize("kind", ["sentencepiece", "byte-level"])
def test_an_added_token_past_the_embedding_is_left_out_with_a_note_not_refused(kind, tmp_path):
    """Gemma 3's tokenizer adds <image_soft_token> as id 262144 to every size, where the 1B's embedding has 262144
    rows: the export refused every such bundle ("the tokenizer does not belong to this model; rebuild the bundle",
    which no rebuild changes). The model has no row for the token; llama.cpp's converter leaves it out of the file
    with a warning, and so does the export now, with a note that llama.cpp tokenizes its text as plain text."""
    from tokenizers import Tokenizer

    from edgesdk.errors import ExportError
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json
    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_gemma_tokenizer() if kind == "sentencepiece" else tiny_tokenizer(320)
    rows = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image_soft_token>"]})
    assert tokenizer.convert_tokens_to_ids("<image_soft_token>") == rows
    path = tmp_path / "tokenizer.json"
    tokenizer.backend_tokenizer.save(str(path))
    bos, eos = (tokenizer.bos_token, tokenizer.eos_token)

    vocab = vocab_from_tokenizer_json(path, bos, eos, rows)
    assert len(vocab.tokens) == rows
    assert "<image_soft_token>" not in vocab.tokens
    plain = Tokenizer.from_file(str(path))
    for i in range(rows):  # every embedded token as the bundle's tokenizer has it
        assert vocab.tokens[i] == plain.id_to_token(i)
    assert vocab.bos_id == plain.token_to_id(bos)
    assert vocab.eos_id == plain.token_to_id(eos)
    assert any(f"'<image_soft_token>' (id {rows})" in note and "plain text" in note for note in vocab.notes)

    # a token of the model's own vocabulary past the embedding still means another model's tokenizer
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["model"]["vocab"]["<image_soft_token>"] = rows
    spec["added_tokens"] = [token for token in spec["added_tokens"] if token["id"] != rows]
    path.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ExportError, match=f"token ids up to {rows}, but the model's embedding has {rows} rows"):
        vocab_from_tokenizer_json(path, bos, eos, rows)
