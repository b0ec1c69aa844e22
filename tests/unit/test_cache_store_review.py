"""The host-memory KV cache store at its edges (edgesdk/runtime/cache_store.py, prompt_cache.py): a budget
that holds one conversation, and what the store keeps when caches contain each other."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.runtime.cache_store import CacheStore

pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["standard", "ort-fused", "gated", "triton-reference"])
def backend(request, tmp_path_factory):
    from tests.unit.test_prompt_cache import BACKENDS

    return BACKENDS[request.param](tmp_path_factory.mktemp(request.param))


def _ids(seed: int, count: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 320, count)]


def _answer(backend, prompt, cache=None, **kwargs):
    from edgesdk.runtime.generate import SamplingConfig, generate

    return generate(backend, prompt, SamplingConfig(max_new_tokens=6), stop_ids=set(), cache=cache, **kwargs)


@pytest.mark.parametrize(("kv_heads", "cut"), [(2, 0), (1, 0), (1, 5)])
def test_a_loaded_standard_cache_outlives_the_saved_copy_it_came_from(tmp_path, kv_heads, cut):
    """The standard form wraps a loaded state's arrays without copying them. Rewound to its whole length
    (a prompt that continues it), or with one KV head (where a shorter slice is contiguous too), the
    cache was rebuilt on views that did not keep those arrays alive: once the store let go of them
    (evicted), the next prefill read freed memory (NaN logits, or another cache's keys)."""
    import gc

    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_backend import OrtBackend
    from tests._utils.tiny import tiny_llama

    spec = export_model(tiny_llama(heads=4, kv_heads=kv_heads), tmp_path,
                        ExportConfig(form="standard", max_context=128))
    backend = OrtBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    ids, tail = _ids(40, 70), _ids(41, 4)
    backend.prefill(np.array(ids))
    state, _ = backend.save_cache()
    backend.reset()
    backend.load_cache(state)
    backend.rewind(len(ids) - cut)
    del state
    gc.collect()
    junk = [np.full((1, kv_heads, len(ids), 16), np.nan, np.float32) for _ in range(64)]  # reuses freed memory
    continued = backend.prefill(np.array(ids[len(ids) - cut:] + tail), keep_logits=len(tail))
    del junk
    backend.reset()
    whole = backend.prefill(np.array(ids + tail), keep_logits=len(tail))
    np.testing.assert_allclose(continued, whole, atol=2e-4)


def test_a_budget_for_one_conversation_gives_each_its_cache_back_in_turn(backend):
    """Two chats take turns under a budget that holds one saved cache: saving the live chat to load the
    other must not evict the cache being loaded before it is loaded (it was a ValueError, the request
    failed); each chat's next turn comes from the store and answers as an empty cache does."""
    from edgesdk.runtime.prompt_cache import SAVE_AT_LEAST, PromptCache

    chat_a, chat_b = _ids(30, SAVE_AT_LEAST + 4), _ids(31, SAVE_AT_LEAST + 4)
    backend.reset()
    backend.prefill(np.array(chat_a))
    per_token = backend.save_cache()[1] // len(chat_a)
    cache = PromptCache(backend, CacheStore(budget_bytes=per_token * (len(chat_a) + 20)))  # one, not two
    answer_a, _ = _answer(backend, chat_a, cache)
    answer_b, _ = _answer(backend, chat_b, cache)  # A saved
    assert [len(entry.tokens) for entry in cache.store.entries] == [len(chat_a) + len(answer_a) - 1]
    turn_a = chat_a + answer_a + _ids(32, 3)
    again, stats = _answer(backend, turn_a, cache)  # B saved (A evicted): A loaded all the same
    assert stats.cached_tokens == len(chat_a) + len(answer_a) - 1
    assert again == _answer(backend, turn_a)[0]
    assert [entry.tokens for entry in cache.store.entries] == [tuple(chat_b + answer_b[:-1])]
    assert len(cache.tokens) == backend.position
    turn_b = chat_b + answer_b + _ids(33, 3)
    again, stats = _answer(backend, turn_b, cache)  # A (longer now) saved, B loaded
    assert stats.cached_tokens == len(chat_b) + len(answer_b) - 1
    assert again == _answer(backend, turn_b)[0]


def test_a_streamed_json_request_the_tokenizer_cannot_serve_gets_a_400_not_a_started_stream(tiny_bundle):
    """JSON mode refuses a bundle whose tokens it cannot read as bytes (here a WordPiece decoder). A streamed
    request was refused only once its turn had come, after the 200 and the event-stream headers were out,
    so the client got a started stream with an error event; it is now a 400 naming response_format, as
    the same request unstreamed gets."""
    from tokenizers import decoders

    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_serve import Served

    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.tokenizer.decoder = decoders.WordPiece()
    server = Served(runtime)
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}
        for stream in (False, True):
            status, headers, payload = server.request("POST", "/v1/chat/completions", {**body, "stream": stream})
            assert status == 400, payload
            assert headers["Content-Type"] == "application/json"
            error = json.loads(payload)["error"]
            assert error["param"] == "response_format"
            assert "(JSON mode, a JSON schema or tools, a GBNF grammar) cannot read this bundle's tokens" \
                in error["message"]
    finally:
        server.close()


def test_a_cache_that_a_saved_one_begins_with_is_not_saved_again():
    """The longer cache serves every prompt its prefix could, so saving the prefix (a regenerated answer
    stopped early, whose tokens a saved cache already holds) only marks the longer one used: it took
    budget beside it, and could evict another conversation."""
    store = CacheStore(budget_bytes=25)
    store.put([1, 2, 3, 4], "long", 10)
    store.put([7, 8], "other", 10)
    assert store.put([1, 2], "prefix", 10)
    assert [entry.state for entry in store.entries] == ["other", "long"]
    assert store.put([5], "new", 10)  # evicts the least recently used: "other", not "long"
    assert [entry.state for entry in store.entries] == ["long", "new"]
    assert store.best([1, 2, 9]) == (2, store.entries[0])
