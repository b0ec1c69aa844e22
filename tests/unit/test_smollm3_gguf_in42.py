"""SmolLM3 GGUF files (llama.cpp's ``smollm3`` architecture) as ``edgesdk build --model FILE.gguf``.

transformers' GGUF reader has no smollm3 mapping, so edgesdk reads the file itself (edgesdk/models/loader.py:
_smollm3_config, _read_smollm3_gguf) into a transformers ``SmolLM3ForCausalLM``. llama.cpp's smollm3
(src/models/smollm3.cpp) is Llama's tensors with the query / key rows in its pairwise rotary order and no rotary in a
layer ``il`` where ``(il + 1) % 4 == 0``; nothing about NoPE is stored in the file. Checked here: a bundle exported to
GGUF and built again computes the original bundle's logits with its NoPE layers where they were; the loaded model has
the weights, config and tokenizer transformers' llama reader takes from the same file renamed to llama (the
architecture whose keys the smollm3 ones mirror), also de-quantized from Q8_0; a file laid out as llama.cpp's
converter writes one (6 layers, tied) computes the Hugging Face model's logits and llama.cpp's; files llama.cpp would
refuse or read differently are refused by name. Comparisons print their max abs logit difference (``-s``) and record
it as ``max_abs_diff``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import add_tokenizer_keys, close_gguf, rewrite_gguf
from tests._utils.parity import report_max_abs_diff
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
SMOLLM3 = {"model_type": "smollm3", "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128}
IDS = [5, 17, 120, 33, 250, 9, 101, 3, 42, 7, 99, 12]
needs_llama_cpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (pip install llama-cpp-python)")


def _bundle_logits(bundle) -> np.ndarray:
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    return bundle_scorer(open_runtime(bundle.path, threads=1))(np.array(IDS))


def _nope_layers(bundle) -> list[int]:
    from edgesdk.export.bundle_weights import read_bundle_decoder

    decoder = read_bundle_decoder(bundle.path, bundle.manifest)
    return [index for index, layer in enumerate(decoder.layers) if layer.rope is None]


def _load(path: Path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A float32 SmolLM3 bundle of 8 layers (NoPE at 3 and 7, untied, weights at 10x transformers' spread so that
    attention depends on position), its GGUF export (edgesdk export writes llama.cpp's smollm3) and the bundle
    built again from that file with --model FILE.gguf."""
    from edgesdk.export.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("smollm3-gguf-in")
    model_dir = save_tiny_model_dir(root / "model", **SMOLLM3, layers=8, tie=False,
                                    config_overrides={"initializer_range": 0.2})
    (root / "original").mkdir()
    (root / "rebuilt").mkdir()
    original = build_tiny_bundle(root / "original", FUSED_FP32, "host", model_dir=model_dir, generated_sequences=0)
    report = export_gguf(original.path, root / "model.gguf")
    rebuilt = build_tiny_bundle(root / "rebuilt", FUSED_FP32, "host", model_dir=report.path, generated_sequences=0)
    return original, report.path, rebuilt


# ---------------------------------------------------------------------------------------------- edgesdk's own file
def test_a_bundle_built_from_its_smollm3_gguf_computes_the_original_bundle_s_logits(exported, record_property):
    original, path, rebuilt = exported
    assert rebuilt.manifest["model"]["before"]["architecture"] == "smollm3"
    assert rebuilt.manifest["model"]["before"]["format"] == "gguf"
    assert _nope_layers(original) == _nope_layers(rebuilt) == [3, 7]
    expected = _bundle_logits(original)
    scale = float(np.abs(expected).max())
    diff = float(np.abs(_bundle_logits(rebuilt) - expected).max())
    report_max_abs_diff(f"bundle rebuilt from its smollm3 GGUF vs the original bundle, logit scale {scale:.1f}",
                        diff, 1e-5 * max(scale, 1.0), record_property)


