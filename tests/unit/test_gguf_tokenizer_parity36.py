"""llama.cpp against the bundle's own tokenizer, on GGUF files ``edgesdk export`` writes.

For each kind of tokenizer the export writes (byte-level BPE under each llama.cpp pre-tokenizer name it maps
to: gpt-2, smollm, qwen2, llama-bpe; SentencePiece BPE as Gemma's and as Llama 2's, in the normalizer form of
older tokenizer.json files and the Metaspace form transformers writes now) a tiny bundle is built and exported,
the file is opened by llama.cpp (llama-cpp-python, ``vocab_only``), and over a varied set of texts llama.cpp's
token ids (special tokens parsed and not, BOS added and not), its text for the ids and its chat prompt (the
chat handler llama-cpp-python builds from the file's template and BOS / EOS tokens) are compared with the
bundle's tokenizer and template. The tokenizers the export refuses, or writes with a note, are shown to
tokenize differently in llama.cpp.
"""

from __future__ import annotations

import ctypes
import json

import pytest

from edgesdk.errors import ExportError
from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import CHAT_TEMPLATE, CORPUS, tiny_gemma_tokenizer, tiny_llama, tiny_llama2_tokenizer

pytest.importorskip("gguf")
pytest.importorskip("torch")
LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install llama-cpp-python, which compiles llama.cpp)"

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = QWEN2_REGEX.replace(r"\p{N}|", r"\p{N}{1,3}|")
TRAINING = CORPUS + [
    "It's 12345678 o'clock; they're 3.14159 and we've 2024-01-01, 1000000 and 42.",
    "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\n",
    "Überall café naïve 東京 日本語 中文 emoji 🙂🚀👍🏽 e\u0301 a\u0308",
    "I'll I'd I'm you're she's THEY'RE IT'S DON'T",
    "   spaces   and\n\n\nnewlines  \n \r\n",
] * 10
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "1 12 123 1234 12345 1234567 1234567890 3.14159 2024-01-01",  # digits: one by one, in threes, in runs
    "It's they're we've I'll I'd I'm DON'T IT'S a'b 's 't",
    "a  b   c    d", "trailing space ", "line\nline\n\nline\r\nend", "\ttab\t\ttabs", "x  \n  \n y",
    "Überall café naïve", "東京 日本語 中文", "emoji 🙂🚀👍🏽", "combining e\u0301 a\u0308 n\u0303",
    "def f(x):\n    return x ** 2  # square\n", "!!! ??? ... hello,world;foo:bar", "\u00a0nbsp\u2003em ŉ ǅ ﬁ",
    "<|im_start|>user\nhi<|im_end|>", "x<|im_end|>y", "<s>a</s> b", "<start_of_turn>user\nhi<end_of_turn>",
]
LEADING_SPACE = [" leading space", " ", "  \n  \n"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi! What's 12345 + 1?"},
        {"role": "assistant", "content": "12346."}, {"role": "user", "content": "Café 🙂?"}]


def _byte_level(pre_tokenizer, ignore_merges: bool = False, bos_first: bool = False):
    """A byte-level BPE trained on TRAINING, with ChatML's special tokens, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAINING, trainer)
    if bos_first:  # Llama 3's: the BOS token in front of every text
        tok.post_processor = processors.TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _smollm():
    from tokenizers import pre_tokenizers

    return _byte_level(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)]))


def _split(regex: str, **kwargs):
    from tokenizers import Regex, pre_tokenizers

    return _byte_level(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), **kwargs)


def _gpt2():
    from tokenizers import pre_tokenizers

    return _byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False))


def _llama2_normalizer():
    """Llama 2's tokenizer.json as older transformers wrote it (TinyLlama's on the Hub): a Prepend and a Replace
    normalizer, no pre-tokenizer, a decoder that strips the space put in front."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tiny_llama2_tokenizer().backend_tokenizer.to_str())
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    spec["pre_tokenizer"] = None
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


KINDS = {"gpt-2": _gpt2, "smollm": _smollm, "qwen2": lambda: _split(QWEN2_REGEX),
         "llama-bpe": lambda: _split(LLAMA3_REGEX, ignore_merges=True, bos_first=True),
         "gemma": tiny_gemma_tokenizer, "llama2-normalizer": _llama2_normalizer, "llama2-metaspace": tiny_llama2_tokenizer}
PRE = {"gpt-2": "gpt-2", "smollm": "smollm", "qwen2": "qwen2", "llama-bpe": "llama-bpe"}
# llama_detokenize takes the space out of " ." and " 's" for these pre-tokenizer names (clean_spaces, set by the
# name in llama-vocab.cpp, no GGUF key), as transformers' clean_up_tokenization_spaces does and the bundle's
# tokenizers decode does not; the pieces llama-server streams an answer in are compared for every kind
CLEANS_SPACES = {"gpt-2", "llama-bpe"}


def _export(tmp_path, tokenizer):
    """A tiny Llama with ``tokenizer`` built into a bundle and exported: (bundle, report)."""
    from edgesdk.export.gguf_export import export_gguf

    model_dir = tmp_path / "model"
    tiny_llama(hidden=32, heads=2, kv_heads=1, layers=1, vocab_size=len(tokenizer) + 2).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir, generated_sequences=0)
    return bundle, export_gguf(bundle.path, tmp_path / "model.gguf")


