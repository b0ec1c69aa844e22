"""llama.cpp's ``infill`` sampler (src/llama-sampler.cpp, ``llama_sampler_infill_apply``), which llama.vscode and
llama.vim put in the sampler chain of every ``/infill`` request (``"samplers": ["top_k", "top_p", "infill"]``).

It works on the candidates the samplers before it left, and reads the tokens' texts and which tokens end
generation:

1. the candidates' probabilities, softmax of their logits, largest first;
2. where the end-of-generation (EOG) tokens' probability is not small against the text's
   (``3 * p_eog_sum * n > p_txt_sum``, ``n`` the number of candidates) only the EOG tokens are kept;
3. otherwise a token whose text is a prefix of another candidate's adds that one's probability to its own, or to
   the other's where the other is the more likely, and the one that gave its probability away is dropped;
4. text tokens under 0.2 are dropped (EOG tokens are kept); where no text token is left, the one candidate is the
   EOT token (else EOS), with logit 1;
5. the probabilities are normalised, and text tokens under ``1 / (text tokens left + 1)`` dropped.

The sampler after it (llama.cpp's ``dist``, the draw here) takes the softmax of the logits left, so what
this sampler passes on is which candidates stay, and their logits.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.text import end_of_generation_ids

# The texts llama.cpp's vocab loader takes for the EOT token where the model's metadata names none (src/llama-vocab.cpp,
# "find EOT token"), in its order.
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
             "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
FIRST_THRESHOLD = np.float32(0.2)  # llama_sampler_infill_apply's first ``thold``


@dataclass(frozen=True)
class InfillVocabulary:
    """What the infill sampler reads of a vocabulary: ``texts[id]``, each token's bytes as llama.cpp's
    ``token_to_piece(id, special=false)`` gives them (None or b"" for a token that renders as nothing: control and
    unknown tokens), ``eog``, the ids that end generation (``llama_vocab_is_eog``), and ``eot``, the token it falls
    back to (``llama_vocab_eot``, else ``llama_vocab_eos``)."""

    texts: Sequence[bytes | None]
    eog: Collection[int]
    eot: int


_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its InfillVocabulary


def vocabulary_of(tokenizer) -> InfillVocabulary:
    """The infill sampler's view of a :class:`~edgesdk.runtime.text.ChatTokenizer`, built on first use and kept
    with it: the token bytes table (``ChatTokenizer.token_bytes``: special tokens and the ids that end generation
    render as nothing, as control tokens do with ``special`` false), the ids that end generation
    (``eos_token_ids``, with the FIM pad, repo and file-separator tokens llama.cpp adds, and the EOT token, which
    llama.cpp's vocab loader adds where they lack it) and the EOT token: CodeLlama's ``▁<EOT>``, which its GGUF names
    as the EOT, else the first of llama.cpp's EOT texts the vocabulary holds, else the EOS token.

    The FIM tokens (prefix, suffix, middle, pad, repo, file separator) and the EOT token render as nothing too,
    also where the tokenizer does not mark them special (Qwen2.5-Coder's ``<|fim_prefix|>`` ... are added tokens with
    ``special`` false): llama.cpp's vocab loader makes each token it finds by those texts a control token ("control-
    looking token ... its type will be overridden", src/llama-vocab.cpp), which ``token_to_piece(id, special=false)``
    renders as nothing, so the infill sampler never merges ``<`` with ``<|fim_middle|>`` as a common prefix."""
    if isinstance(tokenizer, InfillVocabulary):
        return tokenizer
    found = _VOCABULARIES.get(tokenizer)
    if found is not None:
        return found
    try:
        texts = tokenizer.token_bytes()
    except EdgeSDKError as exc:
        raise EdgeSDKError(f"the infill sampler cannot read this bundle's token texts ({exc.problem})",
                           "leave 'infill' out of the samplers for this bundle") from exc
    fim = tokenizer.fim_tokens()
    # CodeLlama's GGUF names its EOT (▁<EOT>: edgesdk/runtime/fim.py), which llama.cpp takes before any found by text
    eot = fim.eot if fim.eot is not None else next(
        (token for token in map(tokenizer.token_id, EOT_TEXTS) if token is not None), None)
    if eot is None and tokenizer.eos_token:
        eot = tokenizer.token_id(tokenizer.eos_token)
    if eot is None and tokenizer.eos_token_ids:
        eot = min(tokenizer.eos_token_ids)
    if eot is None:
        raise EdgeSDKError("the infill sampler needs an end-of-text token to fall back to, and this bundle's "
                           f"vocabulary has none (no EOS token, none of {', '.join(EOT_TEXTS)})",
                           "leave 'infill' out of the samplers for this bundle")
    # llama.cpp's vocab loader puts the EOT token among the ids that end generation where they lack it ("special_eot_id
    # is not in special_eog_ids - the tokenizer config may be incorrect"): DeepSeek-Coder-Instruct's EOS is <|EOT|>,
    # its <｜end▁of▁sentence｜> the EOT found by text, both EOG to llama_vocab_is_eog
    # and then takes out, as for the ids it stops at, <|end|> where gpt-oss's <|return|> and <|call|> end the answer
    ends = end_of_generation_ids(tokenizer.token_id, {*tokenizer.eos_token_ids, eot})
    control = {token for token in (fim.pre, fim.suf, fim.mid, fim.pad, fim.rep, fim.sep, eot, *ends)
               if token is not None and 0 <= token < len(texts) and texts[token]}
    if control:  # a copy: JSON mode and grammars read the tokenizer's table, where these keep their text
        texts = list(texts)
        for token in control:
            texts[token] = None
    found = InfillVocabulary(texts, frozenset(ends), eot)
    _VOCABULARIES[tokenizer] = found
    return found


def infill_apply(ids, logits, texts: Sequence[bytes | None], eog: Collection[int],
                 eot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's ``llama_sampler_infill_apply`` on the candidates ``ids`` with their ``logits``: the candidates
    it leaves, in its order, with their logits and probabilities (float32, as llama.cpp computes them).

    ``texts[id]``: a token's bytes (``token_to_piece`` without special rendering; None, b"" or an id past the table:
    none), ``eog``: the ids ``llama_vocab_is_eog`` holds true, ``eot``: the token a step without a text token left
    falls back to. The steps, their constants and their order are llama.cpp's:

    - ``llama_sampler_softmax_impl(cur_p, true)``: the candidates sorted by logit, largest first (ties: the lower id
      first; ``std::partial_sort`` leaves their order unspecified), ``p = expf(logit - max) / sum``, the sum taken
      in order in float32;
    - ``p_eog_sum`` and ``p_txt_sum`` summed in order; where ``3*p_eog_sum*n > p_txt_sum`` (float32, ``n`` the
      number of candidates, -inf ones included) only the EOG tokens stay, their probabilities normalised;
    - for each candidate ``i0`` in order, each ``i1`` in order (``i0`` and ``i1`` neither of them at -inf, ``i0``'s
      text not empty) whose text begins with ``i0``'s: the probability goes to ``i1`` where ``p[i1] > p[i0]``, else
      to ``i0``, and the other is set to logit -inf, probability 0; an ``i0`` so dropped takes no further one;
    - text tokens with ``p < 0.2f`` leave, EOG tokens stay; where no text token is left the one candidate is
      ``eot`` with logit 1 (its probability, which llama.cpp leaves as it was and its draw sets to 1, is 1 here);
    - the probabilities normalised, then text tokens with ``p < 1.0/(n_non_eog + 1)`` (as a float) leave, and the
      probabilities are normalised again.
    """
    ids = np.asarray(ids, np.int64).reshape(-1)
    logits = np.asarray(logits, np.float32).reshape(-1)
    if ids.shape != logits.shape or ids.size == 0:
        raise ValueError(f"the infill sampler needs one logit per candidate and at least one candidate, got "
                         f"{ids.size} ids and {logits.size} logits")
    order = np.lexsort((ids, -logits))  # by logit, largest first; ties: the lower id first
    ids, logits = ids[order], logits[order].copy()
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(logits - logits[0])
    p /= _sum(p)
    is_eog = np.fromiter((int(token) in eog for token in ids), bool, ids.size)

    p_txt_sum, p_eog_sum = _sum(p[~is_eog]), _sum(p[is_eog])
    if np.float32(3) * p_eog_sum * np.float32(ids.size) > p_txt_sum:  # the EOG tokens take over
        p, ids, logits = p[is_eog], ids[is_eog], logits[is_eog]
        return ids, logits, p / _sum(p)

    _combine_prefixes(ids, logits, p, texts)

    keep = ~((p < FIRST_THRESHOLD) & ~is_eog)
    n_non_eog = int(np.count_nonzero(keep & ~is_eog))
    if n_non_eog == 0:
        return np.array([eot], np.int64), np.array([1.0], np.float32), np.array([1.0], np.float32)
    ids, logits, p, is_eog = ids[keep], logits[keep], p[keep], is_eog[keep]
    p = p / _sum(p)

    threshold = np.float32(1.0 / (n_non_eog + 1))
    keep = ~((p < threshold) & ~is_eog)
    ids, logits, p = ids[keep], logits[keep], p[keep]
    return ids, logits, p / _sum(p)


def _combine_prefixes(ids: np.ndarray, logits: np.ndarray, p: np.ndarray, texts: Sequence[bytes | None]) -> None:
    """llama_sampler_infill_apply's "combine tokens with common prefix" loop, in place. Its inner loop over every
    ``i1`` changes something only at an ``i1`` whose text begins with ``i0``'s, so those alone are visited (found in
    the texts sorted, where they follow one another), in the loop's order; the result is the loop's."""
    count = ids.size
    pieces = [_text(texts, int(token)) for token in ids]
    by_text = sorted(range(count), key=pieces.__getitem__)
    sorted_pieces = [pieces[index] for index in by_text]
    for i0 in range(count):
        head = pieces[i0]
        if logits[i0] == -np.inf or not head:  # len0 > 0
            continue
        at, longer = bisect_left(sorted_pieces, head), []
        while at < count and sorted_pieces[at].startswith(head):
            longer.append(by_text[at])
            at += 1
        for i1 in sorted(longer):
            if i1 == i0 or logits[i1] == -np.inf:
                continue
            dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)  # into the more likely one
            p[dst] += p[src]
            logits[src], p[src] = -np.inf, 0.0
            if logits[i0] == -np.inf:
                break


def _text(texts: Sequence[bytes | None], token: int) -> bytes:
    return (texts[token] or b"") if 0 <= token < len(texts) else b""


def _sum(values: np.ndarray) -> np.float32:
    """The float32 sum of ``values`` taken in order, as llama.cpp's loops add them (0 for none)."""
    return np.cumsum(values, dtype=np.float32)[-1] if values.size else np.float32(0.0)
