"""GBNF grammars and JSON-schema constraints against llama.cpp's own grammar engine (llama-cpp-python's
``llama_sampler_init_grammar``): the grammars its parser accepts and refuses, and the texts its sampler takes
as a whole answer, as the prefix of one, or refuses.

llama.cpp's grammar sampler needs a vocabulary: a GGUF holding only a tokenizer (SentencePiece, the 256 byte
tokens ``<0x00>`` ... ``<0xFF>`` and a few special ones) is written and loaded with ``vocab_only``. A text is
fed one byte token at a time: each byte must survive ``llama_sampler_apply`` before it is accepted, and the
end-of-text token surviving at the end means the grammar accepts the whole text."""

from __future__ import annotations

import ctypes
import json
import math
import os
import random
import resource
import subprocess
import sys

import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarMatcher
from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema

EOS, FIRST_BYTE, TOOL = 2, 3, 259  # token ids in the vocabulary below

ARITHMETIC = r"""
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""

JSON = r"""
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

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""

JSON_ARR = r"""
root   ::= arr
value  ::= object | array | string | number | ("true" | "false" | "null") ws
arr  ::=
  "[\n" ws (
            value
    (",\n" ws value)*
  )? "]"
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
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws
ws ::= ([ \t\n] ws)?
"""

LIST = r"""
root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
"""

C = r"""
root ::= (declaration)*

declaration ::= dataType identifier "(" parameter? ")" "{" statement* "}"

dataType  ::= "int" ws | "float" ws | "char" ws
identifier ::= [a-zA-Z_] [a-zA-Z_0-9]*

parameter ::= dataType identifier

statement ::=
    ( dataType identifier ws "=" ws expression ";" ) |
    ( identifier ws "=" ws expression ";" ) |
    ( identifier ws "(" argList? ")" ";" ) |
    ( "return" ws expression ";" ) |
    ( "while" "(" condition ")" "{" statement* "}" ) |
    ( "if" "(" condition ")" "{" statement* "}" ("else" "{" statement* "}")? ) |
    ( singleLineComment ) |
    ( multiLineComment )

condition ::= expression relationOperator expression
relationOperator ::= ("<=" | "<" | "==" | "!=" | ">=" | ">")

expression ::= term (("+" | "-") term)*
term ::= factor(("*" | "/") factor)*

factor ::= identifier | number | unaryTerm | funcCall | parenExpression
unaryTerm ::= "-" factor
funcCall ::= identifier "(" argList? ")"
parenExpression ::= "(" ws expression ws ")"

argList ::= expression ("," ws expression)*

number ::= [0-9]+

singleLineComment ::= "//" [^\n]* "\n"
multiLineComment ::= "/*" ( [^*] | ("*" [^/]) )* "*/"

ws ::= ([ \t\n]+)
"""


