"""The chat's typed input (edgesdk/cli_interactive.py) and the tokenizer (edgesdk/runtime/text.py), review 58."""

from __future__ import annotations

from tests.unit.test_text57 import _tokenizer


def test_in_suffix_reads_a_control_token_the_model_marks_not_special_as_the_token(tmp_path):
    """--in-suffix '<|end|>' for Phi-3: llama-completion tokenizes the suffix with parse_special, which reads the
    control token <|end|> (a control token in llama.cpp whatever tokenizer.json says) as the token; the typed line
    holding the same text stays plain text."""
    from edgesdk.cli_interactive import TypedPrompt, typed_prompt_ids

    tokenizer = _tokenizer(tmp_path, ["<|end|>"])
    end = tokenizer.token_id("<|end|>")
    ids = typed_prompt_ids(tokenizer, TypedPrompt("<|end|>", (), "say <|end|>", "<|end|>\n"))
    assert ids.count(end) == 2
    assert ids[0] == end
    assert ids[-2:] == [end, *tokenizer.encode_plain("\n")]
    assert tokenizer.decode(ids[1:-2]) == "say <|end|>"
