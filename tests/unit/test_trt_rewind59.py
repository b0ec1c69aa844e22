"""The TensorRT backend's ``rewind``, ``save_cache`` and ``load_cache`` (edgesdk/runtime/tensorrt_backend.py), review
59: without them ``serve`` on a Jetson engine prefilled the whole conversation every turn (edgesdk/runtime/prompt_cache.py
reuses nothing on a backend that cannot rewind) and no draft could be checked. TensorRT is not installed here; the
engine is the stand-in of test_gpu_runtime46, which runs the real ONNX graph with ONNX Runtime and reads every input, the past
tensors included, as a contiguous array of the shape ``set_input_shape`` gave from the address it was given, as
TensorRT does. The tiny model has two KV heads, so a rewind that only set the position (the engine then reads a
past of the new length from a buffer laid out for the old one) gives other logits here, as it would on the GPU."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.generate import SamplingConfig, can_draft, generate
from edgesdk.runtime.prompt_cache import SAVE_AT_LEAST, PromptCache
from tests.unit.test_gpu_runtime46 import HostDevice, OrtTensorRT

pytest.importorskip("torch")

MAX_SEQ = 4  # the engine's profile: longer prefills run in chunks of 4


def _exported(out, seed: int):
    """The standard graph (the form TensorRT builds from) of a tiny model whose answers depend on the context: the
    tests' tiny model scales its embedding by 8 and ties its head to it, so it answers with the last token whatever
    the KV cache holds, and a broken cache gave the same greedy answers as a sound one. Untied, with the embedding
    at its initial scale, attention decides the next token."""
    import torch

    from edgesdk.export.onnx_export import ExportConfig, export_model
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(seed=seed, tie=False)
    with torch.no_grad():
        model.model.embed_tokens.weight.div_(8.0)
    spec = export_model(model, out, ExportConfig(form="standard", max_context=128))
    return out / "model.onnx", spec.to_json()


@pytest.fixture(scope="module")
def engine_graph(tmp_path_factory):
    return _exported(tmp_path_factory.mktemp("trt-rewind"), seed=0)


@pytest.fixture(scope="module")
def other_graph(tmp_path_factory):
    """Another model of the same shape: a draft model whose drafts are often refused."""
    return _exported(tmp_path_factory.mktemp("trt-rewind-other"), seed=1)


@pytest.fixture
def make(engine_graph, monkeypatch, tmp_path):
    """Opens a TensorRT backend on the stand-in engine of ``engine_graph`` or ``exported`` (each with its own
    buffers, on a new HostDevice or ``device``)."""
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend

    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"plan")

    def opened(exported=None, device=None):
        model, graph = exported or engine_graph
        assert max(graph["kv_heads"]) > 1  # a past tensor whose layout depends on its length: the case here
        device = device or HostDevice()
        monkeypatch.setitem(sys.modules, "tensorrt", OrtTensorRT(model, graph, device, MAX_SEQ))
        return TensorRTBackend(plan, graph, device=device)

    return opened


@pytest.fixture
def backend(make):
    return make()


def _ids(seed: int, count: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 300, count)]


def _answer(backend, prompt, cache=None, max_new_tokens=5, **kwargs):
    return generate(backend, prompt, SamplingConfig(max_new_tokens=max_new_tokens), stop_ids=set(), cache=cache,
                    **kwargs)


def _assert_same_cache(backend, reference) -> None:
    """The two backends' KV caches hold the same keys and values."""
    assert backend.position == reference.position
    for index, (ours, theirs) in enumerate(zip(backend.save_cache()[0], reference.save_cache()[0], strict=True)):
        np.testing.assert_allclose(ours, theirs, atol=1e-4, err_msg=f"past tensor {index}")


def _fresh(backend, prompt) -> list[int]:
    """The greedy answer to ``prompt`` prefilled whole from an empty cache."""
    backend.reset()
    return _answer(backend, prompt)[0]


def test_a_rewound_cache_continues_as_a_whole_prefill(backend):
    """Rewound into an earlier chunk, in the middle of one, to its whole length and to nothing, the cache gives the
    logits a whole prefill of the kept tokens and the rest gives."""
    ids, tail = _ids(1, 11), _ids(2, 3)
    for kept in (9, 5, 2, 11, 0):
        backend.reset()
        backend.prefill(np.array(ids))
        backend.rewind(kept)
        assert backend.position == kept
        continued = backend.prefill(np.array(ids[:kept] + tail)[kept:], keep_logits=len(tail))
        backend.reset()
        whole = backend.prefill(np.array(ids[:kept] + tail), keep_logits=len(tail))
        np.testing.assert_allclose(continued, whole, atol=1e-4, err_msg=f"rewound to {kept}")