def _detokenize(llama_cpp, model, ids: list[int]) -> str:
    """llama.cpp's text for ``ids`` (llama_detokenize: BOS / EOS removed, control tokens not rendered)."""
    array = (llama_cpp.llama_token * len(ids))(*ids)
    buffer = ctypes.create_string_buffer(4096)
    size = llama_cpp.llama_detokenize(model._model.vocab, array, len(ids), buffer, len(buffer), True, False)
    assert size >= 0
    return buffer.raw[:size].decode()


def _piece(llama_cpp, model, token: int) -> bytes:
    """llama.cpp's bytes for one token (llama_token_to_piece, special tokens written out)."""
    buffer = ctypes.create_string_buffer(64)
    size = llama_cpp.llama_token_to_piece(model._model.vocab, token, buffer, len(buffer), 0, True)
    assert size >= 0
    return buffer.raw[:size]


@pytest.mark.parametrize("kind", list(KINDS))
def test_llama_cpp_tokenizes_detokenizes_and_renders_chat_as_the_bundle(kind, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from edgesdk.runtime.session import open_runtime

    bundle, report = _export(tmp_path, KINDS[kind]())
    tokenizer = open_runtime(bundle.path, threads=1).tokenizer
    model = llama_cpp.Llama(str(report.path), vocab_only=True, verbose=False)
    assert model.metadata["tokenizer.ggml.pre"] == PRE.get(kind, "default")
    # the two cases the export notes for Llama 2's Metaspace form are left to the next test
    texts = [text for text in TEXTS if "<s>" not in text] if kind == "llama2-metaspace" else TEXTS + LEADING_SPACE
    # the bundle's tokenizer reading special-token text as text (llama.cpp's special=False)
    plain = type(tokenizer.tokenizer).from_str(tokenizer.tokenizer.to_str())
    plain.encode_special_tokens = True
    for text in texts:
        for add in (False, True):
            expected = tokenizer.encode(text, add_special_tokens=add)
            assert model.tokenize(text.encode(), add_bos=add, special=True) == expected, (text, add)
            assert model.tokenize(text.encode(), add_bos=add, special=False) == \
                plain.encode(text, add_special_tokens=add).ids, (text, add)
        # without BOS: llama_detokenize keeps the space add_space_prefix put in front when it removes a BOS
        ids = tokenizer.encode(text, add_special_tokens=False)
        if kind not in CLEANS_SPACES and ids[:1] != [model.token_bos()]:
            assert _detokenize(llama_cpp, model, ids) == tokenizer.decode(ids), text
        if model.metadata.get("tokenizer.ggml.add_space_prefix") != "true":
            # token by token, as llama-server streams an answer: each piece's bytes, special tokens written out
            assert b"".join(_piece(llama_cpp, model, i) for i in ids).decode() == \
                tokenizer.tokenizer.decode(ids, skip_special_tokens=False), text
    # the chat prompt llama-cpp-python renders with the file's template, as Llama() builds its handler
    bos, eos = (model._model.token_get_text(model.token_bos()), model._model.token_get_text(model.token_eos()))
    formatter = Jinja2ChatFormatter(model.metadata["tokenizer.chat_template"], eos_token=eos, bos_token=bos)
    prompt = formatter(messages=CHAT).prompt
    assert prompt == tokenizer.render_chat(CHAT)
    assert model.tokenize(prompt.encode(), add_bos=False, special=True) == \
        tokenizer.encode(prompt, add_special_tokens=False)
    assert bool(report.notes) == (kind == "llama2-metaspace")


def test_a_metaspace_sentencepiece_export_says_where_llama_cpp_tokenizes_differently(tmp_path):
    """transformers' Llama 2 tokenizer puts U+2581 in front with a Metaspace pre-tokenizer (prepend_scheme
    'first'), which puts none before a text that already begins with a space nor after a special token;
    llama.cpp's add_space_prefix does both, and no GGUF key says otherwise. The export writes the file and says
    so, by the two cases, each of which llama.cpp shows."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    from edgesdk.runtime.session import open_runtime

    with pytest.warns(UserWarning, match="begins with a space") as caught:
        bundle, report = _export(tmp_path, tiny_llama2_tokenizer())
    assert len(report.notes) == 2
    assert "after a special token" in report.notes[1]
    assert len(caught) == 2
    tokenizer = open_runtime(bundle.path, threads=1).tokenizer
    model = llama_cpp.Llama(str(report.path), vocab_only=True, verbose=False)
    space = tokenizer.token_id("\u2581")
    ids = tokenizer.encode(" leading", add_special_tokens=False)
    assert model.tokenize(b" leading", add_bos=False) == [space, *ids]
    ids = tokenizer.encode("</s>\nx", add_special_tokens=False)
    assert model.tokenize(b"</s>\nx", add_bos=False, special=True) == [ids[0], space, *ids[1:]]


def _tokenizer_json(tmp_path, spec: dict):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return path


def _written(tmp_path, path, bos: str, eos: str, size: int):
    """The vocabulary of ``path`` written by the export's own tokenizer keys into a GGUF file llama.cpp opens
    with ``vocab_only``."""
    from edgesdk.export.gguf_export import add_tokenizer
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json
    from tests._utils.gguf_files import vocab_only_gguf

    vocab = vocab_from_tokenizer_json(path, bos, eos, size)
    return vocab, vocab_only_gguf(tmp_path / "vocab.gguf", lambda writer: add_tokenizer(writer, vocab, None))


def test_an_eos_token_the_tokenizer_appends_is_appended_by_llama_cpp_too(tmp_path):
    """A post-processor that puts EOS after the text: tokenizer.ggml.add_eos_token says so (llama.cpp adds none
    to a gpt2 vocabulary without it)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    from tokenizers import Tokenizer

    tok = _gpt2().backend_tokenizer
    spec = json.loads(tok.to_str())
    spec["post_processor"] = {"type": "TemplateProcessing", "special_tokens": {
        "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
        "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}},
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}], "pair": []}
    path = _tokenizer_json(tmp_path, spec)
    vocab, target = _written(tmp_path, path, "<|im_start|>", "<|im_end|>", tok.get_vocab_size())
    assert vocab.add_bos
    assert vocab.add_eos
    model = llama_cpp.Llama(str(target), vocab_only=True, verbose=False)
    expected = Tokenizer.from_file(str(path)).encode("hi there").ids
    assert expected[0] == 1
    assert expected[-1] == 2
    assert model.tokenize(b"hi there", add_bos=True) == expected


