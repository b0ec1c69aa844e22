"""Embedding requests beside every other serve feature, on real servers over tiny bundles.

Chat answers with embedding requests between their turns are those of the same server without them (text, finish,
token counts, ``timings.cache_n``, drafts) under the prompt cache with other conversations kept in host memory,
prompt lookup, a draft bundle, a power-gated bundle (whose controller an embedding leaves as it was) and a simulated
hot board that paces. An embedding waits its turn as a generation does: a full queue refuses it (503
``server_busy``), a stopping server ends it (503 ``server_stopping``), a client that left while it waited has it not
run, and a thermal pause holding it ends when its client leaves or the server stops, with the hook's end (a capped
clock given back). ``/metrics`` counts an embedding's tokens as prompt tokens processed and its passes as decodes,
as llama-server counts an embedding task (tools/server/server-context.cpp, ``metrics_post_decode``), never as a
predicted token or a finished answer; ``/slots`` shows the slot processing while it runs.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.profile import get_profile
from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens
from edgesdk.runtime.session import open_runtime
from edgesdk.runtime.speculative import DraftConfig, DraftModel
from edgesdk.serve.api import ApiError, parse_text_request
from edgesdk.serve.completion import ClientGone, Completer, ServeDefaults
from edgesdk.thermal.guard import CLOCK_CAP_RATIO, Guard, GuardConfig, Limits
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import ThermalHook, open_session
from tests._utils.metrics_server import MetricsServer
from tests._utils.serve_command import serve_command
from tests.unit.test_power_export import power_bundle  # noqa: F401 (a fixture)
from tests.unit.test_serve import Served
from tests.unit.test_serve_thermal_abandon39 import NeverCools
from tests.unit.test_thermal_pause_sampled37 import PROFILE

TEXTS = ["a cat sits on the mat", "Edge boards run small models."]


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _normal(value):
    """An answer without what differs by request (ids, clocks): its timings' counts stay, ``cache_n`` among them."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("id", "created", "system_fingerprint"):
                continue
            if key == "timings":
                item = {name: count for name, count in item.items() if not name.endswith(("_ms", "_per_second"))}
            out[key] = _normal(item)
        return out
    if isinstance(value, list):
        return [_normal(item) for item in value]
    return value


