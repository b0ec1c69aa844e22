"""``edgesdk serve`` where a llama.cpp user meets llama-server's behaviour (its tools/server README and
server sources): requests served in arrival order, over real HTTP against the tiny bundle."""

from __future__ import annotations

import threading
import time

import pytest

from edgesdk.serve.api import parse_text_request
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

PROMPT = "The quick brown fox"


def wait_for(condition, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class OrderHook:
    """A StepHook that lists each request's token limit as its turn begins, and holds the first
    request's prefill until :attr:`release` is set."""

    def __init__(self):
        self.held, self.release = threading.Event(), threading.Event()
        self.order: list[int] = []

    def begin(self, prompt_tokens, max_new_tokens):
        self.order.append(max_new_tokens)

    def before_step(self, kind):
        if len(self.order) == 1 and kind == "prefill":
            self.held.set()
            assert self.release.wait(60)
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        pass

    def end(self, stats):
        pass


# ------------------------------------------------------------------------------------ the queue


def test_queued_requests_take_their_turns_in_arrival_order(runtime):
    """A slow first request, then five queued one by one: each runs in the order it arrived (the
    token limit tells the requests apart), and all are answered."""
    hook = OrderHook()
    server = Served(runtime, ServeDefaults(max_tokens=16), hook=hook)
    results: dict[int, tuple[int, dict]] = {}

    def send(limit: int) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.update(
            {limit: server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": limit})}))
        thread.start()
        return thread

    try:
        threads = [send(1)]
        assert hook.held.wait(30)
        limits = [6, 2, 5, 3, 4]  # not sorted: the order is the arrival's, not the requests' own
        for count, limit in enumerate(limits, start=2):
            threads.append(send(limit))
            assert wait_for(lambda: server.completer._turn.queued == count)  # noqa: B023 (waited for here)
        assert server.completer.waiting == len(limits)
        hook.release.set()
        for thread in threads:
            thread.join(60)
        assert hook.order == [1, *limits]
        assert {limit: status for limit, (status, _) in results.items()} == dict.fromkeys([1, *limits], 200)
        assert server.completer.waiting == 0
        assert server.completer._turn.queued == 0
    finally:
        hook.release.set()
        server.close()


def test_a_thread_that_asks_again_at_once_goes_behind_the_one_waiting(runtime):
    """A client whose next request follows its answer at once (a script in a loop) does not take the
    turn back from a request that was already waiting for it."""
    hook = OrderHook()
    server = Served(runtime, ServeDefaults(max_tokens=16), hook=hook)
    completer = server.completer
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)  # token ids: no tokenizing between turns
    again = parse_text_request({"prompt": ids, "max_tokens": 1})

    def again_and_again() -> None:
        for _ in range(4):
            completer.complete(again)

    try:
        looping = threading.Thread(target=again_and_again)
        looping.start()
        assert hook.held.wait(30)
        waiting = threading.Thread(target=lambda: completer.complete(
            parse_text_request({"prompt": PROMPT, "max_tokens": 7})))
        waiting.start()
        assert wait_for(lambda: completer._turn.queued == 2)
        hook.release.set()
        looping.join(60)
        waiting.join(60)
        assert hook.order == [1, 7, 1, 1, 1]
    finally:
        hook.release.set()
        server.close()


# ------------------------------------------------------------------------------------ browsers (CORS)

ORIGIN = "http://webui.example:5173"


def test_a_preflight_is_answered_without_the_api_key(runtime):
    """llama-server answers OPTIONS before its API key check (a browser sends no Authorization there):
    the request's origin, credentials, GET and POST, and the headers the browser asked for."""
    server = Served(runtime, api_key="sesame")
    try:
        status, headers, payload = server.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert (status, payload) == (200, b"")
        assert headers["Access-Control-Allow-Origin"] == ORIGIN
        assert headers["Access-Control-Allow-Credentials"] == "true"
        assert headers["Access-Control-Allow-Methods"] == "GET, POST"
        # echoed: '*' would not cover Authorization, which a browser then refuses to send
        assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert headers["Vary"] == "Origin"
        assert headers["Content-Length"] == "0"
        status, headers, _ = server.request("OPTIONS", "/no/such/route", headers={"Origin": ORIGIN})
        assert (status, headers["Access-Control-Allow-Headers"]) == (200, "*")
    finally:
        server.close()


def test_answers_and_refusals_carry_the_origin(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key="sesame")
    key = {"Authorization": "Bearer sesame", "Origin": ORIGIN}
    try:
        body = {"prompt": PROMPT, "max_tokens": 2}
        for path, request_headers, expected in [
                ("/v1/completions", key, 200),
                ("/v1/completions", {"Origin": ORIGIN}, 401),  # no key: the browser can still read why
                ("/v1/nothing", key, 404),
                ("/completion", {**key}, 200)]:
            status, headers, payload = server.request("POST", path, body, headers=request_headers)
            assert status == expected, payload
            assert headers["Access-Control-Allow-Origin"] == ORIGIN, (path, headers)
        status, headers, payload = server.request("POST", "/v1/completions", {**body, "stream": True}, headers=key)
        assert (status, headers["Content-Type"]) == (200, "text/event-stream")
        assert headers["Access-Control-Allow-Origin"] == ORIGIN
        status, headers, _ = server.request("GET", "/health", headers={"Origin": ORIGIN})
        assert (status, headers["Access-Control-Allow-Origin"]) == (200, ORIGIN)
        status, headers, _ = server.request("PUT", "/v1/completions", headers={"Origin": ORIGIN})  # the base class's 501
        assert (status, headers["Access-Control-Allow-Origin"]) == (501, ORIGIN)
        status, headers, _ = server.request("GET", "/health")  # no Origin (curl, a script): no CORS headers
        assert status == 200
        assert not any(name.startswith("Access-Control-") for name in headers)
    finally:
        server.close()


def test_a_keep_alive_connection_goes_on_after_a_preflight_and_forgets_its_origin(runtime):
    import http.client
    import socket

    server = Served(runtime, ServeDefaults(max_tokens=2))
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("OPTIONS", "/completion", headers={"Origin": ORIGIN})
        first = connection.getresponse()
        assert (first.status, first.read()) == (200, b"")
        connection.request("POST", "/completion", body=b'{"prompt": "The quick brown fox", "n_predict": 2}',
                           headers={"Origin": ORIGIN, "Content-Type": "application/json"})
        second = connection.getresponse()
        assert second.status == 200
        assert second.getheader("Access-Control-Allow-Origin") == ORIGIN
        second.read()
        connection.close()
        # a request line refused after a request with an Origin: its answer does not carry that origin
        client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        client.sendall(b"OPTIONS / HTTP/1.1\r\nHost: x\r\nOrigin: " + ORIGIN.encode() + b"\r\n\r\nGET /a b HTTP/1.1\r\n\r\n")
        received = b""
        while chunk := client.recv(65536):
            received += chunk
        client.close()
        preflight, _, refused = received.partition(b"\r\n\r\n")
        assert b"Access-Control-Allow-Origin: " + ORIGIN.encode() in preflight
        assert refused.startswith(b"HTTP/1.1 400"), refused
        assert b"Access-Control-Allow-Origin" not in refused
    finally:
        server.close()


# ------------------------------------------------------------------------------------ n_probs


# A prompt the tiny model answers in whole characters, token by token "et", "s", "et", "s" ... (each taken 0.44 or
# more above the next token, in log-probability): to PROMPT it answers a lone byte 0xd7 first, which no text holds.
IN_TEXT = "What is"


def _events(payload: bytes) -> list[dict]:
    import json

    return [json.loads(block[len("data: "):]) for block in payload.decode().split("\n\n") if block]


def _same(first: list[dict], second: list[dict]) -> None:
    """Two lists of probabilities name the same tokens with the same figures (a prompt served from the cache
    rounds otherwise than a fresh prefill, in the last digits)."""
    def tokens(entries):
        return [(e["id"], e["token"], e["bytes"], [t["id"] for t in e["top_logprobs"]]) for e in entries]

    def figures(entries):
        return [[e["logprob"], *(t["logprob"] for t in e["top_logprobs"])] for e in entries]

    assert tokens(first) == tokens(second)
    for one, other in zip(figures(first), figures(second), strict=True):
        assert one == pytest.approx(other, rel=1e-3, abs=1e-4)


def test_n_probs_gives_llama_server_s_completion_probabilities(served, runtime):
    """Each answer token's id, text, bytes and log-probability, with the N most likely tokens at its
    position: the same figures as the OpenAI route's logprobs of the same request."""
    status, body = served.post("/completion", {"prompt": IN_TEXT, "n_predict": 6, "n_probs": 3})
    assert status == 200, body
    probabilities = body["completion_probabilities"]
    assert len(probabilities) == body["tokens_predicted"] == 6
    assert body["generation_settings"]["n_probs"] == 3
    table = runtime.tokenizer.token_bytes()
    for entry in probabilities:
        assert list(entry) == ["id", "token", "bytes", "logprob", "top_logprobs"]
        assert bytes(entry["bytes"]) == table[entry["id"]]
        assert [list(top) for top in entry["top_logprobs"]] == [["id", "token", "bytes", "logprob"]] * 3
        figures = [top["logprob"] for top in entry["top_logprobs"]]
        assert figures == sorted(figures, reverse=True)
        assert entry["logprob"] <= 0
        # greedy (the server's default): the token taken is the most likely one
        assert (entry["id"], entry["logprob"]) == (entry["top_logprobs"][0]["id"], figures[0])
    assert b"".join(bytes(entry["bytes"]) for entry in probabilities).decode() == body["content"]
    status, openai = served.post("/v1/completions", {"prompt": IN_TEXT, "max_tokens": 6, "logprobs": 3})
    assert status == 200, openai
    reference = openai["choices"][0]["logprobs"]
    assert [entry["logprob"] for entry in probabilities] == pytest.approx(reference["token_logprobs"])
    assert [entry["token"] for entry in probabilities] == reference["tokens"]
    # without n_probs (or with 0) the answer has none, as llama-server's
    assert "completion_probabilities" not in served.post("/completion", {"prompt": PROMPT, "n_predict": 2})[1]


def test_a_token_ending_inside_a_character_shows_its_complete_characters_only(runtime):
    """llama-server cuts a token's text before an unfinished UTF-8 character at its end; its bytes stay whole."""
    from edgesdk.runtime.logprobs import TokenLogprob
    from edgesdk.serve.api import completion_probabilities

    pieces = {1: "é".encode() + "€".encode()[:2], 2: b"\x80", 3: b"ok"}
    shown = completion_probabilities([TokenLogprob(1, -0.5, ((1, -0.5), (2, -1.0), (3, -2.0)))], pieces.__getitem__)
    assert shown[0]["token"] == "é"
    assert shown[0]["bytes"] == list(pieces[1])
    assert [top["token"] for top in shown[0]["top_logprobs"]] == ["é", "\ufffd", "ok"]


def test_a_stream_carries_each_piece_s_probabilities(served):
    whole = served.post("/completion", {"prompt": PROMPT, "n_predict": 8, "n_probs": 2})[1]
    status, _, payload = served.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 8, "n_probs": 2,
                                                                "stream": True})
    assert status == 200, payload
    *pieces, last = _events(payload)
    assert all(event["completion_probabilities"] for event in pieces)
    streamed = [entry for event in pieces for entry in event["completion_probabilities"]]
    _same(streamed, whole["completion_probabilities"])
    for event in pieces:  # each event's entries are the tokens whose text it carries
        text = b"".join(bytes(entry["bytes"]) for entry in event["completion_probabilities"])
        assert event["content"] == text.decode("utf-8", errors="replace")
    assert "completion_probabilities" not in last  # llama-server's last event carries none
    assert last["stop"] is True


