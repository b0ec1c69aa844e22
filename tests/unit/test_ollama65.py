"""Ollama's routes (edgesdk/serve/ollama.py) where they answered otherwise than Ollama:

* an answer ending in a U+FFFD the model wrote (its bytes EF BF BD, valid UTF-8) lost it, as if it were a character
  the token limit cut short: the trim is now told from the answer's bytes (edgesdk/runtime/text.py, broken_end);
* every origin was answered on Ollama's routes, where Ollama answers only local origins and those OLLAMA_ORIGINS
  adds (a 403 otherwise); llama-server's and OpenAI's routes still answer every origin, as llama-server does;
* a ``format`` (or OpenAI's json_schema response format) whose root is a string, an enum or a const was refused,
  where Ollama constrains the answer to that value (edgesdk/runtime/json_schema.py)."""

from __future__ import annotations

import json
import threading

import pytest

from edgesdk.runtime.json_schema import SchemaError, compile_schema
from edgesdk.runtime.text import StreamDecoder, broken_end
from edgesdk.serve.completion import Completer, Completion, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from edgesdk.serve.ollama import Answer, origin_allowed, parse_generate, parse_origins, windowed
from tests.unit.test_serve import Served

NAME = "tiny-host"
REPLACEMENT = "\ufffd"


# ------------------------------------------------------------------------------------------------ U+FFFD


def _byte_token(runtime, byte: int) -> int:
    """The token whose bytes are the one byte ``byte`` (a byte-level tokenizer has one for each)."""
    return runtime.tokenizer.token_bytes().index(bytes((byte,)))


def _decoded(runtime, ids: list[int]) -> list[str]:
    """The pieces the completer's stream decoder gives out for ``ids``, its last flush included."""
    decoder = StreamDecoder(runtime.tokenizer)
    pieces = [decoder.push(token) for token in ids] + [decoder.flush()]
    return [piece for piece in pieces if piece]


def _answers(runtime, ids: list[int]) -> tuple[dict, str]:
    """The whole answer of /api/generate for an answer of ``ids`` that the token limit ended, and its stream's
    ``response`` pieces joined."""
    pieces = _decoded(runtime, ids)
    completion = Completion(text="".join(pieces), finish_reason="length", prompt_tokens=10,
                            completion_tokens=len(ids), tokens=list(ids))

    def answer(stream: bool) -> Answer:
        completer = Completer(runtime, ServeDefaults(max_tokens=16))
        asked = parse_generate({"model": NAME, "prompt": "Say", "stream": stream}, NAME)
        return Answer(completer, asked, windowed(completer, asked))

    whole = answer(False).whole(completion)
    streamed = answer(True)
    lines: list[dict] = []
    on_text = streamed.listener(lines.append)
    for piece in pieces:
        on_text(piece, None)
    lines += streamed.closing(completion)
    return whole, "".join(line["response"] for line in lines)


def test_a_replacement_character_the_model_wrote_ends_the_answer_whole_and_streamed(runtime):
    ids = runtime.tokenizer.encode("Hi " + REPLACEMENT, add_special_tokens=False)
    whole, streamed = _answers(runtime, ids)
    assert whole["response"] == "Hi " + REPLACEMENT  # was "Hi ": taken for a character the end cut short
    assert streamed == "Hi " + REPLACEMENT
    assert runtime.tokenizer.decode(whole["context"]).endswith(REPLACEMENT)  # the context tokenizes it again


@pytest.mark.parametrize("tail", [b"\xc3", b"\xe2\x82", b"\xff"])
def test_bytes_that_are_no_character_at_the_end_are_still_trimmed(runtime, tail):
    ids = runtime.tokenizer.encode("Hi " + REPLACEMENT, add_special_tokens=False) + \
        [_byte_token(runtime, byte) for byte in tail]
    whole, streamed = _answers(runtime, ids)
    assert whole["response"] == streamed == "Hi " + REPLACEMENT  # the real one kept, the broken bytes not
    assert not runtime.tokenizer.decode(whole["context"]).endswith(REPLACEMENT * 2)


def test_broken_end_counts_only_the_replacement_characters_of_bytes_that_are_no_utf8(runtime):
    tokenizer = runtime.tokenizer
    real = tokenizer.encode(REPLACEMENT, add_special_tokens=False)
    stray = [_byte_token(runtime, 0xFF)]
    assert broken_end(tokenizer, real, REPLACEMENT) == 0
    assert broken_end(tokenizer, real + stray, REPLACEMENT * 2) == 1
    assert broken_end(tokenizer, stray + stray, REPLACEMENT * 2) == 2
    # a stop string cut the text: its end is read where the text ends, not where the tokens do
    assert broken_end(tokenizer, real + tokenizer.encode(" stop", add_special_tokens=False), REPLACEMENT) == 0
    assert broken_end(tokenizer, stray + tokenizer.encode(" stop", add_special_tokens=False), REPLACEMENT) == 1
    # tokens that are not the text's (none known): every U+FFFD it ends with, as before
    assert broken_end(tokenizer, [], "a" + REPLACEMENT) == 1
    assert broken_end(tokenizer, real, "plain") == 0


# ------------------------------------------------------------------------------------------------ origins