class LlamaGrammar:
    """llama.cpp's grammar sampler over a vocabulary of byte tokens."""

    def __init__(self, llama_cpp, path):
        from tests._utils.gguf_files import vocab_only_gguf

        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + ["<|tool|>"]

        def vocabulary(writer):
            writer.add_tokenizer_model("llama")
            writer.add_token_list(tokens)
            writer.add_token_scores([0.0] * len(tokens))
            writer.add_token_types([2, 3, 3] + [6] * 256 + [3])  # unknown, control, byte
            writer.add_bos_token_id(1)
            writer.add_eos_token_id(EOS)
            writer.add_unk_token_id(0)

        vocab_only_gguf(path, vocabulary)
        self.path = path
        self.lib = llama_cpp
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, "llama.cpp did not load the vocabulary"
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.size = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def sampler(self, source: str):
        sampler = self.lib.llama_sampler_init_grammar(self.vocab, source.encode(), b"root")
        return sampler if sampler else None

    def parses(self, source: str) -> bool:
        sampler = self.sampler(source)
        if sampler is not None:
            self.lib.llama_sampler_free(sampler)
        return sampler is not None

    def allowed(self, sampler) -> set[int]:
        data = (self.lib.llama_token_data * self.size)()
        for token in range(self.size):
            data[token].id, data[token].logit, data[token].p = token, 0.0, 0.0
        candidates = self.lib.llama_token_data_array(data=data, size=self.size, selected=-1, sorted=False)
        self.lib.llama_sampler_apply(sampler, ctypes.byref(candidates))
        return {data[i].id for i in range(self.size) if not math.isinf(data[i].logit)}

    def verdict(self, source: str, text: bytes) -> str:
        """"complete", "prefix" or "refused", as llama.cpp's sampler reads ``text`` byte token by byte token
        (a refused token is never accepted: llama.cpp aborts on one)."""
        sampler = self.sampler(source)
        assert sampler is not None, f"llama.cpp refused the grammar {source!r}"
        try:
            for byte in text:
                if FIRST_BYTE + byte not in self.allowed(sampler):
                    return "refused"
                self.lib.llama_sampler_accept(sampler, FIRST_BYTE + byte)
            return "complete" if EOS in self.allowed(sampler) else "prefix"
        finally:
            self.lib.llama_sampler_free(sampler)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is llama.cpp's grammar engine, the reference")
    pytest.importorskip("gguf", reason="the gguf package writes the vocabulary llama.cpp's grammar sampler needs")

    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):  # llama.cpp prints each refused grammar; the tests compare verdicts
        pass

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    try:
        yield LlamaGrammar(llama_cpp, tmp_path_factory.mktemp("vocab") / "bytes.gguf")
    finally:
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def _parses(source: str) -> bool:
    try:
        parse_grammar(source)
    except GrammarError:
        return False
    return True


def _verdict(source: str, text: bytes) -> str:
    matcher = GrammarMatcher(parse_grammar(source))
    state = matcher.feed(matcher.start(), text)
    return "refused" if state is None else "complete" if matcher.accepts(state) else "prefix"


# ------------------------------------------------------------------------------------------ parsing

BOTH_ACCEPT = [
    ARITHMETIC, JSON, JSON_ARR, LIST, C,
    'root ::= "a"{2,}', 'root ::= "a"{ 2 , 3 }', 'root ::= "a"{0}', 'root ::= "a"{0,0}', 'root ::= "a"{2}{2}',
    'root ::= "a" {2}', 'root ::= "a"*?', 'root ::= ("a"{2,\n3})', 'root ::= "a"{0,1999}',
    'root ::= <[5]>', 'root ::= !<[5]>', 'root ::= <|tool|>', 'root ::= "a" # c\n', '#c\nroot ::= "a"',
    'root ::= ( "a"\n | "b" )', 'root ::= "a" |\n "b"', 'root ::= ("a"\n"b")', 'root ::= "a"\n\n\nx ::= "b"',
    'root ::= [a-]', 'root ::= [-a]', 'root ::= [a\\-z]', 'root ::= "\\x41\\u00e9\\U0001F600\\t\\r\\n\\\\\\"\\[\\]"',
    'root ::= x\nx ::= "a"\nx ::= "b"', 'root::="a"', 'root ::= "a"\r\nx ::= "b"\r\n', 'root ::= "a"\rx ::= "b"',
    'Root ::= "a"\nroot ::= Root', 'root ::= 9a\n9a ::= "x"', 'root ::= x-y\nx-y ::= "a"', 'root ::= ("a" | )',
    'root ::= ( )', 'root ::= ()', 'root ::= .', 'root ::= [é-ü]+', 'root ::= "a" | | "b"', 'root ::= |', 'root ::=',
    'root ::= a\na ::= b "x" a | "y"\nb ::= | "z"', 'root ::= "a"#x\n',
    # each comes back to itself through a rule that matches the empty text, but has no empty alternative,
    # and last in its alternative: llama_grammar_detect_left_recursion takes it, and the expansion ends
    'root ::= ("x"?)*', 'root ::= (ws)*\nws ::= | " "', 'root ::= a\na ::= b a | "y"\nb ::= c\nc ::= | "z"',
    'root ::= ((("x"?)*)* "y")*', 'root ::= (ws){2,}\nws ::= | " "',
    # a rule whose expansion never ends, where the root cannot reach it
    'root ::= "q"\na ::= b a "x" | "y"\nb ::= "z"?',
]

