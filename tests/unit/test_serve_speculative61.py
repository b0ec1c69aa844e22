"""llama-server's per-request draft settings on ``edgesdk serve``: ``speculative.n_max``, ``speculative.n_min`` and
``speculative.p_min`` on POST /completion, /v1/completions and /v1/chat/completions set the drafts of that answer alone
(a draft bundle's, serve --draft, or prompt lookup's, serve --lookup N), bad values are refused by name, and /props,
/slots list all three. Real servers on 127.0.0.1 over the tiny bundle; the drafts
expected come from generate() with the same settings on other sessions of the bundle, and every answer is the plain
decode's."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

pytest.importorskip("torch")

from edgesdk.runtime.generate import SamplingConfig, generate  # noqa: E402
from edgesdk.runtime.lookup import LookupConfig  # noqa: E402
from edgesdk.runtime.speculative import DraftConfig, DraftModel  # noqa: E402
from edgesdk.serve.api import parse_chat_request, parse_text_request  # noqa: E402
from edgesdk.serve.completion import Completer, ServeDefaults  # noqa: E402
from edgesdk.serve.http_server import ApiServer  # noqa: E402

TOKENS = 16
PROMPT = "The quick brown fox"
CHAT = [{"role": "user", "content": "Say the quick brown fox"}]
ROUTES = {"/completion": {"prompt": PROMPT}, "/v1/completions": {"prompt": PROMPT}, "/v1/chat/completions": {"messages": CHAT}}
SERVER_DRAFT = DraftConfig(max_draft=3, min_draft=1, p_min=0.0)  # serve --draft-max 3 --draft-min 1


class _Server:
    """A server over ``completer`` on a free port in a background thread."""

    def __init__(self, completer: Completer):
        self.completer = completer
        self.server = ApiServer(("127.0.0.1", 0), completer, "tiny-host", log=False)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.server_address[1], timeout=60)
        connection.request(method, path, body=None if body is None else json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
        connection.close()
        return response.status, payload

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _open(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture(scope="module")
def drafting(tiny_bundle):
    """serve --draft (the same bundle, which agrees with it on every greedy token), -n 16."""
    model = DraftModel(_open(tiny_bundle).backend, SERVER_DRAFT)
    server = _Server(Completer(_open(tiny_bundle), ServeDefaults(max_tokens=TOKENS), draft=model))
    yield server, model
    server.close()


@pytest.fixture(scope="module")
def reference(tiny_bundle):
    """Another session of the bundle and its own draft model, run through each answer the server gives, in turn."""
    return _open(tiny_bundle), DraftModel(_open(tiny_bundle).backend, SERVER_DRAFT)


@pytest.fixture(scope="module")
def plain(tiny_bundle):
    """serve with no drafter: each route's answer and its ids."""
    server = _Server(Completer(_open(tiny_bundle), ServeDefaults(max_tokens=TOKENS)))
    yield server
    server.close()


def _ids(completer: Completer, path: str) -> list[int]:
    body = ROUTES[path]
    request = parse_chat_request(body) if "messages" in body else parse_text_request(body)
    return completer.prompt_ids(request)


def _text(path: str, answer: dict) -> str:
    if path == "/completion":
        return answer["content"]
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _expected_drafts(reference, ids: list[int], config: DraftConfig | None) -> tuple[list[int], int]:
    """generate()'s answer and the tokens drafted with ``config`` (None: no drafter) on the reference sessions, whose
    draft model has drafted for every answer before, as the server's has."""
    target, model = reference
    before, kept = model.drafted, model.config
    model.config = config or kept
    try:
        answer, _ = generate(target.backend, ids, SamplingConfig(max_new_tokens=TOKENS),
                             target.tokenizer.eos_token_ids, lookup=None if config is None else model)
    finally:
        model.config = kept
    return answer, model.drafted - before


