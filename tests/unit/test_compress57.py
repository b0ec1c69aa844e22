"""Fake quantization re-attached with another scheme; refusals of training text without text."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from edgesdk.compress import fake_quant
from edgesdk.compress.data import read_training_text
from edgesdk.errors import BuildError


def _tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(config).eval()


def test_reattach_with_other_bits_drops_the_cached_weight_codes():
    model = _tiny_llama()
    ids = torch.randint(0, 64, (1, 8))
    four = fake_quant.QuantScheme(weight_bits=4, activations="none", embedding_bits=None)
    eight = fake_quant.QuantScheme(weight_bits=8, activations="none", embedding_bits=None)
    fake_quant.attach(model, four)
    model(ids)  # caches the 4-bit codes
    fake_quant.attach(model, eight)  # attached already: switched to 8 bits in place
    switched = model(ids).logits
    fake_quant.detach(model, bake=False)
    fake_quant.attach(model, eight)
    fresh = model(ids).logits
    assert torch.equal(switched, fresh)
    q_proj = model.model.layers[0].self_attn.q_proj
    expected = fake_quant.quantize_weight(q_proj.weight, 8, "block", 32)
    assert torch.equal(q_proj.quantized_weight(), expected)


@pytest.mark.parametrize(("content", "skip"), [("", 0), (" \n\n", 0), (" \n\n", 2)], ids=["empty", "blank", "blank-skipped"])
def test_training_text_without_text_is_not_blamed_on_the_skip(tmp_path, content, skip):
    path = tmp_path / "train.txt"
    path.write_text(content)
    with pytest.raises(BuildError) as info:
        read_training_text(path, skip)
    assert "skip" not in str(info.value)  # no skip leaves text: a smaller --data-skip-chars cannot help
    assert "with text" in info.value.fix


def test_training_text_too_short_for_the_skip_names_the_largest_skip_that_keeps_text(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("ab  \n")
    with pytest.raises(BuildError, match="empty after skipping 3 characters: it holds 5 characters") as info:
        read_training_text(path, 3)
    assert "--data-skip-chars of at most 1" in info.value.fix
    assert read_training_text(path, 1) == "b  \n"  # the skip it names keeps the text


def test_reattach_without_embedding_bits_puts_the_head_back_in_float():
    model = _tiny_llama()
    ids = torch.randint(0, 64, (1, 8))
    plain = model(ids).logits
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=8, activations="none", embedding_bits=4))
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=8, activations="none", embedding_bits=None))
    assert type(model.lm_head) is torch.nn.Linear
    assert type(model.model.embed_tokens) is torch.nn.Embedding
    switched = model(ids).logits
    fake_quant.detach(model, bake=False)
    assert torch.equal(model(ids).logits, plain)  # weights untouched
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=8, activations="none", embedding_bits=None))
    assert torch.equal(switched, model(ids).logits)


def test_smooth_refuses_an_empty_site_list():
    from edgesdk.build.registry import make_config

    with pytest.raises(BuildError, match="sites is empty, so smoothing would change nothing") as info:
        make_config("smooth", {"sites": []})
    assert "qkv, gate_up, down, o" in str(info.value)