def _events(text: str) -> list:
    return [json.loads(line[len("data: "):]) for line in text.split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


EMBEDDINGS = [("/v1/embeddings", {"input": TEXTS}), ("/embedding", {"content": "The quick brown fox"}),
              ("/api/embed", {"model": "tiny", "input": "Edge boards run"}), ("/embeddings", {"input": [5, 6, 7, 8]}),
              ("/api/embeddings", {"model": "tiny", "prompt": "Grouped-query attention"})]


def _embeddings(model: str) -> list[tuple[str, dict]]:
    """:data:`EMBEDDINGS` for a server that serves ``model`` (Ollama's routes name it)."""
    return [(path, {**body, "model": model} if "model" in body else body) for path, body in EMBEDDINGS]


def _conversation(server: MetricsServer, embeds: bool) -> tuple[list, list, dict]:
    """Three conversations whose turns interleave (each comes back to a prompt cache kept aside), llama-server's
    /completion extending a prompt, and with ``embeds`` an embedding request of each route between the turns: the
    answers, the embeddings' prompt token counts, and the metrics after."""
    history = {"a": [_user("The quick brown fox")], "b": [_user("Edge boards run small models")],
               "c": [_user("Grouped-query attention shares")]}
    answers, embedded, pending = [], [], deque(EMBEDDINGS * 2)
    plan = ["a", "b", "a", "c", "b", "a", "completion", "c", "b", "completion", "a"]
    for step, name in enumerate(plan):
        if embeds and pending:
            path, body = pending.popleft()
            status, text = server.request("POST", path, body)
            assert status == 200, (path, text)
            answer = json.loads(text)
            embedded.append(answer)
        if name == "completion":
            prompt = "The quick brown fox jumps" + " over" * step
            status, text = server.request("POST", "/completion", {"prompt": prompt, "n_predict": 12})
            assert status == 200, text
            answers.append(_normal(json.loads(text)))
            continue
        stream = step % 3 == 2
        status, text = server.request("POST", "/v1/chat/completions",
                                      {"messages": history[name], "max_tokens": 10 + step, "stream": stream})
        assert status == 200, text
        if stream:
            events = _events(text)
            reply = "".join(event["choices"][0]["delta"].get("content") or "" for event in events if event["choices"])
            answers.append(_normal(events))
        else:
            body = json.loads(text)
            reply = body["choices"][0]["message"]["content"]
            answers.append(_normal(body))
        history[name] = history[name] + [{"role": "assistant", "content": reply}, _user(f"and turn {step}")]
    return answers, embedded, server.metrics()


def _embedded_tokens(answers: list) -> tuple[int, int]:
    """(prompt tokens, inputs) of the embedding answers, as the runtime counts them."""
    tokens = inputs = 0
    for answer in answers:
        if isinstance(answer, dict) and "usage" in answer:  # OpenAI's
            tokens += answer["usage"]["prompt_tokens"]
            inputs += len(answer["data"])
        elif isinstance(answer, dict) and "prompt_eval_count" in answer:  # Ollama's /api/embed
            tokens += answer["prompt_eval_count"]
            inputs += len(answer["embeddings"])
        elif isinstance(answer, dict):  # /api/embeddings: one prompt, no count in the answer
            inputs += 1
        else:  # llama-server's: a list of {index, embedding}
            inputs += len(answer)
    return tokens, inputs


def _hot_board():
    """A simulated Raspberry Pi 5 warm enough that the guard goes hot and paces (on the simulated board's clock): it
    starts at 74 °C (past the 71.5 °C the guard paces from, below the 78 °C hard limit) in a 42 °C room, where it idles
    at 68.6 °C, below the 70 °C resume point, so a pause at the hard limit ends. At 49 °C ambient (idling at 75.6 °C,
    hot from the start) a loaded machine, where each step takes longer and heats the board more, took an answer past
    78 °C into a pause that never ended: a 503 board_too_hot (as tests/unit/test_serve_invariance39.py's board)."""
    session = open_session(get_profile("rpi5"), guard=True, simulate=True, status=False, sim_speed=50.0,
                           ambient_c=42.0)
    session.hook.board.temp_c = 74.0
    return session


CONFIGS = {  # name -> (ServeDefaults fields, draft, thermal)
    "cache-ram": ({"cache_ram_mib": 4}, False, False),
    "lookup": ({"lookup": 3}, False, False),
    "draft": ({}, True, False),
    "hot-board": ({"lookup": 2}, False, True),
}


def _server(path, fields: dict, draft: bool, thermal: bool) -> MetricsServer:
    runtime = open_runtime(path, threads=1)
    drafter = DraftModel(open_runtime(path, threads=1).backend, DraftConfig(max_draft=3, p_min=0.0),
                         runtime.backend.vocab_size) if draft else None
    session = _hot_board() if thermal else None
    completer = Completer(runtime, ServeDefaults(max_tokens=16, **fields), hook=session.hook if session else None,
                          draft=drafter)
    return MetricsServer(completer, session)


def _token_count(runtime, text: str) -> int:
    return len(runtime.tokenizer.encode(text))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_chat_answers_with_embeddings_between_turns_are_those_without(tiny_bundle, runtime, name):
    fields, draft, thermal = CONFIGS[name]
    plain, mixed = _server(tiny_bundle.path, fields, draft, thermal), _server(tiny_bundle.path, fields, draft, thermal)
    try:
        want, _, plain_metrics = _conversation(plain, embeds=False)
        got, embedded, metrics = _conversation(mixed, embeds=True)
        health = json.loads(mixed.request("GET", "/health")[1])
    finally:
        plain.close()
        mixed.close()
    assert got == want
    assert any(answer.get("timings", {}).get("cache_n") for answer in want if isinstance(answer, dict))
    if draft or fields.get("lookup"):
        assert any(answer.get("timings", {}).get("draft_n") for answer in want if isinstance(answer, dict))
    if thermal:
        assert health["thermal"]["level"] != "normal"
        assert metrics["edgesdk_thermal_wait_seconds_total"] > 0
    # the embeddings counted as llama-server counts them: prompt tokens processed, a decode per input, nothing
    # predicted, cached or finished
    tokens, inputs = _embedded_tokens(embedded)
    tokens += sum(_token_count(runtime, text) for text in ("The quick brown fox", "Grouped-query attention")) * 2 + 8
    assert metrics["edgesdk_prompt_tokens_total"] - plain_metrics["edgesdk_prompt_tokens_total"] == tokens
    assert metrics["edgesdk_n_decode_total"] - plain_metrics["edgesdk_n_decode_total"] == inputs
    for same in ("edgesdk_tokens_predicted_total", "edgesdk_prompt_tokens_cached_total", "edgesdk_n_tokens_max",
                 *(key for key in metrics if key.startswith("edgesdk_requests_finished_total"))):
        assert metrics[same] == plain_metrics[same], same


def _controller_state(backend) -> dict:
    return {key: list(value) if isinstance(value, deque) else value
            for key, value in vars(backend.controller).items() if key != "config"}


def test_a_power_gated_bundle_answers_alike_and_its_controller_stays_across_embeddings(power_bundle):  # noqa: F811
    def run(embeds: bool) -> tuple[list, list]:
        runtime = open_runtime(power_bundle.path, threads=1)
        server = Served(runtime, ServeDefaults(max_tokens=16))
        answers, moved = [], []
        messages = [_user("The quick brown fox")]
        try:
            for turn in range(3):
                if embeds:
                    before = _controller_state(runtime.backend)
                    for path, body in _embeddings("tiny-host")[:3]:
                        status, answer = server.post(path, body)
                        assert status == 200, answer
                    moved.append(_controller_state(runtime.backend) != before)
                status, body = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 12})
                assert status == 200, body
                answers.append(_normal(body))
                messages = messages + [body["choices"][0]["message"], _user(f"turn {turn}")]
            status, body = server.post("/completion", {"prompt": "The quick brown fox jumps", "n_predict": 12})
            answers.append(_normal(body))
        finally:
            server.close()
        assert runtime.backend.controller.blocks_total > 0  # the answers' decode steps moved it
        return answers, moved

    want, _ = run(embeds=False)
    got, moved = run(embeds=True)
    assert got == want
    assert moved == [False, False, False]


