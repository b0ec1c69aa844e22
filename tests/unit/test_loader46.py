"""Review of model loading (edgesdk/models/loader.py): faults found and fixed, each shown on a real file."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.gguf_files import close_gguf, one_layer_llama_gguf

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

U32 = gguf.GGUFValueType.UINT32


def _gguf_file(path, arch: str, rope_dims: int | None, width: int = 64, heads: int = 2):
    """A GGUF file with the keys and the embedding check_gguf_model reads (head size width / heads), and
    ``{arch}.rope.dimension_count`` ``rope_dims`` where given."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32(f"{arch}.block_count", 1)
    writer.add_uint32(f"{arch}.embedding_length", width)
    writer.add_uint32(f"{arch}.attention.head_count", heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", 1)
    writer.add_uint32(f"{arch}.context_length", 128)
    writer.add_uint32(f"{arch}.feed_forward_length", 96)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if rope_dims is not None:
        writer.add_key_value(f"{arch}.rope.dimension_count", rope_dims, U32)
    writer.add_tensor("token_embd.weight", np.zeros((16, width), np.float32))
    return close_gguf(writer, path)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_a_rotary_over_part_of_each_head_is_refused_not_loaded_as_a_whole_head(arch, tmp_path):
    """llama.cpp reads ``{arch}.rope.dimension_count`` as n_rot: its llama refuses a file whose n_rot is not the
    head size ("invalid n_rot: %u, expected %u", llama-model.cpp load_hparams), and its qwen2 / qwen3 graphs
    rotate only the first n_rot dimensions of each head. The loader took the head size (width / heads, or
    key_length) as head_dim and left the count unread, so such a file loaded with rotary over the whole head
    without a word: answers other than llama.cpp's."""
    from edgesdk.models.loader import check_gguf_model

    partial = _gguf_file(tmp_path / "partial.gguf", arch, rope_dims=16)
    with pytest.raises(ModelSourceError, match=rf"rotates 16 of each head's 32 dimensions \({arch}\.rope\."
                                               r"dimension_count 16") as refused:
        check_gguf_model(partial)
    assert f"{arch}.rope.dimension_count is the head size (32)" in refused.value.fix
    # the whole head, or no count (llama.cpp's default: the head size), loads as before
    for dims in (32, None):
        assert check_gguf_model(_gguf_file(tmp_path / f"whole-{dims}.gguf", arch, rope_dims=dims)) \
            .get("head_dim") == 32


@pytest.mark.parametrize("extra", ["model.layers.0.self_attn.q_proj.bias", "model.layers.2.mlp.up_proj.weight"])
def test_weights_the_config_has_no_place_for_are_refused_not_dropped(extra, tmp_path):
    """A checkpoint whose config.json gives no place to some of its tensors (q/k/v biases with attention_bias
    off, a third layer where num_hidden_layers is 2) loaded with those tensors dropped: transformers only logs
    them as UNEXPECTED, and the model computed something other than its checkpoint. llama.cpp refuses a file
    with tensors its model does not read (``done_getting_tensors``: "wrong number of tensors")."""
    from safetensors.torch import load_file, save_file

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model")
    weights = load_file(model_dir / "model.safetensors")
    clean = load_model(resolve_model(str(model_dir)), progress=False)  # the checkpoint as saved loads
    assert clean.model.config.num_hidden_layers == 2
    weights[extra] = torch.ones((64,) if extra.endswith("bias") else (112, 64))
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelSourceError, match=r"holds 1 weight\(s\) its config.json has no place for, which "
                                               rf"transformers would drop: {extra.replace('.', '[.]')}") as refused:
        load_model(resolve_model(str(model_dir)), progress=False)
    assert "num_hidden_layers, attention_bias, mlp_bias" in refused.value.fix


