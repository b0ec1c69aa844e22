"""llama.cpp ends generation at the FIM pad, repo and file-separator tokens as well as at the end-of-turn tokens
(src/llama-vocab.cpp: ``special_fim_pad_id``, ``special_fim_rep_id``, ``special_fim_sep_id`` go into
``special_eog_ids``), so a code model's answer stops at ``<|file_sep|>`` instead of writing the next file."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.unit.test_serve_infill40 import QWEN, STARCODER, _chat_tokenizer, qwen_bundle, qwen_runtime  # noqa: E402, F401


def test_the_fim_pad_repo_and_file_separator_tokens_end_generation(tmp_path):
    qwen = _chat_tokenizer(tmp_path / "qwen", QWEN)
    fim = qwen.fim_tokens()
    assert {fim.pad, fim.rep, fim.sep} == {323, 324, 325}
    assert {323, 324, 325} <= qwen.eos_token_ids
    assert not {fim.pre, fim.suf, fim.mid} & qwen.eos_token_ids  # the infill markers are prompt tokens
    starcoder = _chat_tokenizer(tmp_path / "starcoder", STARCODER)  # <repo_name>, <file_sep>: in no list
    # besides its <|endoftext|> and <|im_end|>, which llama.cpp finds by their text (tests/unit/test_eog46.py)
    end_of_text = {starcoder.token_id("<|endoftext|>"), starcoder.token_id("<|im_end|>")}
    assert starcoder.eos_token_ids - end_of_text == {starcoder.fim_tokens().pad}


def test_ollama_lists_insert_for_a_model_that_can_fill_in_the_middle(qwen_runtime, runtime):  # noqa: F811
    """/api/show's capabilities name "insert" where a suffix is answered (Ollama: where the template reads
    .Suffix), after tools, as server/images.go orders them; the tiny bundle without FIM tokens has none."""
    from edgesdk.serve.completion import Completer
    from edgesdk.serve.ollama import capabilities

    assert "insert" in capabilities(Completer(qwen_runtime))
    assert "insert" not in capabilities(Completer(runtime))
