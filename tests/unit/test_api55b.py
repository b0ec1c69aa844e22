"""The Python API's ``load(seed=N)`` and its refusals of a fill-in-the-middle prompt past the bundle's context.

- llama-cpp-python's ``Llama(seed=N)`` is the seed of every call that sends none; ``load(seed=N)`` was refused
  ("pass seed=N to create_completion"), where ``edgesdk serve -s N`` and ``ServeDefaults.seed`` take it.
- ``create_completion(prompt, suffix=...)`` whose suffix overflowed the context was refused naming the prompt
  ("shorten the prompt"), whose one token could not be the cause.
- ``POST /infill`` whose ``prompt`` (the cursor line, always kept whole) overflowed the context was refused naming
  ``input_prefix`` and asking for a shorter prefix or suffix, neither of which could help.
"""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.errors import EdgeSDKError
from tests.unit.test_serve_infill40 import qwen_bundle, qwen_runtime  # noqa: F401  (fixtures)

WORDS = "the cat sat on the mat and the dog ran far"


def _sampled(model, **fields) -> str:
    return model.create_completion(WORDS, max_tokens=12, temperature=1.5, **fields)["choices"][0]["text"]


# ------------------------------------------------------------------------------------------------ load(seed=N)


def test_load_seed_is_the_seed_of_every_call_that_sends_none(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, seed=42, prompt_cache=False) as model:  # each prompt whole
        assert model._completer.defaults.seed == 42
        first, again = _sampled(model), _sampled(model)
        assert first == again  # the same seed for each call, as llama-cpp-python's Llama(seed=42)
        assert _sampled(model, seed=42) == first  # the call's own seed 42 is the same seed
        random_texts = {_sampled(model, seed=-1) for _ in range(6)}  # a call's -1: a random seed still
        assert len(random_texts) > 1


@pytest.mark.parametrize("seed", [-1, 4294967295])
def test_load_seed_minus_one_and_llama_default_seed_are_a_random_seed_for_each_call(tiny_bundle, seed):
    with edgesdk.load(tiny_bundle.path, threads=1, seed=seed) as model:
        assert model._completer.defaults.seed is None
        assert len({_sampled(model) for _ in range(6)}) > 1


@pytest.mark.parametrize("seed", [1.5, "42", True, None])
def test_load_refuses_a_seed_that_is_not_a_seed_naming_it(tiny_bundle, seed):
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tiny_bundle.path, threads=1, seed=seed)
    assert f"seed={seed!r}" in refused.value.problem
    assert "-1 for a random seed" in refused.value.problem
    assert "does not take" not in refused.value.problem


# ------------------------------------------------------------------------------------------------ a long FIM prompt


@pytest.fixture(scope="module")
def fim_model(qwen_bundle):  # noqa: F811
    with edgesdk.load(qwen_bundle.path, threads=1, max_tokens=4) as loaded:
        yield loaded


def test_a_suffix_past_the_context_is_refused_naming_the_suffix(fim_model):
    plain = fim_model.runtime.tokenizer.encode_plain
    suffix = "y = 2\n" * 100
    with pytest.raises(RequestError) as refused:
        fim_model.create_completion("x", suffix=suffix)
    error = refused.value
    assert error.param == "suffix"
    assert f"the prompt's {len(plain('x'))}, the suffix's {len(plain(suffix))}" in error.problem
    assert f"maximum context length is {fim_model.n_ctx()} tokens. However, your fill-in-the-middle prompt" \
        in error.problem
    assert error.fix.startswith("shorten the suffix")


def test_a_prompt_past_the_context_beside_a_suffix_is_refused_naming_the_prompt(fim_model):
    plain = fim_model.runtime.tokenizer.encode_plain
    prompt = "x = 1\n" * 100
    for streamed in (False, True):
        with pytest.raises(RequestError) as refused:  # before a stream starts, as the prompt is parsed
            fim_model.create_completion(prompt, suffix="}", stream=streamed)
        assert refused.value.param == "prompt"
        assert f"the prompt's {len(plain(prompt))}, the suffix's {len(plain('}'))}" in refused.value.problem
        assert refused.value.fix.startswith("shorten the prompt")
    # the same prompt as token ids, counted as they are
    with pytest.raises(RequestError, match=r"the prompt's 300, the suffix's 1"):
        fim_model.create_completion([5] * 300, suffix="}")


