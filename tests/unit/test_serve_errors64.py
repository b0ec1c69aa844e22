"""What a client and an operator read of a refused request, and which build answers:

* a prompt past the context is refused in OpenAI's words, "This model's maximum context length is M tokens.
  However, your messages resulted in N tokens" (the openai client's ``str(error)`` is the message alone, and apps
  test ``"maximum context length" in str(error)``), naming the route's own field (``input`` on /v1/responses and
  /v1/embeddings), with the fix after it; Anthropic's Messages API leads with its own words, its counts taken from the
  refusal rather than read back out of its text;
* the request log gives a refusal's message beside its status line (one line, cut short, never the request's body),
  and writes nothing with the log off (``serve --quiet``);
* ``/health`` and ``/props`` give the manifest's ``bundle_id``, and ``/props``' ``model_path`` is the bundle's
  directory, resolved, as llama-server's is the model file."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import LOGGED_REASON_CHARS, ApiServer
from tests.unit.test_serve import Served

LIMIT = 256  # the tiny bundle's context (tests/conftest.py)
LONG_TEXT = "The tide came in over the flats and the gulls rose. " * 40  # well past 256 tokens
OPENAI_HEAD = f"This model's maximum context length is {LIMIT} tokens. However, your "


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4))
    yield server
    server.close()


def _chat(text: str = LONG_TEXT) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 2}


def _counted(message: str, what: str) -> int:
    """N of "However, your WHAT resulted in N tokens"."""
    head = f"{OPENAI_HEAD}{what} resulted in "
    assert message.startswith(head), message
    counted = int(message[len(head):].split(" ", 1)[0])
    assert counted > LIMIT, message
    return counted


# ------------------------------------------------------------------------------------------------ the wording


def test_a_chat_past_the_context_is_refused_in_openais_words(served):
    status, body = served.post("/v1/chat/completions", _chat())
    assert status == 400, body
    error = body["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    _counted(error["message"], "messages")
    assert "shorten the messages to fewer tokens (POST /tokenize counts them)" in error["message"]


def test_a_completion_past_the_context_names_the_prompt(served):
    status, body = served.post("/v1/completions", {"prompt": list(range(10, 10 + LIMIT + 44)), "max_tokens": 2})
    assert status == 400, body
    assert _counted(body["error"]["message"], "prompt") == LIMIT + 44
    assert body["error"]["param"] == "prompt"
    assert "shorten the prompt to fewer tokens" in body["error"]["message"]


def test_the_openai_clients_error_text_holds_maximum_context_length(served):
    """What an app written for OpenAI's API tests: the openai client's str() of the 400 (its message alone)."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny-host", max_tokens=2,
                                       messages=[{"role": "user", "content": LONG_TEXT}])
    assert "maximum context length" in str(refused.value), str(refused.value)
    assert refused.value.code == "context_length_exceeded"


def test_the_responses_route_names_its_input_not_the_messages(served):
    """/v1/responses has no ``messages``: its refusal said "shorten the messages" under param ``input``."""
    status, body = served.post("/v1/responses", {"model": "tiny-host", "input": LONG_TEXT, "max_output_tokens": 16})
    assert status == 400, body
    error = body["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input")
    _counted(error["message"], "input")
    assert "shorten the input to fewer tokens" in error["message"]
    assert "messages" not in error["message"]


def test_an_embedding_input_past_the_context_is_refused_in_openais_words(served, runtime):
    ids = list(range(10, 10 + LIMIT + 20))
    status, body = served.post("/v1/embeddings", {"model": "tiny-host", "input": ids})
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"] == (f"{OPENAI_HEAD}input resulted in {LIMIT + 20} tokens; shorten the input or "
                                        "split it into passages")
    # of several inputs, the one too long is named
    status, body = served.post("/v1/embeddings", {"model": "tiny-host", "input": [[5, 6], ids]})
    assert status == 400, body
    assert body["error"]["param"] == "input[1]"
    assert body["error"]["message"].startswith(f"{OPENAI_HEAD}input[1] resulted in {LIMIT + 20} tokens"), body


def test_the_runtimes_refusal_of_a_long_embedding_input_is_openais_too():
    from edgesdk.runtime.embedding import InputTooLong, fitted

    with pytest.raises(InputTooLong) as refused:
        fitted(list(range(1, 71)), 64)
    assert refused.value.problem == "This model's maximum context length is 64 tokens. However, your input " \
        "resulted in 70 tokens"
    # a smaller window a request asked for (Ollama's num_ctx) is named as such, not as the model's context
    with pytest.raises(InputTooLong, match="more than 'options.num_ctx' of 32"):
        fitted(list(range(1, 41)), 32, window="'options.num_ctx'")


