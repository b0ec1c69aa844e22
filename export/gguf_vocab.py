"""A bundle's tokenizer (a Hugging Face ``tokenizer.json``) as GGUF ``tokenizer.ggml.*`` metadata.

Byte-level BPE only (GPT-2's scheme, which SmolLM2, Llama 3 and Qwen2 use), stored as llama.cpp's
``gpt2`` tokenizer model: the vocabulary in id order, each token's type, the merges as "left right"
strings in rank order. llama.cpp splits text before BPE with a regex chosen by
``tokenizer.ggml.pre``; the pre-tokenizers it is picked from here are those whose regexes are
known to equal llama.cpp's (``llama-vocab.cpp``): ByteLevel alone (``gpt-2``), individual digits
then ByteLevel (``smollm``), and a Split on Qwen2's or Llama 3's regex before a regex-free
ByteLevel (``qwen2``, ``llama-bpe``). Any other is refused rather than guessed, since a wrong regex
tokenizes differently without any error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import ExportError

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # llama.cpp's token types (LLAMA_TOKEN_TYPE_*)
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
    merges: list[str]  # "left right", highest priority first
    pre: str  # tokenizer.ggml.pre
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    add_bos: bool


def vocab_from_tokenizer_json(path: Path, bos_token: str | None, eos_token: str | None, vocab_size: int) -> GGUFVocab:
    """Read ``path``; ``vocab_size`` is the model's (rows of its embedding), which the vocabulary must fill."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not _byte_level(spec.get("decoder")):
        raise ExportError(f"{path}: tokenizer model {model.get('type')!r} with decoder "
                          f"{(spec.get('decoder') or {}).get('type')!r}; GGUF export writes byte-level BPE only",
                          "export a model with a GPT-2-style byte-level BPE tokenizer, or run the bundle with edgesdk")
    pre = _pre_tokenizer_name(spec.get("pre_tokenizer"), path)
    by_id = {int(index): token for token, index in model["vocab"].items()}
    special = set()
    user_defined = set()
    for added in spec.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
        (special if added.get("special") else user_defined).add(int(added["id"]))
    missing = [i for i in range(vocab_size) if i not in by_id]
    extra = [i for i in by_id if i >= vocab_size]
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
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in model.get("merges", [])]
    ids = {token: i for i, token in enumerate(tokens)}
    return GGUFVocab(tokens=tokens, token_types=types, merges=merges, pre=pre,
                     bos_id=ids.get(bos_token) if bos_token else None, eos_id=ids.get(eos_token) if eos_token else None,
                     unk_id=ids.get(model.get("unk_token")) if model.get("unk_token") else None,
                     add_bos=_adds_bos(spec.get("post_processor"), bos_token))


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
    if kinds[-1:] == ["ByteLevel"] and not byte_level.get("add_prefix_space"):
        regex = byte_level.get("use_regex", True)
        if len(parts) == 1 and regex:
            return "gpt-2"
        if len(parts) == 2 and kinds[0] == "Digits" and parts[0].get("individual_digits") and regex:
            return "smollm"
        split = parts[0] if len(parts) == 2 and kinds[0] == "Split" else {}
        if not regex and split.get("behavior") == "Isolated" and not split.get("invert"):
            name = SPLIT_REGEXES.get((split.get("pattern") or {}).get("Regex"))
            if name:
                return name
    raise ExportError(f"{path}: pre-tokenizer {json.dumps(pre_tokenizer)[:200]} has no llama.cpp regex known to match "
                      "it (known: ByteLevel alone -> gpt-2; Digits(individual) then ByteLevel -> smollm; "
                      "Qwen2's and Llama 3's Split regexes -> qwen2, llama-bpe)",
                      "run the bundle with edgesdk, or convert the original model with llama.cpp's convert_hf_to_gguf.py")


def _adds_bos(post_processor, bos_token: str | None) -> bool:
    """Whether encoding a single sequence puts the BOS token in front (a TemplateProcessing rule)."""
    if not post_processor or not bos_token:
        return False
    processors = post_processor.get("processors", [post_processor]) if post_processor.get("type") == "Sequence" \
        else [post_processor]
    for processor in processors:
        if processor.get("type") != "TemplateProcessing":
            continue
        single = processor.get("single") or []
        first = single[0] if single else {}
        return "SpecialToken" in first and first["SpecialToken"].get("id") == bos_token
    return False
