"""serve's context shift end to end: ``edgesdk serve --context-shift`` (ServeDefaults.context_shift) with llama-server's
per-request ``n_keep`` / ``n_discard`` on POST /completion, the OpenAI routes under the server's setting, and Ollama's
``shift`` (on unless false) with ``options.num_keep``. Real servers over a tiny lively bundle with a 32-token context;
the expected tokens come from generate() with the same ContextShift on another session of the bundle."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from edgesdk.runtime.generate import ContextShift, SamplingConfig, generate  # noqa: E402
from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402

MAX_CONTEXT = 32
PROMPT = [5, 17, 99, 3, 250, 41, 8, 77, 120, 64]
NAME = "tiny-host:latest"


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory):
    from tests._utils.builds import build_lively_bundle

    return build_lively_bundle(tmp_path_factory.mktemp("serve-shift41"), seed=5, max_context=MAX_CONTEXT).path


def _server(path, max_tokens: int = 16, **defaults) -> Served:
    from edgesdk.runtime.session import open_runtime

    return Served(open_runtime(path, threads=1), ServeDefaults(max_tokens=max_tokens, **defaults))


@pytest.fixture(scope="module")
def shifting(bundle_path):
    server = _server(bundle_path, context_shift=True)
    yield server
    server.close()


@pytest.fixture(scope="module")
def plain(bundle_path):
    server = _server(bundle_path)
    yield server
    server.close()


@pytest.fixture(scope="module")
def reference(bundle_path):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(bundle_path, threads=1)


def _expected(reference, ids: list[int], tokens: int, keep: int, ignore_eos: bool = False) -> list[int]:
    stops = set() if ignore_eos else reference.tokenizer.eos_token_ids
    answer, _ = generate(reference.backend, ids, SamplingConfig(max_new_tokens=tokens), stops,
                         shift=ContextShift(keep=keep))
    return answer


def _ids(answer: dict) -> list[int]:
    return [entry["id"] for entry in answer["completion_probabilities"]]


@pytest.mark.parametrize("keep", [None, 0, 4, -1])
def test_completion_with_the_shift_on_runs_past_the_context_as_generate_does(shifting, reference, keep):
    body = {"prompt": PROMPT, "n_predict": 3 * MAX_CONTEXT, "n_probs": 1, "ignore_eos": True,
            **({} if keep is None else {"n_keep": keep})}
    status, answer = shifting.post("/completion", body)
    assert status == 200, answer
    assert _ids(answer) == _expected(reference, PROMPT, 3 * MAX_CONTEXT, 0 if keep is None else keep, True)
    assert answer["tokens_predicted"] == answer["timings"]["predicted_n"] == 3 * MAX_CONTEXT
    assert (answer["truncated"], answer["stop_type"]) == (True, "limit")


def test_completion_without_the_shift_stops_at_the_full_context_whatever_n_keep_says(plain):
    status, answer = plain.post("/completion", {"prompt": PROMPT, "n_predict": 3 * MAX_CONTEXT, "n_keep": 4,
                                                "ignore_eos": True})
    assert status == 200, answer
    assert answer["tokens_predicted"] == MAX_CONTEXT - len(PROMPT) + 1
    # llama-server's process_token marks a slot that ran out of context truncated, shifted or not
    assert (answer["truncated"], answer["stop_type"]) == (True, "limit")


def test_n_predict_minus_one_with_the_shift_runs_ten_contexts(bundle_path):
    from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS

    server = _server(bundle_path, max_tokens=UNTIL_THE_CONTEXT_FILLS, context_shift=True)
    try:
        status, answer = server.post("/completion", {"prompt": PROMPT, "n_predict": -1, "ignore_eos": True})
    finally:
        server.close()
    assert status == 200, answer
    assert answer["tokens_predicted"] == 10 * MAX_CONTEXT


def test_n_predict_minus_one_is_held_to_the_server_s_n(shifting):
    """llama-server's slot.n_predict_max: a request's -1 takes the server's ``-n`` (16 here)."""
    status, answer = shifting.post("/completion", {"prompt": PROMPT, "n_predict": -1, "ignore_eos": True})
    assert status == 200, answer
    assert answer["tokens_predicted"] == 16
    assert answer["generation_settings"]["n_predict"] == -1  # as asked, as llama-server's params.n_predict shows it


