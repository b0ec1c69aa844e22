"""Runtime, review 57 (edgesdk/runtime/embedding.py, json_schema.py, text.py, gbnf.py): token ids that are whole
numbers of any kind, a tool schema's format that fits no type it names, CodeLlama's ``▁<EOT>`` in plain text, and a
range fix that every llama.cpp version's grammar parser reads."""

from __future__ import annotations

import re

import numpy as np
import pytest

from edgesdk.runtime.embedding import EmbeddingError, fitted


def test_token_ids_to_embed_given_as_a_torch_tensor_are_the_ids_it_holds():
    """``int(token)`` took a torch tensor's items; the whole-number check named each as a Tensor and refused it."""
    torch = pytest.importorskip("torch")
    assert fitted(torch.tensor([5, 6, 7]), 8) == ([5, 6, 7], False)
    assert fitted([torch.tensor(4), np.int32(3), np.array(2)], 2, truncate=True) == ([4, 3], True)


@pytest.mark.parametrize("kind", ["torch bool", "torch float", "numpy bool array"])
def test_token_ids_of_a_bool_or_float_tensor_are_still_refused(kind):
    if kind == "numpy bool array":
        given = [np.array(True)]
    else:
        torch = pytest.importorskip("torch")
        given = [torch.tensor(True) if kind == "torch bool" else torch.tensor(2.0)]
    with pytest.raises(EmbeddingError, match=re.escape("at position 0: expected a whole-number token id")):
        fitted(given, 8)


@pytest.mark.parametrize("name", ["password", "binary", "path"])
def test_a_lenient_tool_schema_drops_an_any_string_format_on_a_number(name):
    """OpenAPI's password / binary and pydantic's path fit any string but no number: lenient_schema kept them on an
    integer, and compile_schema then refused the tool's schema."""
    from edgesdk.runtime.json_schema import compile_schema, lenient_schema

    schema = {"type": "object", "properties": {"pin": {"type": "integer", "format": name},
                                               "key": {"type": "string", "format": name},
                                               "either": {"type": ["integer", "string"], "format": name}}}
    lenient, dropped = lenient_schema(schema)
    assert dropped == (f"$.properties.pin.format {name!r}".replace("'", '"'),)
    assert lenient["properties"]["pin"] == {"type": "integer"}
    assert lenient["properties"]["key"] == {"type": "string", "format": name}  # any string has it: kept
    assert lenient["properties"]["either"] == {"type": ["integer", "string"], "format": name}
    compile_schema(lenient)


def test_codellama_s_eot_the_model_marks_not_special_is_plain_text(tmp_path):
    """``▁<EOT>`` ends generation as CodeLlama's GGUF EOT (fim.py): a control token, its text read as characters in
    plain text, as the FIM prefix, suffix and middle are."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from edgesdk.runtime.text import ChatTokenizer
    from tests._utils.tiny import CORPUS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False)
                          for text in ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    chat = ChatTokenizer(tmp_path / "tokenizer.json", {"eos_token_ids": [1]}, None)
    eot = chat.token_id("▁<EOT>")
    assert eot in chat.control_ids()
    code = "s = '▁<EOT>'\n"
    assert eot not in chat.encode_plain(code)
    assert chat.decode(chat.encode_plain(code)) == code


# what every llama.cpp version's parse_char reads after a backslash: src/llama-grammar.cpp now also reads ``-``,
# which older copies (the one Ollama vendors, for one) refuse as an unknown escape
LLAMA_CPP_ESCAPES = "xuUtrn\\\"[]"


@pytest.mark.parametrize(("written", "low", "high"), [("[z-\\x2D]", ord("-"), ord("z")),
                                                      ("[\\x2D-,]", ord(","), ord("-"))])
def test_a_backwards_range_fix_writes_a_dash_as_llama_cpp_reads_it(written, low, high):
    """The fix wrote ``-`` as ``\\-``, an escape older llama.cpp versions refuse ("unknown escape"; the copy Ollama
    vendors, for one): it is written ``\\x2D``, which every version reads."""
    from edgesdk.runtime.gbnf import GrammarError, parse_grammar

    with pytest.raises(GrammarError) as caught:
        parse_grammar(f"root ::= {written}")
    fix = str(caught.value).split("fix: write it as ", 1)[1]
    assert "\\-" not in fix
    assert all(fix[at + 1] in LLAMA_CPP_ESCAPES for at in range(len(fix)) if fix[at] == "\\")
    (element,) = parse_grammar(f"root ::= [{fix}]").alternatives[0]
    assert element[1:] == (((low, high),), False)