BOTH_REFUSE = [
    'root ::= !"a"', 'root ::= "a"\n | "b"', 'root ::= "\\x4"', 'root ::= "\\q"', 'root ::= undefined',
    'other ::= "a"', 'root ::= a\na ::= a "x" | "y"', 'root ::= *', 'root ::= "a"{}', 'root ::= "a" ::= "b"',
    'root ::= "a" "', 'root ::= [a', 'root ::= (', 'root ::= )', 'root ::= <[ 5]>', 'root ::= <>',
    'root ::= "a"{1#c\n}', 'root ::= ws*\nws ::= | " "', 'root ::= expr\nexpr ::= expr "+" "1" | "1"',
    # llama.cpp's names are letters, digits and '-' (is_word_char) and its escapes have no \/ (parse_char)
    'root ::= my_rule\nmy_rule ::= "a"', 'my_root ::= "a"\nroot ::= my_root', 'root ::= "\\/"', 'root ::= [\\/]',
    # a repetition of a rule with an empty alternative is left recursion to llama.cpp: R ::= x R |
    'root ::= ("a" | )*', 'root ::= "a"?*', 'root ::= x+\nx ::= "a" | ',
    # a repetition of a symbol that writes nothing (handle_repetitions: "expecting preceding item")
    'root ::= "a" ""*', 'root ::= ""{0,2} "a"', 'root ::= "b" "a"{0}?',
]


@pytest.mark.parametrize("source", BOTH_ACCEPT)
def test_grammars_llama_cpp_accepts_are_accepted(llama, source):
    assert llama.parses(source)
    assert _parses(source)


@pytest.mark.parametrize("source", BOTH_REFUSE)
def test_grammars_llama_cpp_refuses_are_refused(llama, source):
    assert not llama.parses(source)
    assert not _parses(source)


def test_an_underscore_in_a_rule_name_is_refused_naming_the_rule_and_the_name_to_write(llama):
    source = 'root ::= yes_no\nyes_no ::= "yes" | "no"'
    assert not llama.parses(source)
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert "'yes_no' has a '_'" in caught.value.problem
    assert "line 1, column 13" in caught.value.problem
    assert "'yes-no'" in caught.value.fix
    assert _verdict(source.replace("_", "-"), b"no") == llama.verdict(source.replace("_", "-"), b"no") == "complete"


def test_the_escape_slash_is_refused_as_llama_cpp_refuses_it(llama):
    assert not llama.parses('root ::= "a\\/b"')
    with pytest.raises(GrammarError, match=r"unknown escape \\/"):
        parse_grammar('root ::= "a\\/b"')
    assert _verdict('root ::= "a/b"', b"a/b") == llama.verdict('root ::= "a/b"', b"a/b") == "complete"


def test_a_negated_class_that_lists_nothing_is_refused_where_llama_cpp_reads_it_as_nothing(llama):
    """``[^]`` is no symbol at all to llama.cpp's parser (it writes no element), not one character."""
    source = 'root ::= "a" [^] "b"'
    assert llama.verdict(source, b"ab") == "complete"
    assert llama.verdict(source, b"axb") == "refused"
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert "[^]" in caught.value.problem
    assert "write . for any one character" in caught.value.fix


# ------------------------------------------------------------------------------------------ matching

