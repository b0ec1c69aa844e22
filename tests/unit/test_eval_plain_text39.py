"""A special token's name written in a scored text is text: perplexity reads it as llama-perplexity's
common_tokenize(ctx, text, true) does (parse_special false), not as the control token."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def test_a_special_tokens_name_in_the_text_is_scored_as_its_characters(runtime):
    from edgesdk.evaluate import PerplexityConfig, _scored_ids, bundle_perplexity

    tokenizer = runtime.tokenizer
    name = tokenizer.eos_token
    special = tokenizer.token_id(name)
    text = f"The quick brown fox {name} jumps over the lazy dog. " * 4
    assert special in tokenizer.encode(text, add_special_tokens=False)  # the tokenizer's own reading
    config = PerplexityConfig(context=32, stride=32, max_chars=None)
    ids = _scored_ids(runtime, text, config)
    assert special not in ids
    assert ids == tokenizer.encode_plain(text)
    assert tokenizer.decode(ids) == text  # every character scored as written
    assert bundle_perplexity(runtime, text, config).tokens_scored == len(ids) - len(range(0, len(ids) - 1, 32))


def test_the_plain_text_tokenizer_is_a_copy(runtime):
    tokenizer = runtime.tokenizer
    name = tokenizer.eos_token
    tokenizer.encode_plain(name)
    assert tokenizer.encode(name, add_special_tokens=False) == [tokenizer.token_id(name)]  # unchanged
    assert tokenizer.plain_text() is tokenizer.plain_text()  # made once