def test_a_streamed_completion_shifts_and_ends_as_the_whole_one(shifting):
    body = {"prompt": PROMPT, "n_predict": 2 * MAX_CONTEXT, "n_keep": 4, "ignore_eos": True}
    _, whole = shifting.post("/completion", body)
    status, _, payload = shifting.request("POST", "/completion", {**body, "stream": True})
    assert status == 200
    events = [json.loads(line[len("data: "):]) for line in payload.decode().split("\n\n") if line]
    assert "".join(event["content"] for event in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == 2 * MAX_CONTEXT
    assert events[-1]["truncated"] is True


@pytest.mark.parametrize(("field", "value", "named"), [
    ("n_keep", -2, ">= -1"), ("n_keep", "all", ">= -1"), ("n_keep", 1.5, ">= -1"), ("n_discard", -1, ">= 0"),
])
def test_a_bad_n_keep_or_n_discard_is_a_400_naming_it(shifting, field, value, named):
    status, answer = shifting.post("/completion", {"prompt": PROMPT, "n_predict": 4, field: value})
    assert status == 400
    assert answer["error"]["param"] == field
    assert named in answer["error"]["message"]


def test_an_n_keep_that_leaves_nothing_to_discard_is_a_400_before_the_answer(shifting):
    prompt = (PROMPT * 4)[:MAX_CONTEXT]
    status, answer = shifting.post("/completion", {"prompt": prompt, "n_predict": 1, "n_keep": -1})
    assert status == 200, answer  # the answer never reaches the full context: nothing to shift
    status, answer = shifting.post("/completion", {"prompt": prompt, "n_predict": 4, "n_keep": -1})
    assert status == 400
    assert answer["error"]["param"] == "n_keep"
    assert "keeps 32 tokens" in answer["error"]["message"]
    assert "leaves nothing to discard" in answer["error"]["message"]


def test_openai_completions_shift_under_the_servers_setting(shifting, plain):
    body = {"prompt": "The quick brown fox", "max_tokens": 3 * MAX_CONTEXT, "logit_bias": {}}
    status, shifted = shifting.post("/v1/completions", {**body, "ignore_eos": True})
    assert status == 200, shifted
    assert (shifted["usage"]["completion_tokens"], shifted["choices"][0]["finish_reason"]) == (3 * MAX_CONTEXT,
                                                                                           "length")
    status, stopped = plain.post("/v1/completions", {**body, "ignore_eos": True})
    assert status == 200, stopped
    assert stopped["usage"]["prompt_tokens"] + stopped["usage"]["completion_tokens"] == MAX_CONTEXT + 1


def test_ollama_shifts_by_default_and_stops_with_shift_false(plain, shifting):
    """Ollama's ``shift`` is on unless false, whatever the server's --context-shift: the plain server shifts an
    Ollama answer, and ``shift`` false stops it at the full context (done_reason "length")."""
    text = "The quick brown fox jumps over the lazy dog."
    body = {"model": NAME, "prompt": text, "raw": True, "stream": False,
            "options": {"num_predict": 3 * MAX_CONTEXT, "num_keep": 4}}
    status, shifted = plain.post("/api/generate", body)
    assert status == 200, shifted
    prompt = shifted["prompt_eval_count"]
    status, native = shifting.post("/completion", {"prompt": text, "n_predict": 3 * MAX_CONTEXT, "n_keep": 4})
    assert status == 200, native
    assert shifted["response"] == native["content"]
    assert shifted["eval_count"] == native["tokens_predicted"]
    assert (shifted["eval_count"], shifted["done_reason"]) == (3 * MAX_CONTEXT, "length")
    assert prompt + shifted["eval_count"] > MAX_CONTEXT
    status, stopped = shifting.post("/api/generate", {**body, "shift": False})
    assert status == 200, stopped
    assert (stopped["eval_count"], stopped["done_reason"]) == (MAX_CONTEXT - prompt + 1, "length")
    # num_predict -1 shifting runs to ten contexts of tokens, as llm/server.go limits it
    status, unlimited = plain.post("/api/generate", {**body, "options": {"num_predict": -1}})
    assert status == 200, unlimited
    assert unlimited["eval_count"] == 10 * MAX_CONTEXT


def test_ollama_num_keep_is_read_and_refused_by_name(plain):
    body = {"model": NAME, "prompt": "fox", "raw": True, "stream": False,
            "options": {"num_predict": 2, "num_keep": "four"}}
    status, answer = plain.post("/api/generate", body)
    assert status == 400
    assert "options.num_keep" in answer["error"]
