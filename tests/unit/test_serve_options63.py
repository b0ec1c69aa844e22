"""``edgesdk serve`` in place of llama-server: its options ``--embedding`` / ``--embeddings`` (and
LLAMA_ARG_EMBEDDINGS), ``--swa-full`` and ``--cache-reuse 0`` are taken with a note (``--sleep-idle-seconds`` is
serve/model_pool.py's idle unload now); ``--reranking``, ``--lora``, ``--lora-scaled``, ``--lora-init-without-apply``
and a ``--cache-reuse`` that turns it on are refused by name with what to do, not click's "No such option".
``GET /v1/models`` cards carry llama-server's ``meta`` from the bundle's manifest; llama-server's routes serve lacks
(``/v1/rerank``, ``/lora-adapters``, ``POST /slots/{id}``) answer a 404 that says so; ``serve --help`` names
llama-server's routes it has."""

from __future__ import annotations

import http.client
import json
import shutil
import threading

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_serve import _model_pool, _served_models
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ROUTES, ApiServer


def _said(*args: str, env: dict | None = None):
    """serve's (or another command's) exit code and what it said, on one line; the bundle need not exist."""
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, " ".join(result.output.split())


# ------------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize("args", [("--embedding",), ("--embeddings",), ("--swa-full",), ("--cache-reuse", "0"),
                                  ("--cache-reuse=0",)])
def test_serve_takes_llama_server_options_it_does_already_with_a_note(args):
    code, said = _said("serve", "bundle", *args)
    name = args[0].partition("=")[0]
    assert f"{name} is accepted for llama.cpp's scripts and changes nothing here" in said, said
    assert "No such option" not in said
    assert "does not exist" in said  # parsing went on to the bundle


def test_embedding_says_embeddings_are_served_beside_the_other_routes():
    _, said = _said("serve", "bundle", "--embedding")
    assert "embeddings are always served (POST /v1/embeddings, /embedding, Ollama's /api/embed), beside the chat " \
           "and completion routes" in said, said


def test_llama_arg_embeddings_is_read_as_embedding_is():
    _, said = _said("serve", "bundle", env={"LLAMA_ARG_EMBEDDINGS": "1"})
    assert "LLAMA_ARG_EMBEDDINGS (llama.cpp's --embedding) is accepted for llama.cpp's scripts" in said, said
    assert "not read" not in said


def test_swa_full_is_taken_by_run_too_as_every_bundle_keeps_the_whole_cache():
    _, said = _said("run", "bundle", "--swa-full", "-p", "hi")
    assert "--swa-full is accepted for llama.cpp's scripts and changes nothing here: the KV cache keeps every " \
           "position of a sliding-window layer already" in said, said


@pytest.mark.parametrize(("args", "fix"), [
    (("--reranking",), "rank documents by the cosine similarity of their POST /v1/embeddings vectors"),
    (("--rerank",), "edgesdk serve has no reranker"),
    (("--lora", "adapter.gguf"), "'edgesdk build --target T --model BASE --lora ADAPTER'"),
    (("--lora-scaled", "adapter.gguf:0.5"), "'edgesdk build --target T --model BASE --lora-scaled ADAPTER SCALE'"),
    (("--lora-init-without-apply",), "no LoRA adapter is loaded or applied while edgesdk serve runs"),
])
def test_serve_refuses_what_it_does_not_do_by_name_with_what_to_do(args, fix):
    code, said = _said("serve", "bundle", *args)
    assert code == 2, said
    long = "--reranking" if args[0] == "--rerank" else args[0]
    assert f"{args[0]} is llama.cpp's {long}, which edgesdk serve does not have" in said, said
    assert fix in said, said
    assert "No such option" not in said


def test_serve_s_lora_refusal_names_serving_a_bundle_for_each_adapter_and_run_s_does_not():
    _, served = _said("serve", "bundle", "--lora", "a.gguf")
    assert "a bundle for each adapter can be served together (edgesdk serve BUNDLE..., a request's model picks " \
           "one)" in served, served
    code, ran = _said("run", "bundle", "--lora", "a.gguf")
    assert code == 2
    assert "--lora is llama.cpp's --lora, which edgesdk run does not have: a bundle carries its LoRA adapters " \
           "merged into its weights at build" in ran, ran
    assert "served together" not in ran


@pytest.mark.parametrize(("args", "fix"), [
    (("--cache-reuse", "256"), "reuses only the prefix a prompt shares with the KV cache"),
])
def test_an_option_that_would_turn_on_what_serve_lacks_is_refused_at_that_value(args, fix):
    code, said = _said("serve", "bundle", *args)
    assert code == 2, said
    assert f"Invalid value for '{args[0]}' (llama.cpp's {args[0]}): is {args[1]}, and edgesdk serve" in said, said
    assert fix in said
    off = "0" if args[0] == "--cache-reuse" else "-1"
    assert f"pass {args[0]} {off} (off) or leave it out" in said