def test_greedy_turns_with_the_prompt_cache_answer_as_a_fresh_prefill_each_turn(make):
    """As ``serve`` runs a chat: one PromptCache over the turns, nothing reset between them. The next prompt repeats
    the last one and its answer, then edits the end of the answer (the template re-tokenized it: the cache is
    rewound into it), then starts otherwise (another system prompt: rewound to its first tokens). Each turn's greedy
    answer equals the one a fresh prefill of the whole prompt gives, and the turns that share a prefix take it from
    the cache."""
    backend, reference = make(), make()
    cache = PromptCache(backend)
    assert cache.supported
    prompt = _ids(3, 10)
    cached = []
    for turn in range(4):
        answer, stats = _answer(backend, prompt, cache)
        cached.append(stats.cached_tokens)
        assert len(cache.tokens) == backend.position
        assert answer == _fresh(reference, prompt), f"turn {turn}"
        _assert_same_cache(backend, reference)
        if turn == 0:
            prompt = prompt + answer + _ids(4, 3)  # all of it again
        elif turn == 1:
            prompt = prompt + answer[:-3] + _ids(5, 4)  # the answer's last tokens differ
        else:
            prompt = prompt[:2] + _ids(6 + turn, 3) + prompt[5:]
    assert cached[:2] == [0, 10 + 5 - 1]  # the cache holds the prompt and the answer but its last token
    assert cached[2] == 10 + 5 + 3 + 2  # the second prompt and the answer's first 2 tokens
    assert cached[3] == 2


def test_a_prompt_cache_file_round_trip_answers_as_a_fresh_prefill(make, tmp_path):
    """``edgesdk run --prompt-cache FILE`` (edgesdk/runtime/cache_file.py) keeps the cache between runs: a TensorRT
    backend's cache is written and loaded back, and the next run's answer is the fresh prefill's."""
    from edgesdk.runtime import cache_file

    backend, reference = make(), make()
    assert cache_file.supported(backend)
    path, prompt = tmp_path / "prompt.cache", _ids(7, 12)
    cache = PromptCache(backend)
    answer, _ = _answer(backend, prompt, cache)
    cache_file.save(path, cache, "0123456789abcdef")
    later = make()  # the next run
    cache = PromptCache(later)
    loaded, why = cache_file.load(path, cache, "0123456789abcdef")
    assert (loaded, why) == (len(prompt) + len(answer) - 1, None)
    turn = prompt + answer[:-2] + _ids(8, 3)
    again, stats = _answer(later, turn, cache)
    assert stats.cached_tokens == len(prompt) + len(answer) - 2
    assert again == _fresh(reference, turn)
    _assert_same_cache(later, reference)


def test_a_saved_cache_loaded_back_continues_as_a_whole_prefill(backend):
    ids, tail = _ids(20, 10), _ids(21, 3)
    backend.prefill(np.array(ids))
    state, nbytes = backend.save_cache()
    assert [array.shape for array in state] == [(1, kv, len(ids), backend.head_dim)
                                                for kv in backend.kv_heads for _ in range(2)]
    assert nbytes == sum(array.nbytes for array in state)
    backend.reset()
    backend.prefill(np.array(_ids(22, 7)))  # another conversation in the buffers
    backend.load_cache(state)
    assert backend.position == len(ids)
    continued = backend.prefill(np.array(tail), keep_logits=len(tail))
    backend.reset()
    np.testing.assert_allclose(continued, backend.prefill(np.array(ids + tail), keep_logits=len(tail)), atol=1e-4)


def test_two_conversations_take_turns_through_the_cache_store(make):
    """``serve``'s saved caches (``--cache-ram``): a conversation the other cuts back is saved, and its next turn
    loads it back and answers as a fresh prefill does."""
    from edgesdk.runtime.cache_store import CacheStore

    backend, reference = make(), make()
    cache = PromptCache(backend, CacheStore(budget_bytes=1 << 30))
    assert cache.store is not None
    chat_a, chat_b = _ids(30, SAVE_AT_LEAST + 4), _ids(31, SAVE_AT_LEAST + 4)
    answer_a, _ = _answer(backend, chat_a, cache)
    answer_b, _ = _answer(backend, chat_b, cache)  # A saved
    assert [len(entry.tokens) for entry in cache.store.entries] == [len(chat_a) + len(answer_a) - 1]
    turn_a = chat_a + answer_a[:-2] + _ids(32, 3)
    again, stats = _answer(backend, turn_a, cache)  # B saved, A loaded and rewound into its answer
    assert stats.cached_tokens == len(chat_a) + len(answer_a) - 2
    assert again == _fresh(reference, turn_a)
    _assert_same_cache(backend, reference)
    turn_b = chat_b + answer_b + _ids(33, 3)
    again, stats = _answer(backend, turn_b, cache)
    assert stats.cached_tokens == len(chat_b) + len(answer_b) - 1
    assert again == _fresh(reference, turn_b)
    _assert_same_cache(backend, reference)


