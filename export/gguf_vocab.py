"""A bundle's tokenizer (a Hugging Face ``tokenizer.json``) as GGUF ``tokenizer.ggml.*`` metadata.

Two kinds are written:

- Byte-level BPE (GPT-2's scheme, which SmolLM2, Llama 3 and Qwen2 use), stored as llama.cpp's
  ``gpt2`` tokenizer model: the vocabulary in id order, each token's type, the merges as "left right"
  strings in rank order.
- SentencePiece BPE as transformers converts it (Gemma, Llama 2, TinyLlama): a BPE model with
  ``byte_fallback``, spaces written as U+2581 by the normalizer (or a Metaspace pre-tokenizer), and
  ``<0xNN>`` byte tokens. It is stored as llama.cpp's ``llama`` (SPM) tokenizer model, which merges the
  adjacent pair whose joined token has the highest score: a token's score is minus the rank of the
  first merge that makes it (below every merge for a token none makes), so llama.cpp merges in the
  order the BPE ranks them. The byte tokens are typed BYTE (llama.cpp's byte fallback), and
  ``add_space_prefix`` says whether a U+2581 is put in front of the text (Llama 2's normalizer does,
  Gemma's does not).

For byte-level BPE: llama.cpp splits text before BPE with a regex chosen by
``tokenizer.ggml.pre``; the pre-tokenizers it is picked from here are those whose regexes are
known to equal llama.cpp's (``llama-vocab.cpp``): ByteLevel alone (``gpt-2``), individual digits
then ByteLevel (``smollm``), and a Split on Qwen2's or Llama 3's regex before a regex-free
ByteLevel (``qwen2``, ``llama-bpe``), and the steps edgesdk's GGUF loader gives a tokenizer read from a GGUF
file of any type it rebuilds (``default`` for a file without the key, ``tekken``, ``falcon`` ...), written with that
type again. Any other is refused rather than guessed, since a wrong regex tokenizes differently without any
error. llama.cpp looks a whole word up before merging for the Llama 3 types, ``tekken`` and ``minicpm5`` only
(``ignore_merges``); a BPE model set the other way is refused where that changes a word.

For both: BOS and EOS are added where the tokenizer's post-processor puts them around a text
(``add_bos_token`` / ``add_eos_token``). llama.cpp takes whitespace into an added token only by the
model's name, which no GGUF key overrides: the special tokens of a file whose ``general.name`` holds "phi-3" or
"phi3" strip the whitespace after them (``rstrip``; edgesdk.models.loader.phi3_rstrip_tokens), none of any other. So
``rstrip`` is written where the file's name gives llama.cpp the same tokens (a Phi-3 bundle) and refused where it
does not, and ``lstrip`` or ``single_word`` is refused. A Metaspace pre-tokenizer's U+2581 in front differs
from llama.cpp's ``add_space_prefix`` on two kinds of text, which the vocabulary's ``notes`` name.
llama.cpp normalizes no text, so a normalizer step other than the SentencePiece space handling is refused,
but NFC (Qwen2's), which changes only text not already composed, is written with a note.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import ExportError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's LLAMA_TOKEN_TYPE_*
SPACE_MARK = "\u2581"  # SentencePiece's visible space
BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")
# Split regexes of Hugging Face tokenizers -> the llama.cpp pre-tokenizer that splits the same way
SPLIT_REGEXES = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "llama-bpe",
}


@dataclass(frozen=True)
class GGUFVocab:
    tokens: list[str]  # in id order
    token_types: list[int]
    merges: list[str]  # "left right", highest priority first (gpt2 only)
    pre: str  # tokenizer.ggml.pre
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    add_bos: bool
    pad_id: int | None = None  # tokenizer.ggml.padding_token_id (None: the tokenizer has no padding token)
    model: str = "gpt2"  # tokenizer.ggml.model: gpt2 (byte-level BPE) | llama (SentencePiece)
    scores: list[float] | None = None  # llama: each token's merge priority (higher merges first)
    add_space_prefix: bool = False  # llama: a U+2581 in front of the text before it is tokenized
    add_eos: bool = False  # encoding a text puts the EOS token after it (tokenizer.ggml.add_eos_token)
    # every id that ends the bundle's generation (its manifest's eos_token_ids): tokenizer.ggml.eos_token_ids
    eos_ids: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()  # texts llama.cpp tokenizes differently from the bundle, where it has no key to say so


def vocab_from_tokenizer_json(path: Path, bos_token: str | None, eos_token: str | None, vocab_size: int,
                              name: str | None = None, pad_token: str | None = None,
                              unk_token: str | None = None) -> GGUFVocab:
    """Read ``path``; ``vocab_size`` is the model's (rows of its embedding), which the vocabulary must fill;
    ``name``: the ``general.name`` the file is written with, by which llama.cpp strips whitespace after tokens;
    ``pad_token``: the tokenizer's padding token (tokenizer_config.json's ``pad_token``), whose id llama.cpp's
    converter writes as ``tokenizer.ggml.padding_token_id`` (gguf-py ``SpecialVocab``); ``unk_token``: the
    tokenizer's unknown token (the manifest's ``unk_token``), written as ``tokenizer.ggml.unknown_token_id``, which
    llama.cpp's converter takes from tokenizer_config.json too: a byte-level BPE model's own ``unk_token`` field is
    null in most tokenizer.json files (SmolLM2's), which leaves only the model's field as the fallback."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    prefix_space = _sentencepiece_spaces(spec)
    if model.get("type") == "BPE" and model.get("byte_fallback") and prefix_space is not None:
        return _sentencepiece_vocab(spec, path, bos_token, eos_token, vocab_size, prefix_space, name, pad_token,
                                    unk_token)
    if model.get("type") != "BPE" or not _byte_level(spec.get("decoder")):
        raise ExportError(f"{path}: tokenizer model {model.get('type')!r} with decoder "
                          f"{(spec.get('decoder') or {}).get('type')!r}; GGUF export writes byte-level BPE and "
                          "SentencePiece BPE (byte fallback, spaces as U+2581) only",
                          "export a model with one of those tokenizers, or run the bundle with edgesdk")
    pre = _pre_tokenizer_name(spec.get("pre_tokenizer"), path)
    notes = _normalizer_notes(spec, path, ()) + _unembedded_notes(spec, vocab_size)
    tokens, types = _tokens_by_id(spec, path, vocab_size)
    notes += _check_rstrip(spec, path, tokens, types, name)
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in model.get("merges", [])]
    _check_merges_written(merges, path)
    _check_ignore_merges(spec, pre, merges, path)
    return GGUFVocab(tokens=tokens, token_types=types, merges=merges, pre=pre, notes=notes,
                     **_special_ids(spec, tokens, bos_token, eos_token, pad_token, unk_token))


