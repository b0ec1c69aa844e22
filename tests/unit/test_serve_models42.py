"""``edgesdk serve`` with several bundles, one loaded at a time and swapped when a request names another (Ollama's
behaviour on a small machine, llama-server's router mode): real bundles of two tiny models with different weights,
real servers over HTTP, the CLI's own model loader."""

from __future__ import annotations

import gc
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_serve import _model_pool, _served_models
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from edgesdk.serve.model_pool import ModelPool
from tests.unit.test_serve_review import CountingHook, post_bytes, wait_for

pytest.importorskip("torch")

TOKENS = 8
CHAT = [{"role": "user", "content": "Say something."}]
A, B = "lively1-host", "lively2-host"


def build_named_lively(root: Path, seed: int):
    """tests/_utils/builds.py's lively bundle, its model directory named after the seed, so that each bundle is
    served under its own name (``lively<seed>-host``)."""
    import torch

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import tiny_llama, tiny_tokenizer

    model = tiny_llama(seed=seed, tie=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)
    model_dir = root / f"lively{seed}"
    model.save_pretrained(model_dir, safe_serialization=True)
    tiny_tokenizer(model.config.vocab_size).save_pretrained(model_dir)
    return build(BuildConfig(target="host", model=str(model_dir), out=root / "b",
                             export=ExportConfig(max_context=128), progress=False))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return [build_named_lively(tmp_path_factory.mktemp(f"lively{seed}"), seed).path for seed in (1, 2)]


