"""Fill-in-the-middle (code infill): the model's FIM tokens and the infill prompt, as llama.cpp builds them.

The tokens are found by their text in the bundle's tokenizer, as llama.cpp's vocab loader finds them when the
GGUF file names none (src/llama-vocab.cpp, ``llama_vocab::impl::load``, "auto-detect special tokens by text"): the
texts below, per kind. llama.cpp walks its text-to-id map (an unordered map) and keeps the first match; a
vocabulary holds at most one of each family in practice, and here the first text in llama.cpp's list that the
vocabulary has is taken. StarCoder's and SmolLM2's ``<repo_name>`` and ``<file_sep>`` are in no list, so llama.cpp
takes neither as FIM_REP / FIM_SEP, and neither does this; SmolLM2's ``<reponame>`` (id 4) is in the FIM_REP list
(Granite's), so it is SmolLM2's FIM_REP and ends generation, in llama.cpp and here. SmolLM2 has no FIM prefix, suffix
or middle token: it cannot infill. CodeLlama's ``▁<EOT>``, which llama.cpp's converter writes into its GGUF as the EOT
token, is found by its text too, and ends generation as that EOT does.

The prompt is llama-server's ``format_prompt_infill`` (tools/server/server-common.cpp): the repo-level pattern
(arXiv:2409.12186) where the vocabulary has FIM_REP and FIM_SEP, the 3:1 token budget of prefix and suffix within a
batch, the extra context filling what the context has left, and the BOS rule. OpenAI's ``suffix`` on
``/v1/completions`` takes the same prompt without the extra context and the budget (:func:`fim_ids`), as
llama-cpp-python builds it. Python 3.10, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# llama-vocab.cpp's texts per FIM token kind, in its order
FIM_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
            "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
            "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
            "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
    # CodeLlama's infill end token: convert_hf_to_gguf.py writes it as the GGUF's EOT token beside its prefix, suffix and
    # middle (LlamaModel.set_vocab, for CodeLlama's 32016-token vocabulary), and the vocab loader makes the EOT end
    # generation; no text list of llama.cpp's holds "▁<EOT>" (its "_<EOT>" is an ASCII underscore)
    "eot": ("▁<EOT>",),
}
# llama-server's defaults (common/common.h, common_params): --batch-size 2048, --n-predict -1
DEFAULT_BATCH = 2048
# format_prompt_infill's fixed texts: the project name after FIM_REP, the current file's name after the last FIM_SEP,
# and the separator before each extra chunk where the vocabulary has no FIM_SEP
REPO_NAME = "myproject\n"
CURRENT_FILE = "filename\n"
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
DEFAULT_CHUNK_FILE = "tmp"


@dataclass(frozen=True)
class FimTokens:
    """The model's FIM token ids (None where its vocabulary has none of that kind)."""

    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None
    eot: int | None = None  # CodeLlama's ▁<EOT>, which ends its infill

    def missing(self) -> list[str]:
        """The kinds an infill needs that the vocabulary lacks (prefix, suffix, middle), in llama-server's words."""
        return [name for name, token in (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid))
                if token is None]

    def lacking(self) -> str:
        """What a refusal says of a vocabulary without all three (:meth:`missing` not empty): the FIM tokens it lacks
        and how they are found."""
        missing = self.missing()
        return (f"its vocabulary has no FIM {', '.join(missing)} token{'s' if len(missing) > 1 else ''} (a "
                "fill-in-the-middle model's <|fim_prefix|>, <fim_prefix>, <PRE> ..., found by their text as llama.cpp "
                "finds them)")

    @property
    def can_infill(self) -> bool:
        return not self.missing()

    @property
    def end_of_generation(self) -> set[int]:
        """FIM_PAD, FIM_REP and FIM_SEP, which llama.cpp's vocab loader adds to the tokens that end generation
        (``special_eog_ids``), and CodeLlama's ``▁<EOT>``, its GGUF's EOT token, which the loader adds too, so an
        answer, infill or not, stops at them."""
        return {token for token in (self.pad, self.rep, self.sep, self.eot) if token is not None}


def find_fim_tokens(token_id) -> FimTokens:
    """The FIM tokens of a vocabulary, ``token_id(text)`` giving the id of the token whose text is ``text`` (None
    where none is): for each kind, the first of llama.cpp's texts the vocabulary has."""
    found = {}
    for kind, texts in FIM_TEXTS.items():
        found[kind] = next((token for token in map(token_id, texts) if token is not None), None)
    return FimTokens(**found)


def leading_bos(tokenizer) -> int | None:
    """The token the tokenizer puts in front of a text it encodes with its special tokens (llama.cpp's
    ``llama_vocab_get_add_bos`` with ``llama_vocab_bos``), None where it puts none. A tokenizer that also puts
    EOS after the text (Llama's ``add_eos_token``) still puts BOS first: llama.cpp reads the two apart."""
    plain, special = tokenizer.encode("a", add_special_tokens=False), tokenizer.encode("a", add_special_tokens=True)
    after = special[len(plain) + 1:]  # EOS, where the tokenizer adds one after the text
    return special[0] if len(special) > len(plain) and special[1:len(plain) + 1] == plain and len(after) <= 1 else None


