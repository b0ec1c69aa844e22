"""Stage settings that cannot work are refused when the config is made, naming the option, its value
and what it must be, instead of failing (or computing NaN) after the model has loaded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import make_config  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.compress.prune import fisher_diagonal  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


@pytest.mark.parametrize(("stage", "options", "match"), [
    ("prune", {"sequence_length": 1}, "sequence_length must be >= 2, got 1"),
    ("prune", {"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ("smooth", {"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ("smooth", {"sequence_length": 0}, "sequence_length must be >= 1, got 0"),
    ("distill", {"soft_prompt_tokens": -4}, "soft_prompt_tokens must be >= 0, got -4"),
    ("distill", {"sequence_length": 1}, "sequence_length must be >= 2, got 1"),
    ("distill", {"attention_weight": -0.5}, "attention_weight must be >= 0, got -0.5"),
])
def test_settings_that_cannot_work_are_refused_naming_option_and_value(stage, options, match):
    with pytest.raises(BuildError, match=match) as error:
        make_config(stage, options)
    assert "--set" in str(error.value)  # and the fix


def test_one_token_sequences_would_leave_every_prune_saliency_zero():
    """Why prune needs sequence_length >= 2: one token has no next-token target, so there is no gradient
    and the pruning ranking would be arbitrary."""
    model = tiny_llama(seed=1)
    fisher = fisher_diagonal(model, [torch.randint(0, model.config.vocab_size, (2, 1))])
    assert not any(bool(f.nan_to_num().any()) for f in fisher.values())


def test_teacher_text_of_zero_tokens_is_refused_before_the_model_loads():
    """generated_tokens 0 reached transformers' generate(), which raised 'max_new_tokens must be greater
    than 0' after the model had loaded."""
    with pytest.raises(BuildError, match="generated_tokens is 0 with generated_sequences 4") as error:
        DataConfig(generated_sequences=4, generated_tokens=0)
    assert "--generated-sequences 0" in str(error.value)
    DataConfig(generated_sequences=0, generated_tokens=0)  # no teacher text: nothing to generate