def test_a_mixture_of_experts_gguf_is_named_as_such_not_as_an_incomplete_file(tmp_path):
    """Mixtral's GGUF files are llama files with ``llama.expert_count`` and expert FFN tensors
    (``blk.N.ffn_gate_exps`` ...), which transformers' reader leaves out: the load stopped at "lacks 3 weight(s)
    ... check that every weight file of the model is complete", which sends the user to download the model again."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    width, ffn, vocab, experts = 64, 96, 16, 4
    path = tmp_path / "tiny-moe.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 1), ("embedding_length", width), ("attention.head_count", 2),
                       ("attention.head_count_kv", 1), ("context_length", 128), ("feed_forward_length", ffn),
                       ("expert_count", experts), ("expert_used_count", 2)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{index}" for index in range(vocab)])
    writer.add_token_types([1] * vocab)
    writer.add_token_merges([])
    shapes = {"token_embd.weight": (vocab, width), "output_norm.weight": (width,), "output.weight": (vocab, width),
              "blk.0.attn_norm.weight": (width,), "blk.0.attn_q.weight": (width, width),
              "blk.0.attn_k.weight": (32, width), "blk.0.attn_v.weight": (32, width),
              "blk.0.attn_output.weight": (width, width), "blk.0.ffn_norm.weight": (width,),
              "blk.0.ffn_gate_inp.weight": (experts, width), "blk.0.ffn_gate_exps.weight": (experts, ffn, width),
              "blk.0.ffn_up_exps.weight": (experts, ffn, width), "blk.0.ffn_down_exps.weight": (experts, width, ffn)}
    random = np.random.default_rng(0)
    for name, shape in shapes.items():
        writer.add_tensor(name, random.standard_normal(shape).astype(np.float32))
    close_gguf(writer, path)
    with pytest.raises(ModelSourceError, match=r"holds a mixture-of-experts model \(llama.expert_count 4, 2 used "
                                               r"per token") as refused:
        load_model(resolve_model(str(path)), progress=False)
    assert "complete" not in str(refused.value) + refused.value.fix
    assert "dense model" in refused.value.fix


def test_a_head_the_checkpoint_holds_apart_from_a_tied_config_is_recorded_untied(tmp_path):
    """A config.json that says tie_word_embeddings over weights holding an lm_head.weight of its own values (a
    LoRA on lm_head merged into a tied model, as PEFT's merge_and_unload saves it): transformers keeps the two
    apart ("... so we will NOT tie them. You should update the config with `tie_word_embeddings=False`") and
    leaves the config saying tied. The manifest recorded a tied model, and the next ``tie_weights()`` (what a
    model rebuilt from its config does) replaced the head with the embedding."""
    from safetensors.torch import load_file, save_file

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model", tie=True)
    weights = load_file(model_dir / "model.safetensors")
    head = torch.randn_like(weights["model.embed_tokens.weight"])
    weights["lm_head.weight"] = head
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})

    loaded = load_model(resolve_model(str(model_dir)), progress=False)
    assert torch.equal(loaded.model.lm_head.weight, head)  # transformers loads the file's head
    assert loaded.facts()["tie_word_embeddings"] is False
    assert loaded.model.config.tie_word_embeddings is False
    loaded.model.tie_weights()
    assert torch.equal(loaded.model.lm_head.weight, head)
    assert torch.equal(loaded.model.model.embed_tokens.weight, weights["model.embed_tokens.weight"])


def _dense_gguf(path, tokenizer_model: str, pre: str | None, add_bos: bool | None):
    """A one-layer Llama GGUF with a letters-only vocabulary (``tokenizer_model`` gpt2: BPE with one merge, or
    llama: SentencePiece), BOS id 1, ``tokenizer.ggml.pre`` ``pre`` and ``tokenizer.ggml.add_bos_token`` ``add_bos``
    where given."""
    letters = list("abcdefghijklm")
    tokens = ["<unk>", "<s>", "</s>"] + (["\u2581", *letters] if tokenizer_model == "llama" else [*letters, "ab"])
    vocab = len(tokens)
    spm = tokenizer_model == "llama"
    flags = {} if add_bos is None else {"add_bos_token": add_bos}
    return one_layer_llama_gguf(path, tokenizer_model, tokens, [2, 3, 3] + [1] * (vocab - 3),
                                scores=[0.0] * 3 + [-float(index) for index in range(vocab - 3)] if spm else None,
                                merges=None if spm else ["a b"], pre=pre, unk=0, **flags)


@pytest.mark.parametrize(("tokenizer_model", "pre", "add_bos", "bos"), [
    ("gpt2", "llama-bpe", None, True),  # the case fixed: llama.cpp's LLAMA3 pre-tokenizer adds BOS by default
    ("gpt2", "llama-bpe", False, False),  # the key decides where present
    ("gpt2", "smollm", None, False),  # other BPE pre-tokenizers add none by default
    ("llama", None, None, True),  # SentencePiece: BOS by default in both
])
def test_a_llama3_gguf_without_add_bos_token_adds_bos_as_llama_cpp_does(tokenizer_model, pre, add_bos, bos, tmp_path):
    """llama.cpp adds BOS to the text of a BPE vocabulary whose tokenizer.ggml.pre is a Llama 3 one (llama-bpe,
    llama3, ...) where the file has no tokenizer.ggml.add_bos_token (llama-vocab.cpp: ``add_bos = true`` for
    LLAMA_VOCAB_PRE_TYPE_LLAMA3, then the key read if present), as Llama 3 files written before the converter read
    the BOS from tokenizer.json have it; transformers' GGUF tokenizer added none, so every prompt lost its BOS
    (also in the bundle's tokenizer.json)."""
    from tokenizers import Tokenizer

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    path = _dense_gguf(tmp_path / "tiny.gguf", tokenizer_model, pre, add_bos)
    tokenizer = load_model(resolve_model(str(path)), progress=False).tokenizer
    ids = tokenizer("abc").input_ids
    assert (ids[0] == 1) is bos, ids
    tokenizer.save_pretrained(tmp_path / "saved")  # what the bundle's tokenizer.json is written from
    assert (Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json")).encode("abc").ids[0] == 1) is bos


@pytest.mark.parametrize(("extra", "named"), [
    ({"blk.0.attn_q.bias": np.ones(64)}, "blk.0.attn_q.bias"),  # llama.cpp's llama adds it (TENSOR_NOT_REQUIRED)
    ({"blk.1.attn_q.weight": np.ones((64, 64))}, "blk.1.attn_q.weight"),  # a layer past llama.block_count 1
])
def test_gguf_tensors_transformers_drops_are_refused_not_lost(extra, named, tmp_path):
    """transformers' GGUF reader drops the tensors its config has no place for without a word, not even in
    output_loading_info: a llama file's attn_q bias (which llama.cpp's llama adds to the query) or a layer past
    block_count (for which llama.cpp refuses the file: "wrong number of tensors") loaded as if absent."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.gguf_files import rewrite_gguf

    plain = _dense_gguf(tmp_path / "plain.gguf", "gpt2", "smollm", None)
    assert load_model(resolve_model(str(plain)), progress=False).model.config.num_hidden_layers == 1
    changed = rewrite_gguf(plain, tmp_path / "changed.gguf", tensors=extra)
    with pytest.raises(ModelSourceError, match=rf"holds 1 tensor\(s\) that transformers' GGUF reader, through which "
                                               rf"edgesdk loads GGUF files, drops without a word: {named}") as refused:
        load_model(resolve_model(str(changed)), progress=False)
    assert "llama.block_count is 1" in str(refused.value)
    assert "convert the model again" in refused.value.fix
