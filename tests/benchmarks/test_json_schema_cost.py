"""What the answer constraints cost on a real bundle (edgesdk/runtime/json_schema.py, grammar.py).

- per generated token: the time spent in the constraint's allows/advance calls during a schema-constrained
  answer, greedy and sampled, beside JSON mode's and a GBNF grammar's of the same object on the same prompt,
  and a free-text grammar's (a bullet list), as a share of the whole generation;
- the allowed set where few tokens fit: asking token by token against the vocabulary trie walk;
- the two grammars' cost in llama.cpp (llama-cpp-python), as time per token with against without.

    EDGESDK_BENCH_BUNDLE=DIR python -m pytest tests/benchmarks/test_json_schema_cost.py -m benchmark -s
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.benchmark

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
    "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Spanish"]}, "maxItems": 3}},
    "required": ["name", "age", "city", "languages"]}
PROMPT = "Describe a fictional person living in Paris as JSON."
# PERSON as a GBNF grammar, with the schema constraint's spacing
PERSON_GRAMMAR = r'''
root ::= ("{" ws "\"name\"" ws ":" ws string "," ws "\"age\"" ws ":" ws int "," ws "\"city\"" ws ":" ws string ","
  ws "\"languages\"" ws ":" ws "[" ws (language (ws "," ws language){0,2})? ws "]" ws "}")
language ::= "\"" ("English" | "French" | "German" | "Spanish") "\""
string ::= "\"" ([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\""
int ::= "-"? ([0-9] | [1-9] [0-9]+)
ws ::= | " " | "\n" [ \t]{0,20}
'''
LIST_GRAMMAR = r'root ::= ("- " [^\n]+ "\n"){3}'
LIST_PROMPT = "List three things to see in Paris."


class _Timed:
    """A constraint whose calls are timed."""

    def __init__(self, inner):
        self.inner, self.seconds, self.asked = inner, 0.0, 0

    def allows(self, token: int) -> bool:
        start = time.perf_counter()
        allowed = self.inner.allows(token)
        self.seconds += time.perf_counter() - start
        self.asked += 1
        return allowed

    def advance(self, token: int) -> None:
        start = time.perf_counter()
        self.inner.advance(token)
        self.seconds += time.perf_counter() - start

    @property
    def complete(self) -> bool:
        return self.inner.complete


def test_constraint_cost_per_token(smollm2_rpi5_bundle):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.json_mode import JsonConstraint
    from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(smollm2_rpi5_bundle.path, threads=2)
    tokenizer = runtime.tokenizer
    table = tokenizer.token_bytes()
    schema = compile_schema(PERSON)
    ids = tokenizer.prompt_ids(PROMPT, raw=False)
    SchemaConstraint(table, schema)._allowed_tokens()  # the vocabulary trie, built once per tokenizer
    from edgesdk.runtime.gbnf import parse_grammar
    from edgesdk.runtime.grammar import GrammarConstraint

    grammar, bullets = parse_grammar(PERSON_GRAMMAR), parse_grammar(LIST_GRAMMAR)
    stops = tokenizer.eos_token_ids
    list_ids = tokenizer.prompt_ids(LIST_PROMPT, raw=False)
    print(f"\n{'constraint':<12}{'temperature':>12}{'tokens':>8}{'stop':>16}{'allows calls':>14}{'us/token':>10}"
          f"{'share':>8}")
    for name, make, prompt in (("schema", lambda: SchemaConstraint(table, schema), ids),
                               ("json mode", lambda: JsonConstraint(table), ids),
                               ("grammar", lambda: GrammarConstraint(table, grammar, stops), ids),
                               ("list gbnf", lambda: GrammarConstraint(table, bullets, stops), list_ids)):
        for temperature in (0.0, 0.8):
            constraint = _Timed(make())
            start = time.perf_counter()
            tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=100, temperature=temperature,
                                                                          seed=1), tokenizer.eos_token_ids,
                                     constraint=constraint)
            total = time.perf_counter() - start
            print(f"{name:<12}{temperature:>12}{len(tokens):>8}{stats.stop_reason:>16}{constraint.asked:>14}"
                  f"{constraint.seconds / len(tokens) * 1e6:>10.0f}{constraint.seconds / total:>8.1%}")


def test_allowed_set_by_trie_against_token_by_token(smollm2_rpi5_bundle):
    from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema
    from edgesdk.runtime.session import open_runtime

    table = open_runtime(smollm2_rpi5_bundle.path, threads=2).tokenizer.token_bytes()
    schema = compile_schema(PERSON)
    bytewise = [bytes((b,)) for b in range(256)]
    SchemaConstraint(table, schema)._allowed_tokens()  # build the trie outside the timing
    print(f"\n{'after':<46}{'allowed':>9}{'token by token ms':>19}{'trie ms':>9}")
    for prefix in ('{"name": "Ann', '{"name": "Ann", "age": ', '{"name": "Ann", "age": 3',
                   '{"name": "Ann", "age": 3, "city": "Paris", "languages": ['):
        walker = SchemaConstraint(bytewise, schema)
        for byte in prefix.encode():
            walker.advance(byte)
        constraint = SchemaConstraint(table, schema)
        constraint.ways = walker.ways
        start = time.perf_counter()
        asked = {token for token in range(len(table)) if constraint._feed(constraint.ways, table[token] or b"")
                 and table[token]}
        one_by_one = time.perf_counter() - start
        start = time.perf_counter()
        walked = constraint._allowed_tokens()
        trie = time.perf_counter() - start
        assert walked == asked
        print(f"{prefix!r:<46}{len(walked):>9}{one_by_one * 1e3:>19.1f}{trie * 1e3:>9.1f}")


def test_grammar_cost_against_llamacpp(smollm2_rpi5_bundle):
    """The same two grammars through llama.cpp (llama-cpp-python's chat completion with a LlamaGrammar,
    Q4_0 of the same model): its time per token with the grammar against without, over the same number
    of tokens (the answer's length with the grammar), median of three alternating runs."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from edgesdk.models.sources import fetch_alias
    from tests.benchmarks.llamacpp import quantized_gguf

    source = fetch_alias("smollm2-135m", quiet=True)
    llm = llama_cpp.Llama(str(quantized_gguf(source, "Q4_0", source.parent)), n_ctx=512, n_threads=2,
                          n_threads_batch=2, verbose=False)
    print(f"\n{'llama.cpp':<12}{'tokens':>8}{'free ms':>9}{'grammar ms':>12}{'ms/token':>10}{'share':>8}")
    for name, source_text, prompt in (("person", PERSON_GRAMMAR, PROMPT), ("list gbnf", LIST_GRAMMAR, LIST_PROMPT)):
        grammar = llama_cpp.LlamaGrammar.from_string(source_text, verbose=False)
        messages = [{"role": "user", "content": prompt}]
        tokens = llm.create_chat_completion(messages, max_tokens=100, temperature=0.0,
                                            grammar=grammar)["usage"]["completion_tokens"]
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(3):
            for constrained in (False, True):
                time.sleep(0.5)
                start = time.perf_counter()
                answer = llm.create_chat_completion(messages, max_tokens=tokens, temperature=0.0,
                                                    grammar=grammar if constrained else None)
                times[constrained].append(time.perf_counter() - start)
                assert answer["usage"]["completion_tokens"] == tokens
        free, constrained = sorted(times[False])[1], sorted(times[True])[1]
        print(f"{name:<12}{tokens:>8}{free * 1e3:>9.0f}{constrained * 1e3:>12.0f}"
              f"{(constrained - free) / tokens * 1e3:>10.2f}{(constrained - free) / constrained:>8.1%}")
