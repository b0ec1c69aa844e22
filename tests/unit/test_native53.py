"""Review of llama-server's native routes (53rd stop), over real HTTP against the tiny bundle: ``POST /completion``'s
whole-number fields written as floats (``n_predict: 2.0``), which llama-server reads as numbers and the OpenAI routes
take, and a one-prompt array holding a token id that is not one, refused by the element at fault."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served, runtime  # noqa: F401 (the module's runtime fixture)

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def served(runtime):  # noqa: F811
    server = Served(runtime, ServeDefaults(max_tokens=8))
    yield server
    server.close()


# ------------------------------------------------------------------ whole numbers written as floats


@pytest.mark.parametrize("field", ["n_predict", "max_tokens", "max_completion_tokens"])
def test_a_token_limit_written_as_a_float_is_taken(served, field):
    # llama-server reads n_predict with nlohmann's get<int>, which takes 3.0 as 3; /v1/completions takes it too
    status, body = served.post("/completion", {"prompt": PROMPT, field: 3.0, "ignore_eos": True})
    assert status == 200, body
    assert body["tokens_predicted"] == 3
    assert body["generation_settings"]["n_predict"] == 3


def test_a_limit_of_zero_written_as_a_float_evaluates_the_prompt_only(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 0.0})
    assert status == 200, body
    assert (body["content"], body["tokens_predicted"]) == ("", 0)


def test_minus_one_written_as_a_float_is_the_server_s_limit(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": -1.0, "ignore_eos": True})
    assert status == 200, body
    assert body["tokens_predicted"] == 8
    assert body["generation_settings"]["n_predict"] == -1


@pytest.mark.parametrize("field", ["n_probs", "logprobs"])
def test_n_probs_written_as_a_float_is_taken(served, field):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, field: 2.0})
    assert status == 200, body
    assert len(body["completion_probabilities"]) == 2
    assert all(len(entry["top_logprobs"]) == 2 for entry in body["completion_probabilities"])


def test_n_indent_written_as_a_float_is_taken(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "n_indent": 4.0})
    assert status == 200, body


@pytest.mark.parametrize(("field", "value"), [("n_predict", 2.5), ("n_probs", 1.5), ("n_indent", 0.5)])
def test_a_fraction_is_still_refused_naming_the_field(served, field, value):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, field: value})
    assert status == 400
    assert body["error"]["param"] == field
    assert str(value) in body["error"]["message"]


# ------------------------------------------------------------------ a one-prompt array with a bad element


@pytest.mark.parametrize(("prompt", "index", "shown"), [
    ([42, 71.5], 1, "71.5"),  # was "'prompt[0]' must be ... got 42": the first, valid, id blamed
    ([42, 71.0], 1, "71.0"),
    ([42, 71, True], 2, "true"),
    ([42, 71, -1], 2, "-1"),
    ([42, "lo", None], 2, "null"),
    ([42, [71]], 1, "[71]"),
])
def test_an_array_holding_token_ids_is_one_prompt_and_its_bad_element_is_named(served, prompt, index, shown):
    status, body = served.post("/completion", {"prompt": prompt, "n_predict": 1})
    assert status == 400
    message = body["error"]["message"]
    assert message.startswith(f"'prompt[{index}]' must be a token id")
    assert message.endswith(f"got {shown}")
    assert body["error"]["param"] == "prompt"


def test_the_same_array_is_named_on_v1_completions(served):
    status, body = served.post("/v1/completions", {"prompt": [42, 71.5], "max_tokens": 1})
    assert status == 400
    assert body["error"]["message"].startswith("'prompt[1]' must be a token id")


def test_arrays_of_prompts_and_good_token_arrays_are_unchanged(served):
    status, body = served.post("/completion", {"prompt": [42, 71, "llo"], "n_predict": 1})
    assert status == 200, body
    assert body["tokens_evaluated"] == 5
    status, body = served.post("/completion", {"prompt": [[42, 71], "Hello"], "n_predict": 1})
    assert status == 200, body
    assert [answer["tokens_evaluated"] for answer in body] == [2, 5]


# ------------------------------------------------------------------ post_sampling_probs without probabilities


@pytest.mark.parametrize("extra", [{}, {"n_probs": 0}, {"logprobs": False}])
def test_post_sampling_probs_without_probabilities_changes_nothing(served, extra):
    # llama-server lists no probabilities without n_probs, whatever post_sampling_probs says: a client that always
    # sends it gets its answer, not a 400 for a flag that has no effect
    plain = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, **extra})[1]
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "post_sampling_probs": True, **extra})
    assert status == 200, body
    assert body["content"] == plain["content"]
    assert "completion_probabilities" not in body


def test_post_sampling_probs_with_probabilities_is_still_refused(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "n_probs": 1,
                                               "post_sampling_probs": True})
    assert status == 400
    assert body["error"]["param"] == "post_sampling_probs"


@pytest.mark.parametrize("name", ["n_keep", "n_discard"])
def test_the_context_shift_fields_written_as_floats_are_taken(name):
    """n_keep and n_discard are whole numbers as n_predict is: 2.0 is 2, 2.5 is still refused by name."""
    from edgesdk.serve.api import ApiError, _shift_field

    assert _shift_field({name: 2.0}, name, -1) == 2
    with pytest.raises(ApiError, match=name):
        _shift_field({name: 2.5}, name, -1)
