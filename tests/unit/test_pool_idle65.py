"""A served model's idle unload and load, and the refusals around them: a router load of a model an answer holds
(whose keep_alive 0, or the server's default 0, would unload it as it ends), a server default keep_alive of 0 that
leaves the first model loaded at start, OLLAMA_KEEP_ALIVE quoted or unread, token ids sent under a served name that
looks like OpenAI's embedding model, and the Python API's embedding refusal with one fix. Real bundles, a real model
pool and real servers over HTTP."""

from __future__ import annotations

import math
import socket
import threading

import pytest
from click.testing import CliRunner

import edgesdk
from edgesdk.api import RequestError
from edgesdk.cli import main
from edgesdk.errors import EdgeSDKError
from edgesdk.serve.api import ApiError
from edgesdk.serve.embeddings import parse_embedding_request
from edgesdk.serve.ollama import keep_alive_from_env
from tests.unit.test_keep_alive65 import Served

A, C = "a", "c"
JOIN_S = 60  # far beyond a timer of 0 s: only a timer that never ends reaches it


@pytest.fixture
def served(tmp_path, tiny_bundle):
    """test_keep_alive65's servers, answers of 2 tokens."""
    made = []

    def serve(**kwargs) -> Served:
        made.append(Served(tmp_path / f"served{len(made)}", tiny_bundle, max_tokens=2, **kwargs))
        return made[-1]

    yield serve
    for server in made:
        server.close()


def _join_timers() -> None:
    """Let every timer running now end (an idle unload of 0 s fires at once): what it unloads is then gone."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.join(JOIN_S)


# ------------------------------------------------- a router load of a model an answer holds, and will unload


@pytest.mark.parametrize(("keep_alive_s", "unload"), [(math.inf, True), (0.0, False)])
def test_a_router_load_of_a_held_model_keeps_it_past_the_answer_that_would_unload_it(served, keep_alive_s, unload):
    """The answer holding ``a`` unloads it as it ends: its own keep_alive 0, or the server's default 0. The load
    came meanwhile: it was answered 400 "already loaded", and ``a`` then went."""
    server = served(keep_alive_s=keep_alive_s)
    held = server.pool.acquire(A)  # a request for a, its answer not yet written
    status, answer = server.post("/models/load", {"model": A})
    assert (status, answer) == (200, {"success": True})
    server.pool.release(held, unload=unload)
    assert server.pool.loaded[0] == A
    assert server.pool.loaded[1] is not None


def test_a_router_load_of_an_idle_loaded_model_is_still_refused(served):
    server = served()
    status, answer = server.post("/models/load", {"model": A})
    assert status == 400, answer
    assert answer["error"]["code"] == "model_already_loaded"


def test_with_a_default_keep_alive_of_0_a_loaded_model_stays_for_the_next_answer_which_unloads_it(served):
    server = served(keep_alive_s=0.0)
    status, answer = server.post("/models/load", {"model": C})
    assert (status, answer) == (200, {"success": True})
    _join_timers()
    assert server.pool.loaded[0] == C
    lease = server.pool.acquire(C)
    server.pool.release(lease)  # its answer: keep_alive 0 by default
    assert server.pool.loaded == (None, None)


# ------------------------------------------------------------ a default keep_alive of 0 and the first model


def test_a_default_keep_alive_of_0_leaves_the_first_model_loaded_until_its_first_answer(served):
    """The start line says the first model is loaded: a timer of 0 s unloaded it at once."""
    server = served(keep_alive_s=0.0)
    _join_timers()
    name, completer = server.pool.loaded
    assert name == A
    assert completer is not None
    lease = server.pool.acquire(None)
    assert lease.name == A
    server.pool.release(lease)
    assert server.pool.loaded == (None, None)


# ------------------------------------------------------------------------------------ OLLAMA_KEEP_ALIVE


@pytest.mark.parametrize(("text", "seconds"), [('"5m"', 300.0), ("'10m'", 600.0), (" '-1' ", math.inf),
                                               ('""', None)])
def test_a_quoted_ollama_keep_alive_is_read_as_ollama_reads_it(text, seconds):
    assert keep_alive_from_env(text) == seconds


def test_an_ollama_keep_alive_that_is_no_duration_says_ollama_would_take_5m():
    with pytest.raises(EdgeSDKError) as raised:
        keep_alive_from_env("forever")
    assert "Ollama would fall back to its default of 5m" in str(raised.value)


def test_an_unread_ollama_keep_alive_does_not_stop_a_server_of_one_bundle(tiny_bundle):
    """With one bundle the value changes nothing; it stopped the server before it listened."""
    with socket.socket() as taken:  # the server stops at its listen check, after the options are read
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        result = CliRunner().invoke(main, ["serve", str(tiny_bundle.path), "--port", str(taken.getsockname()[1])],
                                    env={"OLLAMA_KEEP_ALIVE": "forever"})
    said = " ".join(result.output.split())
    assert "OLLAMA_KEEP_ALIVE='forever' is not a duration" in said, said
    assert "it is ignored: with one bundle served" in said, said
    assert "cannot listen" in said, said  # it went on to the listen check, past the variable


# ---------------------------------------------- token ids under a name that looks like OpenAI's embedding model


@pytest.mark.parametrize("model", ["text-embedding-nomic-embed-text-v1.5", "text-embedding-3-small-local"])
def test_token_ids_under_a_name_that_is_not_openais_are_embedded(model):
    assert parse_embedding_request({"model": model, "input": [[1, 2]]}).inputs == ((1, 2),)


def test_token_ids_under_openais_name_in_another_case_are_refused():
    with pytest.raises(ApiError) as caught:
        parse_embedding_request({"model": "Text-Embedding-3-Small", "input": [[1, 2]]})
    assert caught.value.code == "token_ids_of_another_tokenizer"


def test_token_ids_under_a_served_alias_of_openais_name_are_embedded(served):
    """Served as --alias text-embedding-3-small so that OpenAI clients work unchanged: its own ids were refused, with
    a fix (name the served model) that named the same model."""
    server = served(several=False, name="text-embedding-3-small")
    ids = server.runtime.tokenizer.encode("a cat on a mat")
    status, answer = server.post("/v1/embeddings", {"model": "text-embedding-3-small", "input": [ids]})
    assert status == 200, answer
    assert len(answer["data"]) == 1


# ------------------------------------------------------------------ the Python API's embedding refusal


def test_an_embedding_refusal_gives_the_python_caller_one_fix(tiny_bundle):
    """The route's fix (POST /tokenize, LangChain) stood in the message before the Python fix."""
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        with pytest.raises(RequestError) as caught:
            model.embed([[10 ** 7]])
    text = str(caught.value)
    assert "10000000" in text, text
    assert "tokenize() gives them" in text, text
    assert "POST /tokenize" not in text, text