def test_anthropics_refusal_takes_its_counts_from_the_refusal(served):
    status, body = served.post("/v1/messages", {"model": "tiny-host", "max_tokens": 4,
                                                "messages": [{"role": "user", "content": LONG_TEXT}]})
    assert status == 400, body
    message = body["error"]["message"]
    lead, _, rest = message.partition("; ")
    counted = _counted(rest, "messages")
    assert lead == f"prompt is too long: {counted} tokens > {LIMIT} maximum", message


def test_too_long_reads_no_counts_out_of_the_text():
    from edgesdk.serve.anthropic import too_long

    assert too_long("the prompt has 300 tokens; this model's context holds 256") == \
        "prompt is too long: the prompt has 300 tokens; this model's context holds 256"
    assert too_long("anything", (300, 256)) == "prompt is too long: 300 tokens > 256 maximum; anything"


# ------------------------------------------------------------------------------------------------ the request log


class Logged:
    """A server over ``runtime`` with its request log on or off (``serve --quiet`` is ``log=False``)."""

    def __init__(self, runtime, log: bool):
        self.server = ApiServer(("127.0.0.1", 0), Completer(runtime, ServeDefaults(max_tokens=2)), "tiny-host",
                                log=log)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def post(self, path: str, body: object) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        connection.close()
        return response.status

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _log_lines(capsys, runtime, log: bool, requests: list[tuple[str, object]]) -> list[str]:
    server = Logged(runtime, log)
    try:
        statuses = [server.post(path, body) for path, body in requests]
    finally:
        server.close()
    assert all(status == 400 for status in statuses), statuses
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("edgesdk serve: ")]


def test_a_refusal_is_logged_with_its_reason_and_without_the_body(capsys, runtime):
    marker = "zebra-quokka "  # the request's own text, which the log never shows
    lines = _log_lines(capsys, runtime, True, [("/v1/chat/completions", _chat(marker * 200)),
                                               ("/v1/chat/completions", {"messages": "nope"})])
    status_lines = [line for line in lines if '"POST /v1/chat/completions HTTP/1.1" 400' in line]
    assert len(status_lines) == 2, lines
    overflow, malformed = status_lines
    reason = overflow.split('HTTP/1.1" 400 -: ', 1)[1]
    assert reason.startswith(OPENAI_HEAD + "messages resulted in "), overflow
    assert len(reason) <= LOGGED_REASON_CHARS, reason
    assert reason.endswith("..."), reason
    assert "'messages' must be a non-empty array" in malformed, malformed
    assert not any("zebra" in line for line in lines), lines


def test_a_quiet_server_logs_no_refusal(capsys, runtime):
    assert _log_lines(capsys, runtime, False, [("/v1/chat/completions", _chat())]) == []


def test_a_logged_reason_is_one_line_cut_short():
    from edgesdk.serve.http_server import logged_reason, refusal_message

    assert logged_reason("bundle x cannot be run:\n  - one\n  - two") == "bundle x cannot be run: - one - two"
    cut = logged_reason("y" * 1000)
    assert len(cut) == LOGGED_REASON_CHARS
    assert cut.endswith("...")
    assert refusal_message({"error": {"message": "m", "type": "t"}}) == "m"  # OpenAI's and Anthropic's shape
    assert refusal_message({"error": "o"}) == "o"  # Ollama's
    assert refusal_message({"type": "error"}) is None


# ------------------------------------------------------------------------------------------------ which build


def test_health_and_props_name_the_bundle_served(tiny_bundle, tmp_path):
    """Served through a ``current`` link (as deploy switches it), /props' model_path is the directory it resolves
    to, and both routes give the manifest's bundle_id."""
    from edgesdk.runtime.session import open_runtime

    link = tmp_path / "current"
    link.symlink_to(tiny_bundle.path.resolve(), target_is_directory=True)
    server = Served(open_runtime(link, threads=1), ServeDefaults(max_tokens=2))
    try:
        status, _, payload = server.request("GET", "/health")
        assert status == 200
        health = json.loads(payload)
        status, _, payload = server.request("GET", "/props")
        assert status == 200
        props = json.loads(payload)
    finally:
        server.close()
    bundle_id = tiny_bundle.manifest["bundle_id"]
    assert health["bundle_id"] == bundle_id, health
    assert props["bundle_id"] == bundle_id, props
    assert props["model_path"] == str(tiny_bundle.path.resolve()), props
    assert props["model_alias"] == "tiny-host"
