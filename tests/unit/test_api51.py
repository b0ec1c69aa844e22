"""Review of the OpenAI routes against llama-server (51st stop), over real HTTP against the tiny bundle, following
what 53c6c69 fixed on the native routes:

- a request's token limit -1 (``max_tokens``, ``max_completion_tokens`` or ``n_predict``) on ``/v1/chat/completions``
  and ``/v1/completions`` is held to the server's ``-n``, as llama-server's ``slot.n_predict_max`` holds it
  (tools/server/server-context.cpp); it ran to the full context. The in-process API keeps llama-cpp-python's -1;
- ``adaptive_p`` in ``samplers`` without ``adaptive_target`` is llama.cpp's default target, -1 (off), and taken;
- a sampler name or letter llama.cpp does not know is left out of the chain with a warning in the log, as
  llama-server's ``common_sampler_types_from_names`` / ``_from_chars`` skip it (SillyTavern's older presets send
  ``tfs_z`` and ``typical_p``); it was a 400.
"""

from __future__ import annotations

import logging

import pytest

import edgesdk
from edgesdk.runtime.generate import SamplingConfig, sampler_chain
from edgesdk.serve import api, llama_native
from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_native51 import slot_answering
from tests.unit.test_serve import Served

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "hi"}]
SERVER_LIMIT = 5  # the server's -n (--max-new-tokens)


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=SERVER_LIMIT))
    yield server
    server.close()


# ------------------------------------------------------------------ a token limit of -1 and the server's -n


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n_predict"])
def test_chat_minus_one_is_held_to_the_server_s_limit(served, field):
    # llama-server: slot.n_predict_max = task.params.n_predict != -1 ? task.params.n_predict : params_base.n_predict;
    # the OpenAI routes copy the body's fields into the same params (server-common.cpp oaicompat_chat_params_parse)
    status, answer = served.post("/v1/chat/completions", {"messages": MESSAGES, field: -1, "ignore_eos": True})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == SERVER_LIMIT
    assert answer["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("field", ["max_tokens", "n_predict"])
def test_completions_minus_one_is_held_to_the_server_s_limit(served, field):
    status, answer = served.post("/v1/completions", {"prompt": PROMPT, field: -1, "ignore_eos": True})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == SERVER_LIMIT


def test_a_streamed_chat_minus_one_is_held_too(served):
    chunks = served.stream("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": -1, "ignore_eos": True,
                                                    "stream_options": {"include_usage": True}})
    assert chunks[-2]["usage"]["completion_tokens"] == SERVER_LIMIT


def test_the_first_limit_given_is_the_one_read(served):
    # n_predict, else max_completion_tokens, else max_tokens (params_from_json_cmpl): -1 first is the server's limit
    status, answer = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": -1,
                                                          "max_tokens": 2, "ignore_eos": True})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == SERVER_LIMIT
    status, answer = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 2,
                                                          "max_tokens": -1, "ignore_eos": True})
    assert answer["usage"]["completion_tokens"] == 2


def test_a_request_s_own_limit_and_none_are_as_before(served):
    status, answer = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": SERVER_LIMIT + 3,
                                                          "ignore_eos": True})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == SERVER_LIMIT + 3  # the request's limit goes past the server's
    status, answer = served.post("/v1/chat/completions", {"messages": MESSAGES, "ignore_eos": True})
    assert answer["usage"]["completion_tokens"] == SERVER_LIMIT  # absent: the server's (defaults.n_predict)


def test_minus_one_on_a_server_without_a_limit_runs_to_the_context(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=UNTIL_THE_CONTEXT_FILLS))
    try:
        status, answer = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": -1, "ignore_eos": True})
    finally:
        server.close()
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] > SERVER_LIMIT
    assert answer["choices"][0]["finish_reason"] == "length"


def test_slots_show_the_minus_one_asked_for(served):
    # generation_settings' n_predict is the request's params.n_predict (-1); n_remain counts the server's limit down
    request = api.parse_chat_request({"messages": MESSAGES, "max_tokens": -1})
    assert request.max_tokens is None
    assert llama_native.asked_no_limit(request)
    slot = slot_answering(served.completer, request)
    assert slot["params"]["n_predict"] == -1
    assert slot["next_token"]["n_remain"] == SERVER_LIMIT - 2


