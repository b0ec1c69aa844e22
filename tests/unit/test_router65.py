"""``edgesdk serve`` against llama-server's router mode (``--models-dir``) and its options: the router's POST
/models/load and /models/unload and each /v1/models entry's ``status``, ``/slots?model=NAME``, --models-dir bundles
named after their directories, llama-server's --cache-prompt / --no-cache-prompt, --models-max and the router options
refused by name, -to / --timeout (LLAMA_ARG_TIMEOUT), and /completion's ``n_probs`` past OpenAI's 20. Real bundles,
real servers over HTTP, the command itself."""

from __future__ import annotations

import gc
import http.client
import json
import shutil
import threading

import pytest

from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from edgesdk.serve.model_pool import ModelPool, ServedModel
from tests.unit.test_cli import flat, invoke
from tests.unit.test_serve_models42 import ask, serve_in_process

pytest.importorskip("torch")

FIRST, SECOND = "first", "second"


def _completer(bundle) -> Completer:
    return Completer(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=2))


class _Served:
    """A real ApiServer on a free port in a thread: one bundle, or two names of it through a real model pool."""

    def __init__(self, bundle, several: bool):
        first = _completer(bundle)
        self.pool = ModelPool([ServedModel(FIRST, bundle), ServedModel(SECOND, bundle)],
                              load=lambda model: _completer(model.bundle), loaded=first,
                              log=lambda line: None) if several else None
        self.server = ApiServer(("127.0.0.1", 0), first, FIRST, log=False, pool=self.pool)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def request(self, method: str, path: str, body: object | None = None) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.server_address[1], timeout=60)
        connection.request(method, path, None if body is None else json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        return response.status, answer

    def statuses(self) -> dict[str, object]:
        status, listed = self.request("GET", "/v1/models")
        assert status == 200, listed
        return {card["id"]: card.get("status") for card in listed["data"]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def several(tiny_bundle):
    served = _Served(tiny_bundle, several=True)
    yield served
    served.close()


@pytest.fixture
def single(tiny_bundle):
    served = _Served(tiny_bundle, several=False)
    yield served
    served.close()


# --- finding 1: POST /models/load, /models/unload and each entry's status -----------------------------------------


def test_router_routes_load_and_unload_a_model_and_each_entry_says_its_status(several):
    loaded, unloaded = {"value": "loaded"}, {"value": "unloaded"}
    assert several.statuses() == {FIRST: loaded, SECOND: unloaded}
    assert several.request("POST", "/models/load", {"model": SECOND}) == (200, {"success": True})
    assert several.pool.loaded[0] == SECOND  # answered once loaded: the next request finds it in
    assert several.statuses() == {FIRST: unloaded, SECOND: loaded}
    assert several.request("POST", "/models/unload", {"model": SECOND}) == (200, {"success": True})
    assert several.pool.loaded == (None, None)
    assert several.statuses() == {FIRST: unloaded, SECOND: unloaded}
    status, card = several.request("GET", f"/v1/models/{FIRST}")
    assert (status, card["status"]) == (200, unloaded)


def test_router_routes_refuse_as_llama_server_does_naming_the_model(several):
    status, body = several.request("POST", "/models/load", {"model": FIRST})
    assert (status, body["error"]["code"]) == (400, "model_already_loaded"), body
    assert f"the model '{FIRST}' is already loaded" in body["error"]["message"]
    status, body = several.request("POST", "/models/unload", {"model": SECOND})
    assert (status, body["error"]["code"]) == (400, "model_not_loaded"), body
    assert f"the model '{SECOND}' is not loaded ('{FIRST}' is)" in body["error"]["message"]
    status, body = several.request("POST", "/models/load", {"model": "nope"})
    assert (status, body["error"]["code"]) == (404, "model_not_found"), body
    assert f"this server serves {FIRST}, {SECOND}" in body["error"]["message"]
    status, body = several.request("POST", "/models/load", {"name": SECOND})
    assert (status, body["error"]["param"]) == (400, "model"), body
    assert "/models/load takes a JSON object naming the model" in body["error"]["message"]
    assert several.pool.loaded[0] == FIRST  # nothing swapped by a refusal


def test_one_bundle_answers_the_router_routes_and_lists_no_status(single):
    assert single.statuses() == {FIRST: None}  # llama-server's single-model list has none
    status, body = single.request("POST", "/models/load", {"model": FIRST})
    assert (status, body["error"]["code"]) == (400, "model_already_loaded"), body
    status, body = single.request("POST", "/models/unload", {"model": FIRST})
    assert (status, body["error"]["code"]) == (400, "model_not_unloadable"), body
    assert "--models-dir DIR" in body["error"]["message"]


# --- finding 5: /slots?model=NAME ----------------------------------------------------------------------------------


def test_slots_answers_for_the_model_its_query_names(several):
    status, slots = several.request("GET", f"/slots?model={SECOND}")
    assert status == 200, slots
    assert several.pool.loaded[0] == FIRST  # a monitoring GET swaps nothing: the other model described unloaded
    assert slots[0]["status"] == {"value": "unloaded"}
    status, body = several.request("GET", "/slots?model=nope")
    assert (status, body["error"]["code"]) == (404, "model_not_found"), body
    status, slots = several.request("GET", "/slots")  # no name: the loaded model's, no swap
    assert status == 200, slots
    assert several.pool.loaded[0] == FIRST


# --- finding 6: n_probs past 20 on /completion, up to the vocabulary -------------------------------------------------


def test_native_n_probs_lists_up_to_the_vocabulary_and_the_openai_routes_keep_20(single):
    vocabulary = single.server.completer.runtime.backend.vocab_size
    for asked, listed in ((50, 50), (vocabulary + 1000, vocabulary)):
        status, answer = single.request("POST", "/completion", {"prompt": "The quick", "n_predict": 1,
                                                                "n_probs": asked})
        assert status == 200, answer
        assert [len(entry["top_logprobs"]) for entry in answer["completion_probabilities"]] == [listed], asked
    status, body = single.request("POST", "/v1/completions", {"prompt": "The quick", "max_tokens": 1,
                                                              "logprobs": 21})
    assert (status, body["error"]["param"]) == (400, "logprobs"), body
    status, body = single.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True, "top_logprobs": 21})
    assert (status, body["error"]["param"]) == (400, "top_logprobs"), body


