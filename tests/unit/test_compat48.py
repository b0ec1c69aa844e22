"""``seed`` and the token limit read as llama.cpp reads them, against the real parsers, a real server of the tiny
bundle, the Python API and ``edgesdk run``.

- llama.cpp's LLAMA_DEFAULT_SEED (0xFFFFFFFF = 4294967295, include/llama.h) is a random seed wherever a seed is read
  (src/llama-sampling.cpp, ``get_rng_seed``: ``if (seed == LLAMA_DEFAULT_SEED)`` the seed is drawn): llama-cli's
  ``-s`` and llama-server's ``seed`` on every route. Here -1 was random but 4294967295 a fixed seed. llama-server's
  seed is a ``uint32_t``, which cuts a larger one to its low 32 bits without a word; here such a seed stays a fixed
  seed of its own, as OpenAI takes any 64-bit seed (test_reread48c.py). Ollama's sampler fixes every seed but -1 (sample/samplers.go,
  ``NewSampler``: ``uint64(seed)``), so its routes keep 4294967295, and seeds past 32 bits, fixed.
- llama-server reads the token limit as ``n_predict``, else ``max_completion_tokens``, else ``max_tokens`` on every
  completion route (tools/server/server-task.cpp, ``params_from_json_cmpl``); ``/v1/completions`` read only
  ``max_tokens``, so an answer asked for 3 tokens by the other two ran to the server's limit. The Python API's
  ``create_completion`` still refuses both by name, as llama-cpp-python's has neither.
"""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.serve.api import (
    LLAMA_DEFAULT_SEED,
    RANDOM_SEED,
    ApiError,
    parse_chat_request,
    parse_text_request,
)
from edgesdk.serve.ollama import parse_chat, parse_generate
from tests.unit.test_cli import assert_ok, invoke

PROMPT = "Hello there"  # the tiny bundle answers it with "e" after "e", never an end-of-text token
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
TEXT = {"prompt": PROMPT}


def test_llama_default_seed_is_a_random_seed_on_the_llama_server_routes():
    assert LLAMA_DEFAULT_SEED == 4294967295
    for body in (CHAT, TEXT):
        parse = parse_chat_request if "messages" in body else parse_text_request
        assert parse({**body, "seed": 4294967295}).seed == RANDOM_SEED  # random, as -1
        assert parse({**body, "seed": 4294967295.0}).seed == RANDOM_SEED
        assert parse({**body, "seed": -1}).seed == RANDOM_SEED
        assert parse({**body, "seed": 4294967294}).seed == 4294967294  # the largest fixed seed
        assert parse({**body, "seed": 0}).seed == 0


@pytest.mark.parametrize("seed", [2**32, 2**32 + 5, 2**64 - 5])
def test_a_seed_past_llama_server_s_32_bits_is_a_fixed_seed_of_its_own(seed):
    """llama-server would seed 2**32 + 5 as 5 without a word; here it is the fixed seed it was before (OpenAI's
    seed is any 64-bit integer), while a seed that is not a whole number >= 0 is still a 400 naming the field."""
    for body in (CHAT, TEXT):
        parse = parse_chat_request if "messages" in body else parse_text_request
        assert parse({**body, "seed": seed}).seed == seed
        with pytest.raises(ApiError) as refused:
            parse({**body, "seed": -2})
        assert refused.value.param == "seed"
        assert refused.value.message.startswith("'seed' must be a whole number >= 0, or -1 for a random seed, got ")


def test_ollama_s_routes_keep_4294967295_and_larger_seeds_fixed():
    """Ollama's NewSampler fixes every seed but -1: its routes do not take llama.cpp's LLAMA_DEFAULT_SEED rule."""
    for seed, fixed in ((4294967295, 4294967295), (2**32 + 5, 2**32 + 5), (-5, 2**64 - 5), (7, 7)):
        options = {"seed": seed, "temperature": 1.0}
        chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": options}, "m")
        assert chat.request.seed == fixed
        text = parse_generate({"model": "m", "prompt": "hi", "raw": True, "options": options}, "m")
        assert text.request.seed == fixed
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"seed": -1}}, "m")
    assert chat.request.seed == RANDOM_SEED


