"""Review of the Python API against llama-cpp-python's ``Llama`` (51st stop), on the tiny bundle:

- ``max_tokens`` None or 0 on ``create_completion`` / ``__call__`` / ``create_chat_completion`` is no limit but the
  context, as llama-cpp-python reads it (llama_cpp/llama.py ``_create_completion``: "If max_tokens <= 0 or None,
  the maximum number of tokens to generate is unlimited and depends on n_ctx"); None was load()'s default limit
  (512) and 0 an empty completion, or a refusal on chat;
- ``stream=None`` (every field's default, as the HTTP routes read JSON null) is not streamed; it was refused;
- llama-cpp-python's ``Llama(logits_all=, embedding=, n_gpu_layers=, chat_format=)`` given to load() are refused with
  what to do instead (they were refused with no hint).
"""

from __future__ import annotations

import pytest

import edgesdk

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "hi"}]
LOAD_LIMIT = 4  # load()'s max_tokens: what a call that sets none gets


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=LOAD_LIMIT) as loaded:
        yield loaded


def _ran_to_the_context(model, answer: dict) -> bool:
    usage = answer["usage"]
    return (answer["choices"][0]["finish_reason"] == "length" and usage["completion_tokens"] > LOAD_LIMIT
            and usage["prompt_tokens"] + usage["completion_tokens"] >= model.max_context)


@pytest.mark.parametrize("limit", [None, 0, -1])
def test_a_completion_s_max_tokens_none_or_zero_is_no_limit_but_the_context(model, limit):
    answer = model(PROMPT, ignore_eos=True, max_tokens=limit)
    assert _ran_to_the_context(model, answer), answer["usage"]
    assert answer["choices"][0]["text"]  # 0 was an empty completion


@pytest.mark.parametrize("limit", [None, 0, -1])
def test_a_chat_s_max_tokens_none_or_zero_is_no_limit_but_the_context(model, limit):
    answer = model.create_chat_completion(MESSAGES, ignore_eos=True, max_tokens=limit)  # 0 was refused
    assert _ran_to_the_context(model, answer), answer["usage"]


def test_a_streamed_max_tokens_none_runs_to_the_context_too(model):
    chunks = list(model.create_chat_completion(MESSAGES, ignore_eos=True, max_tokens=None, stream=True))
    pieces = [chunk for chunk in chunks if chunk["choices"] and chunk["choices"][0]["delta"].get("content")]
    assert len(pieces) > LOAD_LIMIT
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_max_tokens_left_out_is_still_load_s_limit_and_a_bad_one_still_refused(model):
    assert model(PROMPT, ignore_eos=True)["usage"]["completion_tokens"] == LOAD_LIMIT
    assert model.create_chat_completion(MESSAGES, ignore_eos=True)["usage"]["completion_tokens"] == LOAD_LIMIT
    with pytest.raises(edgesdk.RequestError) as caught:
        model(PROMPT, max_tokens=False)  # a bool is not 0
    assert caught.value.param == "max_tokens"
    with pytest.raises(edgesdk.RequestError) as caught:
        model.create_chat_completion(MESSAGES, max_tokens=-2)
    assert caught.value.param == "max_tokens"


def test_max_completion_tokens_beside_max_tokens_none_holds(model):
    answer = model.create_chat_completion(MESSAGES, ignore_eos=True, max_tokens=None, max_completion_tokens=2)
    assert answer["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("method", ["create_completion", "create_chat_completion"])
def test_stream_none_is_a_whole_answer(model, method):
    first = PROMPT if method == "create_completion" else MESSAGES
    answer = getattr(model, method)(first, stream=None, max_tokens=2)  # was refused: "'stream' must be true or false"
    assert isinstance(answer, dict)
    assert answer["usage"]["completion_tokens"] <= 2


@pytest.mark.parametrize(("argument", "hint"), [
    ("n_gpu_layers", "n_gpu_layers: a bundle runs whole on its backend: pass backend='ort-cuda'"),
    ("chat_format", "chat_format: the bundle's own chat template formats"),
])
def test_llama_cpp_python_s_switches_are_refused_with_what_to_do_instead(tiny_bundle, argument, hint):
    # Llama(model_path, logits_all=True, embedding=True, n_gpu_layers=-1) ported to load(): each named with its hint
    with pytest.raises(edgesdk.EdgeSDKError) as caught:
        edgesdk.load(tiny_bundle.path, **{argument: True})
    assert f"load() got the setting(s) '{argument}', which it does not take; {hint}" in caught.value.problem
