"""What the last read of review 55 found: load()'s hints for a request's fields that no method takes as told, a
template variable of the wrong kind no longer named, and an HTTP fill-in-the-middle prompt past the context blamed on
its prompt where its suffix filled it.

- ``edgesdk.load(b, n_predict=8)`` was told "pass n_predict= to create_completion / create_chat_completion", both of
  which refuse n_predict by name (create_completion max_completion_tokens too); tools and echo were sent to both.
- A template that reads a variable unguarded (``{{ n_days + 1 }}``) fails without it too (UndefinedError), so a
  variable of the wrong kind (``n_days="3"``: TypeError) was blamed on the template.
- ``POST /v1/completions`` with a ``suffix`` that overflowed the context was refused "shorten the prompt" naming
  ``prompt``; the Python API's own check of it moved there.
"""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.errors import BundleError, EdgeSDKError
from tests.unit.test_serve_infill40 import fim_served, qwen_bundle, qwen_runtime  # noqa: F401  (fixtures)
from tests.unit.test_text55 import _tokenizer, tokenizer_json  # noqa: F401  (fixture)

# ------------------------------------------------------------------------------------------------ load()'s hints


@pytest.mark.parametrize(("name", "value", "hint"), [
    ("n_predict", 8, "n_predict: pass max_tokens=N"),
    ("max_completion_tokens", 8, "pass max_completion_tokens= to create_chat_completion, or max_tokens=N to load()"),
    ("tools", [], "tools: a request's field: pass tools= to create_chat_completion"),
    ("tool_choice", "auto", "tool_choice: a request's field: pass tool_choice= to create_chat_completion"),
    ("echo", True, "echo: a request's field: pass echo= to create_completion"),
    ("suffix", "}", "suffix: a request's field: pass suffix= to create_completion"),
    ("stop", ["\n"], "stop: a request's field: pass stop= to create_completion / create_chat_completion"),
])
def test_load_sends_a_request_s_field_to_the_method_that_takes_it(tiny_bundle, name, value, hint):
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tiny_bundle.path, threads=1, **{name: value})
    problem = refused.value.problem
    assert hint in problem
    if name in ("n_predict", "max_completion_tokens"):  # create_completion refuses both by name
        assert f"pass {name}= to create_completion" not in problem
    if name in ("tools", "tool_choice", "echo", "suffix"):  # one method's field alone
        assert "create_completion / create_chat_completion" not in problem


# ------------------------------------------------------------------------------------------------ chat templates

UNGUARDED_VARIABLE = "{% for m in messages %}<U>{{ m['content'] }}{% endfor %}<A>{{ n_days + 1 }}"


def test_a_variable_the_template_reads_unguarded_is_named_when_of_the_wrong_kind(tokenizer_json, tmp_path):  # noqa: F811
    """Without the variable the template fails too, with jinja2's UndefinedError: not the same failure, so the
    variable (a str where the template adds a number) is at fault, not the template."""
    tokenizer = _tokenizer(tokenizer_json, tmp_path, UNGUARDED_VARIABLE, {"n_days": "3"})
    with pytest.raises(BundleError) as caught:
        tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert "failed with the template variables n_days (chat_template_kwargs): TypeError" in caught.value.problem
    assert "leave them out" in caught.value.fix
    tokenizer.template_kwargs = {"n_days": 3}
    assert tokenizer.render_chat([{"role": "user", "content": "hi"}]) == "<U>hi<A>4"


# ------------------------------------------------------------------------------------------------ FIM past the context


def test_an_http_suffix_past_the_context_is_refused_naming_the_suffix(fim_served, qwen_runtime):  # noqa: F811
    plain = qwen_runtime.tokenizer.encode_plain
    suffix = "y = 2\n" * 100
    status, body = fim_served.post("/v1/completions", {"prompt": "x", "suffix": suffix, "max_tokens": 2})
    assert status == 400, body
    error = body["error"]
    assert (error["param"], error["code"]) == ("suffix", "context_length_exceeded")
    from edgesdk.runtime.fim import framing_count  # after: the old code lacked it, and named the prompt

    assert (f"the prompt's {len(plain('x'))}, the suffix's {len(plain(suffix))}, "
            f"{framing_count(qwen_runtime.tokenizer)} special tokens") in error["message"]
    assert "shorten the suffix (or the prompt)" in error["message"]
    assert "POST /tokenize" in error["message"]
    prompt = "x = 1\n" * 100
    status, body = fim_served.post("/v1/completions", {"prompt": prompt, "suffix": "}", "max_tokens": 2})
    assert (status, body["error"]["param"], body["error"]["code"]) == (400, "prompt", "context_length_exceeded")
    assert "shorten the prompt (or the suffix)" in body["error"]["message"]
    status, body = fim_served.post("/v1/completions", {"prompt": "def f(x):\n    return ", "suffix": "\n",
                                                       "max_tokens": 2})
    assert status == 200, body


def test_the_python_api_refuses_it_through_the_route_s_check_in_its_own_terms(qwen_bundle):  # noqa: F811
    with edgesdk.load(qwen_bundle.path, threads=1, max_tokens=4) as model:
        plain = model.runtime.tokenizer.encode_plain
        suffix = "y = 2\n" * 100
        for streamed in (False, True):
            with pytest.raises(RequestError) as refused:
                model.create_completion("x", suffix=suffix, stream=streamed)
            error = refused.value
            assert error.param == "suffix"
            assert f"the prompt's {len(plain('x'))}, the suffix's {len(plain(suffix))}" in error.problem
            assert "model.tokenize(text)" in error.problem
            assert "POST /tokenize" not in error.problem
            assert error.fix.startswith("shorten the suffix")
        with pytest.raises(RequestError, match=r"the prompt's 300, the suffix's 1") as refused:
            model.create_completion([5] * 300, suffix="}")
        assert refused.value.param == "prompt"
