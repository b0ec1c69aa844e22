"""``edgesdk serve``: clients that leave, HTTP framing, stopping the server; real bundle, real sockets."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer

PROMPT = "The quick brown fox"
RESET_ON_CLOSE = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close sends a reset


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


class CountingHook:
    """A StepHook that counts requests and steps; ``hold_at`` holds the step of that number (1: the
    first prefill) until :attr:`release` is set, and :attr:`held` says it got there."""

    def __init__(self, hold_at: int | None = None):
        self.hold_at = hold_at
        self.held, self.release = threading.Event(), threading.Event()
        self.begins, self.steps, self.ends = 0, 0, []

    def begin(self, prompt_tokens, max_new_tokens):
        self.begins += 1

    def before_step(self, kind):
        if self.steps + 1 == self.hold_at:
            self.held.set()
            assert self.release.wait(60)
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self.steps += 1

    def end(self, stats):
        self.ends.append(stats)


class Served:
    def __init__(self, runtime, defaults: ServeDefaults, hook=None):
        self.completer = Completer(runtime, defaults, hook=hook)
        self.server = ApiServer(("127.0.0.1", 0), self.completer, "tiny-host", log=False)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
        connection.close()
        return response.status, payload

    def raw(self, data: bytes) -> socket.socket:
        client = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        client.sendall(data)
        return client

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def post_bytes(body: dict, path: str = "/v1/completions") -> bytes:
    data = json.dumps(body).encode()
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data)


def wait_for(condition, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def runs_to_max_tokens(runtime, max_tokens: int) -> None:
    ids = runtime.tokenizer.prompt_ids(PROMPT, raw=True)
    _, stats = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=max_tokens),
                        runtime.tokenizer.eos_token_ids)
    assert stats.stop_reason == "max_new_tokens", "the tiny model must run to max_tokens for this check"


# ------------------------------------------------------------------------------------ clients that leave


def test_a_request_whose_client_left_while_it_waited_never_runs(runtime):
    """llama-server drops a queued request whose connection closed; the board's turn goes to the next one."""
    hook = CountingHook(hold_at=1)
    server = Served(runtime, ServeDefaults(max_tokens=4), hook=hook)
    try:
        first = server.raw(post_bytes({"prompt": PROMPT}))
        assert hook.held.wait(30)
        free = server.completer.defaults.max_waiting  # places left in the queue
        for stream in (False, True):
            leaving = server.raw(post_bytes({"prompt": PROMPT, "max_tokens": 50, "stream": stream}))
            free -= 1
            assert wait_for(lambda: server.completer._admitted._value == free)  # noqa: B023 (waited for here)
            leaving.close()
        hook.release.set()
        assert first.recv(4096).startswith(b"HTTP/1.1 200")
        first.close()
        assert wait_for(lambda: server.completer._admitted._value == server.completer.defaults.max_waiting + 1)
        assert hook.begins == 1, "a request whose client had left was generated"
        assert server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})[0] == 200
    finally:
        hook.release.set()
        server.close()


def test_a_whole_answer_stops_when_its_client_leaves(runtime):
    """A request without stream writes nothing until its end, so no failed write tells that the client
    left; the generation stops at the next token all the same."""
    runs_to_max_tokens(runtime, 200)
    hook = CountingHook(hold_at=4)  # the third decode step
    server = Served(runtime, ServeDefaults(max_tokens=200), hook=hook)
    try:
        client = server.raw(post_bytes({"prompt": PROMPT, "max_tokens": 200}))
        assert hook.held.wait(30)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        client.close()
        hook.release.set()
        assert wait_for(lambda: hook.ends)
        assert hook.ends == [None]  # ended early, through the hook's end of request
        assert hook.steps <= 5
        assert wait_for(lambda: not server.completer.busy)
        assert server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})[0] == 200
    finally:
        hook.release.set()
        server.close()


# ------------------------------------------------------------------------------------ stopping the server


def read_events(client: socket.socket) -> list[str]:
    """The data lines of a streamed answer, read until the server closes the connection."""
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return [event[len(b"data: "):].decode() for event in body.split(b"\n\n") if event]