class Server:
    """An ApiServer on a free port in a thread: one bundle, or several through the CLI's model pool."""

    def __init__(self, paths: list[Path], hook=None, defaults: ServeDefaults | None = None):
        defaults = defaults or ServeDefaults(max_tokens=TOKENS)
        runtime = open_runtime(paths[0], threads=1)
        runtime.tokenizer.template_kwargs = {}
        self.completer = Completer(runtime, defaults, hook=hook)
        self.pool = None
        name = "single"
        if len(paths) > 1:
            several = _served_models(paths, ())
            name = several[0][0]
            self.pool = _model_pool(several, runtime, self.completer, defaults, hook, {}, 0, backend=None, threads=1,
                                    target=None, ignore_target=False)
        self.server = ApiServer(("127.0.0.1", 0), self.completer, name, log=False, pool=self.pool)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def request(self, method: str, path: str, body: object | None = None) -> tuple[int, object]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request(method, path, body=None if body is None else json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        text = payload.decode()
        if response.getheader("Content-Type", "").startswith("application/json"):
            return response.status, json.loads(text)
        return response.status, text

    def post(self, path: str, body: object) -> tuple[int, object]:
        return self.request("POST", path, body)

    def get(self, path: str) -> tuple[int, object]:
        return self.request("GET", path)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def several(bundles):
    server = Server(bundles)
    yield server
    server.close()


def answers(server: Server, model: str | None) -> dict[str, str]:
    """The greedy answer's text on each API's routes, for ``model`` (None: the request names none)."""
    named = {} if model is None else {"model": model}
    texts = {}
    status, body = server.post("/v1/chat/completions", {**named, "messages": CHAT})
    assert status == 200, body
    texts["openai chat"] = body["choices"][0]["message"]["content"]
    status, text = server.post("/v1/chat/completions", {**named, "messages": CHAT, "stream": True})
    assert status == 200, text
    events = [json.loads(line[len("data: "):]) for line in text.split("\n\n") if line and line != "data: [DONE]"]
    texts["openai chat streamed"] = "".join(event["choices"][0]["delta"].get("content") or "" for event in events
                                            if event["choices"])
    status, body = server.post("/v1/completions", {**named, "prompt": "Once upon"})
    assert status == 200, body
    texts["openai text"] = body["choices"][0]["text"]
    status, body = server.post("/completion", {**named, "prompt": "Once upon"})
    assert status == 200, body
    texts["llama-server"] = body["content"]
    ollama = {"model": model or "single", "stream": False, "options": {"num_predict": TOKENS}}
    status, body = server.post("/api/chat", {**ollama, "messages": CHAT})
    assert status == 200, body
    texts["ollama chat"] = body["message"]["content"]
    status, body = server.post("/api/generate", {**ollama, "prompt": "Once upon", "raw": True})
    assert status == 200, body
    texts["ollama generate"] = body["response"]
    status, body = server.post("/v1/messages", {**named, "max_tokens": TOKENS, "messages": CHAT})
    assert status == 200, body
    texts["anthropic"] = body["content"][0]["text"] if body["content"] else ""
    return texts


def test_each_model_answers_as_its_own_single_bundle_server_on_every_api_back_and_forth(bundles, several, capsys):
    """Each request names its model; the answer is what a server of that bundle alone gives (greedy), on OpenAI's,
    llama-server's, Ollama's and Anthropic's routes, the models swapped in and out between requests."""
    alone = {}
    for name, path in zip((A, B), bundles, strict=True):
        single = Server([path])
        try:
            alone[name] = answers(single, None)
        finally:
            single.close()
    assert alone[A] != alone[B]  # the two models answer differently: a wrong model answering is seen
    for name in (B, A, B, A):
        assert answers(several, name) == alone[name], name
    err = capsys.readouterr().err
    assert f"unloaded {A}; loaded {B} in " in err
    assert f"unloaded {B}; loaded {A} in " in err
    assert err.count("; loaded ") == 4  # one load each time the named model changes, none within one


def test_the_answer_names_the_model_that_gave_it_and_a_request_naming_none_gets_the_loaded_one(several):
    status, body = several.post("/v1/chat/completions", {"model": B, "messages": CHAT})
    assert (status, body["model"]) == (200, B)
    assert several.get("/api/ps")[1]["models"][0]["name"] == f"{B}:latest"
    status, body = several.post("/v1/chat/completions", {"messages": CHAT})  # no model: B, loaded, answers
    assert (status, body["model"]) == (200, B)
    status, body = several.post("/api/chat", {"model": f"{A}:latest", "messages": CHAT, "stream": False})
    assert (status, body["model"]) == (200, f"{A}:latest")  # Ollama's default tag names the model too
    assert several.get("/health")[1]["model"] == A


def test_an_unknown_model_is_a_404_in_each_api_s_own_shape(several):
    status, body = several.post("/v1/chat/completions", {"model": "x", "messages": CHAT})
    assert (status, body) == (404, {"error": {"message": f"The model 'x' does not exist; this server serves {A}, {B} "
                                                         "(GET /v1/models lists them)",
                                              "type": "invalid_request_error", "param": "model",
                                              "code": "model_not_found"}})
    assert several.post("/completion", {"model": "x", "prompt": "a"})[1]["error"]["code"] == "model_not_found"
    assert several.get("/v1/models/x")[0] == 404
    assert several.get("/props?model=x")[0] == 404
    status, body = several.post("/api/chat", {"model": "x", "messages": CHAT})
    assert (status, body) == (404, {"error": f'model "x" not found, try pulling it first (this server serves '
                                             f'"{A}:latest", "{B}:latest"; GET /api/tags lists them)'})
    assert several.get("/v1/models/x")[1]["error"]["message"].endswith(f"serves {A}, {B} (GET /v1/models lists them)")
    status, body = several.post("/v1/messages", {"model": "x", "max_tokens": 4, "messages": CHAT})
    assert status == 404
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert body["error"]["message"].startswith("model: x ")
    assert several.get("/api/ps")[1]["models"][0]["name"] == f"{A}:latest"  # nothing was unloaded for them


def test_listings_name_every_model_and_ps_the_loaded_one(several, bundles):
    assert [card["id"] for card in several.get("/v1/models")[1]["data"]] == [A, B]
    assert several.get(f"/v1/models/{B}")[1]["id"] == B
    assert [entry["name"] for entry in several.get("/api/tags")[1]["models"]] == [f"{A}:latest", f"{B}:latest"]
    assert [entry["name"] for entry in several.get("/api/ps")[1]["models"]] == [f"{A}:latest"]
    status, shown = several.post("/api/show", {"model": B})
    assert status == 200
    assert shown["details"]["family"] == "llama"
    props = several.get(f"/props?model={B}")[1]  # llama-server's router: ?model= on /props
    assert (props["model_alias"], props["model_path"]) == (B, str(Path(bundles[1]).resolve()))
    assert [entry["name"] for entry in several.get("/api/ps")[1]["models"]] == [f"{B}:latest"]
    props = several.get("/props")[1]
    assert (props["model_alias"], props["model_path"]) == (B, str(Path(bundles[1]).resolve()))
    assert several.get("/slots")[1][0]["is_processing"] is False


def test_ollama_load_and_unload_requests_act_on_the_named_model(several):
    status, body = several.post("/api/generate", {"model": B})
    assert (status, body["done_reason"]) == (200, "load")
    assert [entry["name"] for entry in several.get("/api/ps")[1]["models"]] == [f"{B}:latest"]
    status, body = several.post("/api/chat", {"model": B, "messages": [], "keep_alive": 0})
    assert (status, body["done_reason"]) == (200, "unload")
    assert several.get("/api/ps")[1] == {"models": []}
    assert several.get("/slots")[0] == 503  # nothing loaded to describe
    # an answer with keep_alive 0 unloads its model once written
    status, body = several.post("/api/generate", {"model": A, "prompt": "Once", "stream": False, "keep_alive": 0})
    assert (status, body["done"]) == (200, True)
    assert several.get("/api/ps")[1] == {"models": []}
    assert several.get("/health")[1]["model"] is None
    status, body = several.post("/v1/completions", {"prompt": "Once"})  # none named, none loaded: the last loaded
    assert (status, body["model"]) == (200, A)


def test_an_unloaded_model_s_runtime_is_given_back(bundles, several):
    """A swap closes the idle model: nothing keeps its ONNX Runtime session, or its KV cache, alive."""
    backend = weakref.ref(several.completer.runtime.backend)
    several.completer = None  # the test's own reference
    assert several.post("/v1/completions", {"model": B, "prompt": "Once"})[0] == 200
    gc.collect()
    assert backend() is None


def test_requests_for_different_models_are_answered_in_arrival_order_each_by_its_model(bundles):
    """A1 generates; B1, A2, B2 arrive in that order while it does. The swap to B waits for A1; A2, for the loaded
    model A, must not cut in before B1, which came first; each answers as its model does alone."""
    hook = CountingHook(hold_at=1)
    begun = []
    hook.begin = lambda prompt_tokens, max_new_tokens: begun.append(max_new_tokens)
    server = Server(bundles, hook=hook)
    try:
        replies: dict[int, bytes] = {}

        def send(model: str, tokens: int) -> threading.Thread:
            def run():
                connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                connection.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": "Once upon",
                                                                          "max_tokens": tokens}))
                replies[tokens] = connection.getresponse().read()
                connection.close()

            thread = threading.Thread(target=run)
            thread.start()
            return thread

        threads = [send(A, 5)]
        assert hook.held.wait(30)
        for queued, (model, tokens) in enumerate(((B, 6), (A, 7), (B, 8)), start=1):
            threads.append(send(model, tokens))
            assert wait_for(lambda: server.pool.queued == queued)  # noqa: B023 (waited for here)
        hook.release.set()
        for thread in threads:
            thread.join(60)
        assert begun == [5, 6, 7, 8]
        alone = {}
        for name, path in zip((A, B), bundles, strict=True):
            single = Server([path])
            try:
                alone[name] = {tokens: single.post("/v1/completions", {"prompt": "Once upon", "max_tokens": tokens})[1]
                               ["choices"][0]["text"] for tokens in (5, 6, 7, 8)}
            finally:
                single.close()
        for model, tokens in ((A, 5), (B, 6), (A, 7), (B, 8)):
            body = json.loads(replies[tokens])
            assert (body["model"], body["choices"][0]["text"]) == (model, alone[model][tokens])
    finally:
        hook.release.set()
        server.close()