def test_probabilities_stop_where_a_stop_string_cuts_the_answer(served):
    """Tokens past the text handed out (the stop string's) are not listed; one whose text the cut splits is."""
    body = {"prompt": IN_TEXT, "n_predict": 12, "n_probs": 1}
    whole = served.post("/completion", body)[1]
    first, second = (entry["token"] for entry in whole["completion_probabilities"][:2])  # "et", "s"
    assert len(first) > 1, whole["content"]
    assert second, whole["content"]
    assert (first + second).isprintable(), whole["content"]
    # a stop string from the first token's last character into the second's first: the cut splits the first
    stop = first[-1] + second[0]
    assert stop not in first
    cut = served.post("/completion", {**body, "stop": [stop]})[1]
    assert (cut["stop_type"], cut["content"]) == ("word", first[:-1])
    assert [entry["token"] for entry in cut["completion_probabilities"]] == [first]
    _same(cut["completion_probabilities"], whole["completion_probabilities"][:1])


@pytest.mark.parametrize(("field", "value", "message"), [
    ("n_probs", -1, "'n_probs' must be how many of the most likely tokens to list per answer token"),
    ("n_probs", True, "got true"),
    ("n_probs", "3", 'got "3"'),
    ("post_sampling_probs", True, "'post_sampling_probs' = true is not supported: this server lists the model's own "
                                  "probabilities"),
])
def test_probabilities_the_runtime_cannot_give_are_refused_by_name(served, field, value, message):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_probs": 3, field: value})
    assert status == 400, body
    assert body["error"]["param"] == field
    assert message in body["error"]["message"]
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "n_probs": 20,
                                               "post_sampling_probs": False})
    assert (status, len(body["completion_probabilities"][0]["top_logprobs"])) == (200, 20)