def test_the_served_routes_take_llama_default_seed_and_seeds_past_32_bits(served):
    for path, body in (("/v1/completions", TEXT), ("/v1/chat/completions", CHAT), ("/completion", TEXT)):
        status, answer = served.post(path, {**body, "max_tokens": 2, "temperature": 1.0, "seed": 4294967295})
        assert status == 200, answer
        status, answer = served.post(path, {**body, "max_tokens": 2, "seed": 2**32})
        assert status == 200, answer
    # /completion says which seed it drew from: none given (4294967295, LLAMA_DEFAULT_SEED, as llama-server shows it), as for seed -1
    status, answer = served.post("/completion", {**TEXT, "n_predict": 2, "seed": 4294967295})
    assert status == 200, answer
    assert answer["generation_settings"]["seed"] == 4294967295


def test_max_completion_tokens_and_n_predict_limit_v1_completions(served):
    status, body = served.post("/v1/completions", {**TEXT, "max_completion_tokens": 3})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 3  # not the server's 16
    status, body = served.post("/v1/completions", {**TEXT, "n_predict": 4})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 4
    # llama-server's order: n_predict, then max_completion_tokens, then max_tokens; null is not given
    status, body = served.post("/v1/completions", {**TEXT, "n_predict": 2, "max_completion_tokens": 5, "max_tokens": 6})
    assert body["usage"]["completion_tokens"] == 2, body
    status, body = served.post("/v1/completions", {**TEXT, "n_predict": None, "max_completion_tokens": 3,
                                                   "max_tokens": 6})
    assert body["usage"]["completion_tokens"] == 3, body
    status, body = served.post("/v1/completions", {**TEXT, "max_completion_tokens": "three"})
    assert status == 400, body
    assert body["error"]["param"] == "max_completion_tokens"
    assert "'max_completion_tokens' must be a whole number >= 0" in body["error"]["message"]


def test_n_predict_limits_a_chat_answer_as_in_llama_server(served):
    status, body = served.post("/v1/chat/completions", {**CHAT, "n_predict": 2, "max_completion_tokens": 6})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] <= 2
    assert parse_chat_request({**CHAT, "n_predict": 2, "max_completion_tokens": 6}).max_tokens == 2
    assert parse_chat_request({**CHAT, "max_completion_tokens": 6, "max_tokens": 3}).max_tokens == 6


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=16) as loaded:
        yield loaded


def test_the_python_api_reads_max_tokens_alone_and_the_32_bit_seed(model):
    """llama-cpp-python's create_completion has neither n_predict nor max_completion_tokens: refused by name, as
    before; its seed is llama.cpp's, so 4294967295 is random (and a seed past 32 bits a fixed seed)."""
    for name in ("max_completion_tokens", "n_predict"):
        with pytest.raises(RequestError, match=f"takes no field '{name}'"):
            model(PROMPT, **{name: 2})
    with pytest.raises(RequestError, match="takes no field 'n_predict'"):
        model.create_chat_completion(CHAT["messages"], n_predict=2)
    chat = model.create_chat_completion(CHAT["messages"], max_completion_tokens=2)  # OpenAI's chat field
    assert chat["usage"]["completion_tokens"] <= 2
    assert model(PROMPT, max_tokens=2, temperature=1.0, seed=4294967295)["usage"]["completion_tokens"] == 2
    assert model(PROMPT, max_tokens=2, temperature=1.0, seed=2**32)["usage"]["completion_tokens"] == 2


def test_run_s_4294967295_is_a_random_seed_and_a_larger_one_fixed(tiny_bundle):
    """llama-cli's -s 4294967295 is its default, a random seed: no seed the run would call unused at
    --temperature 0, as with -s -1 (a fixed seed there is named unused)."""
    base = ("run", tiny_bundle.path, "--prompt", "hello", "-n", 2, "--threads", 1, "--temperature", 0)
    fixed = invoke(*base, "-s", 4294967294)
    assert_ok(fixed)
    assert "--seed is not used" in fixed.stderr
    default = invoke(*base, "-s", 4294967295)
    assert_ok(default)
    assert "--seed is not used" not in default.stderr
    past = invoke(*base, "-s", 4294967296)  # llama-cli's -s takes it too (std::stoul)
    assert_ok(past)
    assert "--seed is not used" in past.stderr  # a fixed seed, unused at --temperature 0
