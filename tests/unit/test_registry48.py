"""The per-stage held-out tokens (edgesdk/build/registry.py ``BuildContext.eval_ids``) read their text as plain
text, as ``edgesdk eval`` and llama-perplexity read it: a special token's text written in the held-out file is its
characters, not the control id (which the build's figure then scored where ``edgesdk eval`` scores characters)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


def test_held_out_text_with_a_special_token_s_text_is_read_as_edgesdk_eval_reads_it(tmp_path):
    import tokenizers

    from edgesdk.build.registry import BuildContext
    from edgesdk.compress.data import DataConfig
    from edgesdk.compress.measure import windows_after_bos
    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    text = "the cat sat <|endoftext|> on the mat " * 40
    data = tmp_path / "held.txt"
    data.write_text(text + "training text follows " * 50, encoding="utf-8")
    ctx = BuildContext(profile=None, work_dir=tmp_path, tokenizer=tokenizer,
                       data_config=DataConfig(files=(str(data),), skip_chars=len(text)))
    # edgesdk eval's reading (ChatTokenizer.encode_plain): the tokenizer with encode_special_tokens on
    plain = tokenizers.Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    plain.encode_special_tokens = True
    expected = windows_after_bos(plain.encode(text, add_special_tokens=False).ids, None)
    control = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert control not in expected
    assert ctx.eval_ids().tolist() == expected[:8192]
