"""Fill in the middle (edgesdk/runtime/fim.py, edgesdk/runtime/infill_sampler.py, edgesdk/serve/infill.py) where
it meets CodeLlama's vocabulary and the edges of llama-server's ``/infill``.

CodeLlama's SentencePiece vocabulary holds ``▁<PRE>`` 32007, ``▁<SUF>`` 32008, ``▁<MID>`` 32009 and ``▁<EOT>`` 32010;
llama.cpp's convert_hf_to_gguf.py writes the four into the GGUF as its prefix, suffix, middle and EOT tokens
(``LlamaModel.set_vocab``, for the 32016-token vocabulary), and llama.cpp's vocab loader adds the EOT to the tokens
that end generation, so a CodeLlama infill stops at ``▁<EOT>``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CODELLAMA_FIM = ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]


def _codellama_like(folder: Path):
    """A byte-level tokenizer holding CodeLlama's four FIM pieces (ids 2-5) after <unk> and </s> (the EOS, id 1)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from edgesdk.runtime.text import ChatTokenizer
    from tests._utils.tiny import CORPUS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "</s>", *CODELLAMA_FIM],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer.save(str(folder / "tokenizer.json"))
    return ChatTokenizer(folder / "tokenizer.json", {"eos_token_ids": [1], "eos_token": "</s>"}, None)


def test_codellama_s_eot_ends_generation_as_its_gguf_s_eot_does():
    from edgesdk.runtime.fim import find_fim_tokens

    codellama = {"▁<PRE>": 32007, "▁<SUF>": 32008, "▁<MID>": 32009, "▁<EOT>": 32010}
    fim = find_fim_tokens(codellama.get)
    assert (fim.pre, fim.suf, fim.mid, fim.eot) == (32007, 32008, 32009, 32010)
    assert fim.end_of_generation == {32010}


def test_a_codellama_bundle_stops_at_eot_and_the_infill_sampler_falls_back_to_it(tmp_path):
    from edgesdk.runtime.infill_sampler import infill_apply, vocabulary_of

    tokenizer = _codellama_like(tmp_path)
    eot = tokenizer.token_id("▁<EOT>")
    assert eot == 5
    assert eot in tokenizer.eos_token_ids  # the ids an answer stops at
    vocabulary = vocabulary_of(tokenizer)
    assert vocabulary.eot == eot
    assert eot in vocabulary.eog
    # six one-letter tokens (none a prefix of another) at p 1/6 each: none reaches the 0.2 threshold, and the one
    # candidate left is the EOT
    text_tokens = [tokenizer.token_id(letter) for letter in "abcdef"]
    ids, logits, _ = infill_apply(text_tokens, [0.0] * 6, vocabulary.texts, vocabulary.eog, vocabulary.eot)
    assert ids.tolist() == [eot]
    assert logits.tolist() == [np.float32(1.0)]
