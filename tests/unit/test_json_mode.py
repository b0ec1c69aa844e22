"""JSON mode (edgesdk/runtime/json_mode.py): the byte automaton against Python's json module, the token
byte table against the tokenizer, and constrained generation on a real (tiny) bundle."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.json_mode import (
    DONE,
    MAX_NUMBER_DIGITS,
    MAX_WHITESPACE_RUN,
    JsonConstraint,
    JsonState,
    feed,
    step,
)

scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) |
                      st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
objects = st.dictionaries(st.text(max_size=6), values, max_size=5)
# llama.cpp's number rule (common/json-schema-to-grammar.cpp), which JSON mode's numbers follow
LLAMA_CPP_NUMBER = re.compile(r"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][-+]?(0|[1-9][0-9]{0,15}))?")


def numbers_fit_llama_cpp(text: str) -> bool:
    """Every number of the JSON ``text`` (as written) is one llama.cpp's number rule allows."""
    written = []
    json.loads(text, parse_int=lambda number: written.append(number) or 0,
               parse_float=lambda number: written.append(number) or 0.0)
    return all(LLAMA_CPP_NUMBER.fullmatch(number) for number in written)


@settings(max_examples=300, deadline=None)
@given(objects, st.sampled_from([None, 0, 2]), st.booleans())
def test_every_json_object_is_accepted_and_complete_only_at_its_end(value, indent, ascii_only):
    """Python's JSON is accepted, but where a float is written past llama.cpp's digit caps (17 significant
    digits, or an exponent with a leading zero: ``6.103515625e-05``)."""
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    data = text.encode("utf-8")
    state = JsonState()
    for index, byte in enumerate(data):
        assert state.mode != DONE, f"complete before byte {index} of {data!r}"
        state = step(state, byte, MAX_NUMBER_DIGITS)
        if state is None:
            break
    assert (state is not None and state.mode == DONE) == numbers_fit_llama_cpp(text), data


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.-+eE tfnrulas\\\n', max_size=30))
def test_what_the_automaton_completes_python_parses_as_an_object(text):
    """Soundness on JSON-like noise: a text the automaton accepts and completes is an object for
    json.loads, and an object json.loads takes (without long whitespace runs, its numbers within
    llama.cpp's rule) is accepted."""
    state = feed(JsonState(), text.encode())
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if state is not None and state.mode == DONE:
        assert isinstance(parsed, dict), text
    if isinstance(parsed, dict) and text[:1] == "{" and numbers_fit_llama_cpp(text):
        assert state is not None, text
        assert state.mode == DONE, text


@pytest.mark.parametrize("text", [b'[1]', b'"a"', b'{"a" 1}', b'{"a":1,}', b'{"a":01}', b'{"a":1.}', b'{"a":-}',
                                  b'{"a":tru}x', b'{"a":"\x01"}', b'{"a":"\\x"}', b'{"a":"\\u12G4"}', b'{"a":1}x',
                                  b'{"\xff":1}', b'{"\xc3":1}', b"{'a':1}"])
def test_invalid_texts_are_refused(text):
    state = feed(JsonState(), text)
    assert state is None or state.mode != DONE


def test_utf8_in_strings_and_whitespace_runs():
    assert feed(JsonState(), '{"é":"日本"}'.encode()).mode == DONE
    assert feed(JsonState(), b"{" + b" " * MAX_WHITESPACE_RUN + b"}").mode == DONE
    assert feed(JsonState(), b"{" + b" " * (MAX_WHITESPACE_RUN + 1)) is None
    assert feed(JsonState(), b'{"a":"' + b" " * 100 + b'"}').mode == DONE  # spaces inside a string are text


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def test_token_bytes_match_the_tokenizer(runtime):
    tokenizer = runtime.tokenizer
    table = tokenizer.token_bytes()
    assert all(table[token] is None for token in tokenizer.eos_token_ids)
    for token, data in enumerate(table):
        if data is not None and data.isascii():
            assert tokenizer.tokenizer.decode([token], skip_special_tokens=False).encode() == data


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (1.0, 1), (1.0, 2), (1.5, 3)])
def test_constrained_answers_are_json_objects_or_a_prefix_of_one(runtime, temperature, seed):
    tokenizer = runtime.tokenizer
    constraint = JsonConstraint(tokenizer.token_bytes())
    prompt = tokenizer.prompt_ids("Give me a JSON object", raw=False)
    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=96, temperature=temperature,
                                                                      seed=seed), tokenizer.eos_token_ids,
                             constraint=constraint)
    data = b"".join(tokenizer.token_bytes()[token] for token in tokens)
    state = feed(JsonState(), data)
    assert state is not None, data
    if stats.stop_reason == "complete":
        assert isinstance(json.loads(data), dict)
    else:
        assert stats.stop_reason in ("max_new_tokens", "max_context")
        assert state.mode != DONE


def test_run_json_answers_with_a_json_prefix_or_object(tiny_bundle):
    from tests.unit.test_cli import assert_ok, invoke

    result = invoke("run", tiny_bundle.path, "--prompt", "Give me a JSON object", "-n", 48, "--json", "--stats",
                    "--threads", 1)
    assert_ok(result)
    text = result.stdout[:-1]  # the newline after the answer
    state = feed(JsonState(), text.encode())
    assert state is not None, text
    if "stop: complete" in result.stderr:
        assert isinstance(json.loads(text), dict)


def test_serve_json_object_mode_and_refusal_of_a_schema(runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(runtime, ServeDefaults(max_tokens=48))
    try:
        body = {"messages": [{"role": "user", "content": "Give me a JSON object"}],
                "response_format": {"type": "json_object"}}
        status, answer = server.post("/v1/chat/completions", body)
        assert status == 200, answer
        text = answer["choices"][0]["message"]["content"]
        assert feed(JsonState(), text.encode()) is not None, text
        if answer["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
        events = server.stream("/v1/chat/completions", body)
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1]) == text
        status, refused = server.post("/v1/chat/completions", {**body, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 1}}}})
        assert (status, refused["error"]["param"]) == (400, "response_format")
        assert "keyword 'minProperties'" in refused["error"]["message"]
    finally:
        server.close()
