"""Serve's decoding options leave a greedy answer as it is: a draft bundle (``serve --draft``), prompt lookup
decoding (``--lookup``), the prompt cache between requests (on by default) with other prompts' KV caches kept in
host memory (``--cache-ram``) or not, and a simulated board's thermal guard, each against a plain server (no
drafts, no prompt cache) over the same bundle.

One real server per configuration answers one sequence of requests on every route (chat and text completions,
llama-server's /completion, /v1/responses, /v1/messages, Ollama's /api/chat and /api/generate; whole and streamed)
with stop strings, token limits, logprobs, JSON schemas, grammars, tools, a thinking template's reasoning block,
prompts that fill the context and requests that share a prefix or diverge inside a token, so the cache and the
drafts meet what the requests before left. Each answer's text, finish reason, token counts, tool calls and
logprobs (within 1e-4) equal the plain server's. The prompt tokens an answer took from the cache are the one
documented difference (OpenAI's ``cached_tokens``, Anthropic's ``cache_read_input_tokens``, llama-server's
``timings.cache_n``); Ollama's ``prompt_eval_count`` is the prompt's tokens, cached or not, as its API reference
defines it ("number of tokens in the prompt", docs/api.md), so it equals the plain server's, as its ``eval_count``
and ``done_reason`` do; the metrics count each request's prompt tokens as prefilled or cached as its answer
reports them, and its predicted tokens as the plain server does."""

from __future__ import annotations

import json

import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.session import open_runtime
from edgesdk.runtime.speculative import DraftConfig, DraftModel
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.thermal.watch import open_session
from tests._utils.builds import build_lively_bundle
from tests._utils.metrics_server import MetricsServer
from tests._utils.tiny import CORPUS
from tests.unit.test_serve_reasoning import THINKING_TEMPLATE

MAX_CONTEXT = 512  # room for the tools' prompt (about 300 tokens of the tiny tokenizer)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    pytest.importorskip("torch")
    return {"target": build_lively_bundle(tmp_path_factory.mktemp("target39"), 11, MAX_CONTEXT).path,
            "other": build_lively_bundle(tmp_path_factory.mktemp("other39"), 12, MAX_CONTEXT).path}


def _open(path):
    runtime = open_runtime(path, threads=1)
    # A template that opens a <think> block (Qwen3's way): chat answers are reasoning unless enable_thinking is false
    runtime.tokenizer.template_source = THINKING_TEMPLATE
    runtime.tokenizer._template = None
    return runtime


class Server(MetricsServer):
    """A real server over its own runtime (its KV cache is its prompt cache's), in a background thread."""

    def __init__(self, bundles, defaults: ServeDefaults, draft: str | None = None, thermal=None):
        runtime = _open(bundles["target"])
        drafter = None
        if draft is not None:
            drafter = DraftModel(open_runtime(bundles[draft], threads=1).backend, DraftConfig(max_draft=3),
                                 runtime.backend.vocab_size)
        super().__init__(Completer(runtime, defaults, hook=None if thermal is None else thermal.hook, draft=drafter),
                         thermal)


def _thermal():
    """A simulated Raspberry Pi 5 warm enough that the guard goes hot and paces the long answers (it waits on the
    simulated board's clock). At 42 °C ambient it idles at 68.6 °C (2.8 W), below the 70 °C resume point, so a
    pause at the hard limit ends; at 49 °C it idled at 75.6 °C, and on a loaded machine, where each step takes
    longer and heats the board more, an answer that crossed 78 °C got a 503 board_too_hot."""
    return open_session(get_profile("rpi5"), guard=True, simulate=True, status=False, sim_speed=50.0, ambient_c=42.0)


CONFIGS = {  # name -> (ServeDefaults fields, draft bundle, thermal session)
    "prompt-cache": ({}, None, None),
    "prompt-cache-no-ram": ({"cache_ram_mib": 0}, None, None),
    "prompt-cache-1-mib": ({"cache_ram_mib": 1}, None, None),  # saved caches evicted as others come
    "lookup": ({"lookup": 3, "prompt_cache": False}, None, None),
    "lookup-cache": ({"lookup": 2}, None, None),
    "draft-same-weights": ({}, "target", None),
    "draft-other-model": ({"prompt_cache": False}, "other", None),
    "thermal-lookup-cache": ({"lookup": 2}, None, _thermal),
}

