"""Review of llama-server's native routes (51st stop), over real HTTP against the tiny bundle: a request's
``n_predict`` -1 held to the server's ``-n`` as llama-server holds it, ``adaptive_p`` in ``samplers`` without
``adaptive_target`` (llama.cpp's default target, -1, leaves it off), and ``GET /props``' default generation
settings with the fields ``GET /slots`` shows (``seed`` ...) and ``model_alias``."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve import llama_native
from edgesdk.serve.api import LLAMA_DEFAULT_SEED, UNTIL_THE_CONTEXT_FILLS
from edgesdk.serve.completion import ServeDefaults, SlotState
from tests.unit.test_serve import Served, runtime  # noqa: F401 (the module's runtime fixture)

PROMPT = "The quick brown fox"
SERVER_LIMIT = 5  # the server's -n (--max-new-tokens)


@pytest.fixture(scope="module")
def served(runtime):  # noqa: F811
    server = Served(runtime, ServeDefaults(max_tokens=SERVER_LIMIT))
    yield server
    server.close()


# ------------------------------------------------------------------ n_predict -1 and the server's -n


@pytest.mark.parametrize("field", ["n_predict", "max_tokens"])
def test_a_request_s_minus_one_is_held_to_the_server_s_limit(served, field):
    # llama-server: slot.n_predict_max = task.params.n_predict != -1 ? task.params.n_predict : params_base.n_predict
    # (tools/server/server-context.cpp, launch_slot_with_task): -1 is no limit of the request's own, the server's -n
    # holds it; generation_settings shows the -1 asked for (params.n_predict)
    fields = ["tokens_predicted", "stop_type", "generation_settings/n_predict"]
    status, body = served.post("/completion", {"prompt": PROMPT, field: -1, "ignore_eos": True,
                                               "response_fields": fields})
    assert status == 200, body
    assert (body["tokens_predicted"], body["stop_type"]) == (SERVER_LIMIT, "limit")
    assert body["generation_settings/n_predict"] == -1


def test_a_request_s_own_limit_goes_past_the_server_s(served):
    # "the per-request limit takes priority over the global one" (server-context.cpp)
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": SERVER_LIMIT + 3, "ignore_eos": True})
    assert status == 200, body
    assert body["tokens_predicted"] == SERVER_LIMIT + 3


def test_a_streamed_minus_one_is_held_too(served):
    status, _, payload = served.request("POST", "/completion", {"prompt": PROMPT, "n_predict": -1,
                                                                "ignore_eos": True, "stream": True})
    assert status == 200
    events = [json.loads(line[len("data: "):]) for line in payload.decode().split("\n\n") if line]
    assert events[-1]["stop"] is True
    assert events[-1]["tokens_predicted"] == SERVER_LIMIT


def test_minus_one_on_a_server_without_a_limit_runs_to_the_context(runtime):  # noqa: F811
    server = Served(runtime, ServeDefaults(max_tokens=UNTIL_THE_CONTEXT_FILLS))
    try:
        status, body = server.post("/completion", {"prompt": PROMPT, "n_predict": -1, "ignore_eos": True})
    finally:
        server.close()
    assert status == 200, body
    assert body["tokens_predicted"] > SERVER_LIMIT
    assert (body["stop_type"], body["truncated"]) == ("limit", True)  # the full context stopped it
    assert body["generation_settings"]["n_predict"] == -1


def test_slots_count_a_minus_one_request_down_the_server_s_limit(served):
    # llama-server's has_budget sets n_remaining from the server's n_predict where the task's is -1
    slot = slot_answering(served.completer, llama_native.parse_completion_request({"prompt": PROMPT, "n_predict": -1}))
    assert slot["params"]["n_predict"] == -1
    assert slot["next_token"]["n_remain"] == SERVER_LIMIT - 2


def slot_answering(completer, request, decoded: int = 2) -> dict:
    """/slots' record of ``completer`` while ``request`` has ``decoded`` tokens out (slot 7, a 4-token prompt)."""
    completer.slot = SlotState(7, request, completer.sampling(request), 4, decoded=decoded)
    try:
        return llama_native.slots(completer)[0]
    finally:
        completer.slot = None


# ------------------------------------------------------------------ adaptive_p without adaptive_target


@pytest.mark.parametrize("chain", [["top_k", "adaptive_p"], "ka"])
def test_adaptive_p_without_a_target_is_llama_cpp_s_default_off(served, chain):
    # common/common.h: adaptive_target = -1.0f ("negative = disabled"); the sampler then picks from the distribution
    # as it is (src/llama-sampling.cpp: "at negative target values, adaptive-p is no-op"), as the chain's pick here
    body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0.8, "seed": 3}
    status, answer = served.post("/completion", {**body, "samplers": chain})
    assert status == 200, answer
    _, plain = served.post("/completion", {**body, "samplers": ["top_k"]})
    assert answer["content"] == plain["content"]
    assert answer["generation_settings"]["samplers"] == ["top_k"]


def test_adaptive_p_with_a_target_that_turns_it_on_is_still_refused(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "samplers": ["adaptive_p"],
                                               "adaptive_target": 0.5})
    assert status == 400, body
    assert body["error"]["param"] == "adaptive_target"


# ------------------------------------------------------------------ /props


def test_props_default_generation_settings_hold_what_slots_show(served):
    # llama-server's get_props: {"params", task_params.to_json(true)} of its default sampling (seed, stop,
    # ignore_eos, n_probs ...), beside model_alias (its --alias) and model_path
    props = json.loads(served.request("GET", "/props")[2])
    slots = json.loads(served.request("GET", "/slots")[2])
    params = props["default_generation_settings"]["params"]
    assert params["seed"] == LLAMA_DEFAULT_SEED
    assert (params["stop"], params["ignore_eos"], params["n_probs"]) == ([], False, 0)
    assert set(slots[0]["params"]) <= set(params)
    assert {key: params[key] for key in slots[0]["params"]} == slots[0]["params"]
    assert params["n_predict"] == SERVER_LIMIT
    assert props["model_alias"] == "tiny-host"