def framing_count(tokenizer) -> int:
    """How many special tokens a fill-in-the-middle prompt puts around its texts, ``[BOS] FIM_PRE ... FIM_SUF ...
    FIM_MID`` (the BOS where the tokenizer puts one: :func:`leading_bos`), for a refusal to count each text's own."""
    return 3 + (leading_bos(tokenizer) is not None)


def _require_infill(fim: FimTokens) -> None:
    """Refuse a fill-in-the-middle prompt for a vocabulary without the FIM prefix, suffix and middle tokens, naming
    the ones it lacks and the fix."""
    if not fim.can_infill:
        raise ValueError(f"cannot build a fill-in-the-middle prompt: {fim.lacking()}; use a code model built with "
                         "them (Qwen2.5-Coder, StarCoder2, CodeLlama, DeepSeek-Coder, Granite Code)")


def infill_ids(fim: FimTokens, prefix: list[int], suffix: list[int], prompt: list[int],
               extra: list[tuple[str, str]], encode_plain, bos: int | None, n_ctx: int,
               n_predict: int = -1, n_batch: int = DEFAULT_BATCH, spm_infill: bool = False) -> list[int]:
    """The infill prompt's token ids, as llama-server's ``format_prompt_infill`` assembles them.

    ``prefix`` and ``suffix``: the code before and after the cursor, ``prompt``: the text the model goes on from
    (placed after the prefix, before FIM_SUF, where format_prompt_infill puts ``tokens_prompt``), ``extra``: per
    chunk of other files its (file name, text), ``encode_plain(text)``: a text's ids, no special tokens added or
    parsed (``common_tokenize(vocab, text, false, false)``, as the chunks are tokenized), ``bos``: the BOS the vocabulary adds
    (None: none). ``n_predict`` -1 is llama-server's default (no limit). The layout::

        [extra context] [BOS] FIM_PRE prefix prompt FIM_SUF suffix FIM_MID

    (``spm_infill``: FIM_SUF suffix before FIM_PRE prefix prompt). The extra context is FIM_REP "myproject\\n"
    where the vocabulary has FIM_REP, then per chunk FIM_SEP and its file name with a newline (without FIM_SEP the
    "--- snippet ---" separator) and its text, then FIM_SEP "filename\\n" where it has FIM_SEP; only its last
    ``max(0, n_ctx - n_batch - 2 * n_predict)`` tokens are kept. Of the prefix its last ``3 * (n_batch // 4)``
    tokens are kept, of the suffix its first ``max(0, n_batch // 4 - (2 + len(prompt)))``."""
    _require_infill(fim)
    extra_tokens: list[int] = []
    if fim.rep is not None:
        extra_tokens += [fim.rep, *encode_plain(REPO_NAME)]
    for filename, text in extra:
        if fim.sep is not None:
            extra_tokens += [fim.sep, *encode_plain(filename + "\n")]
        else:
            extra_tokens += encode_plain(CHUNK_SEPARATOR)
        extra_tokens += encode_plain(text)
    if fim.sep is not None:
        extra_tokens += [fim.sep, *encode_plain(CURRENT_FILE)]

    quarter = n_batch // 4
    n_prefix_take = min(len(prefix), 3 * quarter)
    n_suffix_take = min(len(suffix), max(0, quarter - (2 + len(prompt))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))

    kept_extra = extra_tokens[len(extra_tokens) - n_extra_take:]
    return kept_extra + fim_ids(fim, [*prefix[len(prefix) - n_prefix_take:], *prompt], suffix[:n_suffix_take], bos,
                                spm_infill)


def fim_ids(fim: FimTokens, prefix: list[int], suffix: list[int], bos: int | None,
            spm_infill: bool = False) -> list[int]:
    """The fill-in-the-middle prompt of ``prefix`` and ``suffix`` as they are, ``[BOS] FIM_PRE prefix FIM_SUF suffix
    FIM_MID`` (``spm_infill``: ``[BOS] FIM_SUF suffix FIM_PRE prefix FIM_MID``): the part of llama-server's
    ``format_prompt_infill`` after the extra context, and the prompt llama-cpp-python's ``Llama._create_completion``
    builds for a ``suffix`` (its ``bos_tokens``, then prefix, suffix and middle tokens, suffix first with
    ``spm_infill``)."""
    _require_infill(fim)
    head, tail = [fim.pre, *prefix], [fim.suf, *suffix]
    first, end = (tail, head) if spm_infill else (head, tail)
    return ([bos] if bos is not None else []) + first + end + [fim.mid]