def test_below_minus_one_is_still_refused_naming_what_minus_one_is(served):
    status, answer = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": -2})
    assert (status, answer["error"]["param"]) == (400, "max_tokens"), answer
    assert "or -1 for no limit but the context and the server's --max-new-tokens" in answer["error"]["message"]


def test_the_python_api_keeps_llama_cpp_python_s_minus_one(tiny_bundle):
    # llama-cpp-python's create_completion: max_tokens <= 0 is unlimited, "depends on n_ctx"; load()'s max_tokens is
    # only what a call that sets none gets
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=SERVER_LIMIT) as model:
        answer = model(PROMPT, ignore_eos=True, max_tokens=-1)
        assert answer["usage"]["completion_tokens"] > SERVER_LIMIT
        assert model(PROMPT, ignore_eos=True)["usage"]["completion_tokens"] == SERVER_LIMIT


# ------------------------------------------------------------------ adaptive_p without adaptive_target


@pytest.mark.parametrize("chain", [["top_k", "adaptive_p"], "ka"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_adaptive_p_without_a_target_is_llama_cpp_s_default_off(served, chain, path):
    # common/common.h: adaptive_target = -1.0f ("negative = disabled"); params_from_json_cmpl takes it where the
    # request gives none. The sampler then picks from the distribution as it is, as the chain's pick here
    body = {"max_tokens": 4, "temperature": 0.8, "seed": 3,
            **({"messages": MESSAGES} if path == "/v1/chat/completions" else {"prompt": PROMPT})}
    status, answer = served.post(path, {**body, "samplers": chain})
    assert status == 200, answer
    _, plain = served.post(path, {**body, "samplers": ["top_k"]})
    assert answer["choices"] == plain["choices"]


def test_adaptive_p_turned_on_is_still_refused(served):
    status, answer = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2,
                                                          "samplers": ["adaptive_p"], "adaptive_target": 0.5})
    assert (status, answer["error"]["param"]) == (400, "adaptive_target"), answer


# ------------------------------------------------------------------ sampler names llama.cpp does not know


@pytest.mark.parametrize(("unknown", "known"), [
    # SillyTavern's older LLAMACPP_DEFAULT_ORDER / its shipped Default preset
    (["top_k", "tfs_z", "typical_p", "top_p", "min_p", "temperature"], ["top_k", "top_p", "min_p", "temperature"]),
    ("kfypmt", "kypmt"),  # 'f': tfs_z, gone from llama.cpp
])
def test_a_sampler_llama_cpp_does_not_know_is_left_out_with_a_warning(served, unknown, known, caplog):
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0.8, "seed": 3}
    api._WARNED_SAMPLERS.clear()  # logged once per set of names: this test's own warning
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.api"):
        status, answer = served.post("/v1/completions", {**body, "samplers": unknown})
    assert status == 200, answer
    _, plain = served.post("/v1/completions", {**body, "samplers": known})
    assert answer["choices"][0]["text"] == plain["choices"][0]["text"]
    skipped = ["tfs_z", "typical_p"] if isinstance(unknown, list) else ["f"]
    assert any(all(repr(name) in record.getMessage() for name in skipped) and "left out" in record.getMessage()
               for record in caplog.records), caplog.records
    # the native route reads samplers through the same function
    status, native = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "samplers": unknown})
    assert status == 200, native
    assert native["generation_settings"]["samplers"] == list(sampler_chain(known))


def test_sampler_chain_skips_only_where_asked():
    skipped: list[str] = []
    assert sampler_chain(["top_k", "bogus", "temp"], skipped=skipped) == ("top_k", "temperature")
    assert skipped == ["bogus"]
    with pytest.raises(ValueError, match="'bogus', which is no sampler"):
        SamplingConfig(samplers=["top_k", "bogus"])  # a direct caller's typo is still refused
    with pytest.raises(ValueError, match="adaptive_p"):
        sampler_chain(["adaptive_p"], skipped=[])  # known to llama.cpp: not skipped as unknown
    with pytest.raises(ValueError, match="adaptive_p"):
        sampler_chain("ka", skipped=[])


def test_a_chain_that_is_no_list_of_names_is_still_refused(served):
    for bad in (5, ["top_k", 3]):
        status, answer = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "samplers": bad})
        assert (status, answer["error"]["param"]) == (400, "samplers"), answer
