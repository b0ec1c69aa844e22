"""Review of model loading (edgesdk/models/loader.py), round 57: a SentencePiece GGUF tokenizer's space prefix for a
Phi-3 file, compared with what llama.cpp's vocabulary (src/llama-vocab.cpp) makes of the same file."""

from __future__ import annotations

import warnings

import pytest

from tests._utils.gguf_files import close_gguf

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

UNKNOWN, NORMAL, CONTROL, BYTE = 2, 1, 3, 6
SPM_PIECES = {"\u2581a": -1.0, "ab": -2.0, "\u2581ab": -3.0, "\u2581\u2581": -4.0, "\u2581b": -5.0, "\u2581": -6.0,
              "a": -7.0, "b": -8.0}
TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), *SPM_PIECES]


def _phi3_vocabulary(path, add_space_prefix: bool | None):
    """A GGUF file of architecture phi3 holding a SentencePiece vocabulary (tokenizer.ggml.model llama), with
    tokenizer.ggml.add_space_prefix only where given."""
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_types([UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(SPM_PIECES))
    writer.add_token_scores([0.0] * 259 + list(SPM_PIECES.values()))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if add_space_prefix is not None:
        writer.add_bool("tokenizer.ggml.add_space_prefix", add_space_prefix)
    return close_gguf(writer, path)


@pytest.mark.parametrize(("add_space_prefix", "text", "expected"), [
    (None, "ab", ["\u2581ab"]),
    (True, "</s>ab", ["</s>", "\u2581ab"]),
    (False, "ab", ["ab"]),  # llama.cpp: no space in front where the file says false
    (False, "</s>ab", ["</s>", "ab"]),
    (False, " ab", ["\u2581ab"]),
])
def test_a_phi3_sentencepiece_gguf_reads_add_space_prefix_as_llama_cpp_does(add_space_prefix, text, expected,
                                                                           tmp_path):
    """transformers builds a Phi-3 file's SentencePiece tokenizer with a Prepend normalizer whatever the file says,
    and _set_spm_space_prefix left a tokenizer with a normalizer as it was: a file with
    tokenizer.ggml.add_space_prefix false got a space (U+2581) in front of its text, where llama.cpp puts none."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from edgesdk.models.loader import _set_spm_space_prefix

    path = _phi3_vocabulary(tmp_path / "phi3.gguf", add_space_prefix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on the tiny vocabulary
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tmp_path), gguf_file=path.name)
    _set_spm_space_prefix(tokenizer, path)
    ids = [TOKENS.index(piece) for piece in expected]
    assert tokenizer(text, add_special_tokens=False).input_ids == ids
    tokenizer.save_pretrained(tmp_path / "saved")
    assert Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids == ids
    if "</s>" not in text:  # the decoder takes off only the space the tokenizer put in front
        assert tokenizer.decode(ids) == text


BPE_TOKENS = [*"abcdefgh", "ab", "abc", "\u0120", "\u0120a", "<|begin_of_text|>", "<|eot_id|>"]
BPE_TYPES = [NORMAL] * 12 + [CONTROL] * 2


def _bpe_gguf(path, extra: list[str]):
    """A one-layer Llama GGUF with a Llama 3 style byte-level vocabulary (no <|endoftext|>), ``extra`` tokens of
    type normal at its end."""
    from tests._utils.gguf_files import one_layer_llama_gguf

    return one_layer_llama_gguf(path, "gpt2", BPE_TOKENS + extra, BPE_TYPES + [NORMAL] * len(extra),
                                merges=["a b", "ab c", "\u0120 a"], pre="llama-bpe", bos=12, eos=13)


def _load(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on the tiny vocabulary, llama.cpp's on empty tokens
        return load_model(resolve_model(str(path)), progress=False)


def test_a_gguf_with_empty_tokens_gives_no_file_id_to_gpt2_s_endoftext(tmp_path):
    """transformers' GGUF tokenizer keys a byte-level vocabulary by text, so two empty tokens (llama.cpp names them
    [EMPTY_14] and [EMPTY_15]) are one entry, and the <|endoftext|> it appends took id 15, the file's last token:
    _drop_tokens_the_file_lacks kept it, as it dropped only ids past the vocabulary, and a text holding
    "<|endoftext|>" became the model's token 15, which llama.cpp never makes of it."""
    loaded = _load(_bpe_gguf(tmp_path / "empty.gguf", ["", ""]))
    tokenizer = loaded.tokenizer
    assert "<|endoftext|>" not in tokenizer.get_added_vocab()
    ids = tokenizer("a<|endoftext|>", add_special_tokens=False).input_ids
    assert not set(ids) & {14, 15}  # text, as llama.cpp tokenizes it: pieces of the vocabulary, no empty token
    assert tokenizer.convert_ids_to_tokens(15) != "<|endoftext|>"
    assert tokenizer("abc").input_ids == [12, 9]  # the file's BOS and tokens as they were


def test_a_gguf_holding_a_token_twice_is_refused_as_llama_cpp_refuses_it(tmp_path):
    """llama.cpp stops on a vocabulary holding a text twice (src/llama-vocab.cpp: "GGML_ASSERT(id_to_token.size() ==
    token_to_id.size()) failed"; it prints no "duplicate token in vocabulary", which the refusal quoted). transformers' GGUF
    tokenizer kept the last id of the two ("ab" became 14, id 8 was never made) and gave its appended <|endoftext|>
    the id 14 as well: "ab" decoded as "<|endoftext|>"."""
    from edgesdk.errors import ModelSourceError

    with pytest.raises(ModelSourceError) as caught:
        _load(_bpe_gguf(tmp_path / "twice.gguf", ["ab"]))
    shown = str(caught.value)
    assert "'ab' twice" in shown
    assert "(tokenizer.ggml.tokens, ids 8 and 14)" in shown
    assert "'GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed'" in shown
    assert "duplicate token in vocabulary" not in shown
    assert "convert_hf_to_gguf.py" in caught.value.fix

