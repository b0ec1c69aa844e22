"""GBNF grammars: the parser (llama.cpp's language), the matcher and the token constraint."""

from __future__ import annotations

import random

import pytest

from edgesdk.runtime.gbnf import CHAR, REF, GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarConstraint, GrammarMatcher

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i
EOS = 256
JSON = r'''
# JSON in llama.cpp's grammar style: rules over several lines inside parentheses and after '|'
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''
LIST = 'root ::= item{2,3}\nitem ::= "- " [a-zé]+ "\\n"  # a short list\n'
UNICODE = 'root ::= [ぁ-ゟ]+ "。" | "\\u00e9t\\u00E9" | [^a-z\\x00-\\x7F]'
GRAMMARS = {"json": JSON, "list": LIST, "unicode": UNICODE}


def _matches(source: str, text: str | bytes) -> bool:
    matcher = GrammarMatcher(parse_grammar(source))
    state = matcher.feed(matcher.start(), text.encode() if isinstance(text, str) else text)
    return state is not None and matcher.accepts(state)


def _prefix(source: str, text: str | bytes) -> bool:
    matcher = GrammarMatcher(parse_grammar(source))
    return matcher.feed(matcher.start(), text.encode() if isinstance(text, str) else text) is not None


@pytest.mark.parametrize(("name", "text"), [
    ("json", '{}'), ("json", '{"a": 1}'), ("json", '{"a": [1, -2.5e3, "x\\u00e9\\n"], "b": {"c": null}}'),
    ("json", '{\n  "日本": true\n}'), ("list", "- ab\n- é\n"), ("list", "- a\n- b\n- c\n"),
    ("unicode", "ぁゟ。"), ("unicode", "été"), ("unicode", "€"),
])
def test_texts_of_the_grammar_are_accepted(name, text):
    assert _matches(GRAMMARS[name], text)


@pytest.mark.parametrize(("name", "text"), [
    ("json", '[1]'), ("json", '{"a": 01}'), ("json", "{'a': 1}"), ("json", '{"a": "\x01"}'), ("json", '{"a":1,}'),
    ("list", "- a\n"), ("list", "- a\n- b\n- c\n- d\n"), ("list", "- A\n- b\n"),
    ("unicode", "a"), ("unicode", "ぁぁ"), ("unicode", "etE"),
])
def test_texts_outside_the_grammar_are_refused_or_unfinished(name, text):
    assert not _matches(GRAMMARS[name], text)


def test_repetition_bounds_are_exact():
    source = 'root ::= "a"{2,4} [0-9]? "b" "c"{0,1} "d"{2,}'
    accepted = {f"{'a' * n}{digit}b{c}{'d' * d}" for n in (2, 3, 4) for digit in ("", "7") for c in ("", "c")
                for d in (2, 5)}
    for text in accepted:
        assert _matches(source, text), text
    for text in ("ab" + "dd", "aaaaab" + "dd", "aab" + "d", "aabcc" + "dd", "aa77b" + "dd"):
        assert not _matches(source, text), text
    assert _matches('root ::= "ab"{2}', "abab")
    assert not _matches('root ::= "ab"{2}', "abb")


def test_layout_comments_and_a_redefined_rule():
    source = "root ::= # the start\n  a |\n  b\na ::= \"x\"\nb ::= ( \"y\"\n  \"z\" )  # nested lines\na ::= \"w\"\n"
    assert _matches(source, "yz")
    assert _matches(source, "w")
    assert not _matches(source, "x")  # the later definition of a replaces the first, as in llama.cpp
    assert _matches('root ::= "a" | ', "")
    assert _matches('root ::= "a" | ', "a")


def test_escapes_and_classes():
    assert _matches(r'root ::= "\x41\u00e9\U0001F600\t\"\\"', 'Aé😀\t"\\')
    assert _matches(r'root ::= [\]\[\-a]+', "][-a")
    assert _matches(r'root ::= [^\n]+ "\n"', "any thing\n")
    assert not _matches(r'root ::= [^\n]+ "\n"', "a\nb\n")
    assert _matches("root ::= . . .", "a\n😀")
    assert _matches("root ::= [a-]", "-")  # a dash before ] is itself


@pytest.mark.parametrize(("source", "message", "where"), [
    ('root ::= foo', "the rule 'foo' is used but never defined", "line 1, column 10"),
    ('x ::= "a"', "no root rule", None),
    ('root ::= "a', "string is not closed", "line 1, column 10"),
    ('root ::= [b-a]', "runs backwards", "line 1, column 10"),
    ('root ::= "a"{3,1}', "maximum below its minimum", "line 1, column 13"),
    ('root ::= "a"{x}', "is not {m}", "line 1, column 13"),
    ('root ::= "\\q"', "unknown escape \\q", "line 1, column 11"),
    ('root ::= "\\x4"', "\\x needs 2 hexadecimal digits", "line 1, column 11"),
    ('root ::= "\\U00110000"', "past the last Unicode code point", "line 1, column 11"),
    ('root ::= ( "a" ', "expected ')'", "line 1, column 16"),
    ('root ::= *', "'*' repeats nothing", "line 1, column 10"),
    ('root ::= []', "matches nothing", "line 1, column 10"),
    ('root ::= "a"\n  | "b"', "expected a rule name", "line 2, column 3"),
    ('root := "a"', "expected '::=' after the rule name 'root'", "line 1, column 6"),
    ('root ::= (\n"a"\nb ::= "c"', "starts before the previous rule ended", "line 3, column 1"),
    ('root ::= <[x1]>', "not a whole number", "line 1, column 10"),
    ('root ::= <think', "a token is written", "line 1, column 10"),
    ('root ::= "a"{20000}', "past the 10,000 followed here", "line 1, column 13"),
])
def test_broken_grammars_are_refused_with_where_and_the_fix(source, message, where):
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert message in caught.value.problem
    assert caught.value.fix
    if where:
        assert where in caught.value.problem


@pytest.mark.parametrize("source", [
    'root ::= expr\nexpr ::= expr "+" "1" | "1"',
    'root ::= a\na ::= b "x"\nb ::= c? a\nc ::= "c"',  # indirect, behind an optional
])
def test_left_recursion_is_refused(source):
    with pytest.raises(GrammarError, match="left-recursive"):
        parse_grammar(source)


def test_a_repetition_of_something_empty_is_refused_in_the_rule_written():
    # a group with an empty alternative, as llama.cpp refuses it; ("a"?)* it takes (the group has none)
    with pytest.raises(GrammarError, match=r"line 1, column 18: in the grammar's rule 'root', this repetition "
                       r"repeats something with an empty alternative"):
        parse_grammar('root ::= ("a" | )*')


# ------------------------------------------------------------------------------------------ UTF-8


def test_a_token_may_end_inside_a_code_point_the_grammar_can_finish():
    source = 'root ::= [ぁ-ゟ] "!"'  # U+3041..U+309F: E3 81 81 .. E3 82 9F
    assert _prefix(source, "ぁ".encode()[:1])
    assert _prefix(source, "ぁ".encode()[:2])
    assert not _prefix(source, "é".encode()[:1])  # C3: a two-byte code point, below the class
    assert not _prefix(source, "日".encode()[:2])  # E6 97: U+65C0.., past it
    assert _matches(source, "ゟ!")


@pytest.mark.parametrize("data", [b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80",
                                  b"\xff"])
def test_invalid_utf8_is_refused_even_by_any_character(data):
    assert not _prefix("root ::= .+", data)


# ------------------------------------------------------------------------------------ the constraint


def _random_text(source: str, rng: random.Random, depth: int = 0) -> str:
    """A random text of the grammar, from its compiled rules (shallow alternatives past a depth)."""
    grammar = parse_grammar(source)

    def rule(index: int, depth: int) -> str:
        options = list(grammar.rules[index])
        if depth > 6:
            options.sort(key=lambda i: sum(e[0] == REF for e in grammar.alternatives[i]))
            options = options[:1]
        return "".join(element(e, depth) for e in grammar.alternatives[rng.choice(options)])

    def element(e: tuple, depth: int) -> str:
        if e[0] == REF:
            return rule(e[1], depth + 1)
        assert e[0] == CHAR
        assert not e[2]
        low, high = rng.choice(e[1])
        return chr(rng.randint(low, min(high, low + 30)))

    return rule(grammar.root, depth)


@pytest.mark.parametrize("name", ["json", "list"])
def test_random_texts_of_the_grammar_are_accepted(name):
    rng = random.Random(5)
    for _ in range(40):
        text = _random_text(GRAMMARS[name].replace("[^\"\\\\\\x7F\\x00-\\x1F]", "[a-z]"), rng)
        assert _matches(GRAMMARS[name], text), text


def _brute_force(constraint: GrammarConstraint, vocabulary: list[bytes | None]) -> set[int]:
    return {token for token in range(len(vocabulary)) if token not in constraint.stop_ids
            and constraint.matcher.step_token(constraint.state, token, vocabulary[token]) is not None}


def test_the_trie_finds_the_tokens_that_asking_one_by_one_finds():
    rng = random.Random(3)
    words = ["{", "}", '"', '"a', 'a"', ": ", ", ", " ", "\n  ", "tr", "ue", "true", "1", "12", "-", ".5", "e3", "[",
             "]", "é", "é".encode()[:1], "é".encode()[1:], "日本", "\\", "\\u00", "nul", "l}", '{"']
    vocabulary = [w.encode() if isinstance(w, str) else w for w in words] + BYTES[32:127] + [None]
    stop = len(vocabulary) - 1
    for _ in range(30):
        constraint = GrammarConstraint(vocabulary, parse_grammar(JSON), {stop})
        for _ in range(rng.randint(0, 25)):
            expected = _brute_force(constraint, vocabulary)
            assert constraint._allowed_tokens() == expected
            assert constraint.allows(stop) == constraint.accepts
            if not expected:
                break
            constraint.advance(rng.choice(sorted(expected)))


def test_end_of_text_only_where_the_grammar_accepts_and_complete_when_nothing_follows():
    constraint = GrammarConstraint(BYTES, parse_grammar('root ::= "ab" "c"?'), {EOS})
    assert not constraint.allows(EOS)
    constraint.advance(ord("a"))
    assert not constraint.allows(EOS)
    assert not constraint.complete
    with pytest.raises(ValueError, match="ends the answer where the grammar does not accept"):
        constraint.advance(EOS)
    constraint.advance(ord("b"))
    assert constraint.allows(EOS)
    assert constraint.allows(ord("c"))
    assert not constraint.complete
    constraint.advance(ord("c"))
    assert constraint.complete
    assert constraint.allows(EOS)
    assert not constraint.allows(ord("c"))
    with pytest.raises(ValueError, match="does not continue"):
        constraint.advance(ord("c"))


def test_token_terminals_match_whole_tokens():
    vocabulary = [b"<think>", b"</think>", b"a", b"b", None, None]  # 4: a special token, 5: end of text
    lookup = {"<think>": 0, "</think>": 1, "<|tool|>": 4}.get
    grammar = parse_grammar("root ::= <think> body <[1]> <|tool|>\nbody ::= !<[1]>*")
    constraint = GrammarConstraint(vocabulary, grammar, {5}, token_id_of=lookup)
    assert [constraint.allows(t) for t in range(6)] == [True, False, False, False, False, False]
    constraint.advance(0)
    assert [constraint.allows(t) for t in range(6)] == [True, True, True, True, True, False]
    for token in (2, 0, 3, 4, 1):
        constraint.advance(token)
    assert [constraint.allows(t) for t in range(6)] == [False, False, False, False, True, False]
    constraint.advance(4)
    assert constraint.complete
    with pytest.raises(GrammarError, match=r"token <nope> is not one token"):
        GrammarConstraint(vocabulary, parse_grammar("root ::= <nope>"), {5}, token_id_of=lookup)


# ------------------------------------------------------------------------------------- on a tiny bundle

FINITE = 'root ::= ("yes" | "no") ", " [0-9]{1,3} "."'


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (1.0, 1), (1.5, 2)])
def test_generate_under_a_grammar_gives_a_text_of_it(runtime, temperature, seed):
    import re

    from edgesdk.runtime.generate import SamplingConfig, generate

    tokenizer = runtime.tokenizer
    constraint = GrammarConstraint(tokenizer.token_bytes(), parse_grammar(FINITE), tokenizer.eos_token_ids)
    tokens, stats = generate(runtime.backend, tokenizer.prompt_ids("Answer", raw=False),
                             SamplingConfig(max_new_tokens=40, temperature=temperature, seed=seed),
                             tokenizer.eos_token_ids, constraint=constraint)
    text = b"".join(tokenizer.token_bytes()[t] for t in tokens).decode()
    assert stats.stop_reason == "complete", text
    assert re.fullmatch(r"(yes|no), [0-9]{1,3}\.", text), text


def test_run_grammar_from_text_or_file(tiny_bundle, tmp_path):
    import re

    from tests.unit.test_cli import assert_ok, invoke

    path = tmp_path / "answer.gbnf"
    path.write_text(FINITE + "\n", encoding="utf-8")
    for option, given in (("--grammar", FINITE), ("--grammar-file", str(path))):
        result = invoke("run", tiny_bundle.path, "--prompt", "Answer", "-n", 40, option, given, "--threads", 1)
        assert_ok(result)
        assert re.fullmatch(r"(yes|no), [0-9]{1,3}\.\n?", result.stdout), result.stdout
    for args, message in ((["--grammar", 'root ::= "a'], "string is not closed"),
                          (["--grammar", "root ::= <|nope|>"], "<|nope|> is not one token"),
                          (["--grammar", FINITE, "--json"], "--grammar and --json each constrain"),
                          (["--grammar-file", str(path), "--json-schema", '{"type": "object"}'], "pass one"),
                          (["--grammar-file", str(tmp_path / "missing.gbnf")], "is not a file")):
        result = invoke("run", tiny_bundle.path, "--prompt", "x", *args)
        assert result.exit_code == 2, result.output
        assert message in result.output


def test_serve_follows_a_grammar_on_both_routes(runtime):
    import re

    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(runtime, ServeDefaults(max_tokens=40))
    messages = [{"role": "user", "content": "Answer"}]
    try:
        status, answer = server.post("/v1/chat/completions", {"messages": messages, "grammar": FINITE})
        assert status == 200, answer
        assert answer["choices"][0]["finish_reason"] == "stop"
        assert re.fullmatch(r"(yes|no), [0-9]{1,3}\.", answer["choices"][0]["message"]["content"])
        status, answer = server.post("/v1/completions", {"prompt": "Answer:", "grammar": FINITE, "temperature": 1.0,
                                                         "seed": 3})
        assert status == 200, answer
        assert re.fullmatch(r"(yes|no), [0-9]{1,3}\.", answer["choices"][0]["text"])
        for body, message in (({"grammar": 'root ::= "a'}, "string is not closed"),
                              ({"grammar": 7}, "must be GBNF text"),
                              ({"grammar": "root ::= <|nope|>"}, "is not one token"),
                              ({"grammar": FINITE, "json_schema": {"type": "object"}}, "both constrain"),
                              ({"grammar": FINITE, "response_format": {"type": "json_object"}}, "both constrain")):
            status, answer = server.post("/v1/chat/completions", {"messages": messages, **body})
            assert (status, answer["error"]["param"]) == (400, "grammar"), answer
            assert message in answer["error"]["message"]
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        status, answer = server.post("/v1/chat/completions", {"messages": messages, "grammar": FINITE, "tools": tools})
        assert (status, answer["error"]["param"]) == (400, "grammar"), answer
    finally:
        server.close()


def test_run_grammar_file_and_json_schema_read_from_a_pipe(tiny_bundle, tmp_path):
    import os
    import re
    import threading

    from tests.unit.test_cli import assert_ok, invoke

    # a finite language each: the answer closes within the tiny model's context (at most 6 gaps of 21 whitespace bytes)
    for option, text, shape in (("--grammar-file", FINITE, r"(yes|no), [0-9]{1,3}\.\n?"),
                                ("--json-schema", '{"type": "object", "properties": {"ok": {"type": "boolean"}}, '
                                 '"required": ["ok"]}', r'\s*\{\s*"ok"\s*:\s*(true|false)\s*\}\n?')):
        fifo = tmp_path / f"{option.strip('-')}.pipe"
        os.mkfifo(fifo)

        def write(path=fifo, content=text) -> None:
            with open(path, "w", encoding="utf-8") as out:  # blocks until a reader opens the pipe
                out.write(content)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            result = invoke("run", tiny_bundle.path, "--prompt", "Answer", "-n", 200, option, fifo, "--threads", 1)
        finally:  # a run that never opened the pipe leaves the writer waiting: be that reader
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            writer.join(timeout=10)
            os.close(reader)
        assert_ok(result)
        assert re.fullmatch(shape, result.stdout), (option, result.output)