LONG = " ".join(CORPUS[:4])
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CLAUDE_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a", "b"]}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _chat(messages: list, **fields) -> tuple[str, dict]:
    return "/v1/chat/completions", {"messages": messages, **fields}


# In order: later requests share prefixes with earlier ones (the cache), diverge inside a token ("fo" / "fox"),
# come back to a conversation after another (a saved cache), and fill the context.
REQUESTS = [
    _chat([_user("The quick brown fox")], max_tokens=30),
    _chat([_user("The quick brown fox")], max_tokens=30, stream=True),
    _chat([_user("The quick brown fox")], max_tokens=7, **NO_THINKING),
    _chat([_user("The quick brown fox")], max_tokens=30, logprobs=True, top_logprobs=3, **NO_THINKING),
    _chat([_user("The quick brown fox")], max_tokens=30, logprobs=True, top_logprobs=3, stream=True, **NO_THINKING),
    _chat([_user("Edge boards run")], max_tokens=40, stop=["e", "ab"], **NO_THINKING),
    _chat([_user("Edge boards run")], max_tokens=40, stop=["g"], logprobs=True, top_logprobs=2, stream=True,
          **NO_THINKING),
    _chat([_user("Edge boards run"), {"role": "assistant", "content": "x"}, _user("go on")], max_tokens=25),
    _chat([_user("Give JSON")], max_tokens=40, response_format={"type": "json_schema",
                                                                "json_schema": {"name": "x", "schema": SCHEMA}}),
    _chat([_user("Give JSON")], max_tokens=40, response_format={"type": "json_object"}, stream=True),
    # a call cut inside its arguments (thinking off: a thinking model under tools thinks first, and the tiny one
    # thinks past the limit, as the next request does)
    _chat([_user("weather")], max_tokens=80, tools=TOOLS, tool_choice="required", **NO_THINKING),
    _chat([_user("weather")], max_tokens=80, tools=TOOLS, tool_choice="required", stream=True),
    _chat([_user("weather")], max_tokens=40, tools=TOOLS),
    _chat([_user("x")], max_tokens=12, logit_bias={"5": -100}, presence_penalty=1.5, frequency_penalty=0.5),
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 30}),
    ("/v1/completions", {"prompt": "The quick brown fo", "max_tokens": 30, "logprobs": 2}),
    ("/v1/completions", {"prompt": "The quick brown fox jumps", "max_tokens": 30, "logprobs": 2, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 30, "echo": True, "logprobs": 1}),
    ("/v1/completions", {"prompt": LONG, "max_tokens": 60}),
    ("/v1/completions", {"prompt": LONG[:200], "max_tokens": 23, "stop": ["o"]}),
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 30, "cache_prompt": False}),
    ("/v1/completions", {"prompt": "Grouped-query attention shares key and value heads", "max_tokens": 400}),
    ("/completion", {"prompt": "Grouped-query attention shares", "n_predict": 300, "n_probs": 1, "stream": True}),
    ("/completion", {"prompt": "The quick brown fox", "n_predict": 30, "n_probs": 3}),
    ("/completion", {"prompt": "The quick brown fox", "n_predict": 30, "n_probs": 3, "stream": True}),
    ("/completion", {"prompt": "Edge", "n_predict": 30, "grammar": 'root ::= ("ab" | "abc" | [0-9]+ " "){2,12} "."'}),
    ("/completion", {"prompt": "Edge", "n_predict": 0}),
    ("/completion", {"prompt": "Edge boards", "n_predict": 20, "stop": ["a"]}),
    ("/completion", {"prompt": "Edge boards", "n_predict": 40, "repeat_penalty": 1.5, "repeat_last_n": 8}),
    ("/completion", {"prompt": "Edge boards", "n_predict": 40, "ignore_eos": True}),
    ("/completion", {"prompt": LONG + " " + LONG, "n_predict": 600, "n_keep": 5}),  # to the context's end
    ("/v1/responses", {"input": "The quick brown fox", "max_output_tokens": 30}),
    ("/v1/responses", {"input": "The quick brown fox", "max_output_tokens": 30, "stream": True}),
    ("/v1/responses", {"input": "The quick brown fox", "max_output_tokens": 30, "top_logprobs": 2,
                       "include": ["message.output_text.logprobs"], "reasoning": {"effort": "none"}}),
    ("/v1/messages", {"messages": [_user("The quick brown fox")], "max_tokens": 30}),
    ("/v1/messages", {"messages": [_user("The quick brown fox")], "max_tokens": 30, "stream": True}),
    ("/v1/messages", {"messages": [_user("Edge boards")], "max_tokens": 30, "stop_sequences": ["a", "b"],
                      "thinking": {"type": "disabled"}}),
    ("/v1/messages", {"messages": [_user("weather")], "max_tokens": 80, "tools": CLAUDE_TOOLS,
                      "tool_choice": {"type": "any"}, "thinking": {"type": "disabled"}}),
    ("/v1/messages", {"messages": [_user("weather")], "max_tokens": 80, "tools": CLAUDE_TOOLS,
                      "tool_choice": {"type": "any"}, "stream": True}),
    _chat([_user(LONG[:150])], max_tokens=20),
    _chat([_user("Another user here")], max_tokens=10),
    _chat([_user(LONG[:150]), {"role": "assistant", "content": "ok"}, _user("more")], max_tokens=20),
    _chat([_user("Another user here")], max_tokens=10, stream=True, stream_options={"include_usage": True}),
    _chat([_user(LONG[:150]), {"role": "assistant", "content": "ok"}, _user("more")], max_tokens=20, logprobs=True,
          top_logprobs=2, **NO_THINKING),
    ("/v1/completions", {"prompt": LONG[:151], "max_tokens": 20, "logprobs": 3}),
    ("/v1/completions", {"prompt": LONG[:149], "max_tokens": 20, "logprobs": 3, "stream": True}),
    _chat([_user("The quick brown fox")], max_tokens=30),
]


