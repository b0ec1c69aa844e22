"""llama.cpp ends generation at the FIM pad, repo and file-separator tokens as well as at the end-of-turn tokens
(src/llama-vocab.cpp: ``special_fim_pad_id``, ``special_fim_rep_id``, ``special_fim_sep_id`` go into
``special_eog_ids``), so a code model's answer stops at ``<|file_sep|>`` instead of writing the next file."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.unit.test_serve_infill40 import QWEN, STARCODER, _chat_tokenizer  # noqa: E402


def test_the_fim_pad_repo_and_file_separator_tokens_end_generation(tmp_path):
    qwen = _chat_tokenizer(tmp_path / "qwen", QWEN)
    fim = qwen.fim_tokens()
    assert {fim.pad, fim.rep, fim.sep} == {323, 324, 325}
    assert {323, 324, 325} <= qwen.eos_token_ids
    assert not {fim.pre, fim.suf, fim.mid} & qwen.eos_token_ids  # the infill markers are prompt tokens
    starcoder = _chat_tokenizer(tmp_path / "starcoder", STARCODER)  # <repo_name>, <file_sep>: in no list
    assert starcoder.eos_token_ids == {starcoder.fim_tokens().pad}
