"""Tool calls on a real bundle through the server: which tool the model picks and the arguments it writes.

Every call is well-formed by construction (edgesdk/serve/tools.py); this prints what the model chooses.

    EDGESDK_BENCH_BUNDLE=DIR python -m pytest tests/benchmarks/test_tool_calls.py -m benchmark -s
"""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.benchmark

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
LIGHT = {"type": "function", "function": {"name": "set_light", "description": "Switch the lamp",
                                          "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}},
                                                         "required": ["on"]}}}
ASKED = [("What's the weather in Oslo?", "auto"), ("Turn on the lamp please.", "auto"), ("Tell me a joke.", "auto"),
         ("What's the weather in Paris in fahrenheit?", "required")]


def test_what_the_model_calls(smollm2_rpi5_bundle):
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(open_runtime(smollm2_rpi5_bundle.path, threads=2), ServeDefaults(max_tokens=200))
    try:
        print()
        for content, choice in ASKED:
            start = time.perf_counter()
            status, answer = server.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": content}], "tools": [WEATHER, LIGHT], "tool_choice": choice})
            assert status == 200, answer
            message, usage = answer["choices"][0]["message"], answer["usage"]
            calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                     for c in message.get("tool_calls") or []]
            print(f"{content!r} [{choice}]: {calls or message['content']!r} ({time.perf_counter() - start:.1f} s, "
                  f"{usage['prompt_tokens']} prompt tokens, {usage['prompt_tokens_details']['cached_tokens']} cached)")
    finally:
        server.close()


TWO_CITIES = ("What's the weather in Oslo and in Paris?", "required")


def test_one_call_against_the_list_of_calls(smollm2_fp32_bundle):
    """The same requests with ``parallel_tool_calls`` false (one call) and true (llama.cpp's ``{"tool_calls": [...]}``
    list): how many calls the model makes and how many tokens it spends. A small model given the list form may go on
    calling, which is why only the chat route's explicit ``parallel_tool_calls: true`` (and the Messages route's
    ``disable_parallel_tool_use: false``) asks for it."""
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(open_runtime(smollm2_fp32_bundle.path, threads=2), ServeDefaults(max_tokens=200))
    try:
        print()
        for parallel in (False, True):
            for content, choice in (*ASKED, TWO_CITIES):
                status, answer = server.post("/v1/chat/completions", {
                    "messages": [{"role": "user", "content": content}], "tools": [WEATHER, LIGHT],
                    "tool_choice": choice, "parallel_tool_calls": parallel})
                assert status == 200, answer
                choice_body, usage = answer["choices"][0], answer["usage"]
                calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]) if
                          choice_body["finish_reason"] == "tool_calls" else c["function"]["arguments"])
                         for c in choice_body["message"].get("tool_calls") or []]
                print(f"parallel_tool_calls={parallel} {content!r} [{choice}]: {len(calls)} calls {calls[:3]} "
                      f"finish {choice_body['finish_reason']}, {usage['completion_tokens']} tokens")
    finally:
        server.close()
