"""``edgesdk serve`` with several bundles and its router routes, where they answered otherwise than they should:

* ``POST /models/load`` of the loaded model while its unload was pending (``POST /models/unload`` or Ollama's
  ``keep_alive`` 0 while an answer held it, or while it loaded) was the 400 ``model_already_loaded``, and the model
  went once the answer ended: the load now keeps it (a lease taken and given back) and answers ``{"success": true}``;
* ``GET /slots?model=B&fail_on_no_slot=1`` while A generated queued behind A's answer, then swapped B in: a monitoring
  GET swaps nothing now (the 503 at once while the board is busy; a model not loaded described without loading it),
  and ``model`` is read, as ``fail_on_no_slot`` is, from the parameter's first value;
* Ollama's origin check beside the API key: a preflight from a local origin, a refused origin before the key's 401,
  an allowed origin's 401 carrying its CORS header;
* ``--timeout`` past the request timeout (300 s) cut a request's head and body at 300 s: the request timeout is now at
  least the client timeout;
* a JSON schema's root: an enum whose value is the start of another is refused in its own words, and an integer
  with a minimum and a maximum is a root the answer may have, where no value of its range is the start of another.

Real bundles, real servers over HTTP, a real model pool."""

from __future__ import annotations

import gc
import http.client
import json
import threading

import pytest

from edgesdk.runtime.json_schema import RootError, SchemaConstraint, compile_schema
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import REQUEST_TIMEOUT_S, ApiServer
from edgesdk.serve.model_pool import ModelPool, ServedModel
from tests.unit.test_pool_unload59 import HeldLoad
from tests.unit.test_serve_models42 import serve_in_process
from tests.unit.test_serve_review import CountingHook

pytest.importorskip("torch")

FIRST, SECOND = "first", "second"
WAIT_S = 60  # far beyond what any step here takes: only a step that never comes reaches it


def _completer(bundle, hook=None) -> Completer:
    return Completer(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=2), hook=hook)