@pytest.mark.parametrize("quantize", [None, "Q8_0"])
def test_the_loaded_model_is_what_transformers_llama_reader_takes_from_the_same_file(exported, tmp_path, quantize):
    """The smollm3.* keys mean what llama.* do and the tensors are Llama's: the same file renamed to llama, read by
    transformers' llama GGUF reader (which un-permutes q / k rows and de-quantizes with gguf-py), gives the same
    weights bit for bit, the same config values and the same tokenizer; only the NoPE layers are SmolLM3's."""
    _, path, _ = exported
    kind = None if quantize is None else getattr(gguf.GGMLQuantizationType, quantize)
    source = path if kind is None else rewrite_gguf(path, tmp_path / "q8.gguf", architecture="smollm3", quantize=kind)
    as_llama = rewrite_gguf(path, tmp_path / "as-llama.gguf", architecture="llama", quantize=kind)
    smollm3, llama = _load(source), _load(as_llama)
    assert type(smollm3.model).__name__ == "SmolLM3ForCausalLM"
    assert smollm3.model.config.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0]
    ours, theirs = smollm3.model.state_dict(), llama.model.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    if kind is not None:  # the Q8_0 file's weights are not the float32 file's
        assert not torch.equal(ours["model.layers.0.self_attn.q_proj.weight"],
                               _load(path).model.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    shared = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
              "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "hidden_act", "attention_bias",
              "mlp_bias", "dtype")
    mine, reference = smollm3.model.config, llama.model.config
    assert {key: getattr(mine, key) for key in shared} == {key: getattr(reference, key) for key in shared}
    assert smollm3.model.generation_config.to_dict() == llama.model.generation_config.to_dict()
    assert smollm3.tokenizer.backend_tokenizer.to_str() == llama.tokenizer.backend_tokenizer.to_str()
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "chat_template", "add_bos_token",
                 "add_eos_token"):
        assert getattr(smollm3.tokenizer, name) == getattr(llama.tokenizer, name), name


# ---------------------------------------------------------------------------------------------- llama.cpp's layout
def _converter_file(model_dir: Path, target: Path, tokenizer_from: Path) -> Path:
    """The Hugging Face SmolLM3 in ``model_dir`` written as llama.cpp's convert_hf_to_gguf.py writes it
    (SmolLM3Model(LlamaModel): LlamaModel.set_gguf_parameters' keys, the q / k rows through LlamaModel.permute, no
    output.weight for a tied embedding), float32, with the tokenizer.ggml.* keys of ``tokenizer_from`` (the same
    tiny tokenizer)."""
    from transformers import AutoModelForCausalLM

    from tests.unit._lora_files41 import llama_cpp_permute

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = model.config
    state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(target), "smollm3")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tokenizer_keys(writer, tokenizer_from)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for index in range(config.num_hidden_layers):
        prefix = f"model.layers.{index}."
        q = llama_cpp_permute(state[prefix + "self_attn.q_proj.weight"], config.num_attention_heads,
                              config.num_attention_heads)
        k = llama_cpp_permute(state[prefix + "self_attn.k_proj.weight"], config.num_attention_heads,
                              config.num_key_value_heads)
        for gguf_name, value in (("attn_norm", state[prefix + "input_layernorm.weight"]), ("attn_q", q),
                                 ("attn_k", k), ("attn_v", state[prefix + "self_attn.v_proj.weight"]),
                                 ("attn_output", state[prefix + "self_attn.o_proj.weight"]),
                                 ("ffn_norm", state[prefix + "post_attention_layernorm.weight"]),
                                 ("ffn_gate", state[prefix + "mlp.gate_proj.weight"]),
                                 ("ffn_up", state[prefix + "mlp.up_proj.weight"]),
                                 ("ffn_down", state[prefix + "mlp.down_proj.weight"])):
            writer.add_tensor(f"blk.{index}.{gguf_name}.weight", np.ascontiguousarray(value))
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not config.tie_word_embeddings:
        writer.add_tensor("output.weight", state["lm_head.weight"])
    return close_gguf(writer, target)


@pytest.fixture(scope="module")
def converter_layout(exported, tmp_path_factory):
    """A 6-layer tied SmolLM3 (NoPE at 3 only: layer 5 is rotated, (5 + 1) % 4 != 0) in llama.cpp's converter
    layout, its Hugging Face logits, and the bundle built from the file."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("smollm3-converter")
    model_dir = save_tiny_model_dir(root / "model", **SMOLLM3, layers=6, tie=True, seed=3,
                                    config_overrides={"initializer_range": 0.2})
    path = _converter_file(model_dir, root / "smollm3-6.gguf", exported[1])
    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    assert reference.config.no_rope_layers == [1, 1, 1, 0, 1, 1]
    with torch.no_grad():
        logits = reference(torch.tensor([IDS])).logits[0].numpy()
    bundle = build_tiny_bundle(root, FUSED_FP32, "host", model_dir=path, generated_sequences=0)
    return path, logits, bundle


def test_a_six_layer_file_in_llama_cpp_s_layout_computes_the_hugging_face_model(converter_layout, record_property):
    path, expected, bundle = converter_layout
    assert _nope_layers(bundle) == [3]
    assert bundle.manifest["model"]["before"]["tie_word_embeddings"] is True
    scale = float(np.abs(expected).max())
    report_max_abs_diff(f"bundle built from a 6-layer smollm3 file vs transformers' SmolLM3, logit scale {scale:.1f}",
                        float(np.abs(_bundle_logits(bundle) - expected).max()), 1e-5 * max(scale, 1.0), record_property)


@needs_llama_cpp
def test_llama_cpp_computes_what_the_bundle_built_from_its_file_does(converter_layout, record_property):
    """llama.cpp's smollm3 over the same file (F32 KV cache, child process) against the bundle built from it."""
    from tests._utils.gguf_files import llama_cpp_child

    path, _, bundle = converter_layout
    expected = _bundle_logits(bundle)
    got = llama_cpp_child(path, IDS, f32_cache=True)[0]
    scale = float(np.abs(expected).max())
    report_max_abs_diff(f"llama.cpp smollm3 vs the bundle built from the file, logit scale {scale:.1f}",
                        float(np.abs(got - expected).max()), 1e-4 * max(scale, 1.0), record_property)