@pytest.fixture(scope="module")
def origins_server(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=4))
    server = ApiServer(("127.0.0.1", 0), completer, NAME, log=False,
                       ollama_origins=parse_origins("https://*.example.com, chrome-extension://*"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served = Served.__new__(Served)  # its request helper, on this server
    served.port = server.server_address[1]
    yield served
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1", "https://0.0.0.0:8443", "app://obsidian.md",
                                    "tauri://localhost", "https://chat.example.com", "chrome-extension://abcdef"])
def test_ollama_routes_answer_local_origins_and_those_added(origins_server, origin):
    status, headers, _ = origins_server.request("GET", "/api/version", headers={"Origin": origin})
    assert status == 200
    assert headers["Access-Control-Allow-Origin"] == origin


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null",
                                    "https://example.com.evil.example"])
def test_ollama_routes_refuse_another_origin_as_ollama_does(origins_server, origin):
    status, headers, payload = origins_server.request("GET", "/api/tags", headers={"Origin": origin})
    assert status == 403  # was 200, the origin copied into Access-Control-Allow-Origin
    assert "Access-Control-Allow-Origin" not in headers
    assert origin in json.loads(payload)["error"]
    assert "--ollama-origins" in json.loads(payload)["error"]
    # a preflight and a generation are refused too, before any model work
    status, headers, _ = origins_server.request("OPTIONS", "/api/chat", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST"})
    assert status == 403
    assert "Access-Control-Allow-Origin" not in headers
    status, _, _ = origins_server.request("POST", "/api/generate", {"model": NAME, "prompt": "Hi", "stream": False},
                                          headers={"Origin": origin})
    assert status == 403


def test_other_routes_answer_every_origin_as_llama_server_does(origins_server):
    for path in ("/v1/models", "/health", "/props"):
        status, headers, _ = origins_server.request("GET", path, headers={"Origin": "https://evil.example"})
        assert status == 200, path
        assert headers["Access-Control-Allow-Origin"] == "https://evil.example"


def test_a_page_of_the_server_itself_is_no_cross_origin_request(origins_server):
    host = f"192.0.2.7:{origins_server.port}"  # the address a board is reached at (its Host header)
    status, _, _ = origins_server.request("GET", "/api/version", headers={"Origin": f"http://{host}", "Host": host})
    assert status == 200
    assert origin_allowed("http://BOARD:11434", "board:11434")
    assert not origin_allowed("http://board:11435", "board:11434")


def test_ollama_origins_are_read_as_ollama_reads_them_and_a_bad_one_is_refused_by_name(tiny_bundle):
    from tests.unit.test_cli import invoke

    assert parse_origins(" 'https://a.example, https://*.b.example' ") == ("https://a.example", "https://*.b.example")
    assert origin_allowed("https://anything.test", None, parse_origins("*"))
    assert parse_origins(None) == parse_origins("") == ()
    result = invoke("serve", tiny_bundle.path, "--port", 0, "--ollama-origins", "example.com")
    assert result.exit_code != 0
    assert "'example.com'" in result.output
    assert "https://example.com" in result.output
    result = invoke("serve", tiny_bundle.path, "--port", 0, env={"OLLAMA_ORIGINS": "https://*.*.example"})
    assert result.exit_code != 0
    assert "OLLAMA_ORIGINS" in result.output


# ------------------------------------------------------------------------------------------------ format roots


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


@pytest.mark.parametrize(("schema", "fits"), [
    ({"type": "string", "maxLength": 6}, lambda value: isinstance(value, str) and len(value) <= 6),
    ({"enum": ["red", "green", 3, None]}, lambda value: value in ["red", "green", 3, None]),
    ({"const": "only"}, lambda value: value == "only"),
    ({"type": ["string", "boolean"], "maxLength": 4}, lambda value: isinstance(value, bool) or len(value) <= 4),
    ({"anyOf": [{"enum": [1, 2]}, {"const": "x"}, {"type": "null"}]}, lambda value: value in (1, 2, "x", None)),
])
def test_a_format_whose_root_is_a_string_enum_or_const_is_followed_on_every_route(served, schema, fits):
    answers = {}
    status, body = served.post("/api/generate", {"model": NAME, "prompt": "Say", "format": schema, "stream": False})
    assert status == 200, body  # was 400: "the schema's root is 'string'; the answer must be an object or an array"
    answers["generate"] = body["response"]
    status, body = served.post("/api/chat", {"model": NAME, "messages": [{"role": "user", "content": "Say"}],
                                             "format": schema, "stream": False})
    assert status == 200, body
    answers["chat"] = body["message"]["content"]
    status, body = served.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "value", "schema": schema}}})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "stop"  # the value closed: the answer ended there
    answers["openai"] = body["choices"][0]["message"]["content"]
    for route, text in answers.items():
        assert fits(json.loads(text)), (route, text)


@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "number"}, "root is 'number'"),
    ({"enum": [1, 12]}, "1 and 12"),
    ({"anyOf": [{"const": 2}, {"const": 2.5}]}, "2 and 2.5"),
    ({"type": ["string", "integer"]}, "root is 'integer'"),
])
def test_a_root_with_no_last_byte_to_end_at_is_still_refused_naming_it(schema, named):
    with pytest.raises(SchemaError, match="the answer must be an object or an array, a string, or an enum|no enum / "
                                          "const value may be the start of another") as refused:
        compile_schema(schema)
    assert named in refused.value.problem
    assert "wrap the value in an object" in refused.value.fix