def test_a_fim_prompt_that_fits_is_answered(fim_model):
    answer = fim_model.create_completion("def f(x):\n    return ", suffix="\n\nprint(f(2))\n")
    assert answer["usage"]["completion_tokens"] <= 4


# ------------------------------------------------------------------------------------------------ POST /infill


@pytest.fixture(scope="module")
def infill_completer(qwen_runtime):  # noqa: F811
    from edgesdk.serve.completion import Completer, ServeDefaults

    return Completer(qwen_runtime, ServeDefaults(max_tokens=8))


@pytest.mark.parametrize("field", ["prompt", "input_suffix", "input_prefix"])
def test_an_infill_prompt_past_the_context_names_the_field_that_fills_it(infill_completer, qwen_runtime,  # noqa: F811
                                                                         field):
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.infill import parse_infill_request

    long_text = "x = 1\n" * 60  # 360 tokens: the context holds 256, the default batch of 2048 keeps them all
    body = {"input_prefix": "a", "input_suffix": "b", "prompt": "c", field: long_text}
    with pytest.raises(ApiError) as refused:
        parse_infill_request(body, infill_completer)
    error = refused.value
    assert error.param == field
    assert error.code == "context_length_exceeded"
    assert error.message.startswith("This model's maximum context length is 256 tokens. However, your infill prompt "
                                    "resulted in "), error.message
    assert f"'{field}' {len(qwen_runtime.tokenizer.encode_plain(long_text))}" in error.message
    assert f"send a shorter '{field}'" in error.message
    if field == "prompt":  # kept whole: neither a shorter prefix or suffix nor a smaller batch mends it
        assert "--batch-size" not in error.message


# ------------------------------------------------------------------------------------------------ other settings


def test_load_spm_infill_puts_the_suffix_first(qwen_bundle):  # noqa: F811
    """llama-cpp-python's Llama(spm_infill=True), serve's --spm-infill: refused by load() before."""
    from edgesdk.serve.api import parse_text_request

    pre, mid, suf = 320, 321, 322
    for spm, first in ((True, suf), (False, pre)):
        with edgesdk.load(qwen_bundle.path, threads=1, max_tokens=2, spm_infill=spm) as model:
            ids = parse_text_request({"prompt": "a", "suffix": "b"}, completer=model._completer).prompt_tokens
            assert (ids[0], ids[-1]) == (first, mid)
            assert model.create_completion("def f(x):\n    return ", suffix="\n")["usage"]["prompt_tokens"] > 3
    with pytest.raises(EdgeSDKError, match=r"spm_infill='yes': expected True or False"):
        edgesdk.load(qwen_bundle.path, threads=1, spm_infill="yes")


@pytest.mark.parametrize(("name", "value", "hint", "wrong"), [
    ("stop", ["\n"], "stop: a request's field: pass stop= to create_completion", "top_p"),
    ("stream", True, "stream: a request's field", "threads"),
    ("response_format", {"type": "json_object"}, "response_format: a request's field", "did you mean reasoning"),
    ("ignore_eos", True, "ignore_eos: a request's field", "ignore_target"),
    ("cache_prompt", False, "cache_prompt: pass prompt_cache=True or False", "cache_ram_mib"),
    ("max_queue", 4, "max_queue: pass max_waiting=N", "did you mean"),
    ("last_n_tokens_size", 64, "last_n_tokens_size: pass repeat_last_n=N", "did you mean"),
])
def test_a_setting_load_does_not_take_names_what_to_pass_instead(tiny_bundle, name, value, hint, wrong):
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tiny_bundle.path, threads=1, **{name: value})
    assert hint in refused.value.problem
    assert wrong not in refused.value.problem