def test_llama_arg_cache_reuse_is_checked_as_the_option_is():
    code, said = _said("serve", "bundle", env={"LLAMA_ARG_CACHE_REUSE": "256"})
    assert code == 2, said
    assert "read from the environment, LLAMA_ARG_CACHE_REUSE='256'" in said, said


def test_embedding_is_refused_as_llama_server_s_by_the_commands_that_serve_nothing():
    code, said = _said("embed", "bundle", "--embedding")
    assert code == 2
    assert "it is an option of llama-server's HTTP server, and edgesdk embed serves nothing" in said, said


# ------------------------------------------------------------------------------------------------ help


def test_serve_help_names_llama_server_s_routes_it_has():
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    description = " ".join(result.output.split("Options:")[0].split())
    said = description.partition("llama-server's own routes:")[2].partition(").")[0]
    for route in ("/completion", "/infill", "/embedding", "/tokenize", "/detokenize", "/apply-template", "/props",
                  "/slots", "/metrics"):
        assert route in said, (route, description)


# ------------------------------------------------------------------------------------------------ the server


class _Server:
    """An ApiServer on a free port in a thread: one bundle, or several through the CLI's pool (``names``: their
    NAME=BUNDLE aliases)."""

    def __init__(self, paths, names=()):
        runtime = open_runtime(paths[0], threads=1)
        completer = Completer(runtime, ServeDefaults(max_tokens=4))
        pool, name = None, "tiny"
        if len(paths) > 1:
            several = _served_models(paths, names)
            name = several[0][0]
            pool = _model_pool(several, runtime, completer, ServeDefaults(max_tokens=4), None, {}, 0, backend=None,
                               threads=1, target=None, ignore_target=False)
        self.server = ApiServer(("127.0.0.1", 0), completer, name, log=False, pool=pool)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ask(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
        connection.close()
        return response.status, payload

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def served(tiny_bundle):
    server = _Server([tiny_bundle.path])
    yield server
    server.close()


def _expected_meta(manifest: dict) -> dict:
    facts = manifest["model"]["after"]
    return {"n_vocab": manifest["graph"]["vocab_size"], "n_ctx_train": facts["max_position_embeddings"],
            "n_embd": facts["hidden_size"], "n_params": facts["parameters"],
            "size": sum(entry["size"] for entry in manifest["files"].values())}


def test_a_model_card_carries_llama_server_s_meta_from_the_manifest(served, tiny_bundle):
    status, listed = served.ask("GET", "/v1/models")
    assert status == 200
    (card,) = listed["data"]
    assert card["meta"] == _expected_meta(tiny_bundle.manifest)
    assert card["meta"]["n_ctx_train"] == 512  # the tiny model's trained context, not the bundle's 256
    assert card["meta"]["n_vocab"] == 320
    assert served.ask("GET", "/v1/models/tiny")[1]["meta"] == card["meta"]
    assert card["meta"]["size"] == served.ask("GET", "/api/tags")[1]["models"][0]["size"]


def test_every_bundle_s_card_carries_its_meta_loaded_or_not(tiny_bundle, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_bundle.path, copy)
    server = _Server([tiny_bundle.path, copy], (f"first={tiny_bundle.path}", f"second={copy}"))
    try:
        status, listed = server.ask("GET", "/v1/models")
        assert status == 200
        assert {card["id"]: card["meta"] for card in listed["data"]} == \
            {"first": _expected_meta(tiny_bundle.manifest), "second": _expected_meta(tiny_bundle.manifest)}
        assert server.ask("GET", "/v1/models/second")[1]["meta"] == _expected_meta(tiny_bundle.manifest)
    finally:
        server.close()


@pytest.mark.parametrize(("method", "path", "instead"), [
    ("POST", "/slots/0?action=save", "the caches of recent conversations stay in memory (serve's --cache-ram)"),
    ("POST", "/slots/1?action=erase", "\"cache_prompt\": false prefills its prompt whole"),
    ("GET", "/lora-adapters", "'edgesdk build --target T --model BASE --lora ADAPTER'"),
    ("POST", "/lora-adapters", "a bundle for each adapter can be served together"),
    ("POST", "/v1/rerank", "cosine similarity of their POST /v1/embeddings vectors"),
    ("POST", "/rerank", "it serves no reranker"),
    ("POST", "/v1/reranking", "it serves no reranker"),
    ("POST", "/v1/audio/transcriptions", "it serves text models only"),
])
def test_llama_server_s_routes_serve_lacks_are_a_404_saying_so(served, method, path, instead):
    status, body = served.ask(method, path, b"{}" if method == "POST" else None)
    assert status == 404, body
    error = body["error"]
    assert error["code"] == "not_found"
    route = path.partition("?")[0]
    assert error["message"].startswith(f"no route {method} {route}: it is llama-server's "), error
    assert "which edgesdk serve does not have" in error["message"]
    assert instead in error["message"], error
    assert ROUTES not in error["message"]


def test_another_path_still_lists_the_routes(served):
    status, body = served.ask("POST", "/nothing", b"{}")
    assert status == 404
    assert body["error"]["message"] == f"no route POST /nothing: this server has {ROUTES}"