# (the request's fields, the draft settings the answer has: DraftConfig, or None for no drafts)
PER_REQUEST = [
    ({"speculative.n_max": 1}, DraftConfig(max_draft=1, min_draft=1, p_min=0.0)),
    ({"speculative.n_max": 0}, None),
    ({"speculative.n_min": 3}, DraftConfig(max_draft=3, min_draft=3, p_min=0.0)),
    ({"speculative.n_max": 2, "speculative.n_min": 9}, DraftConfig(max_draft=2, min_draft=2, p_min=0.0)),  # clamped
    ({"speculative.p_min": 0.999999}, DraftConfig(max_draft=3, min_draft=1, p_min=0.999999)),
    ({"speculative.n_max": 2.0, "speculative.n_min": 0, "speculative.p_min": 0}, DraftConfig(max_draft=2)),
    ({}, SERVER_DRAFT),  # the next answer is back to the server's
]


@pytest.mark.parametrize("path", list(ROUTES))
def test_each_answer_drafts_with_its_own_settings_and_answers_as_the_plain_decode(drafting, reference, plain, path):
    server, model = drafting
    ids = _ids(server.completer, path)
    status, answer = plain.request("POST", path, {**ROUTES[path], "max_tokens": TOKENS})
    assert status == 200, answer
    expected_text = _text(path, answer)
    for fields, config in PER_REQUEST:
        before = model.drafted
        status, answer = server.request("POST", path, {**ROUTES[path], **fields, "max_tokens": TOKENS})
        assert status == 200, (fields, answer)
        assert _text(path, answer) == expected_text, fields
        _, drafted = _expected_drafts(reference, ids, config)
        assert model.drafted - before == drafted, fields
        if config == DraftConfig(max_draft=1, min_draft=1):  # greedy, the same-model draft is all taken
            assert drafted > 0
        if path == "/completion":
            assert answer["timings"].get("draft_n", 0) == drafted, fields


def test_props_and_slots_list_n_min_and_p_min_beside_n_max(drafting, plain):
    server, _ = drafting
    for route in ("/props", "/slots"):
        status, body = server.request("GET", route)
        assert status == 200, body
        params = body["default_generation_settings"]["params"] if route == "/props" else body[0]["params"]
        assert (params["speculative.n_max"], params["speculative.n_min"], params["speculative.p_min"]) == (3, 1, 0.0)
        status, body = plain.request("GET", route)
        params = body["default_generation_settings"]["params"] if route == "/props" else body[0]["params"]
        assert (params["speculative.n_max"], params["speculative.n_min"], params["speculative.p_min"]) == (0, 0, 0.0)


def test_a_completion_answer_s_settings_name_its_own_draft_settings(drafting, plain):
    """POST /completion's ``generation_settings`` lists the answer's draft settings, the request's over the server's,
    as llama-server's answer does (its task params' to_json)."""
    server, _ = drafting
    for body, expected in (({}, (3, 1, 0.0)), ({"speculative.n_max": 2, "speculative.n_min": 5,
                                                "speculative.p_min": 0.25}, (2, 2, 0.25))):
        status, answer = server.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 2, **body})
        assert status == 200, answer
        settings = answer["generation_settings"]
        assert (settings["speculative.n_max"], settings["speculative.n_min"], settings["speculative.p_min"]) == expected
    status, answer = plain.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 2})
    assert answer["generation_settings"]["speculative.n_max"] == 0


BAD = [
    ("speculative.n_max", "4", "a whole number up to 64 (below 0 taken as 0"),
    ("speculative.n_max", 65, "a whole number up to 64 (below 0 taken as 0"),
    ("speculative.n_max", 1.5, "a whole number up to 64 (below 0 taken as 0"),
    ("speculative.n_max", True, "a whole number up to 64 (below 0 taken as 0"),
    ("speculative.n_min", [2], "a whole number (below 0 taken as 0"),
    ("speculative.p_min", 1, "a number in [0, 1)"),
    ("speculative.p_min", -0.5, "a number in [0, 1)"),
    ("speculative.p_min", "0.5", "a number in [0, 1)"),
]


