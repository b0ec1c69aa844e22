"""GGUF metadata read as llama.cpp reads it (edgesdk/models/loader.py), round 62: a GQA model written as llama.cpp's
converter writes it loads with transformers' logits for the same weights, and sizes llama.cpp refuses (a key of the
wrong type, key-value heads that do not divide the heads, a rotary base that is no positive number) are refused
naming the key, instead of a bare ValueError or ZeroDivisionError reported as a damaged download."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.gguf_files import close_gguf, rewrite_gguf

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

TEXT_IDS = [1, 5, 9, 17, 33, 65, 100, 200]


def _load(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False)


def _logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([TEXT_IDS])).logits[0].numpy()


def _permuted(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: query / key rows in llama.cpp's pairwise rotary order."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


# Hugging Face names -> llama.cpp's (convert_hf_to_gguf.py's tensor map for LlamaModel)
GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
GGUF_LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                    "mlp.down_proj": "ffn_down"}


def _llama_gguf(model, path, quantize=None):
    """``model`` (a tiny LlamaForCausalLM) written as llama.cpp's converter writes it: its sizes as llama.* keys,
    the query / key rows permuted, no output.weight where the head is tied, the 2-D weights ``quantize``d; a
    SentencePiece vocabulary of placeholder tokens."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", config.num_hidden_layers), ("embedding_length", config.hidden_size),
                       ("attention.head_count", config.num_attention_heads),
                       ("attention.head_count_kv", config.num_key_value_heads),
                       ("context_length", config.max_position_embeddings),
                       ("feed_forward_length", config.intermediate_size)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_float32("llama.rope.freq_base", config.rope_parameters["rope_theta"])
    tokens = ["<unk>", "<s>", "</s>"] + [f"t{index}" for index in range(config.vocab_size - 3)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, tensor in model.state_dict().items():
        weights = tensor.detach().numpy().astype(np.float32)
        if name in GGUF_NAMES:
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            target = GGUF_NAMES[name]
        else:
            parts = name.split(".")
            kind = GGUF_LAYER_NAMES[".".join(parts[3:-1])]
            target = f"blk.{parts[2]}.{kind}.{parts[-1]}"
            if kind in ("attn_q", "attn_k"):
                weights = _permuted(weights, config.num_attention_heads if kind == "attn_q"
                                    else config.num_key_value_heads)
        if quantize is not None and weights.ndim == 2:
            packed = gguf.quants.quantize(weights, quantize)
            writer.add_tensor(target, packed, raw_shape=packed.shape, raw_dtype=quantize)
        else:
            writer.add_tensor(target, weights)
    return close_gguf(writer, path)


@pytest.fixture(scope="module")
def gqa_llama():
    """A tiny tied Llama of 4 query heads sharing 2 key-value heads, an RMS epsilon and rotary base of its own."""
    from tests._utils.tiny import tiny_llama

    return tiny_llama(heads=4, kv_heads=2, hidden=64, intermediate=128, vocab_size=256,
                      config_overrides={"rms_norm_eps": 1e-3, "rope_theta": 5000.0})


@pytest.mark.parametrize(("quantize", "tolerance"), [(None, 1e-4), ("F16", 0.05), ("Q8_0", 0.5)])
def test_a_gqa_llama_gguf_loads_with_the_logits_of_the_same_weights_in_transformers(gqa_llama, quantize, tolerance,
                                                                                    tmp_path):
    """The sizes this round's checks read (head counts, epsilon, rotary base) pass for a file written as llama.cpp's
    converter writes it, and the model computes what transformers computes from the same weights."""
    kind = None if quantize is None else getattr(gguf.GGMLQuantizationType, quantize)
    loaded = _load(_llama_gguf(gqa_llama, tmp_path / "gqa.gguf", quantize=kind))
    config = loaded.model.config

    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.tie_word_embeddings
    assert config.rms_norm_eps == pytest.approx(1e-3)
    assert config.rope_parameters["rope_theta"] == pytest.approx(5000.0)
    np.testing.assert_allclose(_logits(loaded.model), _logits(gqa_llama), atol=tolerance, rtol=0)


@pytest.mark.parametrize(("architecture", "kv_heads"), [("llama", 0), ("llama", 3), ("qwen2", 3)])
def test_key_value_heads_that_do_not_divide_the_heads_are_refused_naming_the_key(gqa_llama, architecture, kv_heads,
                                                                                 tmp_path):
    """0 key-value heads failed with "ZeroDivisionError: integer division or modulo by zero", 3 for 4 heads with
    "ValueError: cannot reshape array of size ...", both reported as a damaged file to download again; llama.cpp
    refuses the file's key / value tensors, whose shape n_head_kv sets."""
    source = _llama_gguf(gqa_llama, tmp_path / "gqa.gguf")
    path = rewrite_gguf(source, tmp_path / "bad.gguf", architecture=architecture,
                        fields={f"{architecture}.attention.head_count_kv": (kv_heads, gguf.GGUFValueType.UINT32)})

    with pytest.raises(ModelSourceError) as refused:
        _load(path)

    message = str(refused.value)
    assert f"{kv_heads} key-value heads ({architecture}.attention.head_count_kv)" in message
    assert f"4 attention heads ({architecture}.attention.head_count)" in message
    assert "download" not in message


@pytest.mark.parametrize(("key", "value", "kind"), [
    ("llama.rope.freq_base", "10000", gguf.GGUFValueType.STRING),
    ("llama.attention.key_length", "16", gguf.GGUFValueType.STRING),
    ("llama.rope.scaling.factor", "2.0", gguf.GGUFValueType.STRING),
    ("llama.block_count", "2", gguf.GGUFValueType.STRING),
    ("llama.attention.layer_norm_rms_epsilon", True, gguf.GGUFValueType.BOOL),
])
def test_a_size_written_as_text_is_refused_naming_the_key_not_a_bare_error(gqa_llama, key, value, kind, tmp_path):
    """llama.cpp refuses a key of another type than it reads ("key llama.rope.freq_base has wrong type str but
    expected type f32"); edgesdk failed with "ValueError: could not convert string to float" (no ModelSourceError,
    no file, no key) or transformers' config validation reported as a damaged download."""
    source = _llama_gguf(gqa_llama, tmp_path / "gqa.gguf")
    path = rewrite_gguf(source, tmp_path / "bad.gguf", fields={key: (value, kind)})

    with pytest.raises(ModelSourceError) as refused:
        _load(path)

    message = str(refused.value)
    assert f"gives {key} as {type(value).__name__} {value!r}" in message
    assert "wrong type" in message


@pytest.mark.parametrize("base", [-5.0, 0.0])
def test_a_rotary_base_that_is_no_positive_number_is_refused(gqa_llama, base, tmp_path):
    """A negative base loaded without a word, and every rotary angle was NaN (a negative number to a fractional
    power); 0 gave infinite frequencies. check_rope_parameters refuses the same in a config.json."""
    source = _llama_gguf(gqa_llama, tmp_path / "gqa.gguf")
    path = rewrite_gguf(source, tmp_path / "bad.gguf",
                        fields={"llama.rope.freq_base": (base, gguf.GGUFValueType.FLOAT32)})

    with pytest.raises(ModelSourceError, match=r"llama\.rope\.freq_base -?0?\d*\.0, where the rotary base is a number > 0"):
        _load(path)