def test_stopping_the_server_ends_the_answers_before_the_thermal_session_closes(runtime):
    """``edgesdk serve`` stops (Ctrl-C, SIGTERM) through ``stop_answers``, then closes the thermal
    session: the answer being generated ends at its next token, its client gets the reason as the last
    event, a queued request gets a 503, and no step of the hook runs once ``stop_answers`` returned."""
    runs_to_max_tokens(runtime, 200)
    hook = CountingHook(hold_at=4)
    server = Served(runtime, ServeDefaults(max_tokens=200), hook=hook)
    try:
        streamed = server.raw(post_bytes({"prompt": PROMPT, "max_tokens": 200, "stream": True}))
        assert hook.held.wait(30)
        queued = server.raw(post_bytes({"prompt": PROMPT, "max_tokens": 200}))
        assert wait_for(lambda: server.server._answering == 2)
        stopped = {}
        stopper = threading.Thread(target=lambda: stopped.update(done=server.server.stop_answers(timeout=30)))
        stopper.start()
        assert wait_for(lambda: server.completer.stopping)
        hook.release.set()
        stopper.join(60)
        assert stopped == {"done": True}
        steps = hook.steps
        assert hook.ends == [None]  # ended early, through the hook's end of request (the clock cap given back)
        assert steps <= 5
        events = read_events(streamed)
        assert json.loads(events[-1])["error"]["code"] == "server_stopping", events[-3:]
        assert "[DONE]" not in events
        reply = queued.recv(65536)
        assert reply.startswith(b"HTTP/1.1 503"), reply
        assert json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["code"] == "server_stopping"
        status, body = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        assert (status, body["error"]["code"]) == (503, "server_stopping")
        assert (hook.steps, hook.begins) == (steps, 1)
    finally:
        hook.release.set()
        server.close()


def test_serve_command_stops_cleanly_on_sigterm_without_thermal_options(tiny_bundle, tmp_path):
    """A service manager stops the server with SIGTERM; without a thermal option it killed the process
    at once, cutting an answer mid-stream without a word, instead of stopping as Ctrl-C does."""
    process = subprocess.Popen(
        [sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port", "0", "--quiet",
         "--threads", "1"], stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    try:
        for line in process.stderr:
            if " on http://" in line:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        rest = process.communicate(timeout=60)[1]
    assert process.returncode == 128 + signal.SIGTERM, rest
    assert "Traceback" not in rest, rest


# ------------------------------------------------------------------------------------ where it listens


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize("host", ["::1", "::", "[::1]"])
def test_serve_listens_on_an_ipv6_address(runtime, host):
    """``--host ::`` (every interface, as the option's help says) and other IPv6 addresses: the server
    was an IPv4 socket and refused them with 'Address family for hostname not supported'."""
    server = ApiServer((host, 0), Completer(runtime, ServeDefaults(max_tokens=2)), "tiny-host", log=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert server.url.startswith("http://[")
        connection = http.client.HTTPConnection("::1", server.server_address[1], timeout=30)
        connection.request("GET", "/health")
        response = connection.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["status"] == "ok"
        connection.close()
    finally:
        server.shutdown()
        server.server_close()


def test_serve_names_a_host_it_cannot_listen_on(tiny_bundle, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--host",
                           "no-such-host.invalid", "--port", "0", "--threads", "1"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    assert proc.returncode != 0
    assert "cannot listen on no-such-host.invalid:0" in proc.stderr
    assert "fix: pass an address of this machine to --host" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------ HTTP framing


def exchange(server: Served, data: bytes) -> list[bytes]:
    """Send ``data`` on one connection and read until the server closes it: the status lines it sent."""
    client = server.raw(data)
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    client.close()
    return [line for line in received.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


@pytest.fixture
def idle_server(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=2))
    yield server
    server.close()


def test_a_content_length_that_is_not_one_number_is_a_400_that_ends_the_connection(idle_server):
    """RFC 9112 §6.3: a Content-Length of a non-ASCII digit was a 500 'internal error' with a traceback in
    the log; two that differ were read as the first, and the rest of the body as a next request."""
    body = b'{"prompt": "x", "max_tokens": 1}'
    nested = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    superscript = "²".encode("latin-1")
    for lengths in ([superscript], [b"%d" % len(body), b"%d" % (len(body) + len(nested))], [b"+%d" % len(body)]):
        head = b"".join(b"Content-Length: %s\r\n" % length for length in lengths)
        statuses = exchange(idle_server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n%s\r\n%s%s"
                            % (head, body, nested))
        assert statuses == [b"HTTP/1.1 400 Bad Request"], (lengths, statuses)


def test_a_get_with_a_body_ends_its_connection(idle_server):
    """No GET route reads a body; it was left on the connection and parsed as the next request."""
    nested = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    statuses = exchange(idle_server, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(nested), nested))
    assert statuses == [b"HTTP/1.1 200 OK"]


def test_refusals_of_the_http_layer_have_openai_s_error_shape(idle_server):
    """A method with no route, a request line past the limit: the base class's HTML page was the body."""
    for request, status in ((b"PUT /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 501),
                            (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414)):
        client = idle_server.raw(request)
        received = b""
        while chunk := client.recv(65536):
            received += chunk
        client.close()
        head, _, payload = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d" % status), head
        assert b"Content-Type: application/json" in head
        error = json.loads(payload)["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"]
        if status == 501:
            assert "PUT" in error["message"]
            assert "POST /v1/chat/completions" in error["message"]


def test_head_gives_a_get_s_headers_without_its_body(idle_server):
    connection = http.client.HTTPConnection("127.0.0.1", idle_server.port, timeout=30)
    connection.request("HEAD", "/health")
    response = connection.getresponse()
    assert response.status == 200
    assert int(response.getheader("Content-Length")) > 0
    assert response.read() == b""
    connection.request("GET", "/health")  # the same connection goes on
    response = connection.getresponse()
    assert json.loads(response.read())["status"] == "ok"
    connection.close()


# ------------------------------------------------------------------------------------ slow clients


@pytest.fixture
def impatient_server(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=2))
    server = ApiServer(("127.0.0.1", 0), completer, "tiny-host", log=False, client_timeout_s=0.5)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def read_until_closed(client: socket.socket) -> bytes:
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    return received


def test_a_client_that_stalls_is_let_go(impatient_server):
    """A request line, header or body that stops coming, or an idle keep-alive connection, held its
    connection and thread for good; now they close after the client timeout."""
    port = impatient_server.server_address[1]
    body = json.dumps({"prompt": PROMPT, "max_tokens": 1}).encode()
    for sent in (b"GET /health HT", b"GET /health HTTP/1.1\r\nHost: x\r\n",
                 b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"):  # the last one answered, then idle
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            client.sendall(sent)
            started = time.monotonic()
            received = read_until_closed(client)
            assert time.monotonic() - started < 20
        assert received == b"" or (sent.endswith(b"\r\n\r\n") and received.startswith(b"HTTP/1.1 200")), received
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(body), body[:5]))
        received = read_until_closed(client)
    head, _, payload = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received
    assert "stalled" in json.loads(payload)["error"]["message"]


def test_a_body_cut_short_is_named(idle_server):
    body = json.dumps({"prompt": PROMPT}).encode()
    client = idle_server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body) + 10, body))
    client.shutdown(socket.SHUT_WR)
    head, _, payload = read_until_closed(client).partition(b"\r\n\r\n")
    client.close()
    assert head.startswith(b"HTTP/1.1 400"), head
    assert f"ended after {len(body)} of the {len(body) + 10} bytes" in json.loads(payload)["error"]["message"]


