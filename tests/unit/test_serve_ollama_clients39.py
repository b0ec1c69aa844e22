"""serve's Ollama API (edgesdk/serve/ollama.py) against what Ollama's clients send and read: ``logprobs`` and
``top_logprobs``, a thinking model's ``thinking``, the request shapes of Home Assistant's Ollama integration, Open
WebUI's Ollama proxy and the ``ollama`` Python client with every argument, on a real server over tiny bundles."""

from __future__ import annotations

import json

import pytest

ollama = pytest.importorskip("ollama")

from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
NAME = "tiny-host:latest"


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def _client(server: Served) -> ollama.Client:
    return ollama.Client(host=f"http://127.0.0.1:{server.port}")


def _lines(server: Served, path: str, body: dict) -> list[dict]:
    """The objects of an Ollama stream, each line one JSON object, the last one ``done`` (or an error)."""
    status, headers, payload = server.request("POST", path, {**body, "stream": True})
    assert status == 200, payload
    assert headers["Content-Type"] == "application/x-ndjson"
    assert payload.endswith(b"\n")
    return [json.loads(line) for line in payload.decode().split("\n")[:-1]]


def _ollama_form(entries: list[dict]) -> list[dict]:
    """The chat route's ``logprobs.content`` (or POST /completion's ``completion_probabilities``) as Ollama lists
    them: ``token``, ``logprob``, ``bytes``, and ``top_logprobs`` where there are any."""
    def shown(entry: dict) -> dict:
        return {"token": entry["token"], "logprob": entry["logprob"], "bytes": entry["bytes"]}

    return [{**shown(e), **({"top_logprobs": [shown(t) for t in e["top_logprobs"]]} if e["top_logprobs"] else {})}
            for e in entries]


def _same(got: list[dict], expected: list[dict]) -> None:
    """The same entries: tokens and bytes exactly, log-probabilities to within float rounding (a prompt evaluated
    again from the prompt cache's reused prefix sums in another order)."""
    def rounded(entries: list[dict]) -> list[dict]:
        return [{**e, "logprob": pytest.approx(e["logprob"], abs=1e-6),
                 **({"top_logprobs": rounded(e["top_logprobs"])} if "top_logprobs" in e else {})} for e in entries]

    assert got == rounded(expected)


# ------------------------------------------------------------------------------------------------ logprobs


def test_logprobs_are_the_chat_route_s_whole_and_streamed(served):
    status, reference = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8, "logprobs": True,
                                                             "top_logprobs": 3})
    assert status == 200, reference
    expected = _ollama_form(reference["choices"][0]["logprobs"]["content"])
    assert len(expected) == 8
    assert all(len(entry["top_logprobs"]) == 3 for entry in expected)
    client = _client(served)
    whole = client.chat(model=NAME, messages=MESSAGES, stream=False, logprobs=True, top_logprobs=3,
                        options={"num_predict": 8})
    assert isinstance(whole.logprobs[0], ollama._types.Logprob)  # the client's types read them
    assert whole.message.content == reference["choices"][0]["message"]["content"]
    status, raw = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False, "logprobs": True,
                                            "top_logprobs": 3, "options": {"num_predict": 8}})
    assert status == 200, raw
    _same(raw["logprobs"], expected)
    assert "logprobs" not in raw["message"]  # at the top, beside the message, as Ollama answers
    lines = _lines(served, "/api/chat", {"model": NAME, "messages": MESSAGES, "logprobs": True, "top_logprobs": 3,
                                         "options": {"num_predict": 8}})
    _same([entry for line in lines for entry in line.get("logprobs", [])], expected)
    assert lines[-1]["done"] is True
    # each streamed object lists the tokens of its own text
    for line in lines[:-1]:
        assert "".join(entry["token"] for entry in line["logprobs"]) == line["message"]["content"]
    # top_logprobs 0: each token's own log-probability alone, no empty top_logprobs (Ollama leaves it out)
    status, alone = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False, "logprobs": True,
                                              "options": {"num_predict": 8}})
    assert status == 200, alone
    _same(alone["logprobs"], [{key: e[key] for key in ("token", "logprob", "bytes")} for e in expected])


def test_generate_logprobs_templated_and_raw(served):
    status, reference = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 6, "logprobs": True,
                                                             "top_logprobs": 2})
    assert status == 200, reference
    body = {"model": NAME, "prompt": "Say something.", "system": "Be brief.", "logprobs": True, "top_logprobs": 2,
            "options": {"num_predict": 6}}
    status, whole = served.post("/api/generate", {**body, "stream": False})
    assert status == 200, whole
    _same(whole["logprobs"], _ollama_form(reference["choices"][0]["logprobs"]["content"]))
    _same([e for line in _lines(served, "/api/generate", body) for e in line.get("logprobs", [])], whole["logprobs"])
    # raw: the text as given, its tokens' log-probabilities those of llama-server's POST /completion
    status, native = served.post("/completion", {"prompt": "Once upon", "n_predict": 5, "n_probs": 2})
    assert status == 200, native
    answer = _client(served).generate(model=NAME, prompt="Once upon", raw=True, stream=False, logprobs=True,
                                      top_logprobs=2, options={"num_predict": 5})
    assert answer.response == native["content"]
    assert [entry.token for entry in answer.logprobs] == [e["token"] for e in native["completion_probabilities"]]
    status, raw = served.post("/api/generate", {"model": NAME, "prompt": "Once upon", "raw": True, "stream": False,
                                                "logprobs": True, "top_logprobs": 2, "options": {"num_predict": 5}})
    assert status == 200, raw
    _same(raw["logprobs"], _ollama_form(native["completion_probabilities"]))


def test_no_logprobs_unless_asked_and_bad_values_are_refused_by_name(served):
    status, plain = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False, "top_logprobs": 3,
                                              "options": {"num_predict": 4}})
    assert status == 200, plain  # top_logprobs without logprobs: nothing listed, as Ollama answers it
    assert "logprobs" not in plain
    for field, value in (("top_logprobs", 21), ("top_logprobs", -1), ("top_logprobs", 2.5), ("top_logprobs", True),
                         ("logprobs", "yes"), ("logprobs", 1)):
        for path, body in (("/api/chat", {"messages": MESSAGES}), ("/api/generate", {"prompt": "hi"})):
            status, payload = served.post(path, {"model": NAME, **body, "logprobs": True, field: value})
            assert status == 400, (path, field, value, payload)
            assert set(payload) == {"error"}
            assert f"'{field}'" in payload["error"]
