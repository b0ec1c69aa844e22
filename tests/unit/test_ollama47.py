"""serve's Ollama API (edgesdk/serve/ollama.py) where Ollama's reading differs from a plain check:

* ``options``: Ollama's ``Options.FromMap`` (api/types.go) refuses a load option (``num_gpu``, ``num_thread``,
  ``num_batch``, ``main_gpu``, ``use_mmap``) of the wrong type; llm/server.go reads any ``num_predict`` below 0 as
  no limit, its runner any ``num_keep`` below 0 as the whole prompt, and its sampler (sample/samplers.go,
  ``NewSampler``) clamps ``temperature``, ``top_p``, ``min_p`` and ``repeat_penalty`` into range and fixes any seed
  but -1; each value Ollama takes answers as the value it reads;
* a body with ``"model": ""`` beside the deprecated ``name`` (a Go client's), read as ShowHandler reads it;
* /api/generate on a bundle without a chat template: Ollama's default template ``{{ .Prompt }}``;
* a raw prompt's thinking split off by routes.go's generic thinking parser.

Real servers over the tiny bundle (256 tokens of context)."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.session import open_runtime
from edgesdk.runtime.text import pieces_text
from edgesdk.serve.completion import ServeDefaults
from tests._utils.tiny import CHAT_TEMPLATE
from tests.unit.test_serve import Served

NAME = "tiny-host"


@pytest.fixture(scope="module")
def served(tiny_bundle):
    server = Served(open_runtime(tiny_bundle.path, threads=1), ServeDefaults(max_tokens=8))
    yield server
    server.close()


def _generate(served, options: dict, **fields) -> dict:
    status, body = served.post("/api/generate", {"model": NAME, "prompt": "Once upon a time", "stream": False,
                                                 "options": options, **fields})
    assert status == 200, body
    return body


def _answer(body: dict) -> tuple:
    return body["response"], body["eval_count"], body["done_reason"]


@pytest.mark.parametrize(("given", "read"), [
    ({"num_predict": 6, "temperature": -1.0}, {"num_predict": 6, "temperature": 0.0}),  # below 0: greedy
    ({"num_predict": 6, "temperature": 1.0, "seed": 3, "top_p": 1.5}, {"num_predict": 6, "temperature": 1.0,
                                                                       "seed": 3, "top_p": 1.0}),
    ({"num_predict": 6, "temperature": 1.0, "seed": 3, "min_p": -0.5}, {"num_predict": 6, "temperature": 1.0,
                                                                        "seed": 3, "min_p": 0.0}),
    ({"num_predict": 6, "temperature": 1.0, "seed": 3, "min_p": 1.5}, {"num_predict": 6, "temperature": 1.0,
                                                                       "seed": 3, "min_p": 1.0}),
    ({"num_predict": 6, "temperature": 1.0, "seed": 3, "repeat_penalty": 0}, {"num_predict": 6, "temperature": 1.0,
                                                                              "seed": 3, "repeat_penalty": 1.0}),
    ({"num_predict": -3, "temperature": 0}, {"num_predict": -1, "temperature": 0}),  # below 0: no limit
    ({"num_predict": 6, "temperature": 1.0, "seed": 3, "top_p": 0}, {"num_predict": 6, "temperature": 1.0,
                                                                     "seed": 3, "top_k": 1}),  # the likeliest alone
    ({"num_predict": 6, "temperature": 1.0, "seed": -5}, {"num_predict": 6, "temperature": 1.0, "seed": 2**64 - 5}),
])
def test_a_number_ollama_takes_answers_as_the_value_ollama_reads(served, given, read):
    """Each of these was a 400 here, where Ollama answers it: the answer is the one of the value Ollama reads."""
    fields = {"shift": False}  # no limit: the answer stops where the context fills
    assert _answer(_generate(served, given, **fields)) == _answer(_generate(served, read, **fields))


def test_a_num_keep_below_minus_one_keeps_the_whole_prompt(served):
    """runner.go ``NewSequence``: ``if params.numKeep < 0 { params.numKeep = len(inputs) }``; the answer runs past
    the full context (256 tokens), which shifts keeping the prompt, as with -1."""
    options = {"num_predict": 300, "temperature": 0}
    kept = _generate(served, {**options, "num_keep": -1})
    assert kept["eval_count"] == 300
    assert _answer(_generate(served, {**options, "num_keep": -7})) == _answer(kept)


@pytest.mark.parametrize(("name", "value", "kind"), [("num_gpu", "x", "integer"), ("num_thread", "4", "integer"),
                                               ("num_batch", True, "integer"), ("main_gpu", [0], "integer"),
                                               ("use_mmap", "yes", "boolean"), ("use_mmap", 1, "boolean")])
def test_a_load_option_of_the_wrong_type_is_refused_as_ollama_refuses_it(served, name, value, kind):
    """Ollama's ``Options.FromMap``: ``option %q must be of type integer`` (or boolean), before the model loads;
    here a 400 naming the option, on both routes, a load request too."""
    bodies = [("/api/generate", {"prompt": "Once upon a time"}), ("/api/chat", {"messages": [
        {"role": "user", "content": "hi"}]}), ("/api/generate", {})]
    for path, body in bodies:
        status, payload = served.post(path, {"model": NAME, "stream": False, "options": {name: value}, **body})
        assert status == 400, (path, payload)
        assert set(payload) == {"error"}
        assert f'option "{name}" must be of type {kind}' in payload["error"]
        assert f"'options.{name}'" in payload["error"]


def test_load_options_of_their_type_change_nothing(served):
    options = {"num_predict": 4, "temperature": 0}
    plain = _answer(_generate(served, options))
    loaded = {"num_gpu": 99, "num_thread": 2.0, "num_batch": 512, "main_gpu": 0, "use_mmap": False}
    assert _answer(_generate(served, {**options, **loaded})) == plain


def test_a_body_with_an_empty_model_and_the_deprecated_name_names_the_model(served):
    """api/types.go's ShowRequest has ``Model`` and the deprecated ``Name`` without omitempty, so a Go client that
    fills ``Name`` sends ``"model": ""`` too; Ollama's ShowHandler reads ``name`` where ``model`` is empty."""
    status, shown = served.post("/api/show", {"model": "", "name": NAME})
    assert status == 200, shown
    assert "completion" in shown["capabilities"]
    status, loaded = served.post("/api/generate", {"model": "", "name": NAME})
    assert (status, loaded["done_reason"]) == (200, "load")
    status, payload = served.post("/api/show", {"model": "", "name": ""})
    assert status == 400
    assert "'model' is required" in payload["error"]


