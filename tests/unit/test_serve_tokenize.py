"""llama-server's ``POST /tokenize`` and ``POST /detokenize`` on ``edgesdk serve``, over real HTTP against the
tiny host bundle's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

TEXT = "Überall sind Zeichen: café, 東京 🙂."


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=8), api_key="sesame")
    yield server
    server.close()


def _post(served, path, body):
    return served.post(path, body, headers={"Authorization": "Bearer sesame"})


def test_tokenize_gives_the_tokenizer_s_ids_and_detokenize_gives_the_text_back(served, runtime):
    ids = runtime.tokenizer.encode(TEXT, add_special_tokens=False)
    status, body = _post(served, "/tokenize", {"content": TEXT})
    assert (status, body) == (200, {"tokens": ids})
    status, body = _post(served, "/detokenize", {"tokens": ids})
    assert (status, body) == (200, {"content": TEXT})
    assert _post(served, "/tokenize", {"content": ""}) == (200, {"tokens": []})
    assert _post(served, "/detokenize", {"tokens": []}) == (200, {"content": ""})


def test_with_pieces_gives_each_token_s_text_or_its_bytes(served, runtime):
    status, body = _post(served, "/tokenize", {"content": TEXT, "with_pieces": True})
    assert status == 200
    ids = runtime.tokenizer.encode(TEXT, add_special_tokens=False)
    assert [entry["id"] for entry in body["tokens"]] == ids
    pieces = [entry["piece"] for entry in body["tokens"]]
    assert any(isinstance(piece, list) for piece in pieces), "the tiny tokenizer splits 東京 or 🙂 into byte pieces"
    assert any(isinstance(piece, str) and piece for piece in pieces)
    joined = b"".join(bytes(piece) if isinstance(piece, list) else piece.encode() for piece in pieces)
    assert joined.decode("utf-8") == TEXT
    for piece in pieces:
        if isinstance(piece, list):
            with pytest.raises(UnicodeDecodeError):
                bytes(piece).decode("utf-8")  # a list only where the bytes are not UTF-8 on their own


def test_special_tokens_in_the_text_are_parsed_unless_parse_special_is_false(served, runtime):
    text = "<|im_start|>user\nhi<|im_end|>"
    tokenizer = runtime.tokenizer.tokenizer
    start, end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    status, body = _post(served, "/tokenize", {"content": text, "with_pieces": True})
    assert status == 200
    assert (body["tokens"][0], body["tokens"][-1]) == ({"id": start, "piece": "<|im_start|>"},
                                                       {"id": end, "piece": "<|im_end|>"})
    status, body = _post(served, "/tokenize", {"content": text, "parse_special": False})
    assert status == 200
    assert start not in body["tokens"]
    assert end not in body["tokens"]
    assert _post(served, "/detokenize", {"tokens": body["tokens"]}) == (200, {"content": text})
    # Parsing special text as plain text left the shared tokenizer as it was.
    assert _post(served, "/tokenize", {"content": text})[1]["tokens"][0] == start
    status, body = _post(served, "/detokenize", {"tokens": [start, *runtime.tokenizer.encode("hi", False), end]})
    assert (status, body) == (200, {"content": "<|im_start|>hi<|im_end|>"})  # special tokens written out


def test_add_special_adds_what_the_tokenizer_adds(served, runtime):
    expected = runtime.tokenizer.encode("hi", add_special_tokens=True)
    assert _post(served, "/tokenize", {"content": "hi", "add_special": True}) == (200, {"tokens": expected})


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {}, "content"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"content": ["a", 2.5]}, "content"),  # an array takes token ids and strings only
    ("/tokenize", {"content": "a", "with_pieces": "yes"}, "with_pieces"),
    ("/tokenize", {"content": "a", "add_special": 1}, "add_special"),
    ("/tokenize", {"content": "a", "parse_special": "no"}, "parse_special"),
    ("/tokenize", {"content": "\ud800"}, "content"),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/detokenize", {"tokens": [1, -2]}, "tokens[1]"),
    ("/detokenize", {"tokens": [1, 2.5]}, "tokens[1]"),
    ("/detokenize", {"tokens": [True]}, "tokens[0]"),
    ("/detokenize", {"tokens": [0, 99999]}, "tokens[1]"),
])
def test_bad_bodies_are_400_naming_the_field(served, path, body, param):
    status, answer = _post(served, path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert param.split("[")[0] in answer["error"]["message"]


def test_the_routes_want_the_api_key_take_post_only_and_are_listed(served):
    status, answer = served.post("/tokenize", {"content": "hi"})
    assert (status, answer["error"]["code"]) == (401, "invalid_api_key")
    status, answer = served.post("/detokenize", {"tokens": [1]}, headers={"Authorization": "Bearer wrong"})
    assert status == 401
    status, headers, payload = served.request("GET", "/tokenize", headers={"Authorization": "Bearer sesame"})
    assert (status, headers["Allow"]) == (405, "POST")
    status, _, payload = served.request("POST", "/nowhere", {}, headers={"Authorization": "Bearer sesame"})
    assert status == 404
    assert b"POST /tokenize, POST /detokenize" in payload
    assert _post(served, "/v1/tokenize", {"content": "hi"})[0] == 200  # the /v1 prefix is optional here too


def test_props_gives_the_context_defaults_and_chat_template(runtime):
    """llama-server's GET /props, behind the key like the other routes."""
    server = Served(runtime, ServeDefaults(max_tokens=33, temperature=0.7, top_k=5), api_key="k")
    try:
        status, _, payload = server.request("GET", "/props")
        assert status == 401, payload
        status, _, payload = server.request("GET", "/props", headers={"Authorization": "Bearer k"})
        assert status == 200, payload
        props = json.loads(payload)
        settings = props["default_generation_settings"]
        assert settings["n_ctx"] == runtime.backend.max_context
        assert (settings["params"]["n_predict"], settings["params"]["temperature"], settings["params"]["top_k"]) == \
            (33, 0.7, 5)
        assert settings["speculative"] is False
        assert props["total_slots"] == 1
        assert props["model_alias"] == "tiny-host"
        assert props["model_path"] == str(Path(runtime.bundle.path).resolve())
        assert props["bundle_id"] == runtime.bundle.bundle_id
        assert props["chat_template"] == (runtime.tokenizer.template_source or "")
        assert props["eos_token"] == (runtime.tokenizer.eos_token or "")
        status, _, payload = server.request("POST", "/props", body={}, headers={"Authorization": "Bearer k"})
        assert status == 405, payload
    finally:
        server.close()
