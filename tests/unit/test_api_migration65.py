"""A llama-cpp-python app ported to ``edgesdk.Model`` (65th stop), on the tiny bundle:

- a prompt past load()'s ``n_ctx`` but within the bundle's context named a rebuild to the context the bundle had
  already (``build_bundle(..., max_context=N)``): the fix is a larger ``n_ctx``, in load()'s words, not ``-c``;
- ``grammar=LlamaGrammar.from_string(text)`` was refused with a generic fix: the GBNF text it keeps is read, and a
  grammar object whose text cannot be read is refused naming ``grammar=<the GBNF string>`` and, for
  ``from_json_schema``, ``response_format``;
- ``Model(model_path=...)`` was a bare TypeError naming ``path``;
- ``Llama(type_k=, main_gpu=)`` were told "did you mean top_k / min_p?", llama.cpp's other knobs got no hint, and
  ``verbose=False`` / ``embedding=True`` / ``logits_all`` (which change nothing here) were refused;
- ``stopping_criteria`` / ``logits_processor`` callbacks were refused with the route's whole field list;
- a route's refusal that says what to do got a generic fix pointing to the HTTP server's section;
- an answer under tools cut in the JSON after its call's whole arguments was logged, in edgesdk serve's words, as
  cut before its arguments were whole.
"""

from __future__ import annotations

import logging

import pytest

import edgesdk
from edgesdk.bundle import context_fix

GRAMMAR = 'root ::= "yes" | "no"'
MESSAGES = [{"role": "user", "content": "hi"}]


class LlamaGrammar:
    """llama-cpp-python's ``llama_cpp.LlamaGrammar`` as it holds a grammar (llama_cpp/llama_grammar.py: ``__init__``
    keeps the GBNF text as ``_grammar`` and the start rule as ``_root``, "root"; ``from_string`` and
    ``from_json_schema`` build one of text); llama-cpp-python is not installed here."""

    def __init__(self, *, _grammar: str, root: str = "root"):
        self._grammar, self._root = _grammar, root

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(_grammar=grammar)


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        yield loaded


def _prompt_of(model, least: int) -> str:
    """A text of at least ``least`` tokens and fewer than the bundle's context."""
    text = "hello"
    while len(model.tokenize(text)) < least:
        text += " hello"
    assert len(model.tokenize(text)) < model.max_context
    return text


# ------------------------------------------------------------------------------------------- n_ctx below the bundle's

def test_a_prompt_past_n_ctx_but_within_the_bundle_names_a_larger_n_ctx(tiny_bundle, model):
    prompt = _prompt_of(model, 80)
    tokens = len(model.tokenize(prompt))
    with edgesdk.load(tiny_bundle.path, threads=1, n_ctx=64) as held:
        with pytest.raises(edgesdk.RequestError) as caught:
            held(prompt, max_tokens=1)
    fix = caught.value.fix
    assert f"load(..., n_ctx={tokens}) or more, up to the bundle's {model.max_context}" in fix, fix
    assert "build_bundle" not in fix, fix  # no rebuild to a context the bundle has
    assert "-c" not in fix, fix
    assert fix in str(caught.value)


def test_context_fix_words_the_held_context_in_each_caller_s_terms():
    python = context_fix("shorten the prompt", 400, 512, 401, terms="python", built=512)
    assert python == ("shorten the prompt, or load the bundle with load(..., n_ctx=401) or more, up to the bundle's "
                      "512 (n_ctx=0: all of it)")
    past = context_fix("shorten the prompt", 400, 1024, 600, terms="python", built=512)
    assert "load(..., n_ctx=N) up to the bundle's 512 holds fewer than 600 tokens" in past
    assert "build_bundle(..., max_context=1024)" in past
    assert "-c" not in past
    unknown = context_fix("shorten it", 400, 512, None, terms="python", built=512)
    assert "a larger load(..., n_ctx=N), up to the bundle's 512" in unknown
    assert "-c" not in unknown
    # the command line's words stay -c
    assert context_fix("shorten the prompt", 400, 512, 401, built=512) == (
        "shorten the prompt, or raise -c to 401 or more, up to the bundle's 512 (-c 0: all of it)")


# ------------------------------------------------------------------------------------------------ LlamaGrammar

def test_a_llama_grammar_object_is_read_as_its_gbnf_text(model):
    text = model("Answer:", max_tokens=4, grammar=LlamaGrammar.from_string(GRAMMAR))["choices"][0]["text"]
    assert text in ("yes", "no")
    assert text == model("Answer:", max_tokens=4, grammar=GRAMMAR)["choices"][0]["text"]
    chat = model.create_chat_completion(MESSAGES, max_tokens=4, grammar=LlamaGrammar.from_string(GRAMMAR))
    assert chat["choices"][0]["message"]["content"] in ("yes", "no")


def test_a_grammar_object_without_its_text_is_refused_naming_the_string_and_response_format(model):
    class Parsed:  # llama-cpp-python's older LlamaGrammar kept parsed rules, not the text
        grammar = object()

    with pytest.raises(edgesdk.RequestError) as caught:
        model("Answer:", max_tokens=2, grammar=Parsed())
    assert caught.value.param == "grammar"
    assert "grammar is a Parsed object; expected GBNF text" in str(caught.value)
    assert "grammar=<the GBNF string>" in caught.value.fix
    assert "response_format={'type': 'json_object', 'schema': schema}" in caught.value.fix
    with pytest.raises(edgesdk.RequestError) as caught:
        model("Answer:", max_tokens=2, grammar=LlamaGrammar(_grammar='start ::= "a"', root="start"))
    assert "start rule is 'start'" in str(caught.value)
    assert "root" in caught.value.fix


