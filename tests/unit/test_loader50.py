"""Review of model loading (edgesdk/models/loader.py), round 50: how a GGUF file's tokenizer metadata is read,
each case a real GGUF file whose tokens are compared with what llama.cpp's vocabulary (src/llama-vocab.cpp) makes
of the same file."""

from __future__ import annotations

import warnings

import pytest

from tests._utils.gguf_files import one_layer_llama_gguf

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6


def _gguf(path, tokenizer_model: str, tokens: list[str], types: list[int], scores: list[float] | None = None,
          merges: list[str] | None = None, pre: str | None = None, bos: int = 1, eos: int = 2,
          ids: dict[str, int] | None = None, **flags):
    """A one-layer Llama GGUF with the vocabulary ``tokens`` (``tokenizer.ggml.model`` ``tokenizer_model``), the
    token-id keys in ``ids`` (eot_token_id, eom_token_id) and the boolean tokenizer keys in ``flags``
    (add_bos_token, add_eos_token, add_space_prefix) where given."""
    return one_layer_llama_gguf(path, tokenizer_model, tokens, types, scores, merges, pre, bos, eos, ids=ids, **flags)


def _tokenizer(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on the tiny vocabularies
        return load_model(resolve_model(str(path)), progress=False).tokenizer


def _saved(tokenizer, directory):
    """The tokenizers.Tokenizer of the tokenizer.json the bundle is written from."""
    from tokenizers import Tokenizer

    tokenizer.save_pretrained(directory)
    return Tokenizer.from_file(str(directory / "tokenizer.json"))


@pytest.mark.parametrize(("model", "pre", "add_bos", "add_eos", "expected"), [
    ("gpt2", "qwen2", None, True, [11, 5, 2]),  # Qwen3-Embedding's: EOS after the text, no BOS
    ("gpt2", "llama-bpe", False, True, [12, 2]),  # the key turns llama-bpe's default BOS off
    ("gpt2", "smollm", True, False, [1, 11, 5]),
    ("llama", None, None, True, [1, 12, 2]),  # SentencePiece: BOS by default, EOS where the file says so
    ("llama", None, False, None, [12]),
])
def test_add_bos_and_add_eos_are_read_as_llama_cpp_reads_them(model, pre, add_bos, add_eos, expected, tmp_path):
    """llama.cpp (llama_vocab::impl::load) takes tokenizer.ggml.add_bos_token / add_eos_token where present, else its
    default per vocabulary (SPM: BOS; BPE: BOS for the Llama 3 pre-tokenizers and tekken; neither adds EOS), and
    llama_tokenize with add_special puts them around the text. An embedding model whose tokenizer appends EOS
    (Qwen3-Embedding: last-token pooling reads that EOS) relies on it, in the bundle's tokenizer.json too."""
    tokens = ["<unk>", "<s>", "</s>", *"abcdefgh", "ab", "abc"]
    flags = {key: value for key, value in (("add_bos_token", add_bos), ("add_eos_token", add_eos))
             if value is not None}
    path = _gguf(tmp_path / "v.gguf", model, tokens, [NORMAL, CONTROL, CONTROL] + [NORMAL] * 10, pre=pre,
                 merges=["a b"] if model == "gpt2" else None, scores=None if model == "gpt2" else [0.0] * 13, **flags)
    tokenizer = _tokenizer(path)
    assert tokenizer("abc").input_ids == expected
    encoding = _saved(tokenizer, tmp_path / "saved").encode("abc")
    assert encoding.ids == expected
    # the EOS the post-processor appends is marked so (edgesdk.runtime.embedding.text_ids keeps it when it truncates)
    assert encoding.special_tokens_mask[-1] == (1 if add_eos else 0)


SPM_PIECES = {"\u2581a": -1.0, "ab": -2.0, "\u2581ab": -3.0, "\u2581\u2581": -4.0, "\u2581b": -5.0, "\u2581": -6.0,
              "a": -7.0, "b": -8.0}


@pytest.mark.parametrize(("add_space_prefix", "text", "expected"), [
    # a space in front of the text, though it begins with one: "  ab" -> "▁" "▁ab"
    (None, " ab", ["\u2581", "\u2581ab"]),
    (True, " ab", ["\u2581", "\u2581ab"]),
    # a space in front of the text after a special token (Llama 2's "<s>[INST]", TinyLlama's "</s>\n<|assistant|>")
    (None, "</s>ab", ["</s>", "\u2581ab"]),
    (None, "ab</s>ab", ["\u2581ab", "</s>", "\u2581ab"]),
    # none at all where the file says add_space_prefix false
    (False, "ab", ["ab"]),
    (False, "</s>ab", ["</s>", "ab"]),
    (False, " ab", ["\u2581ab"]),
])
def test_a_sentencepiece_gguf_puts_the_space_in_front_as_llama_cpp_does(add_space_prefix, text, expected, tmp_path):
    """llama.cpp's SPM tokenize (llama-vocab.cpp: "prefix with space if previous is special") puts a space in front
    of each run of text that begins the input or follows a special token, whatever it begins with, where
    tokenizer.ggml.add_space_prefix is true or absent, and none where it is false. transformers' GGUF tokenizer
    used a Metaspace pre-tokenizer (prepend_scheme "first") that put none before a text beginning with a space,
    none after a special token, and one where the file said false: a Mistral / Llama 2 chat prompt
    ("<s>[INST] ...") got other ids than llama.cpp's and the model's own tokenizer.json. The ids are llama.cpp's
    SPM merges over this vocabulary: the best-scored pair whose join is a token first."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), *SPM_PIECES]
    types = [2, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(SPM_PIECES)
    flags = {} if add_space_prefix is None else {"add_space_prefix": add_space_prefix}
    path = _gguf(tmp_path / "spm.gguf", "llama", tokens, types, scores=[0.0] * 259 + list(SPM_PIECES.values()),
                 **flags)
    tokenizer = _tokenizer(path)
    ids = [tokens.index(piece) for piece in expected]
    assert tokenizer(text, add_special_tokens=False).input_ids == ids
    assert tokenizer(text).input_ids == [1, *ids]
    assert _saved(tokenizer, tmp_path / "saved").encode(text, add_special_tokens=False).ids == ids
    if "</s>" not in text:  # the text comes back: the decoder takes off only the space the tokenizer put in front
        assert tokenizer.decode(ids) == text


def test_control_tokens_outside_the_byte_alphabet_are_one_token_each_as_in_llama_cpp(tmp_path):
    """llama.cpp's converter writes a byte-level vocabulary's added tokens as their text (get_vocab_base: "the
    tokenizer in llama.cpp assumes the CONTROL and USER_DEFINED tokens are pre-normalized"), and llama.cpp finds
    them by that text, each one id. transformers' GGUF tokenizer left a control token with a character outside
    GPT-2's byte alphabet out of its added tokens and keyed it by the byte spelling of its text: DeepSeek-R1-Distill's
    <｜begin▁of▁sentence｜> BOS had no id (the tokenizer gave it one past the vocabulary), its EOS none, and
    <｜User｜> / <｜Assistant｜> in a chat prompt were cut into byte pieces."""
    tokens = [*"abcdefgh", "ab", "abc", "\u0120", "\u0120a", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
              "<｜User｜>", "<｜Assistant｜>", "<think>", "<tool▁call>", "<|im_end|>"]
    types = [NORMAL] * 12 + [CONTROL] * 4 + [USER_DEFINED] * 2 + [CONTROL]
    path = _gguf(tmp_path / "r1.gguf", "gpt2", tokens, types, merges=["a b", "ab c", "\u0120 a"], pre="llama-bpe",
                 bos=12, eos=13, add_bos_token=True)
    tokenizer = _tokenizer(path)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (12, 13)
    text = "<｜User｜>abc<｜Assistant｜><think>abc<tool▁call><｜end▁of▁sentence｜>"
    expected = [12, 14, 9, 15, 16, 9, 17, 13]  # BOS, then each added token whole, as llama_tokenize(parse_special)
    assert tokenizer(text).input_ids == expected
    saved = _saved(tokenizer, tmp_path / "saved")
    assert saved.encode(text).ids == expected
    assert saved.get_vocab_size() == len(tokens)  # no token past the model's embedding
    assert tokenizer.decode(expected, skip_special_tokens=True) == "abc<think>abc<tool▁call>"


@pytest.mark.parametrize(("keys", "expected"), [
    ({"eot_token_id": 14}, [13, 14]),  # the turn's end written as EOT: generation ends there too
    ({"eot_token_id": 14, "eom_token_id": 15}, [13, 14, 15]),
    ({"eot_token_id": 13}, [13]),  # the EOS itself
    ({"eot_token_id": 99}, [13]),  # past the vocabulary: llama.cpp leaves it out ("bad special token")
])
def test_a_gguf_s_eot_and_eom_tokens_end_generation_as_in_llama_cpp(keys, expected, tmp_path):
    """llama.cpp puts tokenizer.ggml.eot_token_id and eom_token_id among the ids that end generation
    (llama_vocab::impl::load: "special_eot_id is not in special_eog_ids", eom the same), whatever their text; gguf-py
    writes the tokenizer_config EOS as EOT where the tokenizer appends another token as EOS. transformers' GGUF reader
    reads the EOS alone, so the bundle built from such a file did not stop at the turn's end where its text is not
    one llama.cpp also finds by text (<|turn_end|> here), and answered on."""
    from edgesdk.build.package import eos_token_ids
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    tokens = [*"abcdefgh", "ab", "abc", "\u0120", "\u0120a", "<|begin|>", "<|end_of_document|>", "<|turn_end|>",
              "<|tool_end|>"]
    path = _gguf(tmp_path / "eot.gguf", "gpt2", tokens, [NORMAL] * 12 + [CONTROL] * 4, merges=["a b"],
                 pre="qwen2", bos=12, eos=13, ids=keys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_model(resolve_model(str(path)), progress=False)
    assert eos_token_ids(loaded.model, loaded.tokenizer) == expected
