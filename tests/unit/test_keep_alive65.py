"""Ollama's ``keep_alive`` with several bundles served (serve/model_pool.py): an idle model is unloaded once its
keep_alive has passed since its last answer (the request's, else the server's default: OLLAMA_KEEP_ALIVE or
llama-server's --sleep-idle-seconds), a request for it before then keeps it, and /api/ps says when it goes; and a
swap to a bundle whose files no longer match their hashes is refused before the loaded model is unloaded. Real tiny
bundles, a real ONNX Runtime session, a real server over HTTP."""

from __future__ import annotations

import http.client
import json
import math
import shutil
import socket
import threading
import time
from datetime import datetime

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_serve import _model_pool
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from edgesdk.serve.model_pool import ModelPool, ServedModel
from edgesdk.serve.ollama import KEPT_LOADED_UNTIL, keep_alive, keep_alive_from_env, running

EVENTUALLY_S = 30  # far beyond a keep_alive of 1 s: only an unload that never comes reaches it
A, C = "a", "c"


class Served:
    """Bundles ``a`` and ``c`` (copies of the tiny bundle) served through the CLI's model pool on a free port, or
    (``several`` False) bundle ``a`` alone under ``name``, with no pool."""

    def __init__(self, root, tiny_bundle, keep_alive_s: float = math.inf, several: bool = True, name: str = A,
                 max_tokens: int = 4):
        self.paths = {}
        for each in (A, C) if several else (A,):
            self.paths[each] = root / each
            shutil.copytree(tiny_bundle.path, self.paths[each])
        runtime = open_runtime(self.paths[A], threads=1)
        runtime.tokenizer.template_kwargs = {}
        defaults = ServeDefaults(max_tokens=max_tokens)
        completer = Completer(runtime, defaults)
        self.runtime = runtime
        self.pool = _model_pool([(A, self.paths[A]), (C, self.paths[C])], runtime, completer, defaults, None, {}, 0,
                                backend=None, threads=1, target=None, ignore_target=False,
                                keep_alive_s=keep_alive_s) if several else None
        self.server = ApiServer(("127.0.0.1", 0), completer, name, log=False, pool=self.pool)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def request(self, method: str, path: str, body: object | None = None) -> tuple[int, object]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.server_address[1], timeout=60)
        connection.request(method, path, body=None if body is None else json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        return response.status, json.loads(payload)

    def post(self, path: str, body: object) -> tuple[int, object]:
        return self.request("POST", path, body)

    def ps(self) -> list[dict]:
        status, answer = self.request("GET", "/api/ps")
        assert status == 200, answer
        return answer["models"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served(tmp_path, tiny_bundle):
    made = []

    def serve(**kwargs) -> Served:
        made.append(Served(tmp_path / f"served{len(made)}", tiny_bundle, **kwargs))
        return made[-1]

    yield serve
    for server in made:
        server.close()


def _eventually(condition) -> None:
    deadline = time.monotonic() + EVENTUALLY_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not so within {EVENTUALLY_S} s")


def _generate(served: Served, model: str, prompt: str = "Once") -> tuple[int, object]:
    return served.request("POST", "/api/generate", {"model": model, "prompt": prompt, "stream": False})


# ------------------------------------------------------------------------------------------------ keep_alive


def test_an_idle_model_is_unloaded_after_the_server_s_keep_alive_and_api_ps_says_when(served):
    server = served(keep_alive_s=1.0)
    status, answer = _generate(server, C)
    assert status == 200, answer
    listed = server.ps()
    if listed:  # not gone yet: /api/ps says when it goes, not Ollama's far-off time of a model kept loaded
        assert [model["name"] for model in listed] == [f"{C}:latest"]
        assert listed[0]["expires_at"] != KEPT_LOADED_UNTIL
        assert datetime.fromisoformat(listed[0]["expires_at"].replace("Z", "+00:00")).year < 2300
    _eventually(lambda: server.ps() == [])
    assert server.pool.loaded == (None, None)
    status, answer = _generate(server, C)  # the next request loads it again
    assert status == 200, answer
    assert answer["response"]


def test_a_request_s_own_keep_alive_unloads_its_model_once_idle_that_long(served):
    """The user's case: the server keeps models loaded (its default), and a request sends "keep_alive": "1s"."""
    server = served()
    status, answer = server.request("POST", "/api/generate", {"model": C, "prompt": "Once", "stream": False,
                                                               "keep_alive": "1s"})
    assert status == 200, answer
    listed = server.ps()
    if listed:  # not gone yet: when it goes, not the far-off time of a model kept loaded
        assert listed[0]["expires_at"] != KEPT_LOADED_UNTIL
    _eventually(lambda: server.ps() == [])
    status, answer = server.request("POST", "/api/generate", {"model": C, "prompt": "Once", "stream": False})
    assert status == 200, answer
    assert server.ps()[0]["expires_at"] == KEPT_LOADED_UNTIL  # no keep_alive: the server's default, kept loaded


def test_a_request_s_keep_alive_replaces_the_server_s_and_a_later_request_calls_the_unload_off(tiny_bundle):
    completer = Completer(open_runtime(tiny_bundle.path, threads=1), ServeDefaults(max_tokens=4))
    pool = ModelPool([ServedModel(A, tiny_bundle), ServedModel(C, tiny_bundle)], load=lambda model: None,
                     loaded=completer, log=lambda line: None)
    assert pool.unload_at() is None  # edgesdk's default: kept loaded
    assert running(completer, A)["models"][0]["expires_at"] == KEPT_LOADED_UNTIL
    pool.release(pool.acquire(A), keep_alive=EVENTUALLY_S)
    assert pool.unload_at() is not None
    assert running(completer, A)["models"][0]["expires_at"] != KEPT_LOADED_UNTIL
    lease = pool.acquire(A)  # a request for it calls the unload off; its keep_alive (forever) is the model's now
    pool.release(lease, keep_alive=math.inf)
    assert pool.unload_at() is None
    assert running(completer, A)["models"][0]["expires_at"] == KEPT_LOADED_UNTIL
    pool.release(pool.acquire(A), keep_alive=1.0)
    _eventually(lambda: pool.loaded == (None, None))


def test_a_pool_refuses_a_keep_alive_below_zero(tiny_bundle):
    completer = Completer(open_runtime(tiny_bundle.path, threads=1), ServeDefaults(max_tokens=4))
    with pytest.raises(EdgeSDKError, match="keep_alive"):
        ModelPool([ServedModel(A, tiny_bundle)], load=lambda model: None, loaded=completer, keep_alive_s=-1.0)


@pytest.mark.parametrize(("value", "seconds"), [
    (None, None), ("3s", 3.0), ("1m30s", 90.0), ("0", 0.0), ("0s", 0.0), ("-1m", math.inf), (-1, math.inf),
    (0, 0.0), (2.5, 2.5), ("1.5h", 5400.0),
])
def test_keep_alive_is_read_in_seconds_as_ollama_reads_it(value, seconds):
    assert keep_alive({} if value is None else {"keep_alive": value}) == seconds


@pytest.mark.parametrize("value", ["3 seconds", "5", True, [1], float("nan")])
def test_a_keep_alive_that_is_no_duration_is_a_400_naming_it(value):
    with pytest.raises(ApiError) as raised:
        keep_alive({"keep_alive": value})
    assert (raised.value.status, raised.value.param) == (400, "keep_alive")


@pytest.mark.parametrize(("text", "seconds"), [
    (None, None), ("", None), ("5m", 300.0), ("10", 10.0), ("-1", math.inf), ("0", 0.0), ("-5m", math.inf),
])
def test_ollama_keep_alive_is_read_as_ollama_reads_it(text, seconds):
    assert keep_alive_from_env(text) == seconds


def test_an_ollama_keep_alive_that_is_no_duration_is_refused_naming_the_variable():
    with pytest.raises(EdgeSDKError) as raised:
        keep_alive_from_env("five minutes")
    assert "OLLAMA_KEEP_ALIVE='five minutes' is not a duration" in str(raised.value)


def _taken_port():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    return taken


def _serve_said(*args: str, env: dict | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["serve", *args], env=env)
    return result.exit_code, " ".join(result.output.split())


def test_sleep_idle_seconds_is_taken_and_said_to_change_nothing_with_one_bundle(tiny_bundle):
    with _taken_port() as taken:  # the server stops at its listen check, after the options are read
        code, said = _serve_said(str(tiny_bundle.path), "--port", str(taken.getsockname()[1]),
                                 "--sleep-idle-seconds", "5")
    assert code != 0
    assert "--sleep-idle-seconds 5 changes nothing with one bundle served: its model stays loaded" in said, said
    assert "cannot listen" in said, said


@pytest.mark.parametrize("value", ["0", "-2", "soon"])
def test_sleep_idle_seconds_of_no_time_is_refused(value):
    code, said = _serve_said("bundle", "--sleep-idle-seconds", value)
    assert code == 2, said
    assert "--sleep-idle-seconds" in said, said
    assert "-1 (never unloaded)" in said, said


def test_a_bad_ollama_keep_alive_is_refused_before_the_server_starts(tiny_bundle, tmp_path):
    """With several bundles served (two copies: one bundle given twice is served once, and ignores the variable)."""
    paths = [shutil.copytree(tiny_bundle.path, tmp_path / name) for name in (A, C)]
    with _taken_port() as taken:  # were it not refused, the server would stop at its listen check
        code, said = _serve_said(*map(str, paths), "--port", str(taken.getsockname()[1]),
                                 env={"OLLAMA_KEEP_ALIVE": "forever"})
    assert code != 0
    assert "OLLAMA_KEEP_ALIVE='forever' is not a duration" in said, said


# ------------------------------------------------------------------------------------------------ a failed swap


def test_a_swap_to_a_bundle_whose_weights_no_longer_match_keeps_the_loaded_model(served):
    server = served()
    weights = max((path for path in server.paths[C].iterdir() if path.is_file()), key=lambda path: path.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    status, answer = _generate(server, C)
    assert status == 500, answer
    assert f"the model '{C}'" in answer["error"], answer
    assert weights.name in answer["error"], answer
    assert [model["name"] for model in server.ps()] == [f"{A}:latest"]  # the loaded model was never unloaded
    status, answer = _generate(server, A)
    assert status == 200, answer
    assert answer["response"]