def test_a_bundle_damaged_after_start_is_a_500_naming_it_and_the_others_still_answer(bundles, tmp_path):
    damaged = Path(shutil.copytree(bundles[1], tmp_path / "copy"))
    server = Server([bundles[0], damaged])
    try:
        assert server.post("/v1/completions", {"model": B, "prompt": "Once"})[0] == 200  # it loads while whole
        assert server.post("/v1/completions", {"model": A, "prompt": "Once"})[0] == 200
        data = damaged / "model.onnx.data"
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
        status, body = server.post("/v1/chat/completions", {"model": B, "messages": CHAT})
        assert status == 500
        assert body["error"]["code"] == "model_load_failed"
        message = body["error"]["message"]
        assert f"'{B}'" in message
        assert str(damaged) in message
        assert "sha256" in message
        status, body = server.post("/api/chat", {"model": B, "messages": CHAT, "stream": False})
        assert status == 500
        assert str(damaged) in body["error"]
        status, body = server.post("/v1/completions", {"model": A, "prompt": "Once"})
        assert (status, body["model"]) == (200, A)
    finally:
        server.close()


def test_a_request_waiting_for_its_model_past_the_queue_is_refused_503(bundles):
    hook = CountingHook(hold_at=1)
    server = Server(bundles, hook=hook, defaults=ServeDefaults(max_tokens=2, max_waiting=1))
    try:
        first = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        first.sendall(post_bytes({"model": A, "prompt": "Once"}))
        assert hook.held.wait(30)
        waiting = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        waiting.sendall(post_bytes({"model": B, "prompt": "Once"}))
        assert wait_for(lambda: server.pool.queued == 1)
        status, body = server.post("/v1/completions", {"model": B, "prompt": "Once"})
        assert (status, body["error"]["code"]) == (503, "server_busy")
        hook.release.set()
        for client in (first, waiting):
            assert client.recv(4096).startswith(b"HTTP/1.1 200")
            client.close()
    finally:
        hook.release.set()
        server.close()


