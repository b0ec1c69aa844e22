"""Review of model loading (edgesdk/models/loader.py), round 59: faults found and fixed, each shown on a tiny GGUF
file compared with what llama.cpp reads from it, or with the fix a user can run as written."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.gguf_files import close_gguf

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

WIDTH, FFN, VOCAB, HEADS = 64, 96, 16, 4


def _tiny_gguf(path, arch: str = "llama", kv_heads: int | None = HEADS, extra: dict | None = None):
    """A one-layer GGUF of ``arch`` (width 64, 4 heads of 16, ``kv_heads`` key-value heads, ``None``: no
    ``{arch}.attention.head_count_kv`` key, as gguf.md allows for a model without GQA) with random float32 weights
    (Qwen2's q/k/v biases and Qwen3's query / key norms where the architecture has them), a SentencePiece vocabulary
    of 16 tokens, and the keys of ``extra`` (key -> (value, GGUFValueType))."""
    writer = gguf.GGUFWriter(str(path), arch)
    sizes = {"block_count": 1, "embedding_length": WIDTH, "attention.head_count": HEADS, "context_length": 128,
             "feed_forward_length": FFN}
    if kv_heads is not None:
        sizes["attention.head_count_kv"] = kv_heads
    for key, value in sizes.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    for key, (value, kind) in (extra or {}).items():
        writer.add_key_value(key, value, kind)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{index}" for index in range(VOCAB - 3)])
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    head = WIDTH // HEADS
    kv_width = (kv_heads or HEADS) * head
    shapes = {"token_embd.weight": (VOCAB, WIDTH), "output_norm.weight": (WIDTH,), "output.weight": (VOCAB, WIDTH),
              "blk.0.attn_norm.weight": (WIDTH,), "blk.0.attn_q.weight": (WIDTH, WIDTH),
              "blk.0.attn_k.weight": (kv_width, WIDTH), "blk.0.attn_v.weight": (kv_width, WIDTH),
              "blk.0.attn_output.weight": (WIDTH, WIDTH), "blk.0.ffn_norm.weight": (WIDTH,),
              "blk.0.ffn_gate.weight": (FFN, WIDTH), "blk.0.ffn_up.weight": (FFN, WIDTH),
              "blk.0.ffn_down.weight": (WIDTH, FFN)}
    if arch == "qwen2":
        shapes.update({"blk.0.attn_q.bias": (WIDTH,), "blk.0.attn_k.bias": (kv_width,),
                       "blk.0.attn_v.bias": (kv_width,)})
    if arch == "qwen3":
        shapes.update({"blk.0.attn_q_norm.weight": (head,), "blk.0.attn_k_norm.weight": (head,)})
    random = np.random.default_rng(0)
    for name, shape in shapes.items():
        writer.add_tensor(name, random.standard_normal(shape).astype(np.float32))
    return close_gguf(writer, path)


def _split_part(directory):
    """Part 2 of 3 of a split GGUF (llama.cpp's gguf-split keys) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return _tiny_gguf(directory / "tiny-00002-of-00003.gguf",
                      extra={"split.count": (3, gguf.GGUFValueType.UINT16),
                             "split.no": (1, gguf.GGUFValueType.UINT16)})


