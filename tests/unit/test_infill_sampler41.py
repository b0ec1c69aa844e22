"""llama.cpp's infill sampler (src/llama-sampler.cpp, ``llama_sampler_infill_apply``) as
edgesdk/runtime/infill_sampler.py ports it, and its place in the sampler chain (edgesdk/runtime/generate.py).

The expected results are worked by hand from llama.cpp's code: the candidates sorted by logit and their softmax, the
EOG-against-text test ``3*p_eog_sum*n > p_txt_sum``, the prefix merging, the 0.2 and ``1/(n_non_eog + 1)`` thresholds,
and the fall back to the EOT token. ``_reference`` is a line-by-line transcription of the C++ function (its nested
loops over ``cur_p``, float32 arithmetic) that the port is checked against on random candidates.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import Sampler, SamplingConfig, sampler_chain
from edgesdk.runtime.infill_sampler import InfillVocabulary, infill_apply

F = np.float32


def _logits(*probs: float) -> list[float]:
    return [math.log(p) for p in probs]


def _apply(ids, probs, texts, eog=(), eot=99):
    kept, logits, p = infill_apply(ids, _logits(*probs), texts, set(eog), eot)
    return kept.tolist(), logits, p


def test_the_eog_tokens_take_over_where_they_are_not_small_against_the_text():
    texts = {1: b"x", 2: b"y", 3: b"z", 9: None}
    table = [texts.get(i) for i in range(10)]
    # 3 * 0.1 * 4 = 1.2 > 0.9: only the EOG token stays, its probability normalised to 1, its logit as it was
    kept, logits, p = _apply([1, 2, 3, 9], [0.5, 0.25, 0.15, 0.1], table, eog={9})
    assert kept == [9]
    assert p.tolist() == [1.0]
    assert logits[0] == F(math.log(0.1))
    # 3 * 0.05 * 4 = 0.6 < 0.95: the text stays (0.5 and 0.3 pass 0.2, 0.15 does not; the EOG token always stays)
    kept, _, p = _apply([1, 2, 3, 9], [0.5, 0.3, 0.15, 0.05], table, eog={9})
    assert kept == [1, 2, 9]
    # the n of the test counts every candidate, also those at -inf: 3 * 0.05 * 7 = 1.05 > 0.95
    ids, logits = [1, 2, 3, 9, 4, 5, 6], [*_logits(0.5, 0.3, 0.15, 0.05), -math.inf, -math.inf, -math.inf]
    kept, _, _ = infill_apply(ids, logits, table, {9}, 99)
    assert kept.tolist() == [9]


def test_a_token_whose_text_begins_another_s_takes_its_probability_or_gives_it_away():
    table = [None] * 20
    table[10], table[11], table[12], table[13], table[14] = b"a", b"ab", b"x", b"ac", b"y"
    # sorted: x .3, ab .25, a .2, ac .15, y .1. "a" begins "ab", which is the more likely: "ab" takes .2 (.45) and "a"
    # leaves; a dropped "a" takes nothing more, so "ac" keeps its .15 and leaves at the 0.2 threshold with "y".
    # x .3 and ab .45 normalised: .4 and .6, both over 1/3. The logits are not merged: "ab" keeps its own.
    kept, logits, p = _apply([10, 11, 12, 13, 14], [0.2, 0.25, 0.3, 0.15, 0.1], table)
    assert kept == [12, 11]
    assert p.tolist() == pytest.approx([0.4, 0.6], abs=1e-6)
    assert logits.tolist() == [F(math.log(0.3)), F(math.log(0.25))]


def test_a_likelier_prefix_gathers_every_token_it_begins_and_the_second_threshold_cuts():
    table = [None] * 20
    table[1], table[2], table[3], table[4] = b"a", b"ab", b"ac", b"z"
    # sorted: a .35, z .25, ab .2, ac .2: "a" takes both (.75); a and z pass 0.2, normalised .75 and .25, and with 2
    # text tokens left the threshold is 1/3: "z" leaves
    kept, _, p = _apply([1, 2, 3, 4], [0.35, 0.2, 0.2, 0.25], table)
    assert kept == [1]
    assert p.tolist() == [1.0]


def test_equal_probabilities_merge_into_the_prefix_and_a_text_is_a_prefix_of_itself():
    table = [None] * 10
    table[3], table[5], table[6], table[7] = b"ab", b"a", b"q", b"q"
    # "ab" (id 3) and "a" (id 5) equally likely: sorted by id, "ab" first; "a" begins "ab", and p[ab] > p[a] is false,
    # so "a" takes it. "q" and "q": the first (id 6) takes the second.
    kept, logits, p = _apply([5, 3, 6, 7], [0.25, 0.25, 0.25, 0.25], table)
    assert kept == [5, 6]
    assert p.tolist() == [0.5, 0.5]


def test_no_text_token_left_falls_back_to_the_eot_token_even_beside_an_eog_token():
    table = [bytes([65 + i]) for i in range(8)]
    # six texts of 1/6 each: none reaches 0.2, no EOG token: the one candidate is EOT (99), at logit 1
    kept, logits, p = _apply(list(range(6)), [1 / 6] * 6, table)
    assert (kept, logits.tolist(), p.tolist()) == ([99], [1.0], [1.0])
    # five texts of .19 and an EOG token of .05: 3 * .05 * 6 = .9 < .95, no take-over; the texts leave at 0.2, the EOG
    # token stays, but no text token does: EOT all the same, not the EOG token there
    kept, _, _ = _apply([0, 1, 2, 3, 4, 7], [0.19] * 5 + [0.05], table, eog={7}, eot=99)
    assert kept == [99]


def test_empty_texts_never_merge():
    table = [b"", b"", b"a", None]
    # control tokens render as nothing (len0 > 0 fails): they neither take nor give
    kept, _, _ = _apply([0, 1, 2, 3], [0.3, 0.3, 0.3, 0.1], table)
    assert kept == [0, 1, 2]


def _reference(ids, logits, texts, eog, eot):
    """llama_sampler_infill_apply, transcribed statement by statement (cur_p as lists, float32 arithmetic)."""
    order = sorted(range(len(ids)), key=lambda i: (-logits[i], ids[i]))
    cur = [[int(ids[i]), F(logits[i]), F(0)] for i in order]
    max_l = cur[0][1]
    cum_sum = F(0)
    for item in cur:
        item[2] = F(np.exp(F(item[1] - max_l)))
        cum_sum = F(cum_sum + item[2])
    for item in cur:
        item[2] = F(item[2] / cum_sum)
    text = lambda token: (texts[token] or b"") if token < len(texts) else b""  # noqa: E731
    p_txt_sum, p_eog_sum = F(0), F(0)
    for item in cur:
        if item[0] in eog:
            p_eog_sum = F(p_eog_sum + item[2])
        else:
            p_txt_sum = F(p_txt_sum + item[2])
    if F(F(F(3) * p_eog_sum) * F(len(cur))) > p_txt_sum:
        cur = [item for item in cur if item[0] in eog]
        p_sum = F(0)
        for item in cur:
            p_sum = F(p_sum + item[2])
        return [(item[0], item[1], F(item[2] / p_sum)) for item in cur]
    for i0 in range(len(cur)):
        for i1 in range(len(cur)):
            if cur[i0][1] == -np.inf:
                break
            if i0 == i1 or cur[i1][1] == -np.inf:
                continue
            t0, t1 = text(cur[i0][0]), text(cur[i1][0])
            if len(t0) > 0 and len(t0) <= len(t1) and t1[:len(t0)] == t0:
                dst, src = (i1, i0) if cur[i1][2] > cur[i0][2] else (i0, i1)
                cur[dst][2] = F(cur[dst][2] + cur[src][2])
                cur[src][1], cur[src][2] = F(-np.inf), F(0)
    kept, n_non_eog, p_sum = [], 0, F(0)
    for item in cur:
        is_eog = item[0] in eog
        if item[2] < F(0.2) and not is_eog:
            continue
        n_non_eog += 0 if is_eog else 1
        p_sum = F(p_sum + item[2])
        kept.append(item)
    if n_non_eog == 0:
        return [(eot, F(1), F(1))]
    for item in kept:
        item[2] = F(item[2] / p_sum)
    thold = F(1.0 / (n_non_eog + 1))
    cur, kept, p_sum = kept, [], F(0)
    for item in cur:
        if item[2] < thold and item[0] not in eog:
            continue
        p_sum = F(p_sum + item[2])
        kept.append(item)
    return [(item[0], item[1], F(item[2] / p_sum)) for item in kept]


def test_the_port_gives_the_transcribed_loops_result_on_random_candidates():
    rng = np.random.default_rng(41)
    alphabet = [b"a", b"b", b"ab", b"c", b"d", b"e"]
    for _ in range(400):
        vocab = int(rng.integers(4, 40))
        texts = [None if rng.random() < 0.1 else b"".join(rng.choice(alphabet, int(rng.integers(1, 4))))
                 for _ in range(vocab)]
        eog = {int(token) for token in rng.choice(vocab, int(rng.integers(0, 3)), replace=False)}
        ids = rng.choice(vocab, int(rng.integers(1, vocab + 1)), replace=False)
        # coarse logits, so that ties happen, flat ones (no text token reaches 0.2) and steep ones; a few at -inf
        logits = np.round(rng.normal(0, rng.choice([0.2, 1.5]), ids.size), 1).astype(np.float32)
        logits[rng.random(ids.size) < 0.1] = -np.inf
        if not np.isfinite(logits).any():
            logits[0] = 0.0
        got_ids, got_logits, got_p = infill_apply(ids, logits, texts, eog, vocab)
        expected = _reference(ids.tolist(), logits.tolist(), texts, eog, vocab)
        assert got_ids.tolist() == [item[0] for item in expected]
        assert got_logits.tolist() == [float(item[1]) for item in expected]
        assert got_p.tolist() == pytest.approx([float(item[2]) for item in expected], rel=1e-6, abs=1e-7)


# The sampler chain


def test_infill_is_a_sampler_name_and_letter():
    assert sampler_chain(["top_k", "top_p", "infill"]) == ("top_k", "top_p", "infill")
    assert sampler_chain(["INFILL"]) == ("infill",)
    assert sampler_chain("kpi") == ("top_k", "top_p", "infill")  # common_sampler_type_to_chr: 'i'
    assert SamplingConfig(samplers="kpi").samplers == ("top_k", "top_p", "infill")


def test_the_refusals_no_longer_name_infill():
    with pytest.raises(ValueError, match="samplers") as caught:
        sampler_chain("ka")
    assert "'a', which is llama.cpp's adaptive_p, not carried by edgesdk" in str(caught.value)
    assert "infill or" not in str(caught.value)
    with pytest.raises(ValueError, match="samplers") as caught:
        sampler_chain(["adaptive_p"])
    assert "'adaptive_p', which is llama.cpp's but not carried" in str(caught.value)
    assert "infill" in str(caught.value).split("the names are ")[1]  # a name listed as taken


def test_a_chain_with_infill_needs_a_vocabulary():
    with pytest.raises(EdgeSDKError) as caught:
        Sampler(SamplingConfig(samplers="ki"))
    assert "infill" in caught.value.problem
    assert "vocabulary=" in caught.value.fix


# A vocabulary of 8 tokens: 0 "c", 1 "a", 2 "ab", 3 "ac", 4 "ad", 5 "zz", 6 the EOG token, 7 nothing
VOCAB = InfillVocabulary([b"c", b"a", b"ab", b"ac", b"ad", b"zz", None, None], frozenset({6}), 6)


def _shaped(**logit_of) -> np.ndarray:
    logits = np.full(8, -30.0, np.float32)
    for token, value in logit_of.items():
        logits[int(token[1:])] = value
    return logits


def test_greedy_decoding_takes_the_most_likely_token_the_infill_sampler_keeps():
    # "c" the most likely (logit 0); "a" and the three it begins at -0.5 each: "a" gathers .71, "c" .29 leaves at
    # 1/3. Greedy decoding without infill takes "c", with infill "a".
    logits = _shaped(t0=0.0, t1=-0.5, t2=-0.5, t3=-0.5, t4=-0.5)
    assert Sampler(SamplingConfig(samplers="k", top_k=6))(logits) == 0
    assert Sampler(SamplingConfig(samplers="ki", top_k=6), VOCAB)(logits) == 1
    # the temperature sampler at 0 after infill: greedy over what infill kept, as llama.cpp's is
    assert Sampler(SamplingConfig(samplers="kit", top_k=6), VOCAB)(logits) == 1
    # before infill, it keeps the top token alone: infill then keeps it
    assert Sampler(SamplingConfig(samplers="kti", top_k=6), VOCAB)(logits) == 0


def test_the_candidates_are_those_no_sampler_before_infill_cut():
    # text .5, .3, .15 and the EOG token .05; the other four tokens at -inf (a logit bias of -inf leaves them in
    # llama.cpp's cur_p). infill alone: n = 8, 3 * .05 * 8 = 1.2 > .95, the EOG token; after top-k 4: n = 4, the text
    logits = np.full(8, -np.inf, np.float32)
    logits[[0, 5, 2, 6]] = _logits(0.5, 0.3, 0.15, 0.05)
    assert Sampler(SamplingConfig(samplers="i"), VOCAB)(logits) == 6
    assert Sampler(SamplingConfig(samplers="ki", top_k=4), VOCAB)(logits) == 0


def test_sampling_draws_only_what_infill_kept():
    logits = _shaped(t0=0.0, t1=-0.5, t2=-0.5, t3=-0.5, t4=-0.5)
    without = {Sampler(SamplingConfig(samplers="kt", top_k=6, temperature=1.0, seed=seed))(logits)
               for seed in range(40)}
    assert without >= {0, 1, 2}
    drawn = {Sampler(SamplingConfig(samplers="kit", top_k=6, temperature=1.0, seed=seed), VOCAB)(logits)
             for seed in range(40)}
    assert drawn == {1}
    # no text token reaches 0.2 (six of 1/6; "a", far below, gives its share to "ab"): the EOT fallback
    flat = _shaped(t0=0.0, t2=0.0, t3=0.0, t4=0.0, t5=0.0, t7=0.0)
    assert Sampler(SamplingConfig(samplers="i", temperature=0.8, seed=1), VOCAB)(flat) == 6


def test_a_constraint_refusing_what_infill_kept_runs_the_chain_over_the_accepted_tokens():
    logits = _shaped(t0=0.0, t1=-0.5, t2=-0.5, t3=-0.5, t4=-0.5)
    # "a" refused: the chain over the others ("c", "ab", "ac", "ad" and two far below): nothing merges, "c" .35 and
    # each of the three .215 pass 0.2 and 1/(4+1); the greedy pick is "c"
    sampler = Sampler(SamplingConfig(samplers="ki", top_k=6), VOCAB)
    assert sampler(logits, allowed=lambda token: token != 1) == 0
