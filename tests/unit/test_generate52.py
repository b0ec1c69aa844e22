"""The generation loop's context shift (edgesdk/runtime/generate.py): a prompt longer than the shift's window is
refused by name before anything runs, and a keep that leaves nothing to discard is refused with the keep that does
fit."""

from __future__ import annotations

import re

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import ContextShift, SamplingConfig, generate

PROMPT = [5, 17, 99, 3, 250, 41, 8, 77, 120, 64, 33, 12]


def test_a_prompt_longer_than_the_shift_window_is_refused_naming_the_window(runtime):
    """Ollama's ``num_ctx`` below the prompt: the cache held the whole prompt, past the window, and each shift (sized
    for a full window) left it past the window again, so the answer shifted at every step in a context larger than the
    one asked for. Refused before the prompt is prefilled, naming both sizes."""
    backend = runtime.backend
    backend.reset()
    with pytest.raises(EdgeSDKError) as refused:
        generate(backend, PROMPT, SamplingConfig(max_new_tokens=6), set(), shift=ContextShift(window=8))
    assert refused.value.problem == f"the prompt has {len(PROMPT)} tokens; the context shift's window is 8 tokens"
    assert "at most 8 tokens" in refused.value.fix
    assert f"at least {len(PROMPT)}" in refused.value.fix
    assert backend.position == 0  # nothing was prefilled


def test_a_prompt_that_fills_the_window_still_shifts_within_it(runtime):
    """A prompt of exactly the window's tokens is taken: its first answer token is fed after a shift, and the cache
    never holds more than the window."""
    backend, window = runtime.backend, len(PROMPT)
    answer, stats = generate(backend, PROMPT, SamplingConfig(max_new_tokens=6), set(),
                             shift=ContextShift(keep=2, window=window))
    assert len(answer) == 6
    assert stats.context_shifts >= 1
    assert backend.position <= window


def _first_refused_keep(fix: str) -> int:
    return int(re.search(r"n_keep below (\d+)", fix).group(1))


@pytest.mark.parametrize("bos", [False, True])
def test_the_keep_a_refusal_names_is_the_first_one_refused(bos):
    """``keep`` N keeps N tokens, and the BOS on top with ``bos``: the refusal names the keep below which a token is
    left to discard. It said ``below 63`` in a 64-token context without a BOS, where keep 63 is taken, and that 0
    keeps the BOS where there is none."""
    context, prompt_tokens = 64, 100
    with pytest.raises(EdgeSDKError) as refused:
        ContextShift(keep=context, bos=bos).spans(prompt_tokens, context)
    bound = _first_refused_keep(refused.value.fix)
    assert bound == context - int(bos)
    with pytest.raises(EdgeSDKError):
        ContextShift(keep=bound, bos=bos).spans(prompt_tokens, context)
    assert ContextShift(keep=bound - 1, bos=bos).spans(prompt_tokens, context) == (context - 1, 1)
    assert ("0 keeps only the BOS" in refused.value.fix) == bos
    assert ("0 keeps none" in refused.value.fix) == (not bos)
