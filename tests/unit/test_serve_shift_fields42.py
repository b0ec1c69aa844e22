"""llama-server reads ``n_keep`` and ``n_discard`` on every completion route (tools/server/server-schema.cpp), not only
POST /completion, and shows them in a slot's settings: the OpenAI routes of a server started with --context-shift
take a request's own n_keep and n_discard, refuse bad ones by name, and ``generation_settings``, ``/slots`` and
``/props`` carry them (the request's, else the server's --keep). Real servers over a tiny lively bundle with a
32-token context; the expected tokens come from generate() with the same ContextShift."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from edgesdk.runtime.generate import ContextShift, SamplingConfig, generate  # noqa: E402
from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402

MAX_CONTEXT = 32
PROMPT = [5, 17, 99, 3, 250, 41, 8, 77, 120, 64]


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory):
    from tests._utils.builds import build_lively_bundle

    return build_lively_bundle(tmp_path_factory.mktemp("serve-shift42"), seed=5, max_context=MAX_CONTEXT).path


@pytest.fixture(scope="module")
def shifting(bundle_path):
    from edgesdk.runtime.session import open_runtime

    server = Served(open_runtime(bundle_path, threads=1), ServeDefaults(max_tokens=16, context_shift=True, n_keep=2))
    yield server
    server.close()


@pytest.fixture(scope="module")
def reference(bundle_path):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(bundle_path, threads=1)


def _expected(reference, tokens: int, keep: int, discard: int = 0) -> list[int]:
    answer, _ = generate(reference.backend, PROMPT, SamplingConfig(max_new_tokens=tokens), set(),
                         shift=ContextShift(keep=keep, discard=discard))
    return answer


@pytest.mark.parametrize(("keep", "discard"), [(None, 0), (4, 0), (-1, 0), (3, 5)])
def test_openai_completions_take_a_requests_n_keep_and_n_discard(shifting, reference, keep, discard):
    body = {"prompt": PROMPT, "max_tokens": 2 * MAX_CONTEXT, "ignore_eos": True,
            **({} if keep is None else {"n_keep": keep}), **({"n_discard": discard} if discard else {})}
    status, answer = shifting.post("/v1/completions", body)
    assert status == 200, answer
    expected = _expected(reference, 2 * MAX_CONTEXT, 2 if keep is None else keep, discard)
    assert answer["usage"]["completion_tokens"] == len(expected) == 2 * MAX_CONTEXT
    assert answer["choices"][0]["text"] == reference.tokenizer.decode(expected)


def test_keeping_other_tokens_changes_the_answer(shifting):
    """The request's n_keep reaches the shift: keeping 8 tokens instead of the server's 2 gives another answer."""
    body = {"prompt": PROMPT, "max_tokens": 2 * MAX_CONTEXT, "ignore_eos": True}
    texts = {keep: shifting.post("/v1/completions", {**body, "n_keep": keep})[1]["choices"][0]["text"]
             for keep in (2, 8)}
    assert texts[2] != texts[8]
    assert shifting.post("/v1/completions", body)[1]["choices"][0]["text"] == texts[2]


@pytest.mark.parametrize(("route", "extra"), [("/v1/completions", {"prompt": "hello"}),
                                          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
@pytest.mark.parametrize(("field", "value"), [("n_keep", -2), ("n_keep", 1.5), ("n_discard", -1), ("n_discard", True)])
def test_a_bad_n_keep_or_n_discard_on_an_openai_route_is_a_400_naming_it(shifting, route, extra, field, value):
    status, answer = shifting.post(route, {**extra, field: value})
    assert status == 400, answer
    assert answer["error"]["param"] == field
    assert f"'{field}' must be a whole number" in answer["error"]["message"]


def test_generation_settings_slots_and_props_show_n_keep_and_n_discard(shifting):
    status, answer = shifting.post("/completion", {"prompt": PROMPT, "n_predict": 2, "n_keep": 5, "n_discard": 3})
    assert status == 200, answer
    assert (answer["generation_settings"]["n_keep"], answer["generation_settings"]["n_discard"]) == (5, 3)
    status, answer = shifting.post("/completion", {"prompt": PROMPT, "n_predict": 2})
    assert (answer["generation_settings"]["n_keep"], answer["generation_settings"]["n_discard"]) == (2, 0)
    status, _, payload = shifting.request("GET", "/slots")
    slots = json.loads(payload)
    assert status == 200, slots
    assert (slots[0]["params"]["n_keep"], slots[0]["params"]["n_discard"]) == (2, 0)
    props = json.loads(shifting.request("GET", "/props")[2])
    params = props["default_generation_settings"]["params"]
    assert (params["n_keep"], params["n_discard"]) == (2, 0)


def test_a_stop_string_after_a_shift_still_says_truncated(shifting, reference):
    """llama-server marks a slot truncated once its context shifted, whatever then ends the answer: a stop string
    met after the shift gives ``truncated: true``, one met before it ``false``."""
    answer = _expected(reference, 2 * MAX_CONTEXT, 2)
    text = reference.tokenizer.decode(answer)
    after = len(reference.tokenizer.decode(answer[:MAX_CONTEXT]))  # past the first shift: the prompt is 10 tokens
    stop = next(text[start:start + 4] for start in range(after, len(text) - 4)
                if text.find(text[start:start + 4]) == start and text[start:start + 4].strip())
    body = {"prompt": PROMPT, "n_predict": 2 * MAX_CONTEXT, "ignore_eos": True}
    status, shifted = shifting.post("/completion", {**body, "stop": [stop]})
    assert status == 200, shifted
    assert (shifted["stop_type"], shifted["stopping_word"], shifted["truncated"]) == ("word", stop, True)
    early = text[:4] if text[:4].strip() else text[1:5]
    status, unshifted = shifting.post("/completion", {**body, "stop": [early]})
    assert (unshifted["stop_type"], unshifted["truncated"]) == ("word", False)
