"""Review of model loading (edgesdk/models/loader.py), round 48: faults found and fixed, each shown on a real file
compared with what llama.cpp (or the Hugging Face checkpoint the file was converted from) computes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.gguf_files import close_gguf, one_layer_llama_gguf

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

# Hugging Face parameter -> llama.cpp tensor, per layer (convert_hf_to_gguf.py's LlamaModel)
LAYER_TENSORS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def _llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute``: a query / key weight's rows in llama.cpp's rotary order."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _convert_to_gguf(model, path, head_count_kv: bool):
    """``model`` (a tiny LlamaForCausalLM, tied) written as llama.cpp's converter writes it: float32 tensors, the
    query / key rows permuted, ``llama.attention.head_count_kv`` only where ``head_count_kv``."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", config.num_hidden_layers), ("embedding_length", config.hidden_size),
                       ("attention.head_count", config.num_attention_heads), ("context_length", 128),
                       ("feed_forward_length", config.intermediate_size)):
        writer.add_uint32(f"llama.{key}", value)
    if head_count_kv:
        writer.add_uint32("llama.attention.head_count_kv", config.num_key_value_heads)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_float32("llama.rope.freq_base", config.rope_parameters["rope_theta"])
    tokens = ["<unk>", "<s>", "</s>"] + [f"t{index}" for index in range(config.vocab_size - 3)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    weights = {name: tensor.detach().numpy().astype(np.float32) for name, tensor in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    for layer in range(config.num_hidden_layers):
        for hf_name, gguf_name in LAYER_TENSORS.items():
            tensor = weights[f"model.layers.{layer}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                tensor = _llama_cpp_permute(tensor, config.num_attention_heads)
            elif gguf_name == "attn_k":
                tensor = _llama_cpp_permute(tensor, config.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", tensor)
    return close_gguf(writer, path)


@pytest.mark.parametrize("head_count_kv", [False, True])
def test_a_llama_gguf_without_head_count_kv_gets_its_query_key_rows_back_in_order(head_count_kv, tmp_path):
    """gguf.md makes ``llama.attention.head_count_kv`` optional (absent: no grouped-query attention) and llama.cpp
    then takes n_head_kv = n_head; its converter permutes the query / key rows all the same. transformers' GGUF
    reader undoes the permutation only where the file gives head_count_kv (LlamaTensorProcessor returns the rows
    as stored when the count is None), so such a file loaded with its attention rows scrambled: other logits than
    the model it was converted from, without a word."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.tiny import tiny_llama

    original = tiny_llama(heads=4, kv_heads=4)  # multi-head attention: head_count_kv may be left out
    path = _convert_to_gguf(original, tmp_path / "mha.gguf", head_count_kv)
    loaded = load_model(resolve_model(str(path)), progress=False).model
    for layer, source in zip(loaded.model.layers, original.model.layers, strict=True):
        assert torch.equal(layer.self_attn.q_proj.weight, source.self_attn.q_proj.weight)
        assert torch.equal(layer.self_attn.k_proj.weight, source.self_attn.k_proj.weight)
    ids = torch.tensor([[1, 5, 9, 33, 7, 100, 250]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, original(ids).logits, rtol=0, atol=1e-5)


def _bpe_gguf(path, pre: str, tokens: list[str] | None = None, merges: tuple[str, ...] = ("a b",),
              add_bos: bool | None = None):
    """A one-layer Llama GGUF with a BPE vocabulary (tokenizer.ggml.model gpt2), by default holding the token "abc"
    that no merge makes (the one merge, "a b", makes "ab"), tokenizer.ggml.pre ``pre`` and, unless ``add_bos`` is
    given, no tokenizer.ggml.add_bos_token."""
    tokens = tokens or ["<unk>", "<s>", "</s>", *"abcdefgh", "ab", "abc"]
    flags = {} if add_bos is None else {"add_bos_token": add_bos}
    return one_layer_llama_gguf(path, "gpt2", tokens, [2, 3, 3] + [1] * (len(tokens) - 3), merges=list(merges), pre=pre,
                                **flags)


@pytest.mark.parametrize(("pre", "expected"), [
    ("llama-bpe", [1, 12]),  # Llama 3: BOS by default, "abc" whole (ignore_merges)
    ("tekken", [1, 12]),  # Mistral Nemo's tekken: the same two settings in llama.cpp
    ("jina-v5-nano", [1, 12]),  # read as LLAMA_VOCAB_PRE_TYPE_LLAMA3 too
    ("smollm", [11, 5]),  # neither: no BOS, the merges decide ("ab" "c")
])
def test_a_bpe_gguf_tokenizes_with_llama_cpps_bos_and_ignore_merges(pre, expected, tmp_path):
    """llama.cpp (src/llama-vocab.cpp, llama_vocab::impl::load) sets ``ignore_merges = true`` for the Llama 3
    pre-tokenizers and tekken: a pre-token the vocabulary holds whole is that token, whatever the merges make of
    it (Llama 3's own tokenizer.json says "ignore_merges": true). transformers' GGUF tokenizer built its BPE model
    without it, so such a word came out as other tokens than llama.cpp's, in the bundle's tokenizer.json too. And
    llama.cpp adds a BOS to tekken's text (Mistral Nemo) where the file has no tokenizer.ggml.add_bos_token, as for
    Llama 3's: edgesdk added it for the Llama 3 names only."""
    from tokenizers import Tokenizer

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    path = _bpe_gguf(tmp_path / "bpe.gguf", pre)
    tokenizer = load_model(resolve_model(str(path)), progress=False).tokenizer
    assert tokenizer("abc").input_ids == expected
    tokenizer.save_pretrained(tmp_path / "saved")  # what the bundle's tokenizer.json is written from
    assert Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json")).encode("abc").ids == expected


def test_a_model_larger_than_the_memory_is_refused_before_its_weights_load(tmp_path):
    """A model whose float32 weights (what the loader makes of any checkpoint) take more memory than the host has
    went on to load: it swapped for hours or was killed for lack of memory (here, where the weights do not fit the
    config, it got as far as the shape check). It is now refused first, with the estimate and what is available."""
    from pathlib import Path

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.tiny import save_tiny_model_dir

    meminfo = Path("/proc/meminfo")
    available = next((int(line.split()[1]) * 1024 for line in meminfo.read_text().splitlines()
                      if line.startswith("MemAvailable:")), None) if meminfo.exists() else None
    if available is None or available > 1.4 * 2 ** 40:
        pytest.skip("the host's available memory is unknown (not Linux), or more than the model needs")

    model_dir = save_tiny_model_dir(tmp_path / "model")
    config = json.loads((model_dir / "config.json").read_text())
    # Llama 3.1 405B's sizes: about 1.5 TiB in float32
    config.update(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                  num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False)
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelSourceError, match=r"has 405\.\d\d billion parameters, which load as float32 \(the "
                                               r"precision edgesdk compresses from\) in about 15\d\d\.\d GiB, and "
                                               r"this machine has [\d.]+ GiB of memory available") as refused:
        load_model(resolve_model(str(model_dir)), progress=False)
    assert "at least 15" in refused.value.fix
    assert "GiB of free memory" in refused.value.fix


def test_a_gguf_tensor_type_gguf_py_cannot_dequantize_is_named_not_called_damaged(tmp_path):
    """transformers de-quantizes every GGUF tensor with gguf-py's ``quants.dequantize``, which raises
    NotImplementedError for some types ggml stores (F64, Q1_0, the integer types): the load failed with "check
    that the file is a complete, uncorrupted GGUF file (download it again ...)", sending the user to download a
    sound file again. It is now refused before the weights load, naming the type and its tensors."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    source = gguf.GGUFReader(str(_bpe_gguf(tmp_path / "f32.gguf", "smollm")))
    path = tmp_path / "f64.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, field in source.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), field.types[0])
    for tensor in source.tensors:  # the norms in float64, as ggml's GGML_TYPE_F64 stores them
        data = np.asarray(tensor.data)
        writer.add_tensor(tensor.name, data.astype(np.float64) if tensor.name.endswith("norm.weight") else data)
    close_gguf(writer, path)
    with pytest.raises(ModelSourceError, match=r"holds tensors of a type the installed gguf package cannot "
                                               r"de-quantize: F64 \(3 tensor\(s\): blk\.0\.attn_norm\.weight, "
                                               r"blk\.0\.ffn_norm\.weight, output_norm\.weight\)") as refused:
        load_model(resolve_model(str(path)), progress=False)
    assert "download it again" not in refused.value.fix
    assert "llama-quantize" in refused.value.fix


def test_the_memory_available_counts_reclaimable_page_cache_and_the_process_s_own_cgroup(tmp_path):
    """A container's limit is its cgroup's memory.max; memory.current counts the page cache of files read (a model
    just downloaded), which the kernel gives back before it kills, so a model that fits was refused. The limit of the
    process's own cgroup (from /proc/self/cgroup) and its ancestors is read, not only the root's."""
    from edgesdk.models.loader import available_memory

    gib = 2**30
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: {64 * gib // 1024} kB\nMemAvailable: {48 * gib // 1024} kB\n")
    (tmp_path / "proc/self/cgroup").write_text("0::/box/job\n")
    job = tmp_path / "sys/fs/cgroup/box/job"
    job.mkdir(parents=True)
    (job / "memory.max").write_text(f"{8 * gib}\n")
    (job / "memory.current").write_text(f"{7 * gib}\n")
    (job / "memory.stat").write_text(f"anon {2 * gib}\nfile {5 * gib}\ninactive_file {5 * gib}\n")
    (job.parent / "memory.max").write_text("max\n")
    assert available_memory(tmp_path) == 6 * gib  # 8 GiB less the 2 GiB it cannot give back
    (job.parent / "memory.max").write_text(f"{4 * gib}\n")
    (job.parent / "memory.current").write_text(f"{1 * gib}\n")
    assert available_memory(tmp_path) == 3 * gib  # an ancestor's tighter limit
    (tmp_path / "proc/self/cgroup").write_text("0::/\n")
    assert available_memory(tmp_path) == 48 * gib  # no limit at the root: MemAvailable
