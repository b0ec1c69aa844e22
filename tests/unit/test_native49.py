"""Review of llama-server's native routes and the HTTP server (49th stop), over real HTTP against the tiny bundle:
``POST /completion``'s counts and timings as llama-server gives them, a grammar that fails mid-answer, and
``edgesdk serve``'s refusals of a host and a port it cannot bind."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from edgesdk.cli_serve import listen_error
from edgesdk.errors import EdgeSDKError
from edgesdk.serve import llama_native
from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS, CompletionRequest
from edgesdk.serve.completion import Completion, ServeDefaults, SlotState
from edgesdk.serve.http_server import ApiServer
from tests.unit.test_cli import flat, invoke
from tests.unit.test_serve import Served, runtime  # noqa: F401 (the module's runtime fixture)

PROMPT = "The quick brown fox"


@pytest.fixture
def served(runtime):  # noqa: F811
    server = Served(runtime)
    yield server
    server.close()


# ------------------------------------------------------------------ tokens_cached and the timings' per-token figures


def test_tokens_cached_is_the_kv_cache_s_length_at_a_token_limit_and_a_stop_word(served):
    # llama-server's tokens_cached is slot.prompt.n_tokens(): the prompt and every sampled token but the last, which
    # ended the answer before it was decoded (server-context.cpp send_final_response)
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 6, "cache_prompt": False})
    assert status == 200, body
    assert body["stop_type"] == "limit"
    assert body["tokens_cached"] == body["tokens_evaluated"] + body["tokens_predicted"] - 1
    word = body["content"][-2:]
    status, cut = served.post("/completion", {"prompt": PROMPT, "n_predict": 6, "stop": [word]})
    assert status == 200, cut
    if cut["stop_type"] == "word":
        assert cut["tokens_cached"] == cut["tokens_evaluated"] + cut["tokens_predicted"] - 1


def test_tokens_cached_at_the_end_of_text_token_counts_every_answer_token():
    # the end-of-text token is sampled and counted by llama-server (n_decoded, as completion_tokens counts it: three
    # answer tokens and the end of text), not decoded: the cache holds the prompt and the answer's tokens
    done = Completion("abc", "stop", prompt_tokens=5, completion_tokens=4, tokens=[1, 2, 3, 0])
    body = llama_native.final_body(llama_native.parse_completion_request({"prompt": "x"}), "m", done, {})
    assert body["stop_type"] == "eos"
    assert body["tokens_cached"] == 5 + 3
    nothing = Completion("", "length", prompt_tokens=5, completion_tokens=0)
    body = llama_native.final_body(llama_native.parse_completion_request({"prompt": "x"}), "m", nothing, {})
    assert body["tokens_cached"] == 5


def test_predicted_per_token_divides_by_every_token_generated():
    # llama-server: predicted_per_token_ms = t_token_generation / n_decoded, predicted_per_second =
    # 1e3 / t_token_generation * n_decoded (server-context.cpp get_timings), n_decoded counting the first token too
    done = Completion("abcd", "length", prompt_tokens=5, completion_tokens=4, prompt_ms=10.0, predicted_ms=20.0)
    timings = llama_native.timings(done)
    assert timings["predicted_per_token_ms"] == pytest.approx(5.0)
    assert timings["predicted_per_second"] == pytest.approx(200.0)


# ------------------------------------------------------------------ a grammar whose parses multiply after its first token

# "a" takes one parse; what follows it, six optional repetitions nested through rule names, more than the matcher
# follows at once (edgesdk/runtime/grammar.py, MAX_WALK_STACKS): the grammar is read and its first token picked
# before the walk that fails
LATE_GRAMMAR = ('r0 ::= "b"?\n' + "".join(f"r{i} ::= r{i - 1}{{0,10}}\n" for i in range(1, 7))
                + 'root ::= "a" r6\n')


def test_a_grammar_that_fails_after_its_first_token_is_refused_as_the_request_s_grammar(served):
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 4, "grammar": LATE_GRAMMAR})
    assert status == 400, body
    text = json.dumps(body)
    assert "parses at once" in text
    assert body["error"]["param"] == "grammar"
    assert body["error"]["type"] == "invalid_request_error"


def test_a_streamed_answer_whose_grammar_fails_ends_in_an_error_event_naming_the_grammar(served):
    status, _, payload = served.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 4, "stream": True,
                                                                 "grammar": LATE_GRAMMAR})
    assert status == 200
    events = [json.loads(block[len("data: "):]) for block in payload.decode().split("\n\n") if block]
    error = events[-1]["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "grammar")
    assert "parses at once" in error["message"]
    assert error["message"].startswith("grammar: ")


# ------------------------------------------------------------------ serve's host and port


def _first_unprivileged_port() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024


def test_a_privileged_port_is_refused_with_the_fix_for_a_privileged_port(served):
    # a port below net.ipv4.ip_unprivileged_port_start needs root or CAP_NET_BIND_SERVICE: its EACCES was told to
    # "pick another --port (0 takes a free one), or stop what listens there", as if something listened there
    first = _first_unprivileged_port()
    if first <= 80:
        pytest.skip("this machine lets any user bind port 80 (net.ipv4.ip_unprivileged_port_start)")
    dropped = os.geteuid() == 0
    if dropped:  # root binds it: the bind is made as nobody, whose effective capabilities are none
        os.seteuid(65534)
    try:
        with pytest.raises(PermissionError) as caught:
            ApiServer(("127.0.0.1", 80), served.completer, "tiny-host", log=False).server_close()
    finally:
        if dropped:
            os.seteuid(0)
    assert caught.value.errno == errno.EACCES
    error = listen_error(caught.value, "127.0.0.1", 80)
    assert isinstance(error, EdgeSDKError)
    assert error.problem == "cannot listen on 127.0.0.1:80 (Permission denied)"
    assert f"ports below {first} need root or the CAP_NET_BIND_SERVICE capability: pass --port {first} or above" \
        in error.fix
    assert "setcap cap_net_bind_service=+ep" in error.fix
    assert "stop what listens there" not in error.fix


def test_a_port_in_use_keeps_its_fix(served):
    with pytest.raises(OSError, match="in use") as caught:
        ApiServer(("127.0.0.1", served.port), served.completer, "tiny-host", log=False).server_close()
    assert caught.value.errno == errno.EADDRINUSE
    error = listen_error(caught.value, "127.0.0.1", served.port)
    assert error.fix == "pick another --port (0 takes a free one), or stop what listens there"


@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_refused_before_the_model_loads(tiny_bundle, tmp_path, host):
    # Python binds "" to every interface (as llama-server's cpp-httplib does): --host "$HOST" with HOST unset served
    # the model to the whole network, and the start line read "http://:8080"
    broken = shutil.copytree(tiny_bundle.path, tmp_path / "b")
    (broken / "manifest.json").write_text("{")  # the bundle must not even be read: the host is refused first
    result = invoke("serve", broken, "--host", host, "--port", "0")
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--host':" in result.stderr
    assert f"{host!r} is empty: an empty host would listen on every interface; pass 127.0.0.1 (the default) for this " \
        "machine only, or 0.0.0.0 (or :: for IPv6 too) for every interface" in flat(result.stderr)


# ------------------------------------------------------------------ generation_settings' n_predict as it was asked for


def test_generation_settings_show_the_limit_asked_for_not_the_context(served):
    # llama-server shows params.n_predict: -1 for no limit (not the context's 256 the answer is held to), and a
    # limit past the context as it was given
    fields = ["generation_settings/n_predict", "tokens_predicted"]
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": -1, "response_fields": fields})
    assert status == 200, body
    assert body["generation_settings/n_predict"] == -1
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 1000, "response_fields": fields})
    assert status == 200, body
    assert body["generation_settings/n_predict"] == 1000
    status, body = served.post("/completion", {"prompt": PROMPT, "n_predict": 3, "response_fields": fields})
    assert (body["generation_settings/n_predict"], body["tokens_predicted"]) == (3, 3)
    status, body = served.post("/completion", {"prompt": PROMPT, "response_fields": fields})
    assert body["generation_settings/n_predict"] == 16  # the server's --max-new-tokens


def test_slots_show_no_limit_as_minus_one(runtime):  # noqa: F811
    server = Served(runtime, ServeDefaults(max_tokens=UNTIL_THE_CONTEXT_FILLS))
    try:
        status, _, payload = server.request("GET", "/slots")
        assert status == 200
        slot = json.loads(payload)[0]
        assert (slot["params"]["n_predict"], slot["next_token"]["n_remain"]) == (-1, -1)
        request = CompletionRequest(chat=False, prompt="x")
        server.completer.slot = SlotState(1, request, server.completer.sampling(request), 1, decoded=5)
        slot = llama_native.slots(server.completer)[0]
        assert (slot["params"]["n_predict"], slot["next_token"]["n_remain"]) == (-1, -1)
        server.completer.slot = None
        status, body = server.post("/completion", {"prompt": PROMPT, "response_fields": ["generation_settings"]})
        assert body["generation_settings"]["n_predict"] == -1
    finally:
        server.completer.slot = None
        server.close()