# ---------------------------------------------------------------------------------------------- refusals
U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


@pytest.mark.parametrize(("change", "told"), [
    ({"drop": ("smollm3.context_length",)}, "without smollm3.context_length, which llama.cpp requires"),
    ({"drop": ("smollm3.attention.layer_norm_rms_epsilon",)},
     "without smollm3.attention.layer_norm_rms_epsilon, which llama.cpp requires"),
    ({"fields": {"smollm3.rope.dimension_count": (8, U32)}},
     "rotates 8 of each head's 16 dimensions (smollm3.rope.dimension_count)"),
    ({"tensors": {"blk.0.attn_q.bias": np.zeros(64)}}, "1 tensor(s) llama.cpp's smollm3 does not read into the "
                                                        "model edgesdk builds: blk.0.attn_q.bias"),
    ({"tensors": {"blk.8.attn_norm.weight": np.ones(64)}}, "does not read into the model edgesdk builds: "
                                                           "blk.8.attn_norm.weight"),
    ({"tensors": {"rope_freqs.weight": np.ones(8)}}, "which llama.cpp's smollm3 architecture does not read"),
    ({"fields": {"smollm3.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING),
                 "smollm3.rope.scaling.factor": (4.0, F32)}}, "smollm3.rope.scaling.type = 'yarn'"),
], ids=["no-context", "no-eps", "partial-rotary", "q-bias", "extra-layer", "rope-freqs", "yarn"])
def test_files_llama_cpp_refuses_or_reads_otherwise_are_refused_by_name(exported, tmp_path, change, told):
    from edgesdk.models.loader import check_gguf_model

    changed = rewrite_gguf(exported[1], tmp_path / "changed.gguf", **change)
    with pytest.raises(ModelSourceError) as refused:
        check_gguf_model(changed)
    assert told in str(refused.value)
    assert refused.value.fix


def test_per_layer_head_counts_that_differ_are_refused(exported, tmp_path):
    """llama.cpp reads a head count per layer (get_key_or_arr); edgesdk's decoder has one for every layer."""
    from edgesdk.models.loader import check_gguf_model

    changed = rewrite_gguf(exported[1], tmp_path / "per-layer.gguf",
                           arrays={"smollm3.attention.head_count_kv": [2, 2, 2, 1, 2, 2, 2, 2]})
    with pytest.raises(ModelSourceError, match="gives a different smollm3.attention.head_count_kv per layer"):
        check_gguf_model(changed)
    same = rewrite_gguf(exported[1], tmp_path / "same.gguf", arrays={"smollm3.attention.head_count_kv": [2] * 8})
    assert check_gguf_model(same)["num_key_value_heads"] == 2


def test_a_token_count_other_than_the_embedding_s_is_refused(exported, tmp_path):
    from edgesdk.models.loader import check_gguf_model

    tokens = gguf.GGUFReader(str(exported[1])).fields["tokenizer.ggml.tokens"].contents()
    changed = rewrite_gguf(exported[1], tmp_path / "short-vocab.gguf", arrays={"tokenizer.ggml.tokens": tokens[:-1]})
    with pytest.raises(ModelSourceError, match="has 319 tokens \\(tokenizer.ggml.tokens\\) for an embedding of 320 rows"):
        check_gguf_model(changed)


def test_a_tensor_whose_shape_the_sizes_do_not_give_is_refused_by_name(exported, tmp_path):
    changed = rewrite_gguf(exported[1], tmp_path / "changed.gguf", fields={"smollm3.feed_forward_length": (96, U32)})
    with pytest.raises(ModelSourceError, match="holds blk.0.ffn_gate.weight of shape \\(128, 64\\), where its "
                                               "smollm3.\\* sizes make it \\(96, 64\\)"):
        _load(changed)