# ------------------------------------------------------------------------------------------------ a pause, the queue


class CappedNeverCools(NeverCools):
    """The scripted board past its hard limit that never cools, with the clock-cap protocol: the ratio last set."""

    cap_ratio = None

    def set_ratio(self, ratio):
        self.cap_ratio = ratio
        self.caps.append(ratio)


def _paused_hook(root, on_wait, temp_c: float | None = None) -> tuple[ThermalHook, CappedNeverCools]:
    """The hook of a guard over :class:`CappedNeverCools`, past its hard limit (paused) or at ``temp_c``."""
    board = CappedNeverCools(root, on_wait)
    board.caps = []
    if temp_c is not None:
        board.temp_c = temp_c
    limits, _ = Limits.resolve(PROFILE.thermal, board.sysfs.trips())
    guard = Guard(limits, PROFILE.thermal_model, GuardConfig(min_dwell_s=0.0, hot_clock_ratio=CLOCK_CAP_RATIO))
    return ThermalHook(board, board.read, guard, board, Telemetry(), clock_cap=board), board


def test_a_paused_embedding_ends_when_its_client_leaves_and_gives_the_clock_back(runtime, tmp_path):
    gone = {"now": False}

    def on_wait(chunks: int) -> None:
        gone["now"] = chunks >= 4

    hook, board = _paused_hook(tmp_path, on_wait)
    completer = Completer(runtime, ServeDefaults(max_tokens=4), hook=hook)
    with pytest.raises(ClientGone, match="while the thermal guard held the embedding"):
        completer.embed(TEXTS, EmbeddingConfig(), client_gone=lambda: gone["now"])
    assert board.chunks == 4
    assert hook.abandon_wait is None
    assert not completer.busy
    assert completer.slot is None
    assert completer.metrics.thermal_wait_seconds > 0  # the wait counted, as a generation's is
    assert completer.metrics.prompt_tokens == completer.metrics.decodes == 0  # nothing ran
    assert sum(completer.metrics.finished.values()) == 0


