"""The BOS a tokenizer puts in front of every text is found also where it puts EOS after the text (Llama's
``add_eos_token``): llama.cpp reads ``add_bos`` and ``add_eos`` apart, so such a model's evaluation windows, its
training and calibration blocks and its infill prompts still start with BOS."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.fim import leading_bos
from tests._utils.tiny import CORPUS, tiny_llama2_tokenizer, tiny_tokenizer

torch = pytest.importorskip("torch")


def _llama2_tokenizer(add_eos: bool):
    from transformers.models.llama.tokenization_llama import LlamaTokenizer

    spec = json.loads(tiny_llama2_tokenizer().backend_tokenizer.to_str())["model"]
    merges = [tuple(pair) if isinstance(pair, list) else tuple(pair.split(" ")) for pair in spec["merges"]]
    return LlamaTokenizer(vocab=spec["vocab"], merges=merges, add_bos_token=True, add_eos_token=add_eos)


@pytest.mark.parametrize("add_eos", [False, True], ids=["bos", "bos-and-eos"])
def test_the_leading_bos_is_found_with_or_without_a_trailing_eos(add_eos):
    tokenizer = _llama2_tokenizer(add_eos)
    assert tokenizer.encode("a")[-1] == (tokenizer.eos_token_id if add_eos else 268)
    assert leading_bos(tokenizer) == tokenizer.bos_token_id == 1


def test_a_tokenizer_that_adds_no_bos_has_none():
    assert leading_bos(tiny_tokenizer()) is None  # SmolLM2-style byte-level BPE


def test_training_blocks_of_a_bos_and_eos_tokenizer_start_with_bos(tmp_path):
    from edgesdk.compress.data import DataConfig, TokenData

    path = tmp_path / "text.txt"
    path.write_text(" ".join(CORPUS * 2), encoding="utf-8")
    data = TokenData.load(DataConfig(files=(str(path),), generated_sequences=0), _llama2_tokenizer(True))
    for block in data.batches(4, 4, 16, seed=3):
        assert (block[:, 0] == 1).all()