class _Served:
    """A real ApiServer on a free port in a thread, serving two names of one bundle through a real model pool."""

    def __init__(self, bundle, load=None, hook=None, api_key=None):
        first = _completer(bundle, hook)
        self.pool = ModelPool([ServedModel(FIRST, bundle), ServedModel(SECOND, bundle)],
                              load=load or (lambda model: _completer(model.bundle)), loaded=first,
                              log=lambda line: None)
        self.server = ApiServer(("127.0.0.1", 0), first, FIRST, log=False, pool=self.pool, api_key=api_key)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def request(self, method: str, path: str, body: object | None = None, headers: dict | None = None,
                timeout: float = WAIT_S) -> tuple[int, dict, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.server_address[1], timeout=timeout)
        connection.request(method, path, None if body is None else json.dumps(body),
                           {"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        return response.status, dict(response.getheaders()), json.loads(payload) if payload else {}

    def call(self, method: str, path: str, body: object | None = None, **kwargs) -> tuple[int, dict]:
        status, _, answer = self.request(method, path, body, **kwargs)
        return status, answer

    def in_thread(self, method: str, path: str, body: object | None = None) -> tuple[threading.Thread, list]:
        got: list = []

        def run():
            try:
                got.append(self.call(method, path, body))
            except BaseException as exc:
                got.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread, got

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def several(tiny_bundle):
    served = _Served(tiny_bundle)
    yield served
    served.close()


# --- finding 1: POST /models/load while an unload is pending ---------------------------------------------------------


def test_a_load_of_a_model_whose_unload_is_pending_keeps_it(several):
    lease = several.pool.acquire(FIRST)  # a request holding the model, as a stream does
    assert several.call("POST", "/models/unload", {"model": FIRST}) == (200, {"success": True})
    assert several.pool.loaded[0] == FIRST  # held: it goes once the answer holding it is written
    # was 400 model_already_loaded, and the model went when the answer ended
    assert several.call("POST", "/models/load", {"model": FIRST}) == (200, {"success": True})
    several.pool.release(lease)
    assert several.pool.loaded[0] == FIRST
    status, body = several.call("POST", "/models/load", {"model": FIRST})  # nothing pending: llama-server's 400
    assert (status, body["error"]["code"]) == (400, "model_already_loaded"), body


def test_a_load_of_a_model_being_loaded_whose_unload_is_pending_keeps_it(tiny_bundle):
    load = HeldLoad()
    served = _Served(tiny_bundle, load=load)
    try:
        got: list = []
        loader = threading.Thread(target=lambda: got.append(served.pool.acquire(SECOND)), daemon=True)
        loader.start()
        assert load.started.wait(WAIT_S)
        assert served.pool.state == (None, None, SECOND)
        assert served.call("POST", "/models/unload", {"model": SECOND}) == (200, {"success": True})
        thread, answer = served.in_thread("POST", "/models/load", {"model": SECOND})
        load.go.set()
        loader.join(WAIT_S)
        thread.join(WAIT_S)
        assert answer == [(200, {"success": True})]  # was 400 model_already_loaded ("being loaded")
        served.pool.release(got[0])  # the answer it was loaded for is written
        assert served.pool.loaded[0] == SECOND  # was unloaded with it
    finally:
        load.go.set()
        served.close()


# --- finding 2: GET /slots?model=B swaps nothing ---------------------------------------------------------------------


def test_slots_for_a_model_not_loaded_answers_at_once_and_swaps_nothing(tiny_bundle):
    hook = CountingHook(hold_at=1)
    served = _Served(tiny_bundle, hook=hook)
    try:
        thread, answer = served.in_thread("POST", "/v1/completions", {"model": FIRST, "prompt": "Hi"})
        assert hook.held.wait(WAIT_S)  # FIRST generates
        # was: queued behind FIRST's answer, then SECOND swapped in
        status, body = served.call("GET", f"/slots?model={SECOND}&fail_on_no_slot=1", timeout=WAIT_S / 2)
        assert (status, body["error"]["code"], body["error"]["type"]) == (503, "no_slot_available",
                                                                         "unavailable_error"), body
        assert f"'{FIRST}'" in body["error"]["message"]
        status, slots = served.call("GET", f"/slots?model={SECOND}", timeout=WAIT_S / 2)
        assert status == 200, slots
        assert slots[0]["is_processing"] is False
        assert slots[0]["status"] == {"value": "unloaded"}
        assert slots[0]["n_ctx"] == served.pool.completer.runtime.backend.max_context
        status, body = served.call("GET", f"/slots?model={FIRST}&fail_on_no_slot=1", timeout=WAIT_S / 2)
        assert (status, body["error"]["code"]) == (503, "no_slot_available"), body
        status, slots = served.call("GET", f"/slots?model={FIRST}", timeout=WAIT_S / 2)
        assert (status, slots[0]["is_processing"]) == (200, True)
        assert "status" not in slots[0]  # the loaded model's slot, as llama-server's
        assert served.pool.loaded[0] == FIRST
        hook.release.set()
        thread.join(WAIT_S)
        assert answer[0][0] == 200, answer
        # idle: a free slot for either model, and still nothing swapped in for a GET
        status, slots = served.call("GET", f"/slots?model={SECOND}&fail_on_no_slot=1")
        assert (status, slots[0]["is_processing"], slots[0]["status"]) == (200, False, {"value": "unloaded"})
        assert served.pool.loaded[0] == FIRST
    finally:
        hook.release.set()
        served.close()


def test_slots_reads_the_model_from_the_parameter_s_first_value_as_fail_on_no_slot(several):
    status, slots = several.call("GET", f"/slots?model={FIRST}&model=nope")
    assert status == 200, slots  # was the last value's 404
    status, body = several.call("GET", f"/slots?model=nope&model={FIRST}")
    assert (status, body["error"]["code"]) == (404, "model_not_found"), body


# --- finding 3: Ollama's origin check beside the API key ---------------------------------------------------------------


@pytest.fixture
def keyed(tiny_bundle):
    served = _Served(tiny_bundle, api_key="secret")
    yield served
    served.close()


def test_an_ollama_preflight_from_a_local_origin_is_answered_with_cors(keyed):
    origin = "http://localhost:5173"
    status, headers, _ = keyed.request("OPTIONS", "/api/chat", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status in (200, 204)
    assert headers["Access-Control-Allow-Origin"] == origin
    assert "POST" in headers["Access-Control-Allow-Methods"]


def test_an_api_key_is_checked_after_the_origin_and_its_401_carries_cors(keyed):
    chat = {"model": FIRST, "messages": [{"role": "user", "content": "Hi"}], "stream": False}
    status, headers, body = keyed.request("POST", "/api/chat", chat, headers={"Origin": "https://evil.example"})
    assert status == 403, body  # refused for its origin first, key or no key
    assert "Access-Control-Allow-Origin" not in headers
    assert "https://evil.example" in body["error"]
    status, _, _ = keyed.request("POST", "/api/chat", chat, headers={"Origin": "https://evil.example",
                                                                     "Authorization": "Bearer secret"})
    assert status == 403
    status, headers, body = keyed.request("POST", "/api/chat", chat, headers={"Origin": "http://localhost:5173"})
    assert status == 401, body
    assert headers["Access-Control-Allow-Origin"] == "http://localhost:5173"  # the page can read why


# --- finding 4: --timeout past the request timeout ---------------------------------------------------------------------


def test_the_request_timeout_is_at_least_the_client_timeout(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=2))
    for client, request in ((600.0, 600.0), (60.0, REQUEST_TIMEOUT_S), (REQUEST_TIMEOUT_S + 1, REQUEST_TIMEOUT_S + 1)):
        server = ApiServer(("127.0.0.1", 0), completer, "m", log=False, client_timeout_s=client)
        try:
            assert server.request_timeout_s == request, client  # was 300 whatever the client timeout
        finally:
            server.server_close()
    server = ApiServer(("127.0.0.1", 0), completer, "m", log=False, client_timeout_s=20.0, request_timeout_s=1.0)
    server.server_close()
    assert server.request_timeout_s == 1.0  # one given is kept


def test_timeout_600_lets_a_request_take_600_seconds(tiny_bundle):
    def check(port):
        servers = [thing for thing in gc.get_objects()
                   if type(thing) is ApiServer and thing.server_address[1] == port]
        assert len(servers) == 1
        return servers[0].client_timeout_s, servers[0].request_timeout_s

    assert serve_in_process([str(tiny_bundle.path), "--timeout", "600"], check) == (600, 600)


def test_the_timeout_option_says_it_is_a_request_s_time_too():
    from tests.unit.test_cli import flat, invoke

    text = flat(invoke("serve", "--help").output)
    said = text[text.index("--timeout SECONDS"):][:600]
    assert f"A whole request (its head and body) has {REQUEST_TIMEOUT_S:g} s or this, whichever is longer" in said, \
        said


# --- finding 5: a JSON schema's root -----------------------------------------------------------------------------------


def test_an_enum_value_that_is_the_start_of_another_is_refused_in_its_own_words():
    with pytest.raises(RootError) as refused:
        compile_schema({"enum": [1, 12]})
    problem = refused.value.problem
    assert "no enum / const value may be the start of another: 1 and 12" in problem
    assert "the answer must be an object or an array" not in problem  # the root IS an enum
    assert "list the values as strings" in refused.value.fix


@pytest.mark.parametrize(("schema", "values"), [
    ({"type": "integer", "minimum": 1, "maximum": 5}, [b"1", b"2", b"3", b"4", b"5"]),
    ({"type": "integer", "minimum": 0, "maximum": 9}, [str(value).encode() for value in range(10)]),
    ({"type": "integer", "minimum": 5, "maximum": 12}, [str(value).encode() for value in range(5, 13)]),
    ({"type": "integer", "exclusiveMinimum": 9, "maximum": 99, "multipleOf": 10},
     [str(value).encode() for value in range(10, 100, 10)]),
])
def test_a_bounded_integer_root_is_the_values_of_its_range(schema, values):
    compiled = compile_schema(schema)  # was refused: "a number has no last digit"
    assert list(compiled.root.literals) == values
    tokens = [b"0", b"1", b"2", b"5", b"9", b"10", b"12", b"x", b"13"]
    constraint = SchemaConstraint(tokens, compiled)
    last = values[-1]
    for piece in (last[:1], last[1:]) if len(last) > 1 else (last,):
        token = tokens.index(piece)
        assert constraint.allows(token)
        constraint.advance(token)
    assert constraint.complete  # the answer ends at the range's last value
    assert not constraint.allows(tokens.index(b"x"))


def test_a_bounded_integer_root_whose_values_start_one_another_is_refused_naming_them():
    with pytest.raises(RootError) as refused:
        compile_schema({"type": "integer", "minimum": 1, "maximum": 12})
    assert "the schema's root is an integer from 1 to 12, and no value it allows may be the start of another: 1 " \
        "and 10" in refused.value.problem
    assert "10 to 99" in refused.value.fix
    assert "wrap the value in an object" in refused.value.fix
    with pytest.raises(RootError) as refused:
        compile_schema({"type": "integer", "minimum": 0, "maximum": 1000})
    assert "an integer from 0 to 1000, 1,001 values, more than the 256" in refused.value.problem
    with pytest.raises(RootError, match="root is 'integer'"):
        compile_schema({"type": "integer", "minimum": 1})


def test_a_bounded_integer_format_is_followed_on_ollama_s_and_openai_s_routes(runtime):
    from tests.unit.test_serve import Served

    served = Served(runtime, ServeDefaults(max_tokens=8))
    schema = {"type": "integer", "minimum": 5, "maximum": 12}
    try:
        status, body = served.post("/api/generate", {"model": "tiny-host", "prompt": "Say", "format": schema,
                                                     "stream": False})
        assert status == 200, body  # was 400: "the schema's root is 'integer'"
        assert json.loads(body["response"]) in range(5, 13)
        status, body = served.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Say"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
        assert status == 200, body
        assert body["choices"][0]["finish_reason"] == "stop"  # the value closed: the answer ended there
        assert json.loads(body["choices"][0]["message"]["content"]) in range(5, 13)
    finally:
        served.close()