# --- finding 2: --models-dir names each bundle after its directory ---------------------------------------------------


def _served_ids(args: list[str]) -> list[str]:
    return serve_in_process(args, lambda port: [card["id"] for card in ask(port, "GET", "/v1/models")[1]["data"]])


def test_models_dir_serves_two_builds_of_one_model_each_under_its_directory(tiny_bundle, tmp_path):
    folder = tmp_path / "models"
    for name in ("build-a", "build-b"):
        shutil.copytree(tiny_bundle.path, folder / name)
    assert _served_ids(["--models-dir", str(folder)]) == ["build-a", "build-b"]
    # a bundle given as BUNDLE keeps its manifest's name beside them, loaded first
    assert _served_ids([str(tiny_bundle.path), "--models-dir", str(folder)]) == \
        ["tiny-llama-host", "build-a", "build-b"]


def test_a_lone_bundle_of_models_dir_is_named_after_its_directory_too(tiny_bundle, tmp_path):
    shutil.copytree(tiny_bundle.path, tmp_path / "models" / "mine")
    assert _served_ids(["--models-dir", str(tmp_path / "models")]) == ["mine"]


# --- finding 3: llama-server's --cache-prompt / --no-cache-prompt, --models-max and the options refused -----------------


@pytest.mark.parametrize(("flag", "cached"), [("--no-cache-prompt", False), ("--cache-prompt", True)])
def test_llama_server_s_cache_prompt_flags_set_the_prompt_cache(tiny_bundle, flag, cached):
    props = serve_in_process([str(tiny_bundle.path), flag], lambda port: ask(port, "GET", "/props")[1])
    assert props["default_generation_settings"]["params"]["cache_prompt"] is cached


def test_models_max_1_is_accepted_and_another_number_refused_by_name(tmp_path):
    missing = tmp_path / "missing"
    taken = invoke("serve", missing, "--models-max", "1")
    assert "--models-max is accepted for llama.cpp's scripts and changes nothing here" in flat(taken.stderr)
    assert f"bundle {missing} does not exist" in flat(taken.output), taken.output  # parsed, then the bundle refused
    refused = invoke("serve", missing, "--models-max", "4")
    assert refused.exit_code == 2, refused.output
    assert "'--models-max' (llama.cpp's --models-max): is 4, and edgesdk serve keeps one model loaded at a time" in \
        flat(refused.stderr)


@pytest.mark.parametrize(("args", "said"), [
    (["--no-models-autoload"], "loads it here"),
    (["--models-preset", "presets.ini"], "no preset file is read here"),
    (["--slot-save-path", "slots"], "no slot's KV cache is written to or read from a file here"),
    (["--prompt-cache", "prompt.cache"], "'edgesdk run --prompt-cache FILE' writes and reads one); edgesdk serve keeps "
                                         "the KV caches of recent conversations in memory instead (--cache-ram MIB"),
])
def test_llama_server_s_router_options_and_run_s_prompt_cache_are_refused_with_why(tmp_path, args, said):
    result = invoke("serve", tmp_path / "missing", *args)
    assert result.exit_code == 2, result.output
    text = flat(result.stderr)
    assert f"{args[0]} is llama.cpp's {args[0]}, which edgesdk serve does not have" in text, text
    assert said in text


# --- finding 4: -to / --timeout and LLAMA_ARG_TIMEOUT ----------------------------------------------------------------


def _client_timeout(args: list[str]) -> float:
    def check(port):
        servers = [thing for thing in gc.get_objects()
                   if type(thing) is ApiServer and thing.server_address[1] == port]
        assert len(servers) == 1
        return servers[0].client_timeout_s
    return serve_in_process(args, check)


def test_timeout_sets_the_servers_client_timeout_from_its_option_or_its_variable(tiny_bundle, monkeypatch):
    from edgesdk.cli_serve import CLIENT_TIMEOUT_S
    from edgesdk.serve import http_server

    assert CLIENT_TIMEOUT_S == http_server.CLIENT_TIMEOUT_S  # the option's default is the server's own
    assert _client_timeout([str(tiny_bundle.path), "-to", "7"]) == 7
    assert _client_timeout([str(tiny_bundle.path), "--timeout", "600"]) == 600
    monkeypatch.setenv("LLAMA_ARG_TIMEOUT", "9")
    assert _client_timeout([str(tiny_bundle.path)]) == 9


def test_a_timeout_below_a_second_is_refused_naming_the_option(tmp_path):
    result = invoke("serve", tmp_path / "missing", "-to", "0")
    assert result.exit_code == 2, result.output
    assert "'--timeout' / '-to': 0 is not in the range x>=1" in flat(result.stderr)
