"""Review of model loading (edgesdk/models/loader.py), round 58: faults found and fixed, each shown on a file
compared with what llama.cpp (or transformers) reads from it."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.gguf_files import close_gguf

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

# the llama.* sizes of a one-layer Llama whose 4 attention heads are all key-value heads (no GQA)
MHA_SIZES = {"block_count": 1, "embedding_length": 64, "attention.head_count": 4, "attention.head_count_kv": 4,
             "context_length": 128, "feed_forward_length": 96}


def _mha_llama_gguf(path, drop: tuple = ()):
    """A one-layer Llama GGUF (width 64, 4 heads of 16, each its own key-value head) with random float32 weights and
    a SentencePiece vocabulary of 16 tokens, the ``llama.*`` keys in ``drop`` left out."""
    vocab, width, ffn = 16, 64, 96
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in MHA_SIZES.items():
        if f"llama.{key}" not in drop:
            writer.add_uint32(f"llama.{key}", value)
    if "llama.attention.layer_norm_rms_epsilon" not in drop:
        writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    tokens = ["<unk>", "<s>", "</s>"] + [f"t{index}" for index in range(vocab - 3)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([2, 3, 3] + [1] * (vocab - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    random = np.random.default_rng(0)
    for name, shape in {"token_embd.weight": (vocab, width), "output_norm.weight": (width,),
                        "blk.0.attn_norm.weight": (width,), "blk.0.attn_q.weight": (width, width),
                        "blk.0.attn_k.weight": (width, width), "blk.0.attn_v.weight": (width, width),
                        "blk.0.attn_output.weight": (width, width), "blk.0.ffn_norm.weight": (width,),
                        "blk.0.ffn_gate.weight": (ffn, width), "blk.0.ffn_up.weight": (ffn, width),
                        "blk.0.ffn_down.weight": (width, ffn)}.items():
        writer.add_tensor(name, random.standard_normal(shape).astype(np.float32))
    return close_gguf(writer, path)


@pytest.mark.parametrize(("drop", "named"), [
    (("llama.attention.head_count", "llama.attention.head_count_kv"), "llama.attention.head_count"),
    (("llama.attention.layer_norm_rms_epsilon",), "llama.attention.layer_norm_rms_epsilon"),
    (("llama.context_length",), "llama.context_length"),
    (("llama.feed_forward_length",), "llama.feed_forward_length"),
])
def test_a_gguf_without_a_size_llama_cpp_requires_is_refused_not_loaded_with_defaults(drop, named, tmp_path):
    """llama.cpp's load_hparams requires context_length and the RMS epsilon, and without head_count or
    feed_forward_length takes 0 heads or an FFN of width 0, whose tensors its shape check refuses. transformers' GGUF
    reader put LlamaConfig's defaults in their place without a word: this 4-head model loaded as 32 heads of 2 (its
    query / key weights have that shape too), with an epsilon of 1e-6 or with 2048 positions, and computed something
    other than the file's model; an FFN of 11008 failed on the weights' shapes, reported as a damaged download."""
    from transformers import AutoConfig

    from edgesdk.models.loader import check_gguf_model

    whole = _mha_llama_gguf(tmp_path / "whole.gguf")
    assert check_gguf_model(whole) == {"head_dim": 16}
    damaged = _mha_llama_gguf(tmp_path / "damaged.gguf", drop)
    read = AutoConfig.from_pretrained(str(tmp_path), gguf_file=damaged.name)  # what the loader would have built
    assert (read.num_attention_heads, read.rms_norm_eps, read.max_position_embeddings, read.intermediate_size) \
        != (4, pytest.approx(1e-5), 128, 96)
    with pytest.raises(ModelSourceError, match=rf"lacks {named}, which llama.cpp needs to load a llama model") \
            as refused:
        check_gguf_model(damaged)
    assert "convert_hf_to_gguf.py" in refused.value.fix


def test_a_gguf_with_zero_attention_heads_is_refused_by_name(tmp_path):
    """A head count of 0 (llama.cpp's own default where the key is absent) is no model either: transformers divided
    by it ("ZeroDivisionError"), reported as a damaged download."""
    from edgesdk.models.loader import check_gguf_model
    from tests._utils.gguf_files import rewrite_gguf

    zero = rewrite_gguf(_mha_llama_gguf(tmp_path / "whole.gguf"), tmp_path / "zero.gguf",
                        fields={"llama.attention.head_count": (0, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ModelSourceError, match=r"gives 0 attention heads \(llama.attention.head_count\)"):
        check_gguf_model(zero)


@pytest.mark.parametrize(("architecture", "drop", "fields", "before"), [
    ("llama", ("llama.feed_forward_length",), {"llama.rope.dimension_count": 8}, "rotates 8 of each head's 16"),
    ("llama", ("llama.attention.head_count",), {"llama.attention.key_length": 16, "llama.attention.value_length": 32},
     "a key head size of 16 and a value head size of 32"),
    ("gemma3", ("gemma3.context_length",), {"gemma3.final_logit_softcapping": 30.0}, "soft-caps its logits"),
])
def test_a_missing_size_is_named_before_the_checks_that_read_the_sizes(architecture, drop, fields, before,
                                                                         tmp_path):
    """The file's missing size was checked last, after the head size, rotary, tensor and Gemma 3 checks: a file
    llama.cpp refuses for it was refused for what those checks read from its incomplete sizes instead."""
    from edgesdk.models.loader import check_gguf_model
    from tests._utils.gguf_files import rewrite_gguf

    kinds = {int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32}
    whole = _mha_llama_gguf(tmp_path / "whole.gguf")
    other = rewrite_gguf(whole, tmp_path / "other.gguf", architecture=architecture,
                         fields={key: (value, kinds[type(value)]) for key, value in fields.items()})
    with pytest.raises(ModelSourceError, match=before):  # the other fault alone
        check_gguf_model(other)
    both = rewrite_gguf(other, tmp_path / "both.gguf", drop=drop)
    with pytest.raises(ModelSourceError, match=rf"lacks {drop[0]}, which llama.cpp needs to load a {architecture} "):
        check_gguf_model(both)
