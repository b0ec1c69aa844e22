"""A context shift keeps the BOS on top of ``--keep`` / ``n_keep`` only where the tokenizer adds one
(llama.cpp: ``n_keep += add_bos``). SmolLM2's tokenizer names ``<|im_start|>`` its ``bos_token`` and adds none, and
every chat prompt begins with that token: taken for a BOS, a shift kept one token more than asked, on ``run`` and on
the server."""

from __future__ import annotations

import pytest

from edgesdk.runtime.generate import starts_with_added_bos
from tests.unit.test_chat_bos45 import KINDS, _chat_tokenizer

pytest.importorskip("transformers")


@pytest.mark.parametrize("kind", list(KINDS))
def test_only_a_bos_the_tokenizer_adds_is_kept_on_top(kind, tmp_path):
    tokenizer = _chat_tokenizer(tmp_path, kind)
    ids = tokenizer.prompt_ids("Hello there", raw=False, system="Be brief.")
    bos_token_id = tokenizer.tokenizer.token_to_id(KINDS[kind][1]["bos_token"])
    assert starts_with_added_bos(tokenizer, ids) == (KINDS[kind][2] is not None)
    if kind == "byte-level":  # the prompt begins with the tokenizer's bos_token, which it does not add
        assert ids[0] == bos_token_id
    assert not starts_with_added_bos(tokenizer, [])


def test_the_server_keeps_n_keep_tokens_of_a_smollm2_style_prompt(runtime):
    from edgesdk.serve.api import parse_text_request
    from edgesdk.serve.completion import Completer, ServeDefaults

    completer = Completer(runtime, ServeDefaults(max_tokens=16, context_shift=True))
    tokenizer = runtime.tokenizer
    prompt = tokenizer.bos_token + "user\nhello"
    request = parse_text_request({"prompt": prompt, "max_tokens": 300})
    ids = completer.prompt_ids(request)
    assert ids[0] == tokenizer.tokenizer.token_to_id(tokenizer.bos_token)
    shift = completer.context_shift(request, ids, completer.sampling(request))
    assert shift is not None
    assert shift.bos is False
