"""OpenAI's ``suffix`` on ``/v1/completions`` and in ``Model.create_completion``: fill-in-the-middle.

llama-cpp-python's ``Llama._create_completion`` builds the prompt of a ``suffix`` as ``bos_tokens +
prefix_tokens + suffix_tokens + middle_tokens`` (``suffix_tokens + prefix_tokens + middle_tokens`` with
``spm_infill``): ``[FIM_PRE]`` and the prompt tokenized with ``special=False`` (token ids as given), ``[FIM_SUF]``
and the suffix tokenized with ``special=False``, ``[FIM_MID]``; its answer is the middle alone. The expected ids
below are written out from that code, with the model's FIM tokens where llama-cpp-python 0.3 has token 0 ("TODO:
Fix"). The tiny bundle of tests/unit/test_serve_infill40.py has Qwen2.5-Coder's FIM tokens (<|fim_prefix|> 320,
<|fim_middle|> 321, <|fim_suffix|> 322, <|fim_pad|> 323) and a tokenizer that adds no BOS; the tiny bundle of
tests/conftest.py has none.
"""

from __future__ import annotations

import json

import pytest

import edgesdk
from edgesdk.api import RequestError
from tests.unit.test_serve_infill40 import (  # noqa: F401  (fixtures)
    PREFIX,
    QWEN,
    SUFFIX,
    _chat_tokenizer,
    _expected,
    fim_served,
    qwen_bundle,
    qwen_runtime,
)

PRE, MID, SUF, PAD = 320, 321, 322, 323

@pytest.fixture(scope="module")
def completer(qwen_runtime):  # noqa: F811
    from edgesdk.serve.completion import Completer, ServeDefaults

    return Completer(qwen_runtime, ServeDefaults(max_tokens=8))


@pytest.fixture(scope="module")
def fim_model(qwen_bundle):  # noqa: F811
    with edgesdk.load(qwen_bundle.path, threads=1, max_tokens=8) as loaded:
        yield loaded


def _parsed(completer, **body):
    from edgesdk.serve.api import parse_text_request

    return parse_text_request(body, completer=completer)


# ------------------------------------------------------------------------------------------------ the prompt


def test_the_prompt_is_llama_cpp_python_s_written_out_token_by_token(completer, qwen_runtime):  # noqa: F811
    plain = qwen_runtime.tokenizer.encode_plain
    # def f(x):\n    return  /  \n\nprint(f(2))\n, as this tokenizer (and llama.cpp on its GGUF) cuts them
    prefix = [299, 72, 223, 72, 10, 90, 11, 28, 201, 223, 223, 223, 223, 84, 303, 87, 84, 80, 223]
    suffix = [201, 201, 82, 84, 75, 275, 10, 72, 10, 20, 11, 11, 201]
    assert plain(PREFIX) == prefix
    assert plain(SUFFIX) == suffix
    request = _parsed(completer, prompt=PREFIX, suffix=SUFFIX)
    assert list(request.prompt_tokens) == [PRE, *prefix, SUF, *suffix, MID]
    # on this bundle (context 256, below llama-server's batch of 2048: no extra context; parts within the budget)
    # /infill's prompt of the same prefix and suffix is the same
    assert list(request.prompt_tokens) == _expected(qwen_runtime.tokenizer, PREFIX, SUFFIX)
    # special=False: a FIM token's text in the prompt or the suffix is plain text, not the token
    marked = _parsed(completer, prompt="x<|fim_pad|>", suffix="<|fim_middle|>")
    assert list(marked.prompt_tokens) == [PRE, *plain("x<|fim_pad|>"), SUF, *plain("<|fim_middle|>"), MID]
    assert PAD not in marked.prompt_tokens[1:-1]
    assert MID not in marked.prompt_tokens[:-1]
    # token ids are the prefix as they are (llama-cpp-python's prompt list goes after FIM_PRE untouched)
    tokens = _parsed(completer, prompt=[5, PAD, 7], suffix="}")
    assert list(tokens.prompt_tokens) == [PRE, 5, PAD, 7, SUF, *plain("}"), MID]


def test_spm_infill_puts_the_suffix_first_and_the_bos_leads(qwen_runtime, tmp_path):  # noqa: F811
    from edgesdk.runtime.fim import fim_ids, leading_bos
    from edgesdk.serve.completion import Completer, ServeDefaults

    plain = qwen_runtime.tokenizer.encode_plain
    spm = _parsed(Completer(qwen_runtime, ServeDefaults(max_tokens=8, spm_infill=True)), prompt=PREFIX,
                  suffix=SUFFIX)
    assert list(spm.prompt_tokens) == [SUF, *plain(SUFFIX), PRE, *plain(PREFIX), MID]
    # bos_tokens: the BOS where the tokenizer adds one, in front of either order
    tokenizer = _chat_tokenizer(tmp_path, QWEN, bos=True)
    bos = leading_bos(tokenizer)
    assert bos is not None
    fim = tokenizer.fim_tokens()
    assert fim_ids(fim, [1, 2], [3], bos) == [bos, PRE, 1, 2, SUF, 3, MID]
    assert fim_ids(fim, [1, 2], [3], bos, spm_infill=True) == [bos, SUF, 3, PRE, 1, 2, MID]