def test_a_paused_embedding_ends_when_the_server_stops(runtime, tmp_path):
    def on_wait(chunks: int) -> None:
        if chunks == 3:
            completer.stop()

    hook, board = _paused_hook(tmp_path, on_wait)
    completer = Completer(runtime, ServeDefaults(max_tokens=4), hook=hook)
    with pytest.raises(ApiError) as caught:
        completer.embed(TEXTS, EmbeddingConfig())
    assert caught.value.status == 503
    assert caught.value.code == "server_stopping"
    assert board.chunks == 3


@pytest.mark.parametrize("temp_c", [None, 75.0])
def test_an_input_past_the_context_is_refused_before_the_guard_sees_it(runtime, tmp_path, temp_c):
    """Paused (past the hard limit) it waits for no pause; hot, the guard's clock cap is not left on."""
    hook, board = _paused_hook(tmp_path, lambda chunks: None, temp_c)
    completer = Completer(runtime, ServeDefaults(max_tokens=4), hook=hook)
    too_long = list(range(5, 5 + runtime.backend.max_context + 1))
    with pytest.raises(ApiError) as caught:
        completer.embed([[5, 6], too_long], EmbeddingConfig())
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, "input[1]", "context_length_exceeded")
    assert (f"maximum context length is {runtime.backend.max_context} tokens. However, your input[1] resulted in "
            f"{len(too_long)} tokens") in caught.value.message
    assert board.chunks == 0
    assert completer.tasks == completer.metrics.decodes == 0  # the other input did not run either
    assert board.cap_ratio is None
    if temp_c is not None:  # the board is hot: an embedding that runs is paced with the clock capped, then given back
        completer.embed([[5, 6]], EmbeddingConfig())
        assert board.caps[0] is not None
        assert board.cap_ratio is None


def test_a_paced_embedding_its_client_leaves_gives_the_capped_clock_back(runtime, tmp_path):
    """A hot board (below the hard limit) paces: the guard caps the clock and holds a step back for credit. An
    embedding whose client leaves during that wait ends with the hook's end, which gives the clock back."""
    gone = {"now": False, "armed": False}
    hook, board = _paused_hook(tmp_path, lambda chunks: gone.update(now=gone["armed"]), temp_c=75.0)
    completer = Completer(runtime, ServeDefaults(max_tokens=24), hook=hook)
    completer.complete(parse_text_request({"prompt": "The quick brown fox", "max_tokens": 24}))  # learns the rate
    assert board.cap_ratio is None
    long_input = list(range(5, 5 + runtime.backend.max_context))
    gone["armed"], chunks = True, board.chunks
    with pytest.raises(ClientGone, match="while the thermal guard held the embedding"):
        completer.embed([long_input], EmbeddingConfig(), client_gone=lambda: gone["now"])
    assert board.chunks == chunks + 1
    assert CLOCK_CAP_RATIO in board.caps
    assert board.cap_ratio is None


def _wait_for(condition, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"never saw {what}")


def _send(port: int, path: str, body: dict) -> socket.socket:
    """A request written on a raw connection, its answer left unread."""
    data = json.dumps(body).encode()
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return connection


