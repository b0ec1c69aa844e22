"""Whitespace after a Phi-3 model's special tokens, as llama.cpp strips it.

llama.cpp (src/llama-vocab.cpp, llama_vocab::impl::load, "set attributes by model/tokenizer/architecture name") gives
LLAMA_TOKEN_ATTR_RSTRIP to every special token (types UNKNOWN, CONTROL, USER_DEFINED) and ``</s>`` of a file whose
``general.name`` holds "phi-3" or "phi3", then takes it off ``<unk>``, ``<s>`` and ``<|endoftext|>``;
tokenizer_st_partition drops the whitespace after such a token, so "<|user|>\\nhi" is ``<|user|>``, ``▁hi`` (the SPM
space prefix after a special token), not ``<|user|>``, ``▁``, ``<0x0A>``, ``h``, ``i``. Microsoft's tokenizer.json for
Phi-3 marks the same added tokens ``rstrip``. No GGUF key holds it: the loader gives a GGUF's tokenizer the attribute
by the file's name, and the GGUF export writes a tokenizer that has it where the file's name gives it the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgesdk.errors import ExportError
from tests._utils.gguf_files import one_layer_llama_gguf, rewrite_gguf

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
TOKENS = (["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
          + ["\u2581", "h", "i", "\u2581h", "\u2581hi", "<|endoftext|>", "<|user|>", "<|end|>", "<|assistant|>"])
TYPES = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * 5 + [CONTROL] * 4
SCORES = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0] + [0.0] * 4
ID = {text: index for index, text in enumerate(TOKENS)}
PROMPT = "<|user|>\nhi<|end|>\n<|assistant|>\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("phi3-rstrip")
    return one_layer_llama_gguf(root / "base.gguf", "llama", TOKENS, TYPES, scores=SCORES, unk=0)


def _named(base: Path, name: str) -> Path:
    return rewrite_gguf(base, base.with_name(f"{name}.gguf"),
                        fields={"general.name": (name, gguf.GGUFValueType.STRING)})


def _tokenizer(path: Path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False).tokenizer


def llama_cpp_ids(text: str, name: str) -> list[int]:
    """llama.cpp's ids for ``text`` (BOS added) over this vocabulary, by its rule: the special tokens split the text
    (RSTRIP ones taking the ASCII whitespace after them), each remaining piece gets a space in front (after a special
    token, add_space_prefix) and is tokenized by SPM; written out by hand for PROMPT's few pieces."""
    strips = any(part in name.lower() for part in ("phi-3", "phi3"))
    assert text == PROMPT
    if strips:  # <|user|> takes "\n"; "hi" -> "▁hi"; <|end|> and <|assistant|> take their "\n"
        return [ID["<s>"], ID["<|user|>"], ID["\u2581hi"], ID["<|end|>"], ID["<|assistant|>"]]
    nl = [ID["\u2581"], ID["<0x0A>"]]  # " \n": "▁" then the byte fallback of "\n"
    return [ID["<s>"], ID["<|user|>"], *nl, ID["h"], ID["i"], ID["<|end|>"], *nl, ID["<|assistant|>"], *nl]


@pytest.mark.parametrize("name", ["Phi-3-mini-4k-instruct", "phi3 medium"])
def test_a_phi3_gguf_s_special_tokens_strip_the_whitespace_after_them_as_llama_cpp(base, name):
    tokenizer = _tokenizer(_named(base, name))
    assert tokenizer(PROMPT)["input_ids"] == llama_cpp_ids(PROMPT, name)
    added = {token["content"]: token["rstrip"]
             for token in json.loads(tokenizer.backend_tokenizer.to_str())["added_tokens"]}
    assert added == {"<unk>": False, "<s>": False, "</s>": True, "<|endoftext|>": False, "<|user|>": True,
                     "<|end|>": True, "<|assistant|>": True}


def test_another_model_s_special_tokens_keep_the_whitespace(base):
    """The rule goes by the name alone: a file named otherwise keeps it (llama.cpp's negative case)."""
    tokenizer = _tokenizer(_named(base, "TinyLlama chat"))
    assert tokenizer(PROMPT)["input_ids"] == llama_cpp_ids(PROMPT, "TinyLlama chat")


def test_the_loaded_phi3_tokenizer_exports_to_gguf_with_the_file_s_name(base, tmp_path):
    """The bundle's tokenizer.json of a Phi-3 (rstrip on its special tokens) is written, not refused, where the GGUF
    file's name gives llama.cpp the same tokens; the vocabulary is the source file's."""
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    tokenizer = _tokenizer(_named(base, "Phi-3-mini-4k-instruct"))
    tokenizer.save_pretrained(tmp_path / "tok")
    vocab = vocab_from_tokenizer_json(tmp_path / "tok" / "tokenizer.json", "<s>", "</s>", len(TOKENS),
                                      "Phi-3-mini-4k-instruct (q8, edgesdk bundle 1)")
    # <unk> comes back CONTROL (the saved tokenizer.json's model has no unk_token), special as UNKNOWN is
    assert (vocab.tokens, vocab.token_types[1:], vocab.model) == (TOKENS, TYPES[1:], "llama")
    assert any("U+00A0" in note for note in vocab.notes)


def _phi3_tokenizer_json(tmp_path: Path, base: Path, rstrip: bool) -> Path:
    tokenizer = _tokenizer(_named(base, "Phi-3-mini-4k-instruct" if rstrip else "TinyLlama chat"))
    tokenizer.save_pretrained(tmp_path / "tok")
    return tmp_path / "tok" / "tokenizer.json"


def test_rstrip_is_refused_where_the_file_s_name_does_not_give_it(base, tmp_path):
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    path = _phi3_tokenizer_json(tmp_path, base, rstrip=True)
    with pytest.raises(ExportError, match=r"'<\|assistant\|>', '<\|end\|>', '<\|user\|>' have rstrip set.*"
                                          r"this file is named 'my-model \(q8\)'"):
        vocab_from_tokenizer_json(path, "<s>", "</s>", len(TOKENS), "my-model (q8)")


def test_a_phi3_named_file_without_rstrip_is_refused(base, tmp_path):
    """llama.cpp would strip after the special tokens of a file so named where the bundle's tokenizer keeps the
    whitespace: other ids without any error."""
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    path = _phi3_tokenizer_json(tmp_path, base, rstrip=False)
    with pytest.raises(ExportError, match=r"have no rstrip in the bundle's tokenizer.*named 'phi3-chat \(q8\)'"):
        vocab_from_tokenizer_json(path, "<s>", "</s>", len(TOKENS), "phi3-chat (q8)")
    assert vocab_from_tokenizer_json(path, "<s>", "</s>", len(TOKENS), "chat (q8)").tokens == TOKENS


def test_the_export_names_the_file_as_it_checks_it():
    from edgesdk.export.gguf_export import gguf_name

    manifest = {"model": {"after": {"source": "/models/Phi-3-mini-4k-instruct"}}, "recipe": {"name": "q8"},
                "bundle_id": "abc"}
    assert gguf_name(manifest) == "Phi-3-mini-4k-instruct (q8, edgesdk bundle abc)"