# ------------------------------------------------------------------------------------------------ the command


def test_two_bundles_under_one_name_are_refused_naming_both(bundles, tmp_path):
    copy = shutil.copytree(bundles[0], tmp_path / "again")
    result = CliRunner().invoke(main, ["serve", str(bundles[0]), str(copy), "--port", "0"])
    assert result.exit_code != 0
    assert f"two bundles are served as '{A}'" in result.output
    assert str(bundles[0]) in result.output
    assert str(copy) in result.output
    assert "--alias" in result.output


def test_the_options_for_one_bundle_are_refused_with_several(bundles):
    for options, named in ((["--draft", str(bundles[1])], "--draft"), (["--gating"], "--gating"),
                           (["--alias", "plain"], "NAME=BUNDLE")):
        result = CliRunner().invoke(main, ["serve", *map(str, bundles), *options])
        assert result.exit_code == 2, result.output
        assert named in result.output


def test_a_models_dir_without_a_bundle_is_refused_with_the_fix(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["serve", "--models-dir", str(tmp_path), "--port", "0"])
    assert result.exit_code == 1, result.output
    assert f"--models-dir {tmp_path} holds no bundle" in result.output
    assert "edgesdk build --out" in result.output
    assert "notes.txt skipped" in result.output
    assert "empty skipped" in result.output