@pytest.mark.parametrize(("path", "headers", "status"), [
    ("/v1/completions", b"Content-Length: 2000000\r\nAuthorization: Bearer k\r\n", 413),
    ("/v1/audio/speech", b"Content-Length: 20\r\n", 404),
    ("/v1/completions", b"Content-Length: 20\r\nAuthorization: Bearer wrong\r\n", 401),
])
def test_expect_100_continue_gets_the_refusal_before_the_body_is_sent(runtime, path, headers, status):
    """curl sends 'Expect: 100-continue' with a large body and waits; a 100 made it send megabytes the
    server then refused unread (and a reset can lose the refusal)."""
    completer = Completer(runtime, ServeDefaults(max_tokens=2))
    server = ApiServer(("127.0.0.1", 0), completer, "tiny-host", api_key="k", log=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=30) as client:
            client.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n%s\r\n" % (path.encode(), headers))
            received = read_until_closed(client)
        assert received.startswith(b"HTTP/1.1 %d" % status), received[:200]
        assert json.loads(received.partition(b"\r\n\r\n")[2])["error"]["message"]
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=30) as client:
            body = json.dumps({"prompt": PROMPT, "max_tokens": 1}).encode()
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nAuthorization: "
                           b"Bearer k\r\nContent-Length: %d\r\n\r\n" % len(body))
            assert client.recv(4096).startswith(b"HTTP/1.1 100 Continue")
            client.sendall(body)
            assert b"HTTP/1.1 200 OK" in client.recv(65536)
    finally:
        server.shutdown()
        server.server_close()


def test_a_body_nested_past_the_json_decoder_s_depth_is_a_400(idle_server):
    """json's RecursionError on deep nesting was a 500 'internal error' with a traceback in the log."""
    connection = http.client.HTTPConnection("127.0.0.1", idle_server.port, timeout=60)
    connection.request("POST", "/v1/completions", body=b"[" * 200_000)
    response = connection.getresponse()
    error = json.loads(response.read())["error"]
    connection.close()
    assert response.status == 400
    assert error["message"].startswith("the request body is not JSON")


# ------------------------------------------------------------------------------------ the OpenAI shapes


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_with_include_usage_every_chunk_has_a_usage_field(idle_server, path):
    """OpenAI's reference for stream_options.include_usage: the last chunk has the usage, and "all other
    chunks will also include a usage field, but with a null value"; without the option, none has one."""
    body = {"messages": [{"role": "user", "content": PROMPT}]} if "chat" in path else {"prompt": PROMPT}
    for include in (True, False):
        client = idle_server.raw(post_bytes({**body, "max_tokens": 3, "stream": True,
                                             "stream_options": {"include_usage": include}}, path))
        events = read_events(client)
        client.close()
        assert events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in events[:-1]]
        if include:
            assert all("usage" in chunk and chunk["usage"] is None for chunk in chunks[:-1]), chunks
            assert chunks[-1]["usage"]["total_tokens"] > 0
        else:
            assert not any("usage" in chunk for chunk in chunks)