def _answer(connection: socket.socket) -> tuple[int, dict]:
    connection.settimeout(60)
    data = b""
    while chunk := connection.recv(65536):
        data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
        if length and len(body) >= length[0]:
            break
    connection.close()
    return int(data.split(b" ")[1]), json.loads(data.partition(b"\r\n\r\n")[2])


@pytest.fixture
def paused_server(runtime, tmp_path):
    """A server whose board never cools, so the first request holds the turn in a pause; its waits sleep a little
    real time between chunks (the test ends them)."""
    release = threading.Event()
    hook, board = _paused_hook(tmp_path, lambda chunks: release.wait(0.02))
    server = Served(runtime, ServeDefaults(max_tokens=4, max_waiting=1), hook=hook)
    yield server, board
    release.set()
    server.completer.stop()
    server.close()


def test_busy_stopping_and_slots_with_an_embedding_in_the_queue(paused_server):
    server, _ = paused_server
    completer = server.completer
    holder = _send(server.port, "/v1/chat/completions", {"messages": [_user("hi")]})
    _wait_for(lambda: completer.busy, "the chat holding the turn")
    waiting = _send(server.port, "/v1/embeddings", {"input": TEXTS})
    _wait_for(lambda: completer.waiting == 1, "the embedding waiting")
    for path, body in [("/embedding", {"content": "x"}), ("/v1/chat/completions", {"messages": [_user("x")]})]:
        status, answer = server.post(path, body)  # the queue holds max_waiting already
        assert (status, answer["error"]["code"]) == (503, "server_busy"), answer
    assert completer.metrics.refused_busy == 2
    completer.stop()
    for connection in (holder, waiting):
        status, answer = _answer(connection)
        assert (status, answer["error"]["code"]) == (503, "server_stopping"), answer
    assert completer.metrics.prompt_tokens == 0  # neither ran


def test_an_embedding_whose_client_left_while_it_waited_does_not_run(paused_server):
    server, _ = paused_server
    completer = server.completer
    holder = _send(server.port, "/v1/chat/completions", {"messages": [_user("hi")]})
    _wait_for(lambda: completer.busy, "the chat holding the turn")
    waiting = _send(server.port, "/embedding", {"content": TEXTS})
    _wait_for(lambda: completer.waiting == 1, "the embedding waiting")
    tasks = completer.tasks
    waiting.close()
    holder.close()  # the chat's pause ends at its next chunk; then the embedding's turn comes, for nobody
    _wait_for(lambda: not completer.busy and completer.waiting == 0 and completer._turn.queued == 0, "the queue empty")
    assert completer.metrics.prompt_tokens == completer.metrics.decodes == 0
    assert completer.tasks - tasks <= 1
    assert completer.slot is None


def test_slots_and_metrics_while_an_embedding_runs(runtime, tmp_path):
    seen = {}

    def on_wait(chunks: int) -> None:
        if chunks == 1:  # the embedding's pause: the slot is busy with it
            status, _, payload = server.request("GET", "/slots")
            seen["slots"] = json.loads(payload)
            status, answer = server.post("/v1/embeddings", {"input": "x"})
            seen["busy"] = answer
        if chunks == 2:
            server.completer.stop()

    hook, _ = _paused_hook(tmp_path, on_wait)
    server = Served(runtime, ServeDefaults(max_tokens=4, max_waiting=0), hook=hook)
    try:
        status, answer = server.post("/v1/embeddings", {"input": TEXTS})
    finally:
        server.close()
    assert (status, answer["error"]["code"]) == (503, "server_stopping")
    slot = seen["slots"][0]
    assert (slot["is_processing"], slot["id_task"]) == (True, 1)
    assert slot["next_token"]["n_decoded"] == 0
    assert seen["busy"]["error"]["code"] == "server_busy"


