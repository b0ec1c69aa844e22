"""Compression stages, review 32: teacher text sampled with its own settings whatever the model's
generation config asks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.data import DataConfig, generate_text  # noqa: E402
from tests._utils.tiny import tiny_llama, tiny_tokenizer  # noqa: E402


def flat_teacher():
    """A tiny teacher whose next-token distributions are spread out, so sampling settings show in its text."""
    model = tiny_llama(seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.div_(8.0)
    return model


def test_teacher_text_ignores_the_sampling_settings_of_the_models_generation_config():
    """transformers fills every generation setting a call leaves out from the model's generation config, so
    Qwen3's top_k 20 (Gemma 3's 64, any repetition penalty) shaped the teacher text, which the docstring gives
    as temperature 1 and top-p 0.95, and the cache (keyed by config and weights) took either text for the other.
    Here top_k 1 made every continuation the greedy one."""
    tokenizer = tiny_tokenizer()
    config = DataConfig(generated_sequences=8, generated_tokens=12, seed=0)
    expected = generate_text(flat_teacher(), tokenizer, config, progress=False)
    teacher = flat_teacher()
    teacher.generation_config.do_sample = True
    teacher.generation_config.top_k = 1
    teacher.generation_config.repetition_penalty = 1.5
    assert torch.equal(generate_text(teacher, tokenizer, config, progress=False), expected)
    assert teacher.generation_config.top_k == 1  # the model's own config is given back
    assert teacher.generation_config.repetition_penalty == 1.5
