"""Review 48 of generation (edgesdk/runtime/generate.py, grammar.py, gbnf.py) against llama.cpp's samplers and
grammar sampler (src/llama-sampling.cpp, src/llama-grammar.cpp, common/sampling.cpp)."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.generate import Sampler, SamplingConfig
from edgesdk.runtime.grammar import GrammarConstraint


@pytest.fixture(scope="module")
def table():
    """A real byte-level vocabulary (SmolLM2's kind): its token for byte 0 has the text b"\\x00"."""
    pytest.importorskip("transformers")
    from edgesdk.runtime.json_mode import token_bytes_table
    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    return token_bytes_table(tokenizer.backend_tokenizer, len(tokenizer)), {tokenizer.eos_token_id}


def _nul(token_bytes) -> int:
    return next(token for token, data in enumerate(token_bytes) if data == b"\x00")


# ------------------------------------------------------------------ a token whose text starts with NUL

@pytest.mark.parametrize("source", ["root ::= .+", "root ::= [^\\n]+", "root ::= \"a\"? [^a-z]",
                                    "root ::= <[{nul}]>", "root ::= !<[5]> \"x\"", "root ::= \"\\x00\" | \"b\""])
def test_a_token_whose_text_starts_with_nul_is_never_taken_under_a_grammar(table, source):
    """llama.cpp's grammar sampler (llama_grammar_apply_impl) sets a token whose piece is empty or starts with NUL
    to -inf before it reads the grammar, so ``.``, a negated class, ``<[id]>`` or ``!<[id]>`` never write a NUL
    byte into the answer there. Here the byte-level vocabulary's token for byte 0 was allowed by each of them (and
    greedy decoding took it where the model liked it best)."""
    token_bytes, stops = table
    nul = _nul(token_bytes)
    grammar = parse_grammar(source.replace("{nul}", str(nul)))
    asked = GrammarConstraint(token_bytes, grammar, stops)
    assert not asked.allows(nul)  # asked one by one (the first questions in a state)
    scanned = GrammarConstraint(token_bytes, grammar, stops)
    for token in range(GrammarConstraint.SCAN_AFTER + 1):
        scanned.allows(token)
    assert not scanned.allows(nul)  # past them: the vocabulary trie's set
    with pytest.raises(ValueError, match=f"token {nul} does not continue the answer"):
        asked.advance(nul)


def test_other_tokens_are_still_taken_where_a_nul_token_is_refused(table):
    token_bytes, stops = table
    nul, a = _nul(token_bytes), token_bytes.index(b"a")
    for source in ("root ::= .+", "root ::= !<[5]> \"x\""):
        for scan in (False, True):
            constraint = GrammarConstraint(token_bytes, parse_grammar(source), stops)
            if scan:
                for token in range(GrammarConstraint.SCAN_AFTER + 1):
                    constraint.allows(token)
            assert constraint.allows(a)
            assert not constraint.allows(nul)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_sampler_takes_the_likeliest_other_token_where_the_model_prefers_nul(table, temperature):
    """The sampler under ``root ::= .+`` with the NUL token by far the likeliest: llama.cpp's chain never sees it
    (-inf), so the answer is the next token; here it was the NUL byte."""
    token_bytes, stops = table
    nul, a = _nul(token_bytes), token_bytes.index(b"a")
    logits = np.full(len(token_bytes), -20.0, np.float32)
    logits[nul], logits[a] = 30.0, 10.0
    constraint = GrammarConstraint(token_bytes, parse_grammar("root ::= .+"), stops)
    sampler = Sampler(SamplingConfig(temperature=temperature, top_k=2, seed=3))
    assert sampler(logits, constraint.allows) == a


def test_generate_under_a_grammar_writes_no_nul_where_the_model_is_pushed_to_it(runtime):
    """End to end on a real (tiny) bundle: a logit bias of +100 on the byte-0 token, greedy decoding under
    ``root ::= .{1,8}``. llama.cpp's answer holds no NUL (the grammar sampler refuses the token first); here each
    token of the answer was the NUL byte."""
    from edgesdk.runtime.generate import generate

    tokenizer = runtime.tokenizer
    token_bytes = tokenizer.token_bytes()
    nul = _nul(token_bytes)
    constraint = GrammarConstraint(token_bytes, parse_grammar("root ::= .{1,8}"), tokenizer.eos_token_ids)
    sampling = SamplingConfig(max_new_tokens=8, logit_bias=((nul, 100.0),))
    tokens, _ = generate(runtime.backend, tokenizer.encode("The quick brown fox", False), sampling,
                             tokenizer.eos_token_ids, constraint=constraint)
    assert tokens
    assert nul not in tokens
    assert b"\x00" not in b"".join(token_bytes[token] for token in tokens)


# ------------------------------------------------------------------ nested repetitions: llama.cpp's threshold

HANG = "root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}"  # tests/test-grammar-integration.cpp "hang"


@pytest.mark.parametrize(("source", "column", "product"), [
    (HANG, 29, "102 x 99 = 10,098"),
    ("root ::= ((\"a\"{0,9}){0,99}){0,99}", 28, "110 x 99 = 10,890"),
    ("root ::= (\"a\"{0,19}){0,100}", 21, "20 x 100 = 2,000"),
    ("root ::= \"a\"{0,1999}{2}", 21, "1,999 x 2 = 3,998"),
])
def test_nested_repetitions_past_llama_cpp_s_threshold_are_refused_by_name(source, column, product):
    """llama.cpp's parser (handle_repetitions) refuses a repetition of something whose own repetitions made
    n_prev_rules rules where n_prev_rules times the new count reaches MAX_REPETITION_THRESHOLD (2000). Each optional
    count of a nested repetition is a stack the matcher follows, so they multiply: llama.cpp's own "hang" grammar
    was taken here, and its matcher then expanded 99**k stacks without end (three levels already never finished)."""
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    problem = caught.value.problem
    assert f"line 1, column {column}: the repetition " in problem
    assert f"made {product.split(' x ')[0]} rules: {product}, past 2,000, which llama.cpp refuses" in problem
    assert "lower the counts of the nested repetitions" in caught.value.fix


@pytest.mark.parametrize(("source", "text"), [
    ("root ::= ([^x]*){0,99}", b"abc"),  # one level: 2 x 99
    ("root ::= (\"a\"{0,19}){0,99}", b"a" * 40),  # 20 x 99 = 1,980, under the threshold
    ("root ::= (\"ab\"{1000}){1000}", None),  # exact counts make no rules: the group stands for 1
    ("root ::= \"a\"{2}{2}", b"aaaa"),
    ("root ::= (\"0x\" [A-F0-9]{2} \" \"?){3,5}", b"0xFF 0x12 0xAB"),
    ("root ::= \"a\"{5000}", None),  # one repetition alone keeps edgesdk's limit (MAX_REPETITION)
])
def test_repetitions_llama_cpp_takes_are_still_taken(source, text):
    from edgesdk.runtime.grammar import GrammarMatcher

    grammar = parse_grammar(source)
    if text is not None:
        matcher = GrammarMatcher(grammar)
        state = matcher.feed(matcher.start(), text)
        assert state is not None
        assert matcher.accepts(state)


def test_a_json_schema_pattern_of_nested_repetitions_is_refused_when_compiled():
    """A JSON schema's pattern is followed through a GBNF grammar: ``^((a{0,9}){0,99}){0,99}$`` compiled, and the
    answer's string then held the matcher on 99 x 99 x 10 stacks per character (a request that never ended)."""
    from edgesdk.runtime.json_schema import SchemaError, compile_schema

    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^((a{0,9}){0,99}){0,99}$"}},
              "required": ["v"]}
    with pytest.raises(SchemaError, match=r"is too large to follow: .*past 2,000, which llama.cpp refuses"):
        compile_schema(schema)