def test_an_empty_or_null_suffix_leaves_the_prompt_as_it_is(completer):
    for suffix in ("", None):
        request = _parsed(completer, prompt=PREFIX, suffix=suffix)
        assert request.prompt == PREFIX
        assert request.prompt_tokens == ()


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"suffix": 5}, "suffix", "'suffix' must be a string"),
    ({"suffix": "\ud800"}, "suffix", "'suffix'"),
    ({"suffix": "}", "echo": True}, "echo", "'echo' with a 'suffix' is not supported"),
    ({"suffix": "}", "logprobs": 0}, "logprobs", "'logprobs' with a 'suffix' is not supported"),
    ({"suffix": "}", "n": 2}, "n", "one choice per request"),
    ({"suffix": "}", "best_of": 3}, "best_of", "one choice per request"),
])
def test_what_a_suffix_cannot_go_with_is_refused_by_name(completer, body, param, words):
    from edgesdk.serve.api import ApiError

    with pytest.raises(ApiError) as refused:
        _parsed(completer, prompt=PREFIX, **body)
    assert refused.value.status == 400
    assert refused.value.param == param
    assert words in refused.value.message


def test_a_model_without_fim_tokens_is_refused_naming_suffix(runtime):
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.completion import Completer

    with pytest.raises(ApiError) as refused:
        _parsed(Completer(runtime), prompt=PREFIX, suffix=SUFFIX)
    assert refused.value.status == 400
    assert refused.value.param == "suffix"
    assert "'suffix' needs a fill-in-the-middle model" in refused.value.message
    assert "no FIM prefix, suffix, middle tokens" in refused.value.message


def test_without_a_completer_the_route_still_refuses_a_suffix():
    """llama-server's /completion (edgesdk/serve/llama_native.py) reads its body without the model: a suffix there is
    refused, pointing at /infill."""
    from edgesdk.serve.api import ApiError, parse_text_request

    with pytest.raises(ApiError) as refused:
        parse_text_request({"prompt": PREFIX, "suffix": SUFFIX}, route="/completion")
    assert refused.value.param == "suffix"
    assert "'input_suffix'" in refused.value.message


# ------------------------------------------------------------------------------------------------ the answer


def test_create_completion_s_suffix_answers_what_infill_answers(fim_model, fim_served):  # noqa: F811
    status, infilled = fim_served.post("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
                                                   "temperature": 0})
    assert status == 200, infilled
    answer = fim_model.create_completion(PREFIX, SUFFIX, max_tokens=6, temperature=0)
    assert answer["choices"][0]["text"] == infilled["content"]
    assert answer["usage"]["prompt_tokens"] == infilled["tokens_evaluated"]
    assert answer["usage"]["completion_tokens"] == infilled["tokens_predicted"] == 6
    assert fim_model(PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0)["choices"][0]["text"] == infilled["content"]
    streamed = list(fim_model.create_completion(PREFIX, SUFFIX, max_tokens=6, temperature=0, stream=True))
    assert "".join(chunk["choices"][0]["text"] for chunk in streamed if chunk["choices"]) == infilled["content"]


def test_create_completion_refuses_a_suffix_by_name(fim_model, tiny_bundle):  # noqa: F811
    with pytest.raises(RequestError) as refused:
        fim_model.create_completion(PREFIX, SUFFIX, echo=True)
    assert refused.value.param == "echo"
    with edgesdk.load(tiny_bundle.path, threads=1) as plain_model:
        with pytest.raises(RequestError) as refused:
            plain_model.create_completion(PREFIX, suffix=SUFFIX, max_tokens=2)
    assert refused.value.param == "suffix"
    assert "fill-in-the-middle" in str(refused.value)


# ------------------------------------------------------------------------------------------------ over HTTP


def test_v1_completions_suffix_answers_what_infill_answers(fim_served):  # noqa: F811
    status, infilled = fim_served.post("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
                                                   "temperature": 0})
    assert status == 200, infilled
    status, completed = fim_served.post("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 6,
                                                            "temperature": 0})
    assert status == 200, completed
    assert completed["choices"][0]["text"] == infilled["content"]
    assert completed["usage"]["prompt_tokens"] == infilled["tokens_evaluated"]
    chunks = fim_served.stream("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 6,
                                                   "temperature": 0})[:-1]
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"]) == infilled["content"]


def test_the_openai_client_s_suffix(fim_served, fim_model):  # noqa: F811
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{fim_served.port}/v1", api_key="none", max_retries=0)
    answer = client.completions.create(model="tiny", prompt=PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0)
    expected = fim_model.create_completion(PREFIX, SUFFIX, max_tokens=6, temperature=0)["choices"][0]["text"]
    assert answer.choices[0].text == expected
    streamed = client.completions.create(model="tiny", prompt=PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0,
                                         stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == expected
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=PREFIX, suffix=SUFFIX, echo=True, max_tokens=2)
    assert refused.value.param == "echo"


def test_v1_completions_suffix_on_a_model_without_fim_tokens_is_a_400_naming_it(served):
    status, _, payload = served.request("POST", "/v1/completions", raw=json.dumps(
        {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 2}).encode())
    error = json.loads(payload)["error"]
    assert status == 400, error
    assert error["param"] == "suffix"
    assert "'suffix' needs a fill-in-the-middle model" in error["message"]


def test_an_empty_prompt_before_a_suffix_completes_the_start_of_a_file(fim_served):  # noqa: F811
    """Completing at a file's very start: llama-cpp-python leaves the prefix empty (``if prompt != ""``), as /infill
    takes an empty ``input_prefix``; an empty prompt without a suffix is still refused."""
    status, infilled = fim_served.post("/infill", {"input_prefix": "", "input_suffix": SUFFIX, "n_predict": 4,
                                                   "temperature": 0})
    assert status == 200, infilled
    status, completed = fim_served.post("/v1/completions", {"prompt": "", "suffix": SUFFIX, "max_tokens": 4,
                                                            "temperature": 0})
    assert status == 200, completed
    assert completed["choices"][0]["text"] == infilled["content"]
    assert completed["usage"]["prompt_tokens"] == infilled["tokens_evaluated"]
    status, refused = fim_served.post("/v1/completions", {"prompt": "", "max_tokens": 4})
    assert (status, refused["error"]["param"]) == (400, "prompt")
