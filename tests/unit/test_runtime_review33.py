"""Runtime review: generation on prompts and options the Python API takes from its caller."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.prompt_cache import PromptCache


@pytest.mark.parametrize("bad", [320, -1])
def test_a_prompt_id_the_model_has_no_row_for_is_refused_before_prefill(runtime, bad):
    """An id past the embedding rows failed in ONNX Runtime's Gather with its own RuntimeError; a negative one was
    read as counted from the end (the last row), an answer to another prompt. Both are refused by name, and the
    KV cache the prompt cache holds stays as it was."""
    backend = runtime.backend
    assert backend.vocab_size == 320
    cache = PromptCache(backend)
    prompt = runtime.tokenizer.encode("The quick brown fox")
    before, _ = generate(backend, prompt, SamplingConfig(max_new_tokens=4), set(), cache=cache)
    held = list(cache.tokens)
    with pytest.raises(EdgeSDKError, match=rf"the prompt holds token id {bad} at position 2; the bundle's model "
                                           r"reads ids 0 to 319") as info:
        generate(backend, [*prompt[:2], bad, *prompt[2:]], SamplingConfig(max_new_tokens=4), set(), cache=cache)
    assert "embedding rows" in info.value.fix
    assert cache.tokens == held
    assert backend.position == len(held)
    again, stats = generate(backend, prompt, SamplingConfig(max_new_tokens=4), set(), cache=cache)
    assert again == before
    assert stats.cached_tokens == len(prompt) - 1


def test_ids_of_a_numpy_prompt_are_checked_too(runtime):
    prompt = np.asarray(runtime.tokenizer.encode("hello"), np.int64)
    tokens, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=2), set())
    assert len(tokens) == 2
    with pytest.raises(EdgeSDKError, match="the prompt holds token id 400 at position 0"):
        generate(runtime.backend, np.concatenate([[400], prompt]), SamplingConfig(max_new_tokens=2), set())


@pytest.mark.parametrize("value", [1.5, float("nan"), True, None, "4"])
def test_max_new_tokens_that_is_no_whole_count_is_refused_by_name(value):
    """1.5 gave an answer of 2 tokens, NaN an answer that ran to the context (no count reaches it), and None or a
    string ended in Python's TypeError ('<' not supported ...) naming no field."""
    with pytest.raises(ValueError, match=rf"max_new_tokens must be a whole number >= 1, got {value!r}"):
        SamplingConfig(max_new_tokens=value)


@pytest.mark.parametrize("field", ["temperature", "top_p", "repeat_penalty", "presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [None, "0.5"])
def test_a_sampling_number_that_is_not_a_number_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be a number, got {value!r}"):
        SamplingConfig(**{field: value})


def test_a_whole_max_new_tokens_of_numpy_s_kind_is_taken(runtime):
    tokens, stats = generate(runtime.backend, runtime.tokenizer.encode("hello"),
                             SamplingConfig(max_new_tokens=np.int64(3)), set())
    assert len(tokens) == 3
    assert stats.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("name", ["triton", "tensorrt"])
def test_a_backend_that_cannot_run_the_bundle_gives_its_own_fix_in_the_chain_s_error(tiny_bundle, name):
    """The chain's error replaced every backend's fix but ort-cpu's with what to install for it, so a bundle
    without block-sparse weights was told to install torch and triton with CUDA; the opener's own fix is given."""
    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.session import OPENERS, open_backend

    with pytest.raises(RuntimeBackendError) as opened:
        OPENERS[name](tiny_bundle, 1, True)
    assert opened.value.fix
    with pytest.raises(RuntimeBackendError, match=f"no backend could run bundle .*: {name}: ") as chain:
        open_backend(tiny_bundle, [name], threads=1)
    assert chain.value.fix == f"{name}: {opened.value.fix}; or pass --backend ort-cpu"  # onnxruntime is here