def _ollama_chat(messages: list, predict: int, options: dict | None = None, **fields) -> tuple[str, dict]:
    return "/api/chat", {"model": "tiny", "messages": messages, "stream": False, **fields,
                         "options": {"num_predict": predict, **(options or {})}}


def _ollama_text(prompt: str, predict: int, options: dict | None = None, **fields) -> tuple[str, dict]:
    return "/api/generate", {"model": "tiny", "prompt": prompt, "stream": False, **fields,
                             "options": {"num_predict": predict, **(options or {})}}


TOOL_TURNS = [_user("weather"), {"role": "assistant", "content": "", "tool_calls": [
    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_name": "get_weather", "content": "sunny"}]

# Ollama's routes in the same order of shared prefixes (the prompts above reach its answers through the cache):
# whole and streamed (NDJSON, Ollama's default), thinking on and off, logprobs, tools, a format schema, stop
# strings, num_predict cuts, num_ctx below the bundle's, and text as it is (raw)
OLLAMA_REQUESTS = [
    _ollama_chat([_user("The quick brown fox")], 30),
    _ollama_chat([_user("The quick brown fox")], 30, stream=True),
    _ollama_chat([_user("The quick brown fox")], 7, think=True),
    _ollama_chat([_user("The quick brown fox")], 30, think=False, logprobs=True, top_logprobs=3),
    _ollama_chat([_user("The quick brown fox")], 30, think=False, logprobs=True, top_logprobs=3, stream=True),
    _ollama_chat([_user("The quick brown fox")], 30, logprobs=True, top_logprobs=1, stream=True),  # thinking
    _ollama_chat([_user("Edge boards run")], 40, think=False, options={"stop": ["e", "ab"]}),
    _ollama_chat([_user("Edge boards run")], 40, think=False, options={"stop": ["g"]}, stream=True, logprobs=True),
    _ollama_chat([_user("Give JSON")], 40, format=SCHEMA),
    _ollama_chat([_user("Give JSON")], 40, format=SCHEMA, stream=True),
    _ollama_chat([_user("Give JSON")], 40, format="json", think=False, stream=True),
    _ollama_chat([_user("weather")], 80, tools=TOOLS),
    _ollama_chat([_user("weather")], 80, tools=TOOLS, stream=True),
    _ollama_chat(TOOL_TURNS, 30, tools=TOOLS, think=False),
    _ollama_chat(TOOL_TURNS, 30, tools=TOOLS, think=False, stream=True, logprobs=True),
    _ollama_chat([_user("x")], 12, options={"repeat_penalty": 1.5, "repeat_last_n": 8, "presence_penalty": 1.5,
                                            "frequency_penalty": 0.5}),
    _ollama_chat([_user(LONG[:150]), {"role": "assistant", "content": "ok"}, _user("more")], 20, think=False,
                 options={"num_ctx": 150}),  # room for 13 tokens
    _ollama_chat([_user(LONG[:150]), {"role": "assistant", "content": "ok"}, _user("more")], 20, stream=True),
    _ollama_text("The quick brown fox", 30),
    _ollama_text("The quick brown fox", 30, system="Be brief.", think=False, logprobs=True, top_logprobs=2,
                 stream=True),
    _ollama_text("The quick brown fox", 30, raw=True),
    _ollama_text("The quick brown fo", 30, raw=True, logprobs=True, top_logprobs=2),
    _ollama_text("The quick brown fox jumps", 30, raw=True, logprobs=True, top_logprobs=2, stream=True),
    _ollama_text(LONG[:200], 23, raw=True, options={"stop": ["o"]}, stream=True),
    _ollama_text("Grouped-query attention shares", 300, raw=True, stream=True),
    _ollama_text(LONG + " " + LONG, -1, raw=True),  # to the context's end
    _ollama_text("Give JSON", 40, raw=True, format=SCHEMA, stream=True),
    _ollama_text("", 30),  # nothing to generate: the model is loaded
    _ollama_chat([_user("The quick brown fox")], 30),
]
OLLAMA_TIMES = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")

# The prompt tokens an answer took from the KV cache: the one field the prompt cache changes (OpenAI's
# prompt_tokens_details / input_tokens_details, Anthropic's split of the input, llama-server's timings)
CACHED_FIELDS = ("cached_tokens", "cache_read_input_tokens", "cache_n")
IDS = ("id", "created", "created_at", "system_fingerprint", "item_id", "call_id", "tool_call_id", "response_id",
       "previous_response_id")
ID_PREFIXES = ("chatcmpl-", "cmpl-", "resp_", "msg_", "call_", "fc_", "toolu_", "rs_")


def _events(text: str) -> list:
    return [json.loads(line[len("data: "):]) for line in text.split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


def _ndjson(text: str) -> list:
    return [json.loads(line) for line in text.split("\n") if line]


def _normal(value, cached: list[int]):
    """The answer without what differs by request (ids, times) and the prompt's cached part, which goes to
    ``cached``; Anthropic's input tokens are counted whole (``input_tokens`` excludes the cached ones)."""
    if isinstance(value, dict):
        value = dict(value)
        if "cache_read_input_tokens" in value:
            value["input_tokens"] += value["cache_read_input_tokens"]
        if "timings" in value:  # its counts; the milliseconds and rates are the clock's
            timings = value.pop("timings")
            value["timings_n"] = (timings["prompt_n"] + timings["cache_n"], timings["predicted_n"])
            cached.append(timings["cache_n"])
        for key in CACHED_FIELDS:
            if key in value:
                cached.append(value.pop(key))
        return {key: _normal(item, cached) for key, item in value.items() if key not in IDS + OLLAMA_TIMES}
    if isinstance(value, list):
        return [_normal(item, cached) for item in value]
    if isinstance(value, str) and value.startswith(ID_PREFIXES):
        return "<id>"
    return value


def _mismatches(expected, got, path: str = "") -> list[str]:
    if isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return [] if abs(expected - got) <= 1e-4 else [f"{path}: {expected!r} != {got!r}"]
    if type(expected) is not type(got):
        return [f"{path}: {expected!r} != {got!r}"]
    if isinstance(expected, dict):
        # an answer's settings name its draft settings (speculative.*), which a drafting server's differ in
        expected, got = ({key: value for key, value in side.items() if not key.startswith("speculative.")}
                         for side in (expected, got))
        if expected.keys() != got.keys():
            return [f"{path}: keys {sorted(expected)} != {sorted(got)}"]
        return [line for key in expected for line in _mismatches(expected[key], got[key], f"{path}.{key}")]
    if isinstance(expected, list):
        if len(expected) != len(got):
            return [f"{path}: {len(expected)} items != {len(got)}: {expected!r} != {got!r}"[:400]]
        return [line for index, (a, b) in enumerate(zip(expected, got, strict=True)) for line in _mismatches(a, b, f"{path}[{index}]")]
    return [] if expected == got else [f"{path}: {expected!r} != {got!r}"]


COUNTERS = ("edgesdk_prompt_tokens_total", "edgesdk_prompt_tokens_cached_total", "edgesdk_tokens_predicted_total")


def _answers(server: Server) -> list[dict]:
    """Each request's status, answer (whole, or the stream's events) without ids and cached counts, the cached
    counts it reported, and what the metrics counted for it."""
    out = []
    for path, body in REQUESTS + OLLAMA_REQUESTS:
        before = server.metrics()
        status, text = server.request("POST", path, body)
        after = server.metrics()
        cached: list[int] = []
        if path.startswith("/api/"):
            answer = _normal(_ndjson(text) if body.get("stream") else json.loads(text), cached)
        else:
            answer = _normal(_events(text) if body.get("stream") else json.loads(text), cached)
        out.append({"status": status, "answer": answer, "cached": cached,
                    "counted": {name: after[name] - before[name] for name in COUNTERS}})
    # a conversation by previous_response_id: each turn's prompt starts with the one before and its answer
    previous = None
    for index, text in enumerate(["The quick brown fox", "and then", "again"]):
        body = {"input": text, "max_output_tokens": 15 + 10 * index, "stream": index == 2,
                **({"previous_response_id": previous} if previous else {})}
        status, answer = server.request("POST", "/v1/responses", body)
        if index < 2:
            assert status == 200, answer
            previous = json.loads(answer)["id"]
        cached = []
        out.append({"status": status, "answer": _normal(_events(answer) if index == 2 else json.loads(answer), cached),
                    "cached": cached, "counted": None})
    return out


@pytest.fixture(scope="module")
def plain(bundles):
    server = Server(bundles, ServeDefaults(max_tokens=16, prompt_cache=False))
    try:
        return _answers(server), server.metrics()
    finally:
        server.close()


def test_the_plain_server_answers_every_request_and_caches_nothing(plain):
    answers, _ = plain
    assert [answer["status"] for answer in answers] == [200] * len(answers)
    assert not any(count for answer in answers for count in answer["cached"])
    finishes = json.dumps([answer["answer"] for answer in answers])
    for reason in ('"stop"', '"length"', '"tool_calls"', '"tool_use"', '"stop_sequence"', '"max_tokens"',
                   '"reasoning_content"', '"thinking"', '"logprobs"'):
        assert reason in finishes  # the matrix reaches each kind of answer
    ollama = json.dumps([answer["answer"] for answer in answers[len(REQUESTS):len(REQUESTS) + len(OLLAMA_REQUESTS)]])
    for reason in ('"done_reason": "stop"', '"done_reason": "length"', '"done_reason": "load"', '"thinking"',
                   '"logprobs"', '"top_logprobs"', '"prompt_eval_count"', '"eval_count"'):
        assert reason in ollama  # and each kind of Ollama answer


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_answers_are_the_plain_server_s_whatever_the_decoding_options(bundles, plain, name):
    fields, draft, thermal = CONFIGS[name]
    server = Server(bundles, ServeDefaults(max_tokens=16, **fields), draft=draft,
                    thermal=None if thermal is None else thermal())
    try:
        answers = _answers(server)
        metrics = server.metrics()
        health = json.loads(server.request("GET", "/health")[1])
    finally:
        server.close()
    expected_answers, expected_metrics = plain
    requests = REQUESTS + OLLAMA_REQUESTS + [("/v1/responses", {"previous_response_id": "chain"})] * 3
    for (path, body), expected, got in zip(requests, expected_answers, answers, strict=True):
        problems = _mismatches({"status": expected["status"], "answer": expected["answer"]},
                               {"status": got["status"], "answer": got["answer"]})
        assert not problems, (path, body, problems[:5])
        if got["counted"] is not None:
            # every prompt token was prefilled or taken from the cache, as the answer says; predicted tokens as plain
            counted = got["counted"]
            assert counted["edgesdk_prompt_tokens_total"] + counted["edgesdk_prompt_tokens_cached_total"] == \
                expected["counted"]["edgesdk_prompt_tokens_total"], (path, body)
            assert counted["edgesdk_tokens_predicted_total"] == expected["counted"]["edgesdk_tokens_predicted_total"]
            reported = [count for count in got["cached"] if count]
            assert all(count == counted["edgesdk_prompt_tokens_cached_total"] for count in reported), (path, body)
    caches = fields.get("prompt_cache", True)
    reused = sum(max(answer["cached"], default=0) for answer in answers)
    assert (reused > 0) == caches
    assert metrics["edgesdk_prompt_tokens_total"] + metrics["edgesdk_prompt_tokens_cached_total"] == \
        expected_metrics["edgesdk_prompt_tokens_total"]
    assert metrics["edgesdk_tokens_predicted_total"] == expected_metrics["edgesdk_tokens_predicted_total"]
    assert metrics["edgesdk_n_tokens_max"] == expected_metrics["edgesdk_n_tokens_max"] == MAX_CONTEXT
    if draft or fields.get("lookup"):  # checked drafts save backend passes
        assert metrics["edgesdk_n_decode_total"] < expected_metrics["edgesdk_n_decode_total"]
    if thermal is not None:  # the guard held steps back: its waits never reach the answers
        assert health["thermal"]["level"] != "normal"
        assert metrics["edgesdk_thermal_wait_seconds_total"] > 0


def _timings(server: Server, path: str, body: dict) -> dict:
    status, text = server.request("POST", path, body)
    assert status == 200, text
    if body.get("stream"):
        return next(event["timings"] for event in reversed(_events(text)) if "timings" in event)
    return json.loads(text)["timings"]


@pytest.mark.parametrize("kind", ["lookup", "target"])
def test_timings_count_the_drafts_only_where_the_answer_drafted(bundles, kind):
    """llama-server's timings carry ``draft_n`` and ``draft_n_accepted`` where an answer drafted tokens
    (tools/server/server-task.cpp, result_timings::to_json: ``if (draft_n > 0)``): here generate's own counts
    (an answer to its token limit) on every route that gives timings, also for an answer a stop string cut short
    (generate then ends in the exception that stops it, without its stats); a plain server's timings have neither,
    nor has an answer of one token."""
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.lookup import LookupConfig

    prompt = "Grouped-query attention shares key and value heads"
    fields, draft = ({"lookup": 3}, None) if kind == "lookup" else ({}, kind)
    drafting, plain = Server(bundles, ServeDefaults(max_tokens=16, **fields), draft=draft), \
        Server(bundles, ServeDefaults(max_tokens=16, prompt_cache=False))
    try:
        reference = open_runtime(bundles["target"], threads=1)
        source = LookupConfig(max_draft=3) if kind == "lookup" else \
            DraftModel(open_runtime(bundles[kind], threads=1).backend, DraftConfig(max_draft=3),
                       reference.backend.vocab_size)
        ids = reference.tokenizer.prompt_ids(prompt, raw=True)
        tokens, stats = generate(reference.backend, ids, SamplingConfig(max_new_tokens=40),
                                 reference.tokenizer.eos_token_ids, lookup=source)
        assert len(tokens) == 40
        assert 0 < stats.draft_accepted <= stats.draft_tokens
        for path, body in [("/completion", {"prompt": prompt, "n_predict": 40}),
                           ("/completion", {"prompt": prompt, "n_predict": 40, "stream": True}),
                           ("/v1/completions", {"prompt": prompt, "max_tokens": 40, "cache_prompt": False}),
                           ("/v1/completions", {"prompt": prompt, "max_tokens": 40, "stream": True,
                                                "stream_options": {"include_usage": True}})]:
            timings = _timings(drafting, path, body)
            assert (timings["predicted_n"], timings["draft_n"], timings["draft_n_accepted"]) == \
                (40, stats.draft_tokens, stats.draft_accepted), (path, body)
            assert not {"draft_n", "draft_n_accepted"} & set(_timings(plain, path, body))
        chat = _timings(drafting, "/v1/chat/completions", {"messages": [_user(prompt)], "max_tokens": 1})
        assert "draft_n" not in chat  # one token: nothing to draft
        if kind == "lookup":  # its answer repeats itself only past where a stop string could first be met
            return
        # a stop string first met past the answer's 24th token, once drafts were taken
        text, start = reference.tokenizer.decode(tokens), len(reference.tokenizer.decode(tokens[:24]))
        stop = next(text[at:at + 3] for at in range(start, len(text) - 3)
                    if text.find(text[at:at + 3]) == at and "\ufffd" not in text[at:at + 3])
        cut = _timings(drafting, "/completion", {"prompt": prompt, "n_predict": 40, "stop": [stop]})
        assert 24 < cut["predicted_n"] < 40
        assert 0 < cut["draft_n_accepted"] <= cut["draft_n"] <= stats.draft_tokens
        assert cut["draft_n_accepted"] < cut["predicted_n"]
    finally:
        drafting.close()
        plain.close()