# ------------------------------------------------------------------------------------------------ no chat template


@pytest.fixture(scope="module")
def untemplated(tiny_bundle):
    """A server over the tiny bundle without a chat template (a base model's bundle)."""
    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source = None
    runtime.tokenizer._template = None
    server = Served(runtime, ServeDefaults(max_tokens=8))
    yield server
    server.close()


def _completed(server, prompt: str) -> dict:
    status, body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0})
    assert status == 200, body
    return body


def test_generate_on_a_bundle_without_a_chat_template_renders_the_prompt_as_given(untemplated):
    """Ollama gives a model without a template its ``DefaultTemplate``, ``{{ .Prompt }}``: /api/generate answers
    the prompt as given (``system`` unread by that template), as /api/show's "completion" capability says it does,
    where it was a 400 about messages the client never sent."""
    prompt = "Once upon a time"
    expected = _completed(untemplated, prompt)
    tokenizer = untemplated.completer.runtime.tokenizer
    for fields in ({}, {"system": "Be brief."}):
        body = _generate(untemplated, {"num_predict": 6, "temperature": 0}, prompt=prompt, **fields)
        assert body["response"] == expected["choices"][0]["text"]
        assert body["prompt_eval_count"] == expected["usage"]["prompt_tokens"]
        # the last object's context: the prompt and the answer tokenized as one, as routes.go answers it
        assert body["context"] == tokenizer.encode(prompt + body["response"], add_special_tokens=False)
    status, shown = untemplated.post("/api/show", {"model": NAME})
    assert status == 200
    assert "completion" in shown["capabilities"]


