"""Distillation training text: the teacher's prompts are encoded as the runtime and llama.cpp encode a prompt to
continue (BOS where the tokenizer adds one, never a trailing EOS)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.data import PROMPTS, DataConfig, generate_text, prompt_ids  # noqa: E402
from tests._utils.tiny import (  # noqa: E402
    tiny_gemma_tokenizer,
    tiny_llama,
    tiny_llama2_tokenizer,
    tiny_tokenizer,
)


def llama2_tokenizer(add_eos: bool):
    tokenizer = tiny_llama2_tokenizer()
    tokenizer.add_eos_token = add_eos  # Llama's tokenizers (and some fine-tunes' configs) put </s> after a text
    return tokenizer


def test_teacher_text_of_an_add_eos_tokenizer_continues_the_prompt_not_a_finished_document():
    """A tokenizer with add_eos_token encoded each prompt as "<s> The history of </s>", so the teacher sampled
    after an end of text rather than continuing the prompt (llama-cli and llama-perplexity refuse such a vocabulary
    for a decoder, GGML_ASSERT(!llama_vocab_get_add_eos(vocab)); the runtime never puts that EOS in a prompt). The
    text is now the one the same tokenizer without add_eos_token gets, and no prompt is followed by its EOS."""
    with_eos, plain = llama2_tokenizer(True), llama2_tokenizer(False)
    prompt = "The history of"
    assert with_eos(prompt)["input_ids"][-1] == with_eos.eos_token_id  # the tokenizer does add it
    assert prompt_ids(with_eos, prompt) == plain(prompt)["input_ids"]
    assert with_eos.eos_token_id not in prompt_ids(with_eos, prompt)
    teacher = tiny_llama(vocab_size=len(plain))
    config = DataConfig(generated_sequences=3, generated_tokens=6, seed=1)
    text = generate_text(teacher, with_eos, config, progress=False)
    assert text.tolist() == generate_text(teacher, plain, config, progress=False).tolist()


@pytest.mark.parametrize("make", [tiny_tokenizer, tiny_gemma_tokenizer, lambda: llama2_tokenizer(False)],
                         ids=["no-bos", "gemma", "llama2"])
def test_prompts_of_a_tokenizer_without_add_eos_are_encoded_as_before(make):
    """BOS first where the tokenizer adds one, nothing where it adds none (SmolLM2): the ids tokenizer(prompt) gave."""
    tokenizer = make()
    for prompt in PROMPTS:
        assert prompt_ids(tokenizer, prompt) == tokenizer(prompt)["input_ids"]


def test_distillation_with_both_loss_weights_zero_is_refused_naming_the_fix():
    """logits_weight 0 and attention_weight 0 made the loss 0 x KL: zero gradients, so the stage ran its batches
    (minutes on the real model) and changed no weight, while the report counted the batches and updates as training."""
    from edgesdk.build.registry import make_config
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match="logits_weight and attention_weight are both 0 with steps 16") as caught:
        make_config("distill", {"steps": 16, "logits_weight": 0, "attention_weight": 0})
    assert "set steps 0" in str(caught.value)
    make_config("distill", {"steps": 0, "logits_weight": 0, "attention_weight": 0})  # nothing trained, nothing asked
    make_config("distill", {"steps": 16, "logits_weight": 0, "attention_weight": 0.5})  # attention alone trains


def test_the_teacher_text_key_changes_with_the_tokenizer_that_encodes_its_prompts():
    """The cached text holds the tokenizer's ids: the same weights under an edited tokenizer (another merge, BOS
    switched on) sampled from other prompt ids, and the old text was reused."""
    from edgesdk.compress.data import DataConfig, teacher_key
    from tests._utils.tiny import tiny_llama, tiny_llama2_tokenizer, tiny_tokenizer

    model, config = tiny_llama(seed=0), DataConfig()
    first, again, other = tiny_tokenizer(), tiny_tokenizer(), tiny_llama2_tokenizer()
    assert teacher_key(model, config, first) == teacher_key(model, config, again)
    assert teacher_key(model, config, first) != teacher_key(model, config, other)
    with_bos = tiny_llama2_tokenizer()
    with_bos.add_bos_token, other.add_bos_token = True, False
    assert teacher_key(model, config, with_bos) != teacher_key(model, config, other)
