"""The Python API (edgesdk/api.py) under serve's decoding options answers as the plain HTTP server does: a Model
loaded with a draft bundle (``draft=``, of the same model and of another), prompt lookup (``lookup=``), no prompt
cache (``prompt_cache=False``), host-memory caches of other prompts (``cache_ram_mib=``) and the thermal guard on a
machine without sensors (``watch_thermal=True``, ``EDGESDK_THERMAL_ROOT`` an empty directory, where the guard paces
at its fixed fallback rate) answers each chat and text completion of the serve invariance matrix, whole and
streamed, with the plain server's body: text, finish reason, usage, logprobs (within 1e-4), tool calls and the
token counts of llama-server's ``timings``; ids, times and the prompt tokens taken from the cache aside. A prompt
cache saved by one configuration and loaded by another answers as without it."""

from __future__ import annotations

import pytest

import edgesdk
from tests.unit import test_serve_invariance39 as matrix
from tests.unit.test_serve_invariance39 import REQUESTS, _mismatches, _normal
from tests.unit.test_serve_reasoning import THINKING_TEMPLATE

bundles, plain = matrix.bundles, matrix.plain  # the matrix's fixtures: its bundles, the plain server's answers

ROUTES = {"/v1/chat/completions": "create_chat_completion", "/v1/completions": "create_completion"}
SERVED = "tiny"  # the plain server's model name, which its answers carry

CONFIGS = {  # name -> load()'s arguments beside the bundle (the draft as the name of a bundle of the fixture)
    "prompt-cache": {},
    "no-prompt-cache": {"prompt_cache": False},
    "prompt-cache-no-ram": {"cache_ram_mib": 0},
    "lookup": {"lookup": 3, "prompt_cache": False},
    "lookup-cache-1-mib": {"lookup": 2, "cache_ram_mib": 1},
    "draft-same-weights": {"draft": "target"},
    "draft-other-model": {"draft": "other", "draft_max": 3, "prompt_cache": False},
    "thermal-no-sensors-lookup": {"watch_thermal": True, "lookup": 2},
}


def _load(bundles, **arguments) -> edgesdk.Model:
    """A Model of the target bundle with the matrix's thinking template (a <think> block unless enable_thinking is
    false), as the matrix's servers have it."""
    if "draft" in arguments:
        arguments["draft"] = bundles[arguments["draft"]]
    model = edgesdk.load(bundles["target"], threads=1, max_tokens=16, **arguments)
    model.runtime.tokenizer.template_source = THINKING_TEMPLATE
    model.runtime.tokenizer._template = None
    return model


def _served_name(value, name: str):
    """The answer with the Model's name as the plain server's."""
    if isinstance(value, dict):
        return {key: _served_name(item, name) for key, item in value.items()}
    if isinstance(value, list):
        return [_served_name(item, name) for item in value]
    return SERVED if value == name else value


def _ask(model: edgesdk.Model, path: str, body: dict) -> tuple[object, list[int]]:
    """The Model's answer to the HTTP request ``body`` of ``path`` (the whole body, or the list of a stream's
    chunks) as the matrix compares answers, and the cached prompt counts it reported."""
    fields = dict(body)
    first = fields.pop("messages" if path == "/v1/chat/completions" else "prompt")
    answer = getattr(model, ROUTES[path])(first, **fields)
    if fields.get("stream"):
        answer = list(answer)
    cached: list[int] = []
    return _normal(_served_name(answer, model.model_name), cached), cached


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_python_api_answers_as_the_plain_server_whatever_the_decoding_options(bundles, plain, name, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(tmp_path / "no-thermal-zones"))
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    arguments = dict(CONFIGS[name])
    expected_answers, _ = plain
    reused, asked = 0, 0
    with _load(bundles, **arguments) as model:
        if arguments.get("watch_thermal"):
            assert any("no thermal sensor found" in note for note in model.notes), model.notes
        for (path, body), expected in zip(REQUESTS, expected_answers[:len(REQUESTS)], strict=True):
            if path not in ROUTES:
                continue
            asked += 1
            answer, cached = _ask(model, path, body)
            problems = _mismatches(expected["answer"], answer)
            assert not problems, (path, body, problems[:5])
            reused += sum(cached)
    assert asked == 30  # every chat and text completion of the matrix
    assert (reused > 0) == arguments.get("prompt_cache", True)


def test_a_prompt_cache_saved_under_one_configuration_answers_under_another(bundles, plain, tmp_path):
    """The file a Model with a draft bundle saved, loaded by one with prompt lookup and a 1 MiB host cache, and its
    file by one with another draft bundle: each answers the conversation as the plain server, prefilling only what
    follows the loaded tokens."""
    expected_answers, _ = plain
    index = next(i for i, (path, body) in enumerate(REQUESTS)
                 if path == "/v1/chat/completions" and body.get("logprobs") and not body.get("stream"))
    path, body = REQUESTS[index]
    expected = expected_answers[index]["answer"]
    first, second = tmp_path / "first.cache", tmp_path / "second.cache"
    with _load(bundles, draft="target") as model:
        answer, cached = _ask(model, path, body)
        assert not _mismatches(expected, answer)
        written = model.save_prompt_cache(first)
    assert written == expected["usage"]["prompt_tokens"] + expected["usage"]["completion_tokens"] - 1
    for arguments, source, target in (({"lookup": 2, "cache_ram_mib": 1}, first, second),
                                      ({"draft": "other", "draft_max": 3}, second, None)):
        with _load(bundles, **arguments) as model:
            assert tuple(model.load_prompt_cache(source)) == (written, None)
            answer, cached = _ask(model, path, body)
            problems = _mismatches(expected, answer)
            assert not problems, (arguments, problems[:5])
            # all but the prompt's last token, whose logits the answer's first pick needs
            assert set(cached) == {expected["usage"]["prompt_tokens"] - 1}, arguments  # usage and timings
            if target is not None:
                assert model.save_prompt_cache(target) == written