def test_generate_without_a_chat_template_resumes_from_its_context(untemplated):
    """routes.go: the context's text (its ids detokenized) goes in front of the rendered prompt."""
    options = {"num_predict": 6, "temperature": 0}
    first = _generate(untemplated, options, prompt="Once upon a time")
    text = pieces_text(untemplated.completer.runtime.tokenizer, first["context"]) + " there was"
    again = _generate(untemplated, options, prompt=" there was", context=first["context"])
    expected = _completed(untemplated, text)
    assert again["response"] == expected["choices"][0]["text"]
    assert again["prompt_eval_count"] == expected["usage"]["prompt_tokens"]
    tokenizer = untemplated.completer.runtime.tokenizer
    assert again["context"] == tokenizer.encode(text + again["response"], add_special_tokens=False)
    streamed = _lines(untemplated, {"model": NAME, "prompt": " there was", "context": first["context"],
                                    "options": options})
    assert "".join(line["response"] for line in streamed) == again["response"]
    assert streamed[-1]["context"] == again["context"]


def _lines(server, body: dict) -> list[dict]:
    """The objects of a streamed /api/generate answer."""
    status, headers, payload = server.request("POST", "/api/generate", body)
    assert status == 200, payload
    return [json.loads(line) for line in payload.decode().splitlines() if line]


# ------------------------------------------------------------------------------------------------ raw and thinking

# a template that thinks (its assistant turn opens a <think> block where enable_thinking is true)
THINKS = CHAT_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}",
    "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking %}<think>{% endif %}{% endif %}")
RAW_PROMPT = "<|im_start|>user\nTell me about the fox.<|im_end|>\n<|im_start|>assistant\n<think>"


@pytest.fixture(scope="module")
def thinks(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source = THINKS
    runtime.tokenizer._template = None
    server = Served(runtime, ServeDefaults(max_tokens=8))
    yield server
    server.close()


def test_a_raw_prompt_s_thinking_is_split_off_as_ollama_splits_it(thinks):
    """routes.go: raw skips the template, not the generic thinking parser, which runs where ``think`` is true (left
    out on a model that thinks, true) and starts inside the block where the prompt ends with the opening tag: the
    answer is ``thinking``, not ``response``. ``think`` false leaves the answer as the model wrote it."""
    options = {"num_predict": 8, "temperature": 0}
    plain = _generate(thinks, options, prompt=RAW_PROMPT, raw=True, think=False)
    assert "thinking" not in plain
    written = plain["response"]
    assert written.strip()
    for fields in ({}, {"think": True}):
        split = _generate(thinks, options, prompt=RAW_PROMPT, raw=True, **fields)
        assert split["response"] == ""
        assert split["thinking"] == written.strip()
        assert split["eval_count"] == plain["eval_count"]
        streamed = _lines(thinks, {"model": NAME, "prompt": RAW_PROMPT, "raw": True, "options": options, **fields})
        assert "".join(line.get("thinking", "") for line in streamed) == split["thinking"]
        assert "".join(line["response"] for line in streamed) == ""
    # where the prompt does not open the block, the answer is the response until the model writes one
    opened_not = _generate(thinks, options, prompt=RAW_PROMPT[:-len("<think>")], raw=True)
    closed = _generate(thinks, options, prompt=RAW_PROMPT[:-len("<think>")], raw=True, think=False)
    assert opened_not["response"] == closed["response"]