TEXTS = {
    ARITHMETIC: ["1+2=3\n", "a=b\n", "x=(1)\n", "1=2", "a_1 = (b*2)\n", "=\n", "1+=2\n"],
    JSON: ['{"a": 1}', "{}", '{"a":[1,2,{"b":null}]} ', '{"a": "\\u00e9"}', "[1]", '{"a":01}', '{\n  "a": true\n}',
           '{"a": "tab\there"}', '{"a": 1e5}', '{"a": -0.5E-3}', '{"é": "😀"}'],
    JSON_ARR: ["[\n1,\n2]", "[\n]", "[1]", '[\n{"a": [ ]},\n"x"]'],
    LIST: ["- a\n- b\n", "- \n", "- é\n", "- a\rb\n"],
    C: ["int main(){return 0;}", "int f(){}", "float g(int a){if(a<1){return a;}else{return 2;}}", "/* x */"],
    'root ::= [^a-c\\n]+ "\\n"': ["xyz\n", "a\n", "é😀\n"],
    'root ::= "<" .{0,3} ">"': ["<>", "<ab>", "<abcd>", "<\n>", "<é😀>"],
    'root ::= "ab"{2,3} "c"* "d"?': ["ababcd", "abababccc", "ab", "abababab"],
    'root ::= [é-ü]+ "😀"?': ["éü😀", "é😀😀", "ë"],
    'root ::= "x"{0,50} "y"': ["x" * 50 + "y", "x" * 51 + "y", "y"],
    'root ::= [a-] [-b]': ["--", "a-", "ab", "ba"],
    'root ::= ("a" | "ab") "c"? | "abd"': ["ac", "abc", "abd", "ab", "abdc"],
    'root ::= e\ne ::= t ("+" t)*\nt ::= "(" e ")" | [0-9]{1,2}': ["(1+(23))+4", "((1)", "123"],
    'root ::= [^\\x00-\\x7F]{2}': ["éé", "é", "😀ü", "aé"],
    # repetitions of what matches the empty text, taken as llama.cpp takes them (each text's prefixes include "")
    'root ::= ("x"?)*': ["xx", "xy", "y"],
    'root ::= (ws)*\nws ::= | " "': ["  ", " x"],
    'root ::= (ws){2,} "."\nws ::= | " "': [" .", "   .", "..", "x"],
    'root ::= ("x"? "c"?)* "y"': ["xcy", "ccxy", "y", "yx", "xz"],
    'root ::= (("x"?)* "y"?)*': ["xyyx", "yz"],
    'root ::= ("x"?){0,3} "y"': ["xxxy", "xxxxy", "y"],
    'root ::= a\na ::= b a | "y"\nb ::= c\nc ::= | "z"': ["zzy", "y", "yz", "zq"],
    'root ::= a "e"\na ::= b d\nd ::= c a | "y"\nb ::= c\nc ::= | "z"': ["zzye", "ye", "e", "yee"],
    'root ::= x\nx ::= y x | "!"\ny ::= ("a"?)*': ["aa!", "!", "!a"],
    'root ::= "q"\na ::= b a "x" | "y"\nb ::= "z"?': ["q", "qz"],
    'root ::= a\na ::= "z" a "x" | "y" "x"*': ["zzyxx", "zyxxx", "zzyx", "yx"],
}


@pytest.mark.parametrize("source", sorted(TEXTS), ids=lambda source: source.strip().splitlines()[0][:40])
def test_texts_and_their_prefixes_get_llama_cpp_s_verdict(llama, source):
    """Each text, and each of its byte prefixes (a prefix may end inside a UTF-8 sequence), is a whole
    answer, the prefix of one, or refused, as llama.cpp's grammar sampler has it."""
    for text in TEXTS[source]:
        data = text.encode()
        for end in range(len(data) + 1):
            assert _verdict(source, data[:end]) == llama.verdict(source, data[:end]), (source, data[:end])


def test_a_partial_code_point_under_a_negated_class_is_kept_while_it_can_become_one_the_class_takes(llama):
    """llama.cpp's ``llama_grammar_match_partial_char`` refuses a partial UTF-8 sequence under a negated class as
    soon as one code point it leaves out lies in the range the sequence can still become: after ``- x`` of
    list.gbnf, the byte E2 (U+2000 to U+2FFF) is refused because U+2028 is left out, so with byte tokens
    llama.cpp can never write U+2014, which the class takes whole. Here the byte is kept: U+2014 is in reach."""
    assert llama.verdict(LIST, b"- x\xe2") == "refused"
    assert llama.verdict(LIST, "- x\u2014\n".encode()[:3]) == "prefix"
    assert _verdict(LIST, b"- x\xe2") == "prefix"
    assert _verdict(LIST, "- x\u2014\n".encode()) == "complete"
    assert _verdict(LIST, "- x\u2028\n".encode()) == "refused"