# ------------------------------------------------------------------------------------ n_predict 0


class StepsHook:
    """A StepHook that lists what it is told."""

    def __init__(self):
        self.calls: list[tuple] = []

    def begin(self, prompt_tokens, max_new_tokens):
        self.calls.append(("begin", prompt_tokens, max_new_tokens))

    def before_step(self, kind):
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self.calls.append((kind, tokens))

    def end(self, stats):
        self.calls.append(("end", None if stats is None else (stats.prompt_tokens, stats.new_tokens)))


def test_n_predict_0_evaluates_the_prompt_into_the_cache_and_generates_nothing(runtime):
    """llama-server's README: "When 0, no tokens will be generated but the prompt is evaluated into the
    cache". The next request that starts with the prompt prefills only what follows it."""
    hook = StepsHook()
    server = Served(runtime, ServeDefaults(max_tokens=16), hook=hook)
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)
    try:
        status, body = server.post("/completion", {"prompt": ids, "n_predict": 0})
        assert status == 200, body
        assert (body["content"], body["tokens_predicted"], body["tokens_evaluated"]) == ("", 0, len(ids))
        assert (body["stop"], body["stop_type"], body["generation_settings"]["n_predict"]) == (True, "limit", 0)
        timings = body["timings"]
        assert (timings["prompt_n"], timings["cache_n"], timings["predicted_n"]) == (len(ids), 0, 0)
        assert timings["prompt_ms"] > 0
        assert hook.calls == [("begin", len(ids), 0), ("prefill", 0), ("end", (len(ids), 0))]
        metrics = server.completer.metrics
        assert (metrics.prompt_tokens, metrics.predicted_tokens, metrics.finished["length"]) == (len(ids), 0, 1)
        # the prompt and what follows it: only the new tokens are prefilled
        more = runtime.tokenizer.encode(" jumps over the lazy dog", add_special_tokens=False)
        status, body = server.post("/completion", {"prompt": ids + more, "n_predict": 3})
        assert status == 200, body
        assert (body["timings"]["cache_n"], body["timings"]["prompt_n"]) == (len(ids), len(more))
        assert body["tokens_predicted"] == 3
        fresh = server.post("/completion", {"prompt": ids + more, "n_predict": 3, "cache_prompt": False})[1]
        assert fresh["timings"]["cache_n"] == 0
        assert body["content"] == fresh["content"]
    finally:
        server.close()