def test_metrics_count_an_embedding_as_prompt_tokens_and_never_as_an_answer(runtime):
    server = MetricsServer(Completer(open_runtime(runtime.bundle.path, threads=1), ServeDefaults(max_tokens=6)))
    try:
        status, _ = server.request("POST", "/v1/chat/completions", {"messages": [_user("The quick brown fox")]})
        assert status == 200
        before = server.metrics()
        status, text = server.request("POST", "/v1/embeddings", {"input": TEXTS})
        assert status == 200, text
        after = server.metrics()
    finally:
        server.close()
    tokens = json.loads(text)["usage"]["prompt_tokens"]
    assert tokens == sum(_token_count(runtime, text) for text in TEXTS)
    assert after["edgesdk_prompt_tokens_total"] - before["edgesdk_prompt_tokens_total"] == tokens
    assert after["edgesdk_n_decode_total"] - before["edgesdk_n_decode_total"] == len(TEXTS)
    assert after["edgesdk_prompt_seconds_total"] > before["edgesdk_prompt_seconds_total"]
    unchanged = [key for key in after if key.startswith(("edgesdk_requests_finished_total", "edgesdk_tokens_predicted",
                                                         "edgesdk_prompt_tokens_cached_total"))]
    assert len(unchanged) == 7
    assert all(after[key] == before[key] for key in unchanged)
    assert after["edgesdk_requests_processing"] == 0


# ------------------------------------------------------------------------------------------------ keys and pooling


def test_every_embedding_route_asks_for_the_api_key(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key="s3cret")
    try:
        for path, body in _embeddings("tiny-host"):
            status, answer = server.post(path, body)
            assert status == 401, (path, answer)
            assert "API key" in json.dumps(answer)
            status, answer = server.post(path, body, headers={"Authorization": "Bearer s3cret"})
            assert status == 200, (path, answer)
        assert server.completer.tasks == len(EMBEDDINGS) - 1 + len(TEXTS)  # a task per input, as llama-server's
    finally:
        server.close()


def test_pooling_none_gives_every_token_s_vector_natively_and_is_refused_elsewhere(runtime):
    ids = runtime.tokenizer.encode("The quick brown fox")
    want = embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling="none", normalize=-1)).vectors
    server = Served(runtime, ServeDefaults(max_tokens=4, pooling="none"))
    try:
        status, native = server.post("/embedding", {"content": "The quick brown fox"})
        assert status == 200, native
        assert len(native[0]["embedding"]) == len(ids)
        assert max(abs(a - b) for row, wanted in zip(native[0]["embedding"], want, strict=True)
                   for a, b in zip(row, wanted, strict=True)) < 1e-5
        status, openai = server.post("/v1/embeddings", {"input": "x"})
        assert (status, openai["error"]["code"]) == (400, "not_supported")
        assert "--pooling" in openai["error"]["message"]
        for path, body in [("/api/embed", {"model": "tiny-host", "input": "x"}),
                           ("/api/embeddings", {"model": "tiny-host", "prompt": "x"})]:
            status, ollama = server.post(path, body)
            assert status == 400, (path, ollama)
            assert "--pooling" in ollama["error"]
        assert server.completer.tasks == 1  # the refusals took no turn
    finally:
        server.close()


def test_serve_s_pooling_option_is_parsed_and_an_unknown_one_named(tiny_bundle, tmp_path):
    result = CliRunner().invoke(main, ["serve", str(tiny_bundle.path), "--pooling", "max"])
    assert result.exit_code == 2
    assert "--pooling" in result.output
    assert "'max' is not one of" in result.output
    import http.client
    from urllib.parse import urlparse

    with serve_command(tiny_bundle.path, tmp_path, "--pooling", "cls") as url:
        address = urlparse(url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
        connection.request("POST", "/v1/embeddings", json.dumps({"input": "The quick brown fox"}))
        answer = json.loads(connection.getresponse().read())
        connection.close()
    runtime = open_runtime(tiny_bundle.path, threads=1)
    ids = runtime.tokenizer.encode("The quick brown fox")
    want = embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling="cls", normalize=2)).vectors
    assert max(abs(a - b) for a, b in zip(answer["data"][0]["embedding"], want, strict=True)) < 1e-5