def test_a_long_run_of_optionals_is_matched_as_llama_cpp_matches_it(llama):
    source = "root ::= " + " ".join(['"x"?'] * 40) + ' "y"'
    for count in (0, 1, 39, 40, 41):
        text = b"x" * count + b"y"
        assert _verdict(source, text) == llama.verdict(source, text)


# ------------------------------------------------------------------ rules that come back through empty ones

# Each comes back to itself through rules that can match the empty text, none by an empty alternative of its
# own, with more to read after the way back: llama.cpp's parser takes it, and llama_grammar_advance_stack
# pushes that rest again on every round, so its stacks never repeat (llama.cpp aborts on std::bad_alloc).
ENDLESS = [
    ('root ::= a\na ::= b a "x" | "y"\nb ::= "z"?', "'a'", "line 2, column 9"),
    ('root ::= a\na ::= b a "x" | "y"\nb ::= c\nc ::= | "z"', "'a'", "line 2, column 9"),
    ('root ::= a\na ::= b (a "x") | "y"\nb ::= "z"?', "'a'", "line 2, column 10"),
    ('root ::= x\nx ::= y x "e" | "!"\ny ::= ("a"?)*', "'x'", "line 2, column 9"),
    ('root ::= "q" | d\nd ::= "w" a\na ::= b a "x" | "y"\nb ::= "z"?', "'a'", "line 3, column 9"),
]

_MAKE_SAMPLER = """
import sys
import llama_cpp

@llama_cpp.llama_log_callback
def quiet(level, text, user_data):
    pass

llama_cpp.llama_log_set(quiet, None)
params = llama_cpp.llama_model_default_params()
params.vocab_only = True
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), params)
vocab = llama_cpp.llama_model_get_vocab(model)
sampler = llama_cpp.llama_sampler_init_grammar(vocab, sys.argv[2].encode(), b"root")
assert sampler, "llama.cpp refused the grammar"
data = (llama_cpp.llama_token_data * 260)(*[llama_cpp.llama_token_data(i, 0.0, 0.0) for i in range(260)])
candidates = llama_cpp.llama_token_data_array(data=data, size=260, selected=-1, sorted=False)
llama_cpp.llama_sampler_apply(sampler, candidates)  # looks one byte ahead: expands the stacks after each
print("sampled")
"""