def test_n_predict_0_streamed_and_through_max_tokens(served):
    status, _, payload = served.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 0, "stream": True})
    assert status == 200, payload
    (only,) = _events(payload)
    assert (only["stop"], only["content"], only["tokens_predicted"]) == (True, "", 0)
    status, body = served.post("/completion", {"prompt": PROMPT, "max_tokens": 0, "n_probs": 2})
    assert (status, body["content"], body["tokens_predicted"]) == (200, "", 0)
    assert "completion_probabilities" not in body  # no token, no probabilities (llama-server leaves them out)
    # OpenAI's route takes 0 too (OpenAI's completions do): the prompt evaluated, nothing generated
    status, body = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert (status, body["choices"][0]["text"], body["usage"]["completion_tokens"]) == (200, "", 0)


# ------------------------------------------------------------------------------------ GET /slots


class HoldAt(StepsHook):
    """Holds the step of the given number (1: the first prefill) until :attr:`release` is set."""

    def __init__(self, step: int):
        super().__init__()
        self.step, self.seen = step, 0
        self.held, self.release = threading.Event(), threading.Event()

    def before_step(self, kind):
        self.seen += 1
        if self.seen == self.step:
            self.held.set()
            assert self.release.wait(60)
        return 0.0


def test_slots_shows_the_one_slot_idle_and_the_request_it_runs(runtime):
    import json

    hook = HoldAt(3)  # the prefill (first token), one decode step (second token), then held
    server = Served(runtime, ServeDefaults(max_tokens=16), hook=hook, api_key="sesame")
    key = {"Authorization": "Bearer sesame"}
    try:
        assert server.request("GET", "/slots")[0] == 401  # behind the key, as in llama-server
        status, _, payload = server.request("GET", "/slots", headers=key)
        assert status == 200, payload
        (idle,) = json.loads(payload)
        assert (idle["id"], idle["id_task"], idle["is_processing"]) == (0, -1, False)
        assert idle["n_ctx"] == runtime.backend.max_context
        assert idle["params"]["n_predict"] == 16  # what a request that sets none gets
        assert idle["next_token"] == {"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}
        assert server.request("GET", "/slots?fail_on_no_slot=1", headers=key)[0] == 200

        results = {}
        running = threading.Thread(target=lambda: results.update(answer=server.post(
            "/completion", {"prompt": PROMPT, "n_predict": 10, "temperature": 0.5, "top_k": 7, "seed": 3},
            headers=key)))
        running.start()
        assert hook.held.wait(30)
        (busy,) = json.loads(server.request("GET", "/slots", headers=key)[2])
        assert (busy["id_task"], busy["is_processing"]) == (1, True)
        params = busy["params"]
        assert (params["n_predict"], params["temperature"], params["top_k"], params["seed"]) == (10, 0.5, 7, 3)
        assert busy["next_token"] == {"has_next_token": True, "has_new_line": False, "n_remain": 8, "n_decoded": 2}
        status, _, payload = server.request("GET", "/slots?fail_on_no_slot=1", headers=key)
        assert status == 503, payload
        assert json.loads(payload)["error"]["code"] == "no_slot_available"
        hook.release.set()
        running.join(60)
        assert results["answer"][0] == 200
        (after,) = json.loads(server.request("GET", "/slots", headers=key)[2])
        assert (after["id_task"], after["is_processing"]) == (-1, False)
        status, headers, _ = server.request("POST", "/slots", {"x": 1}, headers=key)
        assert (status, headers["Allow"]) == (405, "GET, HEAD")
    finally:
        hook.release.set()
        server.close()
