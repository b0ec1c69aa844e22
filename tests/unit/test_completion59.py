"""Text that is not UTF-8 (a lone surrogate from a ``\\ud800`` JSON escape) on the OpenAI and llama-server routes: the
400 names the exact field (a chat message's ``content``, or the part of it, not ``messages`` as a whole) and ends with
the fix the check carries, as the Responses route's refusal does ("send each character whole: both \\uXXXX escapes of
a surrogate pair together, or the character itself"), where before it gave the problem alone."""

from __future__ import annotations

import pytest

from tests.unit.test_serve_infill40 import (  # noqa: F401  (fixtures)
    qwen_bundle,
    qwen_runtime,
)

LONE = "\ud800"  # what a JSON "\ud800" escape decodes to
FIX = "send each character whole: both \\uXXXX escapes of a surrogate pair together, or the character itself"
ASKED = {"role": "user", "content": "Hello"}


def _refused(served, path: str, body: dict) -> dict:
    status, answer = served.post(path, body)
    assert status == 400, answer
    return answer["error"]


def _says_problem_and_fix(error: dict, named: str) -> None:
    assert error["message"].startswith(f"{named} is not valid UTF-8 (U+D800"), error
    assert error["message"].endswith(FIX), error
    assert error["code"] == "not_utf8", error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/apply-template"])
def test_a_chat_message_content_not_utf8_names_that_message_s_content_with_the_fix(served, path):
    error = _refused(served, path, {"messages": [ASKED, {"role": "assistant", "content": "Hi"},
                                                 {"role": "user", "content": "more " + LONE}], "max_tokens": 1})
    assert error["param"] == "messages[2].content"
    _says_problem_and_fix(error, "messages[2].content")
    assert "(U+D800 at character 5)" in error["message"]


def test_a_content_part_not_utf8_is_named_as_that_part(served):
    """The joined content's character index points into no part the client wrote: the part is named instead."""
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": LONE + " second"}]
    error = _refused(served, "/v1/chat/completions", {"messages": [ASKED, {"role": "assistant", "content": "Hi"},
                                                                   {"role": "user", "content": parts}],
                                                      "max_tokens": 1})
    assert error["param"] == "messages[2].content[1].text"
    _says_problem_and_fix(error, "messages[2].content[1].text")
    assert "(U+D800 at character 0)" in error["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/completion"])
def test_a_prompt_not_utf8_is_named_as_the_field_with_the_fix(served, path):
    error = _refused(served, path, {"prompt": "hi " + LONE, "max_tokens": 1})
    assert error["param"] == "prompt"
    _says_problem_and_fix(error, "'prompt'")


@pytest.mark.parametrize("prompt", [["fine", "hi " + LONE], [12, "hi " + LONE]])
def test_one_of_several_prompts_or_a_mixed_prompt_part_not_utf8_is_named_with_the_fix(served, prompt):
    error = _refused(served, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert error["param"] == "prompt"
    _says_problem_and_fix(error, "'prompt[1]'")


def test_tokenize_content_not_utf8_carries_the_fix(served):
    error = _refused(served, "/tokenize", {"content": ["a", LONE]})
    assert error["param"] == "content"
    _says_problem_and_fix(error, "'content[1]'")


def test_a_logit_bias_key_not_utf8_carries_the_fix(served):
    error = _refused(served, "/v1/completions", {"prompt": "hi", "max_tokens": 1, "logit_bias": {"a" + LONE: 5}})
    assert error["param"] == "logit_bias"
    _says_problem_and_fix(error, "the logit_bias key 'a\\ud800'")


def test_a_suffix_not_utf8_carries_the_fix(qwen_runtime):  # noqa: F811
    from edgesdk.serve.api import ApiError, parse_text_request
    from edgesdk.serve.completion import Completer, ServeDefaults

    completer = Completer(qwen_runtime, ServeDefaults(max_tokens=4))
    with pytest.raises(ApiError) as refused:
        parse_text_request({"prompt": "def f(x):", "suffix": "\n" + LONE}, completer=completer)
    error = refused.value.body()["error"]
    assert error["param"] == "suffix"
    _says_problem_and_fix(error, "'suffix'")