def test_an_added_token_that_takes_the_whitespace_around_it_is_refused(tmp_path):
    """lstrip / rstrip / single_word: llama.cpp sets them from no GGUF key, so 'a <mask> b' would be
    ['a', ' <mask> ', 'b'] for the bundle and ['a', 'Ġ', '<mask>', 'Ġb'] for llama.cpp."""
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    tok = _gpt2().backend_tokenizer
    spec = json.loads(tok.to_str())
    spec["added_tokens"].append({"id": tok.get_vocab_size(), "content": "<mask>", "single_word": False,
                                 "lstrip": True, "rstrip": True, "normalized": False, "special": True})
    path = _tokenizer_json(tmp_path, spec)
    with pytest.raises(ExportError, match=r"added token '<mask>' \(id \d+\) has lstrip and rstrip set"):
        vocab_from_tokenizer_json(path, "<|im_start|>", "<|im_end|>", tok.get_vocab_size() + 1)


TOY_VOCAB = {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}
TOY_MERGES = [("b", "c"), ("a", "b"), ("ab", "c")]  # 'abc' is in the vocabulary, but merging it gives a + bc


def _toy(tmp_path, regex: str, ignore_merges: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=dict(TOY_VOCAB), merges=list(TOY_MERGES), ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    return tok, tmp_path / "tokenizer.json"


@pytest.mark.parametrize(("regex", "ignore_merges"), [(LLAMA3_REGEX, False), (QWEN2_REGEX, True)])
def test_ignore_merges_llama_cpp_does_not_follow_is_refused_where_it_changes_a_word(regex, ignore_merges, tmp_path):
    """llama.cpp looks a whole word up before merging for llama-bpe and never for qwen2, whatever the BPE model's
    ignore_merges says: where the merges do not build a vocabulary token back ('abc' here) the word would be one
    token in one tokenizer and two in the other, so the export refuses; with llama.cpp's own setting it writes
    a file llama.cpp tokenizes 'abc' in as the bundle does."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)

    _, path = _toy(tmp_path, regex, ignore_merges)
    with pytest.raises(ExportError, match=r"ignore_merges .*1 vocabulary tokens \(e\.g\. 'abc'\)"):
        _written(tmp_path, path, "<s>", "<s>", 7)
    tok, path = _toy(tmp_path, regex, not ignore_merges)
    _, target = _written(tmp_path, path, "<s>", "<s>", 7)
    model = llama_cpp.Llama(str(target), vocab_only=True, verbose=False)
    whole_word = [TOY_VOCAB["abc"]] if regex == LLAMA3_REGEX else [TOY_VOCAB["a"], TOY_VOCAB["bc"]]
    assert model.tokenize(b"abc", add_bos=False) == tok.encode("abc").ids == whole_word


def test_a_metaspace_that_splits_off_pieces_llama_cpp_would_merge_is_refused(tmp_path):
    """Metaspace with split: the bundle never makes a piece with U+2581 inside ('\u2581\u2581', a run of
    spaces); llama.cpp, splitting nothing, would."""
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    spec = {"model": {"type": "BPE", "byte_fallback": True, "vocab": {"<unk>": 0, "\u2581": 1, "\u2581\u2581": 2},
                      "merges": [["\u2581", "\u2581"]], "unk_token": "<unk>"},
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
            "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]}}
    with pytest.raises(ExportError, match="splits the text before each U\\+2581.*'\u2581\u2581'"):
        vocab_from_tokenizer_json(_tokenizer_json(tmp_path, spec), None, None, 3)