@pytest.mark.parametrize("path", list(ROUTES))
@pytest.mark.parametrize(("field", "value", "expected"), BAD)
def test_a_bad_setting_is_refused_naming_the_field_the_value_and_what_it_takes(drafting, plain, path, field, value,
                                                                              expected):
    for server in (drafting[0], plain):  # refused alike where the server drafts nothing, as its other fields are
        status, body = server.request("POST", path, {**ROUTES[path], field: value, "max_tokens": 2})
        assert status == 400, body
        error = body["error"]
        assert error["param"] == field
        assert f"'{field}' must be {expected}" in error["message"]
        assert f"got {json.dumps(value)}" in error["message"]
        assert "leave it out for the server's" in error["message"]


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_server_that_drafts_nothing_takes_the_settings_and_ignores_them(plain, path):
    status, expected = plain.request("POST", path, {**ROUTES[path], "max_tokens": TOKENS})
    assert status == 200, expected
    fields = {"speculative.n_max": 5, "speculative.n_min": 7, "speculative.p_min": 0.5}
    status, answer = plain.request("POST", path, {**ROUTES[path], **fields, "max_tokens": TOKENS})
    assert status == 200, answer
    assert _text(path, answer) == _text(path, expected)
    if path == "/completion":
        assert "draft_n" not in answer["timings"]


def test_prompt_lookup_takes_n_max_and_n_min_per_answer_and_ignores_p_min(tiny_bundle):
    """serve --lookup 4: a request's n_max drafts up to that many tokens, its n_min drops shorter drafts, and p_min
    changes nothing (an n-gram draft has no probability), as llama-server's n-gram drafters; the answer stays the
    plain decode's and the next one is back to --lookup 4."""
    runtime, target = _open(tiny_bundle), _open(tiny_bundle)
    server = _Server(Completer(runtime, ServeDefaults(max_tokens=TOKENS, lookup=4)))
    try:
        ids = _ids(server.completer, "/completion")
        plain, _ = generate(target.backend, ids, SamplingConfig(max_new_tokens=TOKENS), target.tokenizer.eos_token_ids)

        def drafts(fields: dict) -> tuple[list[int], int]:
            status, answer = server.request("POST", "/completion", {"prompt": ids, "n_predict": TOKENS,
                                                                   "return_tokens": True, **fields})
            assert status == 200, answer
            return answer["tokens"], answer["timings"].get("draft_n", 0)

        def expected(max_draft: int) -> int:
            _, stats = generate(target.backend, ids, SamplingConfig(max_new_tokens=TOKENS),
                                target.tokenizer.eos_token_ids, lookup=LookupConfig(max_draft=max_draft))
            return stats.draft_tokens

        assert expected(4) != expected(1), "the answer must repeat itself for prompt lookup to draft"
        for fields, max_draft in (({"speculative.n_max": 1}, 1), ({}, 4), ({"speculative.p_min": 0.9}, 4)):
            tokens, drafted = drafts(fields)
            assert tokens[:len(plain)] == plain
            assert drafted == expected(max_draft), fields
        tokens, drafted = drafts({"speculative.n_max": 0})
        assert (tokens[:len(plain)], drafted) == (plain, 0)
        tokens, drafted = drafts({"speculative.n_max": 3, "speculative.n_min": 3})
        assert tokens[:len(plain)] == plain
        assert drafted % 3 == 0  # each draft checked holds 3 tokens: a shorter one is dropped
        assert 0 < drafted <= expected(3)
        status, props = server.request("GET", "/props")
        params = props["default_generation_settings"]["params"]
        assert (params["speculative.n_max"], params["speculative.n_min"], params["speculative.p_min"]) == (4, 0, 0.0)
    finally:
        server.close()