@pytest.mark.parametrize("draft", ["same", "other"])
def test_a_draft_model_on_tensorrt_keeps_the_greedy_answer(make, other_graph, draft):
    """With ``rewind`` the backend can check drafts and be a draft model (llama.cpp's ``--model-draft``): the target
    rewinds past the drafts it refuses, the draft past the tokens the target chose otherwise. The answer is the one
    decoding token by token gives, whether the drafts are all taken (the same model) or often refused."""
    from edgesdk.runtime.speculative import DraftConfig, DraftModel

    backend = make()
    assert can_draft(backend)
    prompt = _ids(40, 9)
    plain, _ = _answer(backend, prompt, max_new_tokens=16)
    drafts = DraftModel(make(other_graph if draft == "other" else None), DraftConfig(max_draft=3))
    backend.reset()
    drafted, stats = _answer(backend, prompt, max_new_tokens=16, lookup=drafts)
    assert stats.draft_tokens > 0
    assert drafted == plain
    if draft == "same":
        assert stats.draft_accepted == stats.draft_tokens
    else:
        assert stats.draft_accepted < stats.draft_tokens


@pytest.mark.parametrize("length", [2.5, True, -1, 8, "3"])
def test_a_rewind_outside_the_cache_is_refused_by_name_and_changes_nothing(backend, length):
    backend.prefill(np.array(_ids(50, 7)))
    with pytest.raises(RuntimeBackendError, match="cannot rewind the KV cache to"):
        backend.rewind(length)
    assert backend.position == 7


def test_a_state_of_another_shape_or_type_is_refused_before_the_cache_changes(backend):
    backend.prefill(np.array(_ids(51, 5)))
    state, _ = backend.save_cache()
    with pytest.raises(RuntimeBackendError, match="load_cache array 0"):
        backend.load_cache([array.astype(np.float16) for array in state])
    with pytest.raises(RuntimeBackendError, match="load_cache of 3 arrays"):
        backend.load_cache(state[:3])
    assert backend.position == 5


def test_a_closed_backend_refuses_rewind_and_cache_copies_by_name(backend):
    backend.prefill(np.array(_ids(52, 5)))
    state, _ = backend.save_cache()
    backend.close()
    for call, run in (("rewind", lambda: backend.rewind(2)), ("save_cache", backend.save_cache),
                      ("load_cache", lambda: backend.load_cache(state))):
        with pytest.raises(RuntimeBackendError, match=f"{call} on the closed tensorrt backend"):
            run()


class FailingUpload(HostDevice):
    """Host buffers whose uploads fail after ``left`` more succeed (None: never), as a CUDA copy fails on a GPU that
    fell over."""

    left: int | None = None

    def upload(self, buffer, array):
        if self.left is not None:
            if self.left == 0:
                raise RuntimeBackendError("CUDA call cudaMemcpyAsync failed: cudaErrorLaunchFailure", "check the GPU")
            self.left -= 1
        super().upload(buffer, array)


def test_a_rewind_or_load_whose_copy_fails_leaves_an_empty_cache_the_prompt_cache_starts_over_from(make):
    """A copy that fails after some tensors were moved left the old position over entries laid out for no length;
    the cache is emptied instead, which the prompt cache sees (its tokens no longer match the position) and the
    next answer starts over, as a fresh prefill."""
    device = FailingUpload()
    backend, reference = make(device=device), make()
    cache = PromptCache(backend)
    prompt = _ids(60, 10)
    answer, _ = _answer(backend, prompt, cache)
    state, _ = backend.save_cache()
    for run in (lambda: backend.rewind(5), lambda: backend.load_cache(state)):
        device.left = 2  # two past tensors copied, the third fails
        with pytest.raises(RuntimeBackendError, match="cudaMemcpyAsync"):
            run()
        assert backend.position == 0
    device.left = None
    turn = prompt + answer + _ids(61, 3)
    again, stats = _answer(backend, turn, cache)
    assert stats.cached_tokens == 0
    assert again == _fresh(reference, turn)