def _llama_cpp_samples(llama, source: str) -> bool:
    """llama.cpp makes a grammar sampler for ``source`` and filters a first byte with it, in a process of its own
    held to 1 GiB of memory (a grammar whose expansion never ends takes all there is)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # no gdb backtrace from ggml's std::terminate handler
    try:
        done = subprocess.run([sys.executable, "-c", _MAKE_SAMPLER, str(llama.path), source], capture_output=True,
                              text=True, timeout=300, preexec_fn=limit, env=env)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and done.stdout.strip() == "sampled"


@pytest.mark.parametrize(("source", "rule", "where"), ENDLESS)
def test_a_rule_that_comes_back_through_empty_ones_with_more_after_is_refused_where_llama_cpp_never_ends(
        llama, source, rule, where):
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert f"the grammar's rule {rule} can come back to itself here" in caught.value.problem
    assert where in caught.value.problem
    assert "read at least one character" in caught.value.fix
    assert not _llama_cpp_samples(llama, source)


def test_the_rewrite_the_endless_expansion_error_suggests_is_one_llama_cpp_and_edgesdk_take(llama):
    """The fix written in the error (a ::= "z" a "x" | "y" "x"*) runs in the same harness that the grammars
    above do not finish in, and both engines match the texts of ``a ::= b a "x" | "y"`` with ``b ::= "z"?``."""
    rewritten = 'root ::= a\na ::= "z" a "x" | "y" "x"*'
    assert _llama_cpp_samples(llama, rewritten)
    with pytest.raises(GrammarError) as caught:
        parse_grammar(ENDLESS[0][0])
    assert 'a ::= "z" a "x" | "y" "x"*' in caught.value.fix
    for text in (b"y", b"yx", b"zyx", b"zzyxxx", b"zy", b"zzyx"):
        assert _verdict(rewritten, text) == llama.verdict(rewritten, text)


@pytest.mark.parametrize(("source", "where"), [('root ::= ("a" | )*', "line 1, column 18"),
                                           ('root ::= x+\nx ::= "a" | ', "line 1, column 11")])
def test_a_repetition_of_a_rule_with_an_empty_alternative_is_refused_at_the_repetition(llama, source, where):
    assert not llama.parses(source)
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert "this repetition repeats something with an empty alternative" in caught.value.problem
    assert where in caught.value.problem
    assert '("a")* rather than ("a" | )*' in caught.value.fix


@pytest.mark.parametrize(("source", "where"), [('root ::= "a" ""*', "line 1, column 16"),
                                           ('root ::= "b" "a"{0}?', "line 1, column 20")])
def test_a_repetition_of_a_symbol_that_writes_nothing_is_refused_as_llama_cpp_refuses_it(llama, source, where):
    assert not llama.parses(source)
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert "repeats a symbol that writes nothing" in caught.value.problem
    assert where in caught.value.problem


def _nullable_grammar(rng: random.Random) -> str:
    """Three rules of strings, classes, groups with empty alternatives, every repetition, references to later
    rules, and references back to any rule after a string, a class or group that may match nothing, or nothing."""
    names = ["root", "a", "b"]

    def atom(rule: int, depth: int) -> str:
        kind = rng.randrange(8 if depth < 2 else 3)
        if kind == 0:
            return rng.choice(['"x"', '"y"', '"xy"', '""'])
        if kind == 1:
            return rng.choice(["[xz]", "[^x]"])
        if kind == 2:
            return rng.choice(names[rule + 1:] or ['"z"'])
        if kind == 3:
            return "(" + " | ".join(sequence(rule, depth + 1) for _ in range(rng.randint(1, 3))) + ")"
        if kind == 7:
            return rng.choice(['"x" ', '("z"?) ', '[xz]? ', '("y"?)* ', '']) + rng.choice(names)
        repeated = atom(rule, depth + 1)
        return ('"y"' if repeated == '""' else repeated) + rng.choice(["?", "*", "+", "{0,2}", "{1,2}"])

    def sequence(rule: int, depth: int) -> str:
        return " ".join(atom(rule, depth) for _ in range(rng.randint(0, 3)))

    return "\n".join(f"{name} ::= " + " | ".join(sequence(rule, 0) or '""' for _ in range(rng.randint(1, 3)))
                     for rule, name in enumerate(names))


def test_generated_grammars_with_repetitions_of_empty_things_get_llama_cpp_s_parse_and_verdicts(llama):
    """Grammars edgesdk takes, llama.cpp takes, and the two match each text's prefixes alike (the empty text
    among them); grammars edgesdk refuses as left recursion, llama.cpp refuses. The grammars edgesdk refuses
    because their expansion never ends are not given to llama.cpp here: its grammar sampler would abort the
    test process (the tests above run it on such grammars in a process of its own)."""
    rng = random.Random(36)
    taken = 0
    for _ in range(60):
        source = _nullable_grammar(rng)
        try:
            parse_grammar(source)
            problem = None
        except GrammarError as error:
            problem = error.problem
        if problem is not None:
            if "can come back to itself" not in problem:
                assert not llama.parses(source), (source, problem)
            continue
        taken += 1
        assert llama.parses(source), source
        for _ in range(3):
            data = "".join(rng.choice("xyz") for _ in range(rng.randint(1, 4))).encode()
            for end in range(len(data) + 1):
                assert _verdict(source, data[:end]) == llama.verdict(source, data[:end]), (source, data[:end])
    assert taken >= 15


class _CountingMatcher(GrammarMatcher):
    """A matcher that sums the sizes of the stack sets its walks hand back: the union work of one step."""

    handed_back = 0

    def _expand(self, stack):
        result = super()._expand(stack)
        _CountingMatcher.handed_back += len(result)
        return result

    def _walk(self, starts, cached):
        result = super()._walk(starts, cached)
        _CountingMatcher.handed_back += len(result)
        return result


def _stacks_handed_back(count: int) -> int:
    matcher = _CountingMatcher(parse_grammar("root ::= " + " ".join(['"x"?'] * count) + ' "y"'))
    _CountingMatcher.handed_back = 0
    state = matcher.feed(matcher.start(), b"x" * count + b"y")
    assert matcher.accepts(state)
    return _CountingMatcher.handed_back


def test_a_run_of_optionals_costs_each_byte_one_walk_over_the_live_stacks():
    """After an ``x`` of ``"x"? "x"? ... "y"`` every live stack reads it, and the rest of the run follows each;
    walking the run once per byte (n stacks) rather than once per live stack (n * n) makes a text of the
    whole run cost n * n, not n * n * n: twice the run, four times the stacks, not eight."""
    small, large = _stacks_handed_back(100), _stacks_handed_back(200)
    assert large / small < 5, (small, large)


# ------------------------------------------------------------------------------------------ JSON schema

SCHEMAS = {
    "required and optional": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                              "required": ["a"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {"c": {"enum": ["red", "green", 1, None]}}, "required": ["c"]},
    "array bounds": {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "number"},
                                                             "minItems": 1, "maxItems": 3}}, "required": ["xs"]},
    "nested": {"type": "object", "properties": {"o": {"type": "object", "properties": {"k": {"type": "boolean"}},
                                                      "required": ["k"]}}, "required": ["o"]},
    "root array": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    "anyOf": {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
              "required": ["v"]},
    "const": {"type": "object", "properties": {"k": {"const": "fixed"}, "n": {"type": "number"}}, "required": ["k"]},
}
INSTANCES = {
    "required and optional": ['{"a":1}', '{"a":1,"b":"x"}', '{"b":"x","a":1}', '{"b":"x"}', "{}", '{"a":1.5}',
                              '{"a":-0}', '{"a":01}', '{ "a" : 1 }', '{"a":1,"c":2}', '{"a":1e3}', '{"a":-1}',
                              '{"a":1, "b":"\\u00e9"}', '{"a":1,"b":"\\/"}', '{"a":1,"b":"é😀"}', '{"a":1,"b":"\\q"}'],
    "enum": ['{"c":"red"}', '{"c":1}', '{"c":null}', '{"c":"blue"}', '{"c":1.0}', '{"c":"re"}'],
    "array bounds": ['{"xs":[]}', '{"xs":[1]}', '{"xs":[1,2,3]}', '{"xs":[1,2,3,4]}', '{"xs":[1.5e-3, -2]}',
                     '{"xs":[1 , 2]}', '{"xs":[-0.0]}', '{"xs":[.5]}', '{"xs":[1.]}', '{"xs":[1E+2]}'],
    "nested": ['{"o":{"k":true}}', '{"o":{}}', '{"o":{"k":1}}', '{"o":{"k":false} }'],
    "root array": ["[]", '["a"]', '["a","b"]', '["a","b","c"]', '[ "a" ]', "[1]"],
    "anyOf": ['{"v":1}', '{"v":null}', '{"v":"x"}', '{"v":-12}'],
    "const": ['{"k":"fixed"}', '{"k":"fixed","n":2.5}', '{"k":"other"}', '{"n":1}'],
}


def _schema_verdict(schema: dict, text: bytes) -> str:
    constraint = SchemaConstraint([bytes((byte,)) for byte in range(256)], compile_schema(schema))
    for byte in text:
        if not constraint.allows(byte):
            return "refused"
        constraint.advance(byte)
    return "complete" if constraint.complete else "prefix"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_instances_get_the_verdict_of_llama_cpp_s_schema_grammar(llama, name):
    """Against llama-cpp-python's port of llama.cpp's json_schema_to_grammar, run by llama.cpp's grammar
    sampler. The port spaces tokens with ``" "?`` only, where llama.cpp's converter now also takes a newline
    and up to 20 spaces or tabs of indentation (as the constraint here does), so the instances hold no
    newlines; its strings take raw control characters, which JSON (RFC 8259, section 7) and llama.cpp's
    converter refuse, so none holds one."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar = json_schema_to_gbnf(json.dumps(SCHEMAS[name]))
    for text in INSTANCES[name]:
        data = text.encode()
        for end in range(len(data) + 1):
            assert _schema_verdict(SCHEMAS[name], data[:end]) == llama.verdict(grammar, data[:end]), (name, data[:end])