def _check_merges_written(merges: list[str], path: Path) -> None:
    """Refuse a byte-level BPE without merges: gguf's writer leaves an empty ``tokenizer.ggml.merges`` out of the
    file, and llama.cpp's gpt2 tokenizer refuses a file without that key at load time ("cannot find tokenizer merges
    in model file", src/llama-vocab.cpp)."""
    if not merges:
        raise ExportError(f"{path}: the BPE model has no merges, so the GGUF file would have no "
                          "tokenizer.ggml.merges (gguf's writer drops an empty array), which llama.cpp's gpt2 "
                          "tokenizer requires: it would refuse the file ('cannot find tokenizer merges in model file')",
                          "run the bundle with edgesdk, or build it from a tokenizer with at least one merge")


def _normalizer_notes(spec: dict, path: Path, kept: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse a normalizer llama.cpp does not apply; the notes for one it does not apply but that changes only
    rare text. llama.cpp's BPE and SPM tokenizers normalize nothing (llama-vocab.cpp: ``llm_tokenizer_bpe_session``
    splits the raw text with its regex, ``llm_tokenizer_spm_session`` only writes spaces as U+2581), and its
    converter refuses a BPE tokenizer whose output on its test text it does not know (``get_vocab_base_pre``), as a
    Lowercase or Replace normalizer makes it. Steps of type ``kept`` (the SentencePiece space handling, which
    llama.cpp does itself) are llama.cpp's; NFC (Qwen2's, which llama.cpp's converter accepts) only changes text
    that is not already composed."""
    steps = [step for step in _normalizer_steps(spec) if step]
    other = [step for step in steps if step.get("type") not in ("NFC", *kept)
             or (step.get("type") == "Replace" and not _replaces_spaces(step))
             or (step.get("type") == "Prepend" and step.get("prepend") != SPACE_MARK)]
    if other:
        allowed = "NFC or SentencePiece's space handling (Prepend / Replace of ' ' by U+2581)" if kept else "NFC"
        raise ExportError(f"{path}: normalizer {json.dumps(other[0])[:200]} changes the text before it is "
                          "tokenized, which llama.cpp does not do (it normalizes nothing), so llama.cpp would "
                          "tokenize such text differently from the bundle without any error; GGUF export takes "
                          f"no normalizer or {allowed} only",
                          "run the bundle with edgesdk, or build it from a tokenizer without that normalizer")
    if any(step.get("type") == "NFC" for step in steps):
        return ("a text not in Unicode NFC (a letter followed by a combining accent, 'e' + U+0301): the bundle's "
                "NFC normalizer composes it first (into U+00E9), llama.cpp tokenizes it as written",)
    return ()


def _special_ids(spec: dict, tokens: list[str], bos_token: str | None, eos_token: str | None,
                 pad_token: str | None = None, unk_token: str | None = None) -> dict:
    """GGUFVocab's bos_id, eos_id, unk_id, pad_id (None where the tokenizer has none), add_bos and add_eos; the unknown
    token is the tokenizer's (``unk_token``), else the BPE model's own field."""
    ids = {token: i for i, token in enumerate(tokens)}
    unk = unk_token or spec["model"].get("unk_token")
    single = _single_template(spec.get("post_processor"))
    return {"bos_id": ids.get(bos_token) if bos_token else None, "eos_id": ids.get(eos_token) if eos_token else None,
            "unk_id": ids.get(unk) if unk else None, "pad_id": ids.get(pad_token) if pad_token else None,
            "add_bos": _template_special(single[:1], bos_token),
            "add_eos": _template_special(single[-1:], eos_token)}


def _tokens_by_id(spec: dict, path: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """The tokens in id order and llama.cpp's type of each (padding rows, which no token has: UNUSED), added tokens
    past the embedding left out (:func:`_unembedded`)."""
    model = spec["model"]
    by_id = {int(index): token for token, index in model["vocab"].items()}
    special = set()
    user_defined = set()
    unembedded = _unembedded(spec, vocab_size)
    for added in spec.get("added_tokens", []):
        if int(added["id"]) in unembedded:
            continue
        stripping = [flag for flag in ("lstrip", "rstrip", "single_word") if added.get(flag)]
        if added.get("lstrip") or added.get("single_word"):  # llama.cpp sets LSTRIP only by a model's name
            # (llama-vocab.cpp: jina-v2's and modern-bert's mask), from no GGUF key; rstrip alone: _check_rstrip
            raise ExportError(f"{path}: added token {added['content']!r} (id {added['id']}) has "
                              f"{' and '.join(stripping)} set, so the bundle's tokenizer takes the whitespace around "
                              "it into the token (or matches it only as a whole word); llama.cpp has no GGUF key for "
                              "that and would tokenize the text around it differently",
                              "run the bundle with edgesdk, or build it from a tokenizer whose added tokens have "
                              "lstrip and single_word false")
        by_id[int(added["id"])] = added["content"]
        (special if added.get("special") else user_defined).add(int(added["id"]))
    missing = {i for i in range(vocab_size) if i not in by_id}
    extra = [i for i in by_id if i >= vocab_size and i not in unembedded]
    if extra:
        raise ExportError(f"{path}: token ids up to {max(extra)}, but the model's embedding has {vocab_size} rows",
                          "the tokenizer does not belong to this model; rebuild the bundle")
    # Rows the embedding pads with (vocabularies rounded up to a multiple of 64 or 128) are UNUSED, as llama.cpp's
    # converter marks them: a USER_DEFINED one would match its name in the text ("[PAD330]") as one token.
    for i in missing:
        by_id[i] = f"[PAD{i}]"
    tokens = [by_id[i] for i in range(vocab_size)]
    types = [CONTROL if i in special else USER_DEFINED if i in user_defined else UNUSED if i in missing else NORMAL
             for i in range(vocab_size)]
    return tokens, types


def _unembedded(spec: dict, vocab_size: int) -> dict[int, str]:
    """The added tokens (id -> text) whose ids lie past the model's ``vocab_size`` embedding rows: Gemma 3's
    tokenizer adds <image_soft_token> as id 262144 to every size, the 1B's embedding has 262144 rows. The model has
    no row to read or predict them by; llama.cpp's converter leaves such tokens out of the file with a warning
    (convert_hf_to_gguf.py, ``_create_vocab_sentencepiece``: "id is out of range"), and so does the export (their
    text is then tokenized as plain text)."""
    return {int(added["id"]): added["content"] for added in spec.get("added_tokens", [])
            if int(added["id"]) >= vocab_size}


def _unembedded_notes(spec: dict, vocab_size: int) -> tuple[str, ...]:
    """The note for the added tokens the file leaves out (:func:`_unembedded`)."""
    past = sorted(_unembedded(spec, vocab_size).items())
    if not past:
        return ()
    shown = ", ".join(f"{text!r} (id {index})" for index, text in past[:5]) + (", ..." if len(past) > 5 else "")
    return (f"the texts of the added tokens {shown} as plain text: their ids lie past the model's {vocab_size} "
            "embedding rows, so the file's vocabulary (as llama.cpp's converter writes it) leaves them out",)


def _check_rstrip(spec: dict, path: Path, tokens: list[str], types: list[int], name: str | None) -> tuple[str, ...]:
    """Refuse a vocabulary whose added tokens' ``rstrip`` (the bundle's tokenizer takes the whitespace after the
    token into it) differs from the RSTRIP llama.cpp gives the written ``tokens`` of ``types`` for a file named
    ``name`` (edgesdk.models.loader.phi3_rstrip_tokens: a Phi-3's special tokens); the note for the whitespace the
    two strip differently where any token strips. Added tokens past the embedding (:func:`_unembedded`) are not
    written, so their ``rstrip`` is nothing llama.cpp could differ on."""
    from edgesdk.models.loader import phi3_rstrip_tokens

    llama_cpp = phi3_rstrip_tokens(name, tokens, types) or set()
    added = {token["content"]: bool(token.get("rstrip")) for token in spec.get("added_tokens", [])
             if int(token["id"]) < len(tokens)}
    bundle = {text for text, strips in added.items() if strips}
    only_bundle = sorted(bundle - llama_cpp)
    only_llama_cpp = sorted(text for text in llama_cpp - bundle if text in added)
    rule = ('llama.cpp strips the whitespace after the special tokens but "<unk>", "<s>" and "<|endoftext|>" of a '
            'model whose general.name holds "phi-3" or "phi3" (src/llama-vocab.cpp), and after no token of any '
            f"other; this file is named {name!r}")
    if only_bundle:
        raise ExportError(f"{path}: added tokens {', '.join(repr(text) for text in only_bundle[:5])} have rstrip set, "
                          "so the bundle's tokenizer takes the whitespace after them into the token; " + rule,
                          "run the bundle with edgesdk, or build it from a tokenizer whose added tokens strip as "
                          "llama.cpp's rule gives them (a Phi-3 model's own tokenizer.json, built from a source whose "
                          "name holds Phi-3)")
    if only_llama_cpp:
        raise ExportError(f"{path}: tokens {', '.join(repr(text) for text in only_llama_cpp[:5])} have no rstrip in "
                          "the bundle's tokenizer, which keeps the whitespace after them; " + rule,
                          "run the bundle with edgesdk, or build it from a source whose name does not hold phi-3 or "
                          "phi3, or from a tokenizer whose added tokens strip as llama.cpp's rule gives them")
    if not bundle:
        return ()
    return ("a special token followed by whitespace outside ASCII (U+00A0, U+3000): the bundle's tokenizer takes it "
            "into the token (rstrip strips any Unicode whitespace), llama.cpp keeps it (it strips ASCII spaces, tabs "
            "and line breaks only)",)


def _sentencepiece_spaces(spec: dict) -> bool | None:
    """For a tokenizer that writes spaces as U+2581 and decodes them back (SentencePiece converted by
    transformers): whether it also puts one in front of the text; None for any other tokenizer."""
    steps = _normalizer_steps(spec)
    replaces = any(_replaces_spaces(step) for step in steps)
    prepends = any(step.get("type") == "Prepend" and step.get("prepend") == SPACE_MARK for step in steps)
    pre = spec.get("pre_tokenizer") or {}
    metaspace = pre.get("type") == "Metaspace" and pre.get("replacement") == SPACE_MARK
    decoder = spec.get("decoder") or {}
    decoders = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    byte_fallback = any(step.get("type") == "ByteFallback" for step in decoders)
    if not byte_fallback or not (replaces or metaspace):
        return None
    return prepends or (metaspace and pre.get("prepend_scheme", "always") != "never")


def _normalizer_steps(spec: dict) -> list[dict]:
    normalizer = spec.get("normalizer") or {}
    return normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]


def _replaces_spaces(step: dict) -> bool:
    """A normalizer step that writes every space as U+2581."""
    return step.get("type") == "Replace" and (step.get("pattern") or {}).get("String") == " " \
        and step.get("content") == SPACE_MARK


def _sentencepiece_vocab(spec: dict, path: Path, bos_token: str | None, eos_token: str | None,
                         vocab_size: int, prefix_space: bool, name: str | None = None,
                         pad_token: str | None = None, unk_token: str | None = None) -> GGUFVocab:
    """llama.cpp's ``llama`` tokenizer model for a SentencePiece BPE ``spec`` (module docstring)."""
    model = spec["model"]
    pre = spec.get("pre_tokenizer") or {}
    # llama.cpp's SPM model splits nothing before merging: only a pre-tokenizer that splits nothing more is kept
    # (Metaspace, whose words no SentencePiece piece crosses; Gemma's Split on " ", which its normalizer has
    # already turned into U+2581). Any other would tokenize differently in llama.cpp without an error.
    splits_nothing = pre.get("type") in (None, "Metaspace") or (
        pre.get("type") == "Split" and (pre.get("pattern") or {}).get("String") == " "
        and any(_replaces_spaces(step) for step in _normalizer_steps(spec)))
    if not splits_nothing:
        raise ExportError(f"{path}: pre-tokenizer {json.dumps(pre)[:200]} splits the text before a SentencePiece "
                          "BPE, which llama.cpp's llama tokenizer model does not do",
                          "run the bundle with edgesdk, or convert the original model with llama.cpp's "
                          "convert_hf_to_gguf.py")
    tokens, types = _tokens_by_id(spec, path, vocab_size)
    _spm_added_pieces(tokens, types)
    crossing = [token for i, token in enumerate(tokens) if types[i] == NORMAL and SPACE_MARK in token[1:]]
    if pre.get("type") == "Metaspace" and pre.get("split", True) and crossing:
        raise ExportError(f"{path}: the Metaspace pre-tokenizer splits the text before each U+2581, so the bundle "
                          f"never makes the {len(crossing)} tokens with one inside (e.g. {crossing[0]!r}), which "
                          "llama.cpp's llama tokenizer model, splitting nothing, does make",
                          "run the bundle with edgesdk, or convert the original model with llama.cpp's "
                          "convert_hf_to_gguf.py")
    rank_of: dict[str, int] = {}
    for rank, pair in enumerate(model.get("merges", [])):
        left, right = pair if isinstance(pair, list) else pair.split(" ", 1)
        rank_of.setdefault(left + right, rank)
    unk = model.get("unk_token")
    for i, token in enumerate(tokens):
        if types[i] == NORMAL and BYTE_TOKEN.fullmatch(token):
            types[i] = BYTE
        elif token == unk:  # a padding row is named [PADn], never the unknown token
            types[i] = UNKNOWN
    # A NORMAL token no merge makes (a single character) ranks below every merge; the others are never merged.
    last = float(len(model.get("merges", [])))
    scores = [(-float(rank_of.get(token, last)) if types[i] == NORMAL else 0.0) for i, token in enumerate(tokens)]
    notes = (_metaspace_notes(spec) if prefix_space else ()) + _normalizer_notes(spec, path, ("Prepend", "Replace"))
    notes += _unembedded_notes(spec, vocab_size)
    notes += _check_rstrip(spec, path, tokens, types, name)
    return GGUFVocab(tokens=tokens, token_types=types, merges=[], pre="default", model="llama", scores=scores,
                     add_space_prefix=prefix_space, notes=notes,
                     **_special_ids(spec, tokens, bos_token, eos_token, pad_token, unk_token))


def _spm_added_pieces(tokens: list[str], types: list[int]) -> None:
    """Write the U+2581 of a SentencePiece vocabulary's non-special added tokens (USER_DEFINED) as spaces, in place,
    as llama.cpp's converter does ("pre-normalize user-defined spaces", convert_hf_to_gguf.py
    ``_create_vocab_sentencepiece``, for Gemma's whitespace runs "\u2581\u2581" ...): llama.cpp prints a USER_DEFINED
    token's text as it is and matches it in the raw text, before any space becomes U+2581 (llama-vocab.cpp,
    ``token_to_piece``, ``tokenizer_st_partition``), where the bundle's decoder writes each U+2581 as a space."""
    for i, token in enumerate(tokens):
        if types[i] == USER_DEFINED:
            tokens[i] = token.replace(SPACE_MARK, " ")


def _metaspace_notes(spec: dict) -> tuple[str, ...]:
    """Where a U+2581 put in front by a Metaspace pre-tokenizer differs from llama.cpp's add_space_prefix, which
    puts a space in front of the text and of each piece after a special token, whatever it starts with
    (llama-vocab.cpp, LLAMA_VOCAB_TYPE_SPM in tokenize_impl); a Prepend normalizer does as llama.cpp does."""
    pre = spec.get("pre_tokenizer") or {}
    if any(step.get("type") == "Prepend" for step in _normalizer_steps(spec)) or pre.get("type") != "Metaspace":
        return ()
    notes = ["a text that begins with a space: the bundle's Metaspace pre-tokenizer puts no second U+2581 in front "
             "of it, llama.cpp does (one more '\u2581' token)"]
    if pre.get("prepend_scheme") == "first":
        notes.append("text right after a special token (a chat template's '</s>\n'): the bundle's Metaspace "
                     "(prepend_scheme 'first') puts no U+2581 in front of it, llama.cpp does")
    return tuple(notes)


def _byte_level(component) -> bool:
    if not component:
        return False
    if component.get("type") == "ByteLevel":
        return True
    return component.get("type") == "Sequence" and any(_byte_level(part) for part in component.get("decoders", []))


def _pre_tokenizer_name(pre_tokenizer, path) -> str:
    """llama.cpp's name for the regex split that ``pre_tokenizer`` performs."""
    parts = [pre_tokenizer] if pre_tokenizer and pre_tokenizer.get("type") != "Sequence" else \
        (pre_tokenizer or {}).get("pretokenizers", [])
    kinds = [part.get("type") for part in parts]
    byte_level = parts[-1] if parts else {}
    prefix_space = kinds[-1:] == ["ByteLevel"] and byte_level.get("add_prefix_space")
    name = _byte_level_split_name(parts, kinds)
    if name and not prefix_space:
        return name
    if name:  # the layout of a known name, but for the setting
        raise ExportError(f"{path}: pre-tokenizer {json.dumps(pre_tokenizer)[:200]}: its ByteLevel step has "
                          "add_prefix_space true, so the bundle's tokenizer puts a space in front of every text before "
                          "splitting it, which llama.cpp's byte-level BPE (tokenizer.ggml.model gpt2) never does: the "
                          "first word would be other tokens in llama.cpp, without any error",
                          "run the bundle with edgesdk, or build it from a tokenizer.json whose ByteLevel "
                          "pre-tokenizer has add_prefix_space false (as the model's own has, unless it was saved "
                          "with add_prefix_space=True)")
    also = (" (its ByteLevel step also has add_prefix_space true, which llama.cpp's byte-level BPE never does: "
            "that would need to be false too)") if prefix_space else ""
    raise ExportError(f"{path}: pre-tokenizer {json.dumps(pre_tokenizer)[:200]} has no llama.cpp regex known to match "
                      "it (known, each ending in a ByteLevel without add_prefix_space: ByteLevel alone, applying its "
                      "regex -> gpt-2; Digits(individual) then ByteLevel applying its regex -> smollm; Qwen2's and "
                      "Llama 3's Split regexes then ByteLevel without one -> qwen2, llama-bpe; the splits edgesdk's "
                      f"GGUF loader gives a tokenizer read from a GGUF file -> that file's type){also}",
                      "run the bundle with edgesdk, or convert the original model with llama.cpp's convert_hf_to_gguf.py")


def _byte_level_split_name(parts: list[dict], kinds: list[str]) -> str | None:
    """The llama.cpp name of the regex split of the pre-tokenizer ``parts`` (of types ``kinds``) where they end in
    a ByteLevel step, whatever its add_prefix_space, or None."""
    if kinds[-1:] != ["ByteLevel"]:
        return None
    regex = parts[-1].get("use_regex", True)
    if len(parts) == 1 and regex:
        return "gpt-2"
    if len(parts) == 2 and kinds[0] == "Digits" and parts[0].get("individual_digits") and regex:
        return "smollm"
    split = parts[0] if len(parts) == 2 and kinds[0] == "Split" else {}
    if not regex and split.get("behavior") == "Isolated" and not split.get("invert"):
        name = SPLIT_REGEXES.get((split.get("pattern") or {}).get("Regex"))
        if name:
            return name
    return _loader_split_name(parts)


def _loader_split_name(parts: list[dict]) -> str | None:
    """The tokenizer.ggml.pre whose llama.cpp regexes the pre-tokenizer ``parts`` (ending in ByteLevel) split with,
    where they are the steps edgesdk's GGUF loader gives a tokenizer read from a GGUF file of that type
    (edgesdk/models/loader.py: ``_set_bpe_pre_tokenizer`` from ``BPE_PRE_TOKENIZER_SPLITS``: isolated Splits,
    ``Digits`` for "\\p{N}", ByteLevel applying GPT-2's regex where it is the last): a bundle built from a GGUF file
    of any type the loader rebuilds (a file without tokenizer.ggml.pre: "default") is written with that type
    again. The first name of the loader's table holding those regexes is taken (the names sharing them are one
    llama.cpp type, LLAMA_VOCAB_PRE_TYPE_*)."""
    from edgesdk.models.loader import BPE_PRE_TOKENIZER_SPLITS, GPT2_SPLIT

    regexes = []
    for part in parts[:-1]:
        if part.get("type") == "Digits" and part.get("individual_digits"):
            regexes.append(r"\p{N}")
        elif part.get("type") == "Split" and part.get("behavior") == "Isolated" and not part.get("invert") \
                and "Regex" in (part.get("pattern") or {}):
            regexes.append(part["pattern"]["Regex"])
        else:
            return None
    if parts[-1].get("use_regex", True):
        regexes.append(GPT2_SPLIT)
    return next((name for name, splits in BPE_PRE_TOKENIZER_SPLITS.items() if list(splits) == regexes), None)


def _single_template(post_processor) -> list[dict]:
    """The pieces a TemplateProcessing rule puts around a single sequence ([] without one)."""
    if not post_processor:
        return []
    processors = post_processor.get("processors", [post_processor]) if post_processor.get("type") == "Sequence" \
        else [post_processor]
    for processor in processors:
        if processor.get("type") == "TemplateProcessing":
            return processor.get("single") or []
    return []


def _template_special(pieces: list[dict], token: str | None) -> bool:
    """Whether ``pieces`` (the template's first or last) is the special token ``token``."""
    return bool(token) and bool(pieces) and (pieces[0].get("SpecialToken") or {}).get("id") == token


# the pre-tokenizer names for which llama.cpp looks a whole pre-tokenized word up in the vocabulary before merging
# (llama-vocab.cpp: ignore_merges = true for LLAMA_VOCAB_PRE_TYPE_LLAMA3, tekken, minicpm5: the loader's list)
def _ignores_merges() -> frozenset[str]:
    from edgesdk.models.loader import IGNORE_MERGES_PRE_TOKENIZERS

    return frozenset(IGNORE_MERGES_PRE_TOKENIZERS)


IGNORES_MERGES = _ignores_merges()


def _check_ignore_merges(spec: dict, pre: str, merges: list[str], path: Path) -> None:
    """Refuse a byte-level BPE whose ``ignore_merges`` differs from what llama.cpp does for ``pre`` where it
    changes a token: a vocabulary token the merges do not build back from its characters is one word in one
    tokenizer and several in the other."""
    model = spec["model"]
    ignores = bool(model.get("ignore_merges"))
    if ignores == (pre in IGNORES_MERGES):
        return
    ranks = {tuple(merge.split(" ", 1)): rank for rank, merge in enumerate(merges)}
    added = {token["content"] for token in spec.get("added_tokens", [])}  # matched before any merging
    unbuilt = [token for token in model["vocab"]
               if len(token) > 1 and token not in added and _bpe(token, ranks) != [token]]
    if unbuilt:
        llama_cpp = "looks a whole word up first" if pre in IGNORES_MERGES else "always merges"
        raise ExportError(f"{path}: the BPE model has ignore_merges {str(ignores).lower()}, but llama.cpp's "
                          f"{pre} pre-tokenizer {llama_cpp}; {len(unbuilt)} vocabulary tokens (e.g. "
                          f"{', '.join(repr(token) for token in unbuilt[:3])}) are not what the merges build from "
                          "their characters, so the word is one token in one and several in the other",
                          "run the bundle with edgesdk, or convert the original model with llama.cpp's "
                          "convert_hf_to_gguf.py")


def _bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """``word``'s characters merged as BPE does: the lowest-ranked adjacent pair first, until none is ranked."""
    parts = list(word)
    while len(parts) > 1:
        best = min(range(len(parts) - 1), key=lambda i: ranks.get((parts[i], parts[i + 1]), len(ranks)))
        pair = (parts[best], parts[best + 1])
        if pair not in ranks:
            break
        merged, i = [], 0
        while i < len(parts):
            if i < len(parts) - 1 and (parts[i], parts[i + 1]) == pair:
                merged.append(pair[0] + pair[1])
                i += 2
            else:
                merged.append(parts[i])
                i += 1
        parts = merged
    return parts
