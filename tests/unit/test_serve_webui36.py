"""The request llama.cpp's web UI sends by default (its settings: ``samplers: "edkypmxt"``, ``max_tokens: -1`` for no
limit, every sampler it has at its off value) is answered as llama-server answers it; ``max_tokens: -1`` was a 400."""

from __future__ import annotations

WEB_UI_SETTINGS = {"samplers": "edkypmxt", "temperature": 0.8, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
                   "top_k": 40, "top_p": 0.95, "min_p": 0.05, "xtc_probability": 0.0, "xtc_threshold": 0.1,
                   "typical_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                   "frequency_penalty": 0.0, "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
                   "dry_penalty_last_n": -1, "max_tokens": -1, "cache_prompt": True, "timings_per_token": False}


def test_the_web_ui_s_default_request_runs_to_the_end_of_the_context(runtime, served):
    from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    body = {"messages": [{"role": "user", "content": "hi"}], **WEB_UI_SETTINGS, "seed": 1}
    status, answer = served.post("/v1/chat/completions", body)
    assert status == 200, answer
    # -1: no limit of the request's own, so the server's -n (16 here) holds it, as llama-server's n_predict_max
    # (tools/server/server-context.cpp) holds it: tests/unit/test_api51.py
    assert answer["usage"]["completion_tokens"] == 16
    unlimited = Served(runtime, ServeDefaults(max_tokens=UNTIL_THE_CONTEXT_FILLS))  # serve -n -1, llama-server's default
    try:
        status, answer = unlimited.post("/v1/chat/completions", body)
    finally:
        unlimited.close()
    assert status == 200, answer
    usage = answer["usage"]
    # no limit but the context (this model never ends its answer early)
    assert answer["choices"][0]["finish_reason"] == "length"
    # (the token predicted at the last position is kept, as llama.cpp keeps it at n_ctx)
    assert usage["prompt_tokens"] + usage["completion_tokens"] == runtime.backend.max_context + 1


def test_max_tokens_below_minus_one_or_zero_is_still_refused(served):
    """Below -1, or not a whole number, is refused on both routes; 0 only on chat (OpenAI's completions take 0, the
    prompt scored alone: tests/unit/test_serve_openai45b.py)."""
    for path, prompt in (("/v1/completions", {"prompt": "hi"}),
                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        for value in (0, -2, 1.5) if path == "/v1/chat/completions" else (-2, 1.5):
            status, answer = served.post(path, {**prompt, "max_tokens": value})
            assert (status, answer["error"]["param"]) == (400, "max_tokens"), answer
            assert "or -1 for no limit but the context" in answer["error"]["message"]
    status, answer = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "max_completion_tokens": -1, "max_tokens": 3})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] > 3


def test_a_sampler_this_server_lacks_is_refused_on_every_route_when_set(served):
    """A web UI user who turns DRY or XTC on gets a 400 naming it on the chat route too (it was ignored there and
    refused only on /completion); at its off value it is taken, as the web UI sends it."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                       ("/completion", {"prompt": "hi", "n_predict": 2})):
        for field, value in (("dry_multiplier", 0.8), ("xtc_probability", 0.5), ("typical_p", 0.9)):
            status, answer = served.post(path, {**body, field: value})
            assert status == 400, (path, field, answer)
            message = answer["error"]["message"] if "error" in answer else str(answer)
            assert f"'{field}' = {value} is not supported: this server does not have that sampler" in message
        status, answer = served.post(path, {**body, "dry_multiplier": 0.0, "xtc_probability": 0.0})
        assert status == 200, (path, answer)
