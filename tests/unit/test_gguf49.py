"""Review of model loading and GGUF export (edgesdk/models/loader.py, edgesdk/export/gguf_export.py,
edgesdk/errors.py's read_utf8), round 49: each fault shown on a real file against what llama.cpp
(src/llama-vocab.cpp, gguf-py) does with it."""

from __future__ import annotations

import warnings

import pytest

from tests._utils.gguf_files import rewrite_gguf
from tests.unit.test_loader48 import _bpe_gguf

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

# a byte-level vocabulary whose merges make "a1" (rank 0) and "1234" (ranks 1 to 3), as in test_pretok48
TOKENS = ["<unk>", "<s>", "</s>", "a", "1", "2", "3", "4", "a1", "12", "123", "1234"]
MERGES = ("a 1", "1 2", "12 3", "123 4")
IDS = {token: index for index, token in enumerate(TOKENS)}


def _load(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False)


@pytest.mark.parametrize("pre", [None, ""])
def test_a_bpe_gguf_without_its_pre_tokenizer_splits_with_llama_cpps_default_regexes(pre, tmp_path):
    """llama.cpp reads a BPE vocabulary without tokenizer.ggml.pre (or with it empty) as its "default" type
    (src/llama-vocab.cpp: "missing pre-tokenizer type, using: 'default'", LLAMA_VOCAB_PRE_TYPE_DEFAULT), whose
    regexes split "a1234" into "a" "123" "4" (punctuation, GPT-2's, "\\p{N}+", "[0-9][0-9][0-9]"). edgesdk left
    such a file to transformers' GGUF tokenizer, which splits with GPT-2's regex alone ("a" "1234"): other ids than
    llama.cpp's, in the bundle's tokenizer.json too, without a word. llama.cpp warns; so does edgesdk now."""
    from tokenizers import Tokenizer

    source = _bpe_gguf(tmp_path / "with.gguf", "gpt-2", tokens=list(TOKENS), merges=MERGES, add_bos=False)
    if pre is None:
        path = rewrite_gguf(source, tmp_path / "bpe.gguf", drop=("tokenizer.ggml.pre",))
    else:
        path = rewrite_gguf(source, tmp_path / "bpe.gguf",
                            fields={"tokenizer.ggml.pre": (pre, gguf.GGUFValueType.STRING)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokenizer = _load(path).tokenizer
    expected = [IDS["a"], IDS["123"], IDS["4"]]
    assert tokenizer("a1234").input_ids == expected
    tokenizer.save_pretrained(tmp_path / "saved")  # what the bundle's tokenizer.json is written from
    assert Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json")).encode("a1234").ids == expected
    said = [str(warning.message) for warning in caught if "tokenizer.ggml.pre" in str(warning.message)]
    assert said
    assert "llama.cpp's 'default' pre-tokenizer" in said[0]


def test_a_link_planted_at_the_partial_name_after_it_was_cleared_is_not_written_through(tmp_path, monkeypatch):
    """export_gguf removed whatever was at ``NAME.partial`` and then let gguf's writer open that path by name
    (``open(path, "wb")``), so a link someone who can write the output directory put there in between (here: while
    the tokenizer keys were being added, before the writer opened its file) was followed, and the export wrote over
    the file it pointed at. The partial file is now created by edgesdk with O_EXCL | O_NOFOLLOW before anything is
    written and handed to the writer open: the link cannot take its name, and the target is left alone."""
    import contextlib

    from edgesdk.export import gguf_export
    from tests.unit.test_gguf_export import _bundle

    bundle = _bundle(tmp_path, "fp32")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    partial = out / "model.gguf.partial"
    add_tokenizer = gguf_export.add_tokenizer

    def planting(writer, vocab, template):  # the other process's link, put in place during the export
        with contextlib.suppress(FileExistsError):
            partial.symlink_to(victim)
        add_tokenizer(writer, vocab, template)

    monkeypatch.setattr(gguf_export, "add_tokenizer", planting)
    report = gguf_export.export_gguf(bundle.path, out / "model.gguf")
    assert victim.read_text() == "keep me"
    assert report.path.read_bytes()[:4] == b"GGUF"


UTF16_TEXTS = {"ascii": "Hello world.\nSecond line.\n", "cyrillic": "Привет, мир. Это тест.\n" * 8,
               "cjk": "日本語のテキストです。これはテストです。\n" * 8}


@pytest.mark.parametrize("text", list(UTF16_TEXTS))
@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_text_without_a_byte_order_mark_is_refused_and_named_utf16(tmp_path, text, encoding):
    """UTF-16 without a byte-order mark (Windows tools' "Unicode" text saved without one, a UTF-16 stream cut at
    its start): ASCII or Cyrillic text in it is all bytes below 0x80, valid UTF-8, and read_utf8 took it as text
    with a NUL beside every character; CJK text, whose NULs (beside its line breaks and spaces) are fewer than
    a quarter of its bytes, was named Latin-1, and "iconv -f latin1" turns it into UTF-8 full of NULs without an
    error. Both are now refused with the encoding the NULs' places show, as a marked UTF-16 file is."""
    from edgesdk.errors import EdgeSDKError, read_utf8

    path = tmp_path / "text.txt"
    data = UTF16_TEXTS[text].encode(encoding)
    path.write_bytes(data)
    named = encoding.replace("-le", "le").replace("-be", "be")
    with pytest.raises(EdgeSDKError) as refused:
        read_utf8(path, "evaluation text")
    assert "is not UTF-8 text" in refused.value.problem
    assert f"iconv -f {named} -t utf-8 " in refused.value.fix
    assert data.decode(named) == UTF16_TEXTS[text]  # what the fix names reads the file as written


def test_utf8_text_with_a_stray_nul_and_latin1_text_are_read_and_named_as_before(tmp_path):
    from edgesdk.errors import EdgeSDKError, read_utf8

    path = tmp_path / "text.txt"
    path.write_bytes(("Привет, мир.\n" * 10 + "\x00" + "end\n").encode("utf-8"))
    assert read_utf8(path, "evaluation text").endswith("\x00end\n")
    path.write_bytes("The quíck brown fox.\n".encode("latin1"))
    with pytest.raises(EdgeSDKError) as refused:
        read_utf8(path, "evaluation text")
    assert "iconv -f latin1 -t utf-8 " in refused.value.fix


def test_a_tokenizer_without_a_bos_token_exports_a_bos_id_that_is_not_llama_cpps_default_text_token(tmp_path):
    """A tokenizer without a BOS token (Qwen2's, Qwen3's) was exported with no tokenizer.ggml.bos_token_id, and
    llama.cpp, which cannot read "none" from a file, took its default for a gpt2 vocabulary, token 11 (src/
    llama-vocab.cpp), a text token (',' in Qwen's vocabulary; a byte here) that the chat template's
    {{ bos_token }} and llama-server's /props gave. The EOS token's id is written instead, as llama.cpp's converter
    writes config.json's bos_token_id for such models; add_bos_token stays false, so no prompt gets it."""
    import json

    from edgesdk.export.gguf_export import export_gguf
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit.test_gguf_export import FUSED

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["bos_token"] = None
    config_path.write_text(json.dumps(config))
    bundle = build_tiny_bundle(tmp_path, FUSED.format(weights="fp32", block=32), "host", model_dir=model_dir)
    assert bundle.manifest["tokenizer"]["bos_token"] is None
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    fields = gguf.GGUFReader(str(report.path)).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    eos = fields["tokenizer.ggml.eos_token_id"].contents()
    assert tokens[eos] == "<|im_end|>"
    assert "tokenizer.ggml.bos_token_id" in fields  # before: absent, so llama.cpp's BOS was token 11
    assert fields["tokenizer.ggml.bos_token_id"].contents() == eos
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False


# the pieces llama.cpp's regex_exprs (src/llama-vocab.cpp, llm_tokenizer_bpe) make of "a1234", then the merges
@pytest.mark.parametrize(("pre", "pieces"), [
    ("tiny_aya", ["a", "1", "234"]),  # digits grouped by three from the right: "1" "234" (not "123" "4")
    ("cohere2moe", ["a", "1", "234"]),
    ("bailingmoe", ["a", "1", "2", "3", "4"]),  # "\p{N}": one digit per piece
    ("llada-moe", ["a", "1", "2", "3", "4"]),
    ("exaone-moe", ["a", "1", "2", "3", "4"]),
])
def test_the_tiny_aya_bailingmoe_and_exaone_moe_pre_tokenizers_split_as_llama_cpp_does(pre, pieces, tmp_path):
    """These pre-tokenizers' regexes are plain ones (llama.cpp: LLAMA_VOCAB_PRE_TYPE_TINY_AYA, BAILINGMOE,
    EXAONE_MOE, each the model's tokenizer.json regex), yet a file naming them was refused as one whose split edgesdk
    cannot rebuild, before its architecture was even looked at. They are rebuilt now."""
    from tokenizers import Tokenizer

    from edgesdk.models.loader import check_gguf_model

    path = _bpe_gguf(tmp_path / "bpe.gguf", pre, tokens=list(TOKENS), merges=MERGES, add_bos=False)
    check_gguf_model(path)  # before: "not one edgesdk can rebuild exactly as a tokenizers pre-tokenizer"
    tokenizer = _load(path).tokenizer
    ids = [id for piece in pieces for id in ([IDS[piece]] if piece in IDS else [IDS[c] for c in piece])]
    assert tokenizer("a1234").input_ids == ids
    tokenizer.save_pretrained(tmp_path / "saved")
    assert Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json")).encode("a1234").ids == ids


def test_the_exaone_moe_split_keeps_words_joined_by_single_spaces_together():
    """EXAONE MoE's regex runs a word on over single spaces between letters ("(?: \\p{L}\\p{M}*)*"); a double space
    or a digit ends it."""
    from tokenizers import Regex, pre_tokenizers

    from edgesdk.models.loader import BPE_PRE_TOKENIZER_SPLITS

    split = pre_tokenizers.Split(Regex(BPE_PRE_TOKENIZER_SPLITS["exaone-moe"][0]), behavior="isolated")
    assert [piece for piece, _ in split.pre_tokenize_str("Hello big world  again 42")] == \
        ["Hello big world", " ", " again", " ", "4", "2"]


@pytest.mark.parametrize("pre", ["llama-bpe", "tekken"])
def test_a_bpe_gguf_without_an_endoftext_token_gets_no_token_past_its_vocabulary(pre, tmp_path):
    """transformers' GGUF tokenizer builds a byte-level vocabulary as a GPT2Tokenizer, whose default special token
    <|endoftext|> it appended as one more id where the file has none (Llama 3's vocabulary ends text with
    <|end_of_text|>, Mistral Nemo's with </s>): a text holding "<|endoftext|>" became an id past the model's
    embedding (an IndexError in the model), and the bundle's tokenizer.json held a token the GGUF export refuses
    ("token ids up to N, but the model's embedding has N rows"). llama.cpp knows only the file's tokens."""
    loaded = _load(_bpe_gguf(tmp_path / "bpe.gguf", pre, add_bos=False))
    tokenizer, rows = loaded.tokenizer, loaded.model.get_input_embeddings().weight.shape[0]
    assert len(tokenizer) == rows  # before: rows + 1
    ids = tokenizer("abc<|endoftext|>ab").input_ids
    assert max(ids) < rows
    with torch.no_grad():
        assert loaded.model(torch.tensor([ids])).logits.shape == (1, len(ids), rows)
    tokenizer.save_pretrained(tmp_path / "saved")  # what the bundle's tokenizer.json is written from
    assert "<|endoftext|>" not in (tmp_path / "saved" / "tokenizer.json").read_text()


@pytest.mark.parametrize(("pre", "written"), [(None, "default"), ("tekken", "tekken"), ("falcon", "falcon"),
                                              ("smollm", "smollm"), ("llama-bpe", "llama-bpe")])
def test_a_tokenizer_read_from_a_gguf_is_exported_with_its_pre_tokenizer_type_again(pre, written, tmp_path):
    """A bundle built from a GGUF file whose pre-tokenizer edgesdk's loader rebuilds (now also a file without the
    key, split with llama.cpp's "default" regexes) has those regexes in its tokenizer.json; the GGUF export knew
    only gpt-2, smollm, qwen2 and llama-bpe and refused the rest ("has no llama.cpp regex known to match it"), so
    such a bundle could not go back to llama.cpp. It is written with the type it was read with."""
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    source = _bpe_gguf(tmp_path / "with.gguf", pre or "gpt-2", tokens=list(TOKENS), merges=MERGES, add_bos=False)
    path = source if pre else rewrite_gguf(source, tmp_path / "bpe.gguf", drop=("tokenizer.ggml.pre",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the missing key's warning
        tokenizer = _load(path).tokenizer
    tokenizer.save_pretrained(tmp_path / "saved")
    vocab = vocab_from_tokenizer_json(tmp_path / "saved" / "tokenizer.json", "<s>", "</s>", len(TOKENS))
    assert vocab.pre == written