def test_a_split_part_in_a_directory_with_a_space_is_told_to_merge_the_first_part_quoted(tmp_path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    part = _split_part(tmp_path / "my models")
    with pytest.raises(ModelSourceError) as caught:
        load_model(resolve_model(str(part)), progress=False)
    first = str(part.with_name("tiny-00001-of-00003.gguf"))
    command = caught.value.fix.split("llama-gguf-split ", 1)[1].split(", and pass", 1)[0]
    assert shlex.split(command) == ["--merge", first, "merged.gguf"]  # a shell gives llama-gguf-split one path
    assert caught.value.fix.endswith("pass merged.gguf with --model")


def test_a_split_part_loaded_for_build_bundle_names_its_model_argument_not_the_cli_flag(tmp_path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    part = _split_part(tmp_path / "parts")
    with pytest.raises(ModelSourceError) as caught:
        load_model(resolve_model(str(part)), progress=False, terms="python")
    assert "--model" not in caught.value.fix
    assert caught.value.fix.endswith("pass merged.gguf as build_bundle()'s model")


def test_a_gguf_lora_adapter_is_told_to_go_as_build_bundles_lora_argument_its_path_quoted(tmp_path):
    from edgesdk.models.loader import check_gguf_model

    (tmp_path / "my adapters").mkdir()
    adapter = _tiny_gguf(tmp_path / "my adapters" / "adapter.gguf",
                         extra={"general.type": ("adapter", gguf.GGUFValueType.STRING)})
    with pytest.raises(ModelSourceError) as caught:
        check_gguf_model(adapter)
    assert f"--lora {shlex.quote(str(adapter))}" in caught.value.fix
    with pytest.raises(ModelSourceError) as caught:
        check_gguf_model(adapter, terms="python")
    assert "--model" not in caught.value.fix
    assert "edgesdk build" not in caught.value.fix
    assert f"build_bundle(target, model=BASE, lora={str(adapter)!r})" in caught.value.fix


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_file_without_head_count_kv_loads_one_key_value_head_per_head_as_llama_cpp(tmp_path, arch):
    """llama.cpp takes n_head_kv = n_head where the key is absent; transformers' reader left Qwen2Config's /
    Qwen3Config's default of 32 key-value heads, and the file was refused as a damaged download."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    without = load_model(resolve_model(str(_tiny_gguf(tmp_path / "without.gguf", arch, kv_heads=None))),
                         progress=False)
    written = load_model(resolve_model(str(_tiny_gguf(tmp_path / "written.gguf", arch, kv_heads=HEADS))),
                         progress=False)
    assert without.model.config.num_key_value_heads == HEADS
    ids = torch.tensor([[1, 5, 9, 3, 14, 7]])
    with torch.no_grad():
        assert torch.equal(without.model(ids).logits, written.model(ids).logits)


def _gemma3_gguf(path, freq_base: float | None):
    """A six-layer Gemma 3 GGUF (width 64, 4 heads of 16, 2 key-value heads, window 4; the sixth layer global, as
    llama.cpp's gemma3 makes every sixth) with random float32 weights, ``gemma3.rope.freq_base`` only where given."""
    writer = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in {"block_count": 6, "embedding_length": WIDTH, "attention.head_count": HEADS,
                       "attention.head_count_kv": 2, "context_length": 128, "feed_forward_length": FFN,
                       "attention.key_length": 16, "attention.value_length": 16,
                       "attention.sliding_window": 4}.items():
        writer.add_uint32(f"gemma3.{key}", value)
    writer.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    if freq_base is not None:
        writer.add_float32("gemma3.rope.freq_base", freq_base)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<pad>", "<eos>", "<bos>", "<unk>"] + [f"t{index}" for index in range(VOCAB - 4)])
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types([3, 3, 3, 2] + [1] * (VOCAB - 4))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_bool("tokenizer.ggml.add_space_prefix", False)
    random = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", random.standard_normal((VOCAB, WIDTH)).astype(np.float32))
    writer.add_tensor("output_norm.weight", random.standard_normal(WIDTH).astype(np.float32))
    for layer in range(6):
        for name, shape in {"attn_norm": (WIDTH,), "attn_q": (WIDTH, WIDTH), "attn_k": (32, WIDTH),
                            "attn_v": (32, WIDTH), "attn_output": (WIDTH, WIDTH), "attn_q_norm": (16,),
                            "attn_k_norm": (16,), "post_attention_norm": (WIDTH,), "ffn_norm": (WIDTH,),
                            "ffn_gate": (FFN, WIDTH), "ffn_up": (FFN, WIDTH), "ffn_down": (WIDTH, FFN),
                            "post_ffw_norm": (WIDTH,)}.items():
            writer.add_tensor(f"blk.{layer}.{name}.weight", random.standard_normal(shape).astype(np.float32))
    return close_gguf(writer, path)


def test_a_gemma3_file_without_freq_base_rotates_its_global_layers_at_llama_cpps_base(tmp_path):
    """llama.cpp's rope_freq_base is 10,000 where the file has no rope.freq_base, for Gemma 3's global layers too;
    transformers' reader left Gemma3TextConfig's 1,000,000, so those layers rotated otherwise than llama.cpp's."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    without = load_model(resolve_model(str(_gemma3_gguf(tmp_path / "without.gguf", None))), progress=False)
    written = load_model(resolve_model(str(_gemma3_gguf(tmp_path / "written.gguf", 10_000.0))), progress=False)
    assert without.model.config.rope_parameters["full_attention"]["rope_theta"] == 10_000.0
    assert "full_attention" in without.model.config.layer_types
    ids = torch.tensor([[2, 5, 9, 3, 14, 7, 6, 11, 12, 4]])
    with torch.no_grad():
        assert torch.equal(without.model(ids).logits, written.model(ids).logits)


def test_build_bundle_s_split_part_is_told_in_the_python_api_s_terms(tmp_path):
    """The pipeline loads its model with the build's terms, so ``build_bundle()`` names its own argument."""
    from edgesdk.api import build_bundle
    from edgesdk.errors import EdgeSDKError

    part = _split_part(tmp_path / "parts")
    with pytest.raises(EdgeSDKError) as caught:
        build_bundle("rpi5", model=str(part), out=tmp_path / "bundle", progress=False)
    assert "--model" not in caught.value.fix, caught.value.fix
    assert "build_bundle()'s model" in caught.value.fix