# ------------------------------------------------------------------------------------------------- model_path

def test_model_path_names_the_bundle_as_path_does(tiny_bundle):
    with edgesdk.Model(model_path=tiny_bundle.path, threads=1) as model:
        assert model.runtime.bundle.path == tiny_bundle.path
    with edgesdk.load(model_path=str(tiny_bundle.path), threads=1) as model:
        assert model.runtime.bundle.path == tiny_bundle.path
    with pytest.raises(edgesdk.EdgeSDKError, match="both name the bundle") as caught:
        edgesdk.load(tiny_bundle.path, model_path=tiny_bundle.path)
    assert caught.value.fix == "pass one of them"


# --------------------------------------------------------------------------------------- Llama(...) arguments

@pytest.mark.parametrize(("argument", "hint"), [
    ("type_k", "the KV cache's type and layout are the bundle's"),
    ("main_gpu", "come from the bundle's target profile: pass backend="),
    ("n_batch", "the prompt is prefilled as the backend runs the bundle's graph"),
    ("n_ubatch", "the prompt is prefilled as the backend runs the bundle's graph"),
    ("use_mmap", "loads the bundle's weights itself"),
    ("use_mlock", "loads the bundle's weights itself"),
    ("flash_attn", "attention runs as the bundle's graph computes it"),
    ("offload_kqv", "come from the bundle's target profile"),
    ("tensor_split", "come from the bundle's target profile"),
    ("split_mode", "come from the bundle's target profile"),
    ("rope_freq_base", "the model's rotary settings are its config's"),
    ("numa", "threads=N sets how many"),
    ("kv_overrides", "no GGUF key-value metadata"),
    ("chat_handler", "the bundle's own chat template"),
    ("tokenizer", "the bundle carries its model's tokenizer"),
])
def test_llama_s_constructor_arguments_are_refused_with_their_reason(tiny_bundle, argument, hint):
    with pytest.raises(edgesdk.EdgeSDKError) as caught:
        edgesdk.load(tiny_bundle.path, **{argument: 1})
    assert f"which it does not take; {argument}: " in caught.value.problem
    assert hint in caught.value.problem
    assert "did you mean" not in caught.value.problem  # never a sampler guessed for a constructor argument


def test_llama_s_switches_that_change_nothing_are_taken_with_a_note(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, verbose=False, embedding=True, logits_all=False) as model:
        notes = [note for note in model.notes if note.split("=")[0] in ("verbose", "embedding", "logits_all")]
        assert [note.split(":")[0] for note in notes] == ["verbose=False", "embedding=True", "logits_all=False"]
        assert all(": not used: " in note for note in notes)
        assert model.embed("hello")  # what embedding=True asks for, without it
    with pytest.raises(edgesdk.EdgeSDKError, match=r"load\(\): verbose='no': expected True or False") as caught:
        edgesdk.load(tiny_bundle.path, verbose="no")
    assert caught.value.fix == "leave verbose out"


# ------------------------------------------------------------------------------------------------- callbacks

@pytest.mark.parametrize(("field", "fixes"), [
    ("stopping_criteria", ("stop=[...]", "stream=True and break")),
    ("logits_processor", ("logit_bias=", "grammar=", "response_format=")),
])
def test_llama_s_callbacks_are_refused_with_what_does_their_work(model, field, fixes):
    with pytest.raises(edgesdk.RequestError) as caught:
        model("hi", max_tokens=1, **{field: [lambda ids, scores: False]})
    assert caught.value.param == field
    assert all(fix in caught.value.fix for fix in fixes), caught.value.fix
    assert "max_tokens," not in caught.value.fix  # not the route's list of fields
    assert model("hi", max_tokens=1, **{field: None})["choices"]  # llama-cpp-python's default still passes


# ----------------------------------------------------------------------------------------------- request fixes

def test_a_route_s_refusal_keeps_its_own_fix_and_else_points_to_from_python(model):
    with pytest.raises(edgesdk.RequestError) as caught:
        model("hi", max_tokens=1, n=2)  # "...; leave 'n' out"
    assert caught.value.fix == "leave 'n' out"
    with pytest.raises(edgesdk.RequestError) as caught:
        model("hi", max_tokens=1, grammar="root ::= foo")
    assert caught.value.fix == "define it: foo ::= ..."
    with pytest.raises(edgesdk.RequestError) as caught:
        model.create_chat_completion([{"role": "bogus", "content": "hi"}], max_tokens=1)
    assert "From Python" in caught.value.fix
    assert "Serving over HTTP" not in caught.value.fix


# --------------------------------------------------------------------------------------- a tool call cut short

def test_a_call_cut_after_its_whole_arguments_is_not_said_cut_in_them(caplog):
    from edgesdk.serve.tools import answer_message

    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.tools"):
        fields, finish = answer_message('{"tool_call": {"name": "f", "arguments": {"city": "Paris"}}', "length")
    assert finish == "length"
    assert fields["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    line = caplog.records[-1].getMessage()
    assert "after its tool call's arguments (they are whole JSON)" in line
    assert "before its tool call's arguments were whole" not in line
    assert not line.startswith("edgesdk serve:")  # the Python API's Model reads the answer too
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.tools"):
        answer_message('{"tool_call": {"name": "f", "arguments": {"city": "Pa', "length")
    assert "before its tool call's arguments were whole" in caplog.records[-1].getMessage()