def test_serve_models_dir_answers_for_each_bundle_under_its_name_or_alias(bundles, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    os.symlink(bundles[0], folder / "one")
    os.symlink(bundles[1], folder / "two")
    (folder / "b.tar").write_bytes(b"")
    process = subprocess.Popen(
        [sys.executable, "-m", "edgesdk.cli", "serve", "--models-dir", str(folder), "--alias", "second=two",
         "--port", "0", "--threads", "1", "-n", "4", "--quiet"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    try:
        lines = []
        for line in process.stderr:
            lines.append(line)
            if " on http://" in line:
                break
        started = "".join(lines)
        assert "one, second on http://" in started, started
        assert "b.tar skipped: an archive: unpack it with 'edgesdk unpack" in started
        port = int(lines[-1].split(" on http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("GET", "/v1/models")
        assert [card["id"] for card in json.loads(connection.getresponse().read())["data"]] == ["one", "second"]
        connection.request("POST", "/v1/chat/completions", json.dumps({"model": "second", "messages": CHAT}))
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())["model"]) == (200, "second")
        connection.close()
    finally:
        process.terminate()
        process.communicate(timeout=60)


def test_a_stop_refuses_the_requests_waiting_for_their_model(bundles):
    """The server stopping (Ctrl-C, a service manager's stop): the answer generating ends, and a request waiting
    for its model to be swapped in gets the 503 server_stopping instead of a load."""
    hook = CountingHook(hold_at=1)
    server = Server(bundles, hook=hook)
    try:
        first = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        first.sendall(post_bytes({"model": A, "prompt": "Once"}))
        assert hook.held.wait(30)
        waiting = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        waiting.sendall(post_bytes({"model": B, "prompt": "Once"}))
        assert wait_for(lambda: server.pool.queued == 1)
        stopped = threading.Thread(target=server.server.stop_answers, kwargs={"timeout": 30})
        stopped.start()
        response = http.client.HTTPResponse(waiting)
        response.begin()
        assert response.status == 503
        assert json.loads(response.read())["error"]["code"] == "server_stopping"
        hook.release.set()
        stopped.join(30)
        assert server.get("/api/ps")[1]["models"][0]["name"] == f"{A}:latest"  # nothing was loaded for it
        first.close()
        waiting.close()
    finally:
        hook.release.set()
        server.close()


def test_an_ollama_request_naming_no_model_is_refused_naming_every_served_model(several):
    for path, body in (("/api/chat", {"messages": CHAT}), ("/api/generate", {"prompt": "Once"}), ("/api/show", {}),
                       ("/api/embed", {"input": "Once"})):
        status, answer = several.post(path, body)
        assert status == 400, (path, answer)
        assert answer["error"] == (f"'model' is required: the name of one of the models served here, "
                                   f"'{A}:latest', '{B}:latest' (GET /api/tags lists them), got null"), path


def test_max_queue_0_loads_another_model_on_an_idle_server(bundles):
    """--max-queue 0 lets no request wait behind another, as with one bundle; a request on an idle server waits
    behind nothing, so the model it names is loaded for it."""
    server = Server(bundles, defaults=ServeDefaults(max_tokens=2, max_waiting=0))
    try:
        status, body = server.post("/v1/chat/completions", {"model": B, "messages": CHAT})
        assert (status, body.get("model")) == (200, B), body
        assert server.post("/api/generate", {"model": A, "prompt": "x", "stream": False, "keep_alive": 0})[0] == 200
        assert server.get("/api/ps")[1] == {"models": []}
        status, body = server.post("/v1/chat/completions", {"messages": CHAT})  # none named, none loaded: A again
        assert (status, body.get("model")) == (200, A), body
    finally:
        server.close()


class HeldLoad:
    """The pool's own load of a model, held at its start until :attr:`release` is set (:attr:`loading` says it got
    there): a swap in progress for as long as a test needs one."""

    def __init__(self, pool: ModelPool):
        self.loading, self.release, self._load = threading.Event(), threading.Event(), pool._load
        pool._load = self

    def __call__(self, model):
        self.loading.set()
        assert self.release.wait(60)
        return self._load(model)


def reply_on(server: Server, body: dict) -> tuple[socket.socket, http.client.HTTPResponse]:
    """A request sent on its own connection; its answer read with ``.begin()`` when the test wants it."""
    client = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    client.sendall(post_bytes(body))
    return client, http.client.HTTPResponse(client)


def test_max_queue_counts_the_requests_waiting_behind_a_load_not_the_one_it_is_for(bundles):
    server = Server(bundles, defaults=ServeDefaults(max_tokens=2, max_waiting=1))
    held = HeldLoad(server.pool)
    try:
        loading = reply_on(server, {"model": B, "prompt": "Once"})
        assert held.loading.wait(30)
        waiting = reply_on(server, {"model": B, "prompt": "Once"})  # one waits behind the load: --max-queue 1
        assert wait_for(lambda: server.pool.queued == 2)
        status, body = server.post("/v1/completions", {"model": B, "prompt": "Once"})  # a second would wait
        assert (status, body["error"]["code"]) == (503, "server_busy")
        assert "1 request(s) already wait" in body["error"]["message"]
        held.release.set()
        for client, response in (loading, waiting):
            response.begin()
            assert (response.status, json.loads(response.read())["model"]) == (200, B)
            client.close()
    finally:
        held.release.set()
        server.close()


@pytest.mark.parametrize("load", ["succeeds", "fails"])
def test_health_names_the_model_a_swap_loads_and_says_busy_until_the_load_ends(bundles, load):
    """/health during a swap: no model is loaded (the idle one is closed), but the server is not idle either: it
    names the model loading and says busy. Once the load ends, that model is the loaded one, or, where its load
    failed, none is; either way nothing loads any more."""
    server = Server(bundles)
    held = HeldLoad(server.pool)
    if load == "fails":
        def failing(model):
            raise OSError("the bundle's disk went away")

        held._load = failing
    try:
        status, body = server.get("/health")
        assert (status, body["model"], body["busy"], "loading" in body) == (200, A, False, False)
        client, response = reply_on(server, {"model": B, "prompt": "Once"})
        assert held.loading.wait(30)
        status, body = server.get("/health")
        assert status == 200
        assert (body["status"], body["model"], body["backend"], body["busy"], body["loading"]) == \
            ("ok", None, None, True, B)
        held.release.set()
        response.begin()
        answer = json.loads(response.read())
        client.close()
        if load == "succeeds":
            assert (response.status, answer["model"]) == (200, B)
        else:
            assert (response.status, answer["error"]["code"]) == (500, "model_load_failed")
        status, body = server.get("/health")
        assert (status, body["model"], body["busy"], "loading" in body) == \
            (200, B if load == "succeeds" else None, False, False)
    finally:
        held.release.set()
        server.close()


def test_a_stop_during_a_swap_waits_for_the_request_and_answers_it_503(bundles):
    """Ctrl-C while a request's model loads: the stop waits for that request, which gets the 503 server_stopping
    (not a cut connection), and nothing answers from the model loaded for it."""
    server = Server(bundles)
    held = HeldLoad(server.pool)
    try:
        client, response = reply_on(server, {"model": B, "prompt": "Once"})
        assert held.loading.wait(30)
        assert server.server.stop_answers(timeout=0.1) is False  # the request being loaded for is not answered
        held.release.set()
        response.begin()
        assert (response.status, json.loads(response.read())["error"]["code"]) == (503, "server_stopping")
        assert server.server.stop_answers(timeout=30) is True
        client.close()
    finally:
        held.release.set()
        server.close()


def test_a_stop_waits_for_a_request_waiting_behind_a_swap(bundles):
    server = Server(bundles)
    held = HeldLoad(server.pool)
    try:
        loading = reply_on(server, {"model": B, "prompt": "Once"})
        assert held.loading.wait(30)
        waiting = reply_on(server, {"model": A, "prompt": "Once"})
        assert wait_for(lambda: server.pool.queued == 2)
        stopped = threading.Thread(target=server.server.stop_answers, kwargs={"timeout": 30})
        stopped.start()
        client, response = waiting
        response.begin()  # the waiting request's 503 comes while the load still runs
        assert (response.status, json.loads(response.read())["error"]["code"]) == (503, "server_stopping")
        held.release.set()
        client, response = loading
        response.begin()
        assert (response.status, json.loads(response.read())["error"]["code"]) == (503, "server_stopping")
        stopped.join(30)
        assert not stopped.is_alive()
    finally:
        held.release.set()
        server.close()


def show_without(body: dict) -> dict:
    """/api/show's answer without what names the model (its modelfile's FROM line)."""
    return {key: value for key, value in body.items() if key != "modelfile"}


TOKEN_CALLS = {"/tokenize": {"content": "Once upon a time", "with_pieces": True},
               "/detokenize": {"tokens": [40, 41, 42, 43]},
               "/apply-template": {"messages": CHAT}}


def test_show_and_token_counts_describe_a_model_without_loading_it_or_waiting(bundles, capsys):
    """Ollama's /api/show loads nothing (its show handler reads the model's files); Anthropic's count_tokens,
    OpenAI's input_tokens and llama-server's /tokenize, /detokenize and /apply-template need the tokenizer alone.
    With A generating (held), each answers at once for B as a server of B alone answers, and A stays loaded."""
    single = Server([bundles[1]])
    try:
        alone = {"show": show_without(single.post("/api/show", {"model": "single"})[1]),
                 "count": single.post("/v1/messages/count_tokens", {"model": "single", "messages": CHAT})[1],
                 "input": single.post("/v1/responses/input_tokens", {"model": "single", "input": "Once upon"})[1]}
        alone.update({route: single.post(route, body) for route, body in TOKEN_CALLS.items()})
    finally:
        single.close()
    hook = CountingHook(hold_at=1)
    server = Server(bundles, hook=hook)
    try:
        generating = reply_on(server, {"model": A, "prompt": "Once"})
        assert hook.held.wait(30)
        status, shown = server.post("/api/show", {"model": B})
        assert (status, show_without(shown)) == (200, alone["show"])
        assert f"FROM {B}:latest" in shown["modelfile"]
        assert server.post("/v1/messages/count_tokens", {"model": B, "messages": CHAT}) == (200, alone["count"])
        assert server.post("/v1/responses/input_tokens", {"model": B, "input": "Once upon"}) == (200, alone["input"])
        for route, body in TOKEN_CALLS.items():
            assert alone[route][0] == 200, (route, alone[route])
            assert server.post(route, {**body, "model": B}) == alone[route], route
            assert server.post(route, body) == alone[route], route  # no model named: the loaded A's, the same tokenizer
            assert server.post(route, {**body, "model": "x"})[0] == 404, route
        assert server.pool.queued == 0
        hook.release.set()
        client, response = generating
        response.begin()
        assert (response.status, json.loads(response.read())["model"]) == (200, A)
        client.close()
        assert [entry["name"] for entry in server.get("/api/ps")[1]["models"]] == [f"{A}:latest"]
        assert server.post("/api/show", {"model": "x"})[0] == 404
        assert "loaded " not in capsys.readouterr().err  # nothing was swapped in
    finally:
        hook.release.set()
        server.close()


def test_keep_alive_0_does_not_unload_after_a_request_granted_after_it(several):
    """A request for the model granted before the keep_alive 0 request's lease ends keeps the model: it is not
    unloaded once that later request is answered (Ollama: a later request's keep_alive replaces an earlier one's)."""
    pool = several.pool
    earlier = pool.acquire(A)
    later = pool.acquire(A)
    pool.release(earlier, unload=True)
    pool.release(later)
    assert pool.loaded[0] == A
    alone = pool.acquire(A)  # with nothing granted after it, keep_alive 0 unloads
    pool.release(alone, unload=True)
    assert pool.loaded == (None, None)


# ------------------------------------------------------------------------------------------------ the command


def serve_in_process(args: list[str], check):
    """``edgesdk serve ARGS`` as the command runs (in this thread, its locals and all), ``check(port)`` run in another
    thread once it listens; then stopped as Ctrl-C stops it. What ``check`` returns, or raises."""
    import _thread

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome, ended = {}, threading.Event()

    def run():
        try:
            while not ended.is_set():
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                return
            outcome["checked"] = check(port)
        except BaseException as exc:  # noqa: BLE001 (raised in the test's thread)
            outcome["error"] = exc
        finally:
            if not ended.is_set():
                _thread.interrupt_main()  # Ctrl-C

    handlers = {stop: signal.getsignal(stop) for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    # interrupt_main() raises KeyboardInterrupt only under Python's own SIGINT handler: a process started in the
    # background by a non-interactive shell (CI) inherits SIGINT ignored, and the Ctrl-C would never come
    signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        main(["serve", *args, "--port", str(port), "--threads", "1", "-n", "4", "--quiet"], standalone_mode=False)
    finally:
        ended.set()
        for stop, handler in handlers.items():
            signal.signal(stop, handler)
    thread.join(60)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["checked"]


def ask(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request(method, path, None if body is None else json.dumps(body))
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer


def sessions_of(bundle: Path) -> int:
    """The ONNX Runtime sessions alive on ``bundle``'s graph."""
    import onnxruntime

    gc.collect()
    return sum(type(thing) is onnxruntime.InferenceSession and
               Path(str(thing._model_path)).resolve().is_relative_to(bundle.resolve()) for thing in gc.get_objects())


def test_the_command_gives_back_the_first_model_when_a_request_swaps_in_another(bundles):
    """``edgesdk serve A B``: once B is swapped in, no ONNX Runtime session on A's graph is alive (the command's
    own locals kept A's runtime and completer before), and swapping back to A holds one session of it, not two."""

    def check(port):
        seen = {"start": (sessions_of(bundles[0]), sessions_of(bundles[1]))}
        assert ask(port, "POST", "/v1/completions", {"model": B, "prompt": "Once"})[0] == 200
        seen["B"] = (sessions_of(bundles[0]), sessions_of(bundles[1]))
        assert ask(port, "POST", "/v1/completions", {"model": A, "prompt": "Once"})[0] == 200
        seen["A again"] = (sessions_of(bundles[0]), sessions_of(bundles[1]))
        return seen

    assert serve_in_process([*map(str, bundles)], check) == {"start": (1, 0), "B": (0, 1), "A again": (1, 0)}


def test_one_bundle_takes_the_name_of_an_alias_naming_it_and_refuses_one_naming_another(bundles, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    os.symlink(bundles[0], folder / "one")
    listed = serve_in_process(["--models-dir", str(folder), "--alias", "mymodel=one"],
                              lambda port: [card["id"] for card in ask(port, "GET", "/v1/models")[1]["data"]])
    assert listed == ["mymodel"]
    listed = serve_in_process([str(bundles[0]), "--alias", f"mine={bundles[0]}"],
                              lambda port: [card["id"] for card in ask(port, "GET", "/v1/models")[1]["data"]])
    assert listed == ["mine"]
    result = CliRunner().invoke(main, ["serve", str(bundles[0]), "--alias", f"other={bundles[1]}", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert f"'other={bundles[1]}': '{bundles[1]}' is none of the bundles served ({bundles[0]})" in result.output
