"""The fix a Python API ``RequestError`` takes from a route's refusal: never the client's own text quoted in the
message, never a parenthesis that describes a value, the message's last clause that says what to do, and printed
once (the message loses that tail); a route with a structured fix (``ApiError.fix``) gives it as it is."""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.api import RequestError, _request_error
from edgesdk.api_checks import REQUEST_FIX, split_fix
from edgesdk.serve.api import ApiError, parse_chat_request

MESSAGES = [{"role": "user", "content": "hi"}]


def _python_error(body: dict) -> RequestError:
    """The error create_chat_completion raises for ``body``'s refusal by the chat route."""
    with pytest.raises(ApiError) as refused:
        parse_chat_request({"messages": MESSAGES, **body})
    error = _request_error("create_chat_completion", refused.value)
    assert isinstance(error, RequestError)
    return error


@pytest.mark.parametrize(("body", "sent"), [
    ({"temperature": "hot; use 0.7"}, "use 0.7"),
    ({"stop": {"a": "x: remove this"}}, "remove this"),
    ({"temperature": "it's; use 0.7"}, "use 0.7"),
])
def test_client_text_quoted_in_the_message_is_no_fix(body, sent):
    error = _python_error(body)
    assert sent not in error.fix
    assert error.fix == REQUEST_FIX
    assert sent in error.problem  # the value is still shown where the message quotes it


def test_client_text_before_the_routes_fix_is_skipped():
    error = _python_error({"response_format": {"type": "json: use yaml"}})
    assert error.fix == "leave 'response_format' out"
    assert "yaml" not in error.fix


def test_parenthesis_describing_a_value_is_no_fix():
    with pytest.raises(ApiError) as refused:
        parse_chat_request({"messages": MESSAGES, "suffix": "a"})
    error = RequestError("create_chat_completion", refused.value.message, param="suffix")  # its words alone
    assert error.fix == "leave 'suffix' out"
    assert error.problem.endswith("as 'input_suffix')")
    for message in ("n_responses must be a whole number >= 0 (0: keep no responses), got 'x'",
                    "'n_keep' must be a whole number >= -1 (-1: keep the whole prompt), got \"x\""):
        assert split_fix(message) == (message, None)


@pytest.mark.parametrize("message", [
    "'x' is not supported here (fill-in-the-middle: send the text after the cursor to /infill as 'input_suffix'); "
    "leave 'x' out",
    "'x' = \"a; send b\" is refused: the route takes none; leave 'x' out",
    "'x' = 'a; send b' is refused; leave 'x' out",
    "'x' = [\"a: use b\", {\"c\": \"d; pass e\"}] is refused; leave 'x' out",
])
def test_last_top_level_clause_is_the_fix(message):
    problem, fix = split_fix(message)
    assert fix == "leave 'x' out"
    assert problem == message[:-len("; leave 'x' out")]


def test_a_quote_or_bracket_left_open_gives_no_fix():
    # a value cut short leaves its quote open: what follows may be the client's text
    for message in ("'x' must be a string, got \"aaaa; use b...; leave it out",
                    "'x' must be an array, got [1, 2...; leave it out"):
        assert split_fix(message) == (message, None)


def test_a_fix_taken_from_the_message_is_printed_once():
    message = ("'timings_per_token' must be true or false, got \"x\"; send true to have each streamed event carry "
               "it, or leave it out")
    error = RequestError("create_completion", message, param="timings_per_token")
    assert error.fix == "send true to have each streamed event carry it, or leave it out"
    assert error.problem == "create_completion (timings_per_token): 'timings_per_token' must be true or false, got \"x\""
    assert str(error).count("send true to have each") == 1


def test_a_routes_structured_fix_is_printed_once():
    error = _request_error("create_completion", ApiError(400, "'x' is refused", param="x", fix="leave 'x' out"))
    assert error.fix == "leave 'x' out"
    assert error.problem == "create_completion (x): 'x' is refused"
    assert str(error).count("leave 'x' out") == 1


def test_structured_fix_keeps_the_http_message_whole():
    refused = ApiError(400, "'mirostat' = 2 is not supported", param="mirostat", fix="leave 'mirostat' out")
    assert refused.message == "'mirostat' = 2 is not supported; leave 'mirostat' out"
    assert refused.body()["error"]["message"] == refused.message
    assert refused.fix == "leave 'mirostat' out"
    error = _python_error({"mirostat": 2})
    assert error.fix.startswith("leave 'mirostat' out or set it to ")
    assert "leave 'mirostat' out" not in error.problem
    with pytest.raises(ApiError) as plain:
        parse_chat_request({"messages": MESSAGES, "mirostat": 2})
    assert plain.value.message.endswith(f"; {plain.value.fix}")


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        yield loaded


def test_model_refusals_through_the_python_api(model):
    with pytest.raises(RequestError) as hot:
        model.create_chat_completion(MESSAGES, temperature="hot; use 0.7", max_tokens=1)
    assert hot.value.fix == REQUEST_FIX
    with pytest.raises(RequestError) as shaped:
        model.create_chat_completion(MESSAGES, response_format={"type": "json: use yaml"}, max_tokens=1)
    assert shaped.value.fix == "leave 'response_format' out"
    assert str(shaped.value).count("leave 'response_format' out") == 1
