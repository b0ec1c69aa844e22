"""Review fixes in edgesdk/serve/api.py, edgesdk/serve/openai_answer.py and edgesdk/serve/infill.py."""

from __future__ import annotations

import pytest

from tests.unit.test_serve_api57 import codellama_completer  # noqa: F401 (a fixture)

pytest.importorskip("torch")


# ------------------------------------------------------------------------------- a mixed prompt before a suffix


def test_a_mixed_prompt_before_a_suffix_has_one_bos_in_front_of_the_fim_prefix(codellama_completer):  # noqa: F811
    from edgesdk.runtime.fim import leading_bos
    from edgesdk.serve.api import parse_text_request

    tokenizer = codellama_completer.runtime.tokenizer
    fim, bos = tokenizer.fim_tokens(), leading_bos(tokenizer)
    assert bos is not None  # the Llama 2 tokenizer adds one
    word = tokenizer.encode_plain("end")[0]
    mixed = parse_text_request({"prompt": ["the cat", word], "suffix": "the end"}, completer=codellama_completer)
    ids = list(mixed.prompt_tokens)
    assert ids.count(bos) == 1, ids  # the old code gave [BOS, FIM_PRE, BOS, ...]
    assert ids[:2] == [bos, fim.pre]
    # the same prompt as one string gives the same FIM prompt
    text = parse_text_request({"prompt": "the cat end", "suffix": "the end"}, completer=codellama_completer)
    assert ids[ids.index(fim.suf):] == list(text.prompt_tokens)[list(text.prompt_tokens).index(fim.suf):]
    # without a suffix the mixed prompt keeps its BOS, as llama-server's tokenize_mixed adds it
    plain = parse_text_request({"prompt": ["the cat", word]}, completer=codellama_completer)
    assert plain.prompt_tokens[0] == bos


# ------------------------------------------------------------------------------------- /infill's refusals


@pytest.mark.parametrize(("field", "value"), [("n", 2), ("suffix", "x = 1\n"), ("best_of", 3)])
def test_an_infill_field_refusal_names_the_infill_route_not_completion(codellama_completer, field, value):  # noqa: F811
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.infill import parse_infill_request

    with pytest.raises(ApiError) as caught:
        parse_infill_request({"input_prefix": "def f(", "input_suffix": ")", field: value}, codellama_completer)
    assert caught.value.param == field
    assert "/infill here" in caught.value.message, caught.value.message  # the old code said "/completion here"
    assert "/completion" not in caught.value.message


# ------------------------------------------------------------------------------ a body that is no JSON object


@pytest.mark.parametrize(("body", "kind"), [(None, "null"), ([{"prompt": "x"}], "an array"), ("x", "a string"),
                                            (5, "a number"), (True, "a boolean")])
def test_a_body_that_is_no_json_object_is_named_in_json_s_words(body, kind):
    from edgesdk.serve.api import ApiError, parse_chat_request

    with pytest.raises(ApiError) as caught:
        parse_chat_request(body)
    # the old message said Python's NoneType, list, str, int, bool
    assert caught.value.message == f"the request body must be a JSON object, got {kind}"


# ------------------------------------------------------------------------------------- 'messages' refused


@pytest.mark.parametrize(("body", "got"), [({}, "got none (the field is missing)"),
                                           ({"messages": {"role": "user", "content": "hi"}},
                                            'got {"role": "user", "content": "hi"}'),
                                           ({"messages": []}, "got []"), ({"messages": "hi"}, 'got "hi"'),
                                           ({"messages": None}, "got null"), ({"messages": True}, "got true"),
                                           ({"messages": {"content": "héé" * 30}},  # cut to 60 characters
                                            'got {"content": "' + ("héé" * 30)[:44] + "..."),
                                           ])
def test_messages_that_are_no_array_are_refused_with_what_came(body, got):
    """The refusal said what 'messages' must be but not what the request sent (one message object unwrapped, none
    at all, an empty array); what came is shown as JSON (null, true, "hi"), not as Python's repr (None, True,
    'hi'), and cut to 60 characters."""
    from edgesdk.serve.api import ApiError, parse_chat_request

    with pytest.raises(ApiError) as caught:
        parse_chat_request(body)
    assert caught.value.param == "messages"
    assert caught.value.message.endswith(got), caught.value.message
