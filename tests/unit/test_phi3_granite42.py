"""Phi-3 (transformers' ``phi3``) and Granite 3 (``granite``) models, loaded as the Llama decoder they compute
(edgesdk/models/as_llama.py), built, run and compared with the original transformers models.

Tiny models here have 2 layers, GQA (4 query heads, 2 KV heads, head size 16). The Granite ones set all four
multipliers away from 1 (attention 0.05 against 1/sqrt(16) = 0.25, residual 0.3, embedding 3, logits 4), so a
multiplier left out or folded the wrong way changes every logit. Every comparison prints its max abs logit diff
(``-s``) and records it as ``max_abs_diff``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import ExportError, ModelSourceError
from tests._utils.builds import build_tiny_bundle
from tests._utils.parity import bundle_follows_transformers, report_max_abs_diff
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")

TINY = {"hidden": 64, "heads": 4, "kv_heads": 2, "layers": 2, "intermediate": 128}
GRANITE = {"model_type": "granite", "config_overrides": {"attention_multiplier": 0.05, "residual_multiplier": 0.3,
                                                         "embedding_multiplier": 3.0, "logits_scaling": 4.0}}
LONGROPE = {"model_type": "phi3", "max_positions": 64, "config_overrides": {
    "original_max_position_embeddings": 16,
    "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
                        "short_factor": [1.0 + 0.1 * i for i in range(8)],
                        "long_factor": [2.0 + 0.3 * i for i in range(8)]}}}
PROMPT = [5, 17, 120, 33, 250, 9]


def _recipe(form: str, weights: str) -> str:
    return f"name: r\nstages: []\nexport: {{form: {form}, weights: {weights}}}\n"


def _model_dir(tmp_path, **overrides):
    return save_tiny_model_dir(tmp_path / "model", **{**TINY, **overrides})


def _original(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _load(path, **kwargs):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False, **kwargs)


# ---------------------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("overrides", [
    {"model_type": "phi3"},
    {"model_type": "phi3", "tie": False},
    LONGROPE,
    GRANITE,
    {**GRANITE, "tie": False},
], ids=["phi3-tied", "phi3-untied", "phi3-longrope", "granite-tied", "granite-untied"])
def test_the_loaded_llama_gives_the_original_models_logits(overrides, tmp_path, record_property):
    """40 tokens (past the longrope case's original context of 16, where both switch to the long factors)."""
    path = _model_dir(tmp_path, **overrides)
    loaded = _load(path)
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    facts = loaded.facts()
    assert (facts["architecture"], facts["loaded_as"]) == (overrides["model_type"], "llama")
    ids = torch.tensor([(PROMPT * 7)[:40]])
    with torch.no_grad():
        expected = _original(path)(ids).logits
        got = loaded.model(ids).logits
    scale = float(expected.abs().max())
    report_max_abs_diff(f"{'/'.join(str(v) for v in overrides.values() if not isinstance(v, dict))} as Llama, logit scale "
                        f"{scale:.2f}", float((got - expected).abs().max()), 1e-5 * max(scale, 1.0), record_property)


def test_a_tied_granite_with_other_embedding_and_logit_factors_is_untied(tmp_path):
    """granite-3.x ties its embedding and LM head; embedding_multiplier 3 and logits_scaling 4 need two tables."""
    model = _load(_model_dir(tmp_path, **GRANITE)).model
    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    original = _original(tmp_path / "model")
    table = original.model.embed_tokens.weight
    assert torch.equal(model.model.embed_tokens.weight, table * 3.0)
    assert torch.allclose(model.lm_head.weight, table / 4.0, rtol=0, atol=0)


def test_a_tied_granite_whose_factors_cancel_stays_tied(tmp_path):
    """embedding_multiplier 0.5 and logits_scaling 2: the one table times 0.5 is both, so it stays shared."""
    overrides = {**GRANITE["config_overrides"], "embedding_multiplier": 0.5, "logits_scaling": 2.0}
    model = _load(_model_dir(tmp_path, model_type="granite", config_overrides=overrides)).model
    assert model.config.tie_word_embeddings is True
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_phi3_with_partial_rotary_is_refused(tmp_path):
    """Phi-4-mini (model_type phi3) rotates 0.75 of each head; Llama's rotary covers the whole head."""
    config = {"partial_rotary_factor": 0.5}
    path = _model_dir(tmp_path, model_type="phi3", config_overrides=config)
    with pytest.raises(ModelSourceError, match="phi3 model with partial_rotary_factor 0.5: it rotates 8 of each "
                                               "head's 16 dimensions") as info:
        _load(path)
    assert "whole head" in info.value.fix


def test_a_biased_granite_is_refused_as_a_biased_llama(tmp_path):
    path = _model_dir(tmp_path, model_type="granite", config_overrides={"attention_bias": True})
    with pytest.raises(ModelSourceError, match="attention_bias: true"):
        _load(path)


def test_phi3_s_sliding_window_bounds_the_bundle_context(tmp_path, record_property):
    """Phi3Model masks every layer with its window (Phi-3-mini-4k: 2047); the converted Llama and the graphs attend
    over the whole context. Within the window the two agree, past it they differ, so a longer context is refused."""
    from edgesdk.export.onnx_export import ExportConfig, check_exportable, sliding_window

    path = _model_dir(tmp_path, model_type="phi3", config_overrides={"sliding_window": 20})
    model = _load(path).model
    assert sliding_window(model.config) == 20
    assert getattr(model.config, "sliding_window", None) is None  # a window there makes transformers' cache drop keys
    with pytest.raises(ExportError, match="sliding window of 20 tokens, shorter than the bundle's context of 64"):
        check_exportable(model.config, ExportConfig(max_context=64))
    check_exportable(model.config, ExportConfig(max_context=20))
    ids = torch.tensor([(PROMPT * 6)[:30]])
    with torch.no_grad():
        expected, got = _original(path)(ids).logits[0], model(ids).logits[0]
    report_max_abs_diff("phi3 window 20 vs Llama, first 20 positions", float((got[:20] - expected[:20]).abs().max()), 1e-5,
                        record_property)
    assert float((got[20:] - expected[20:]).abs().max()) > 1e-3


# ---------------------------------------------------------------------------------------------- bundles
@pytest.mark.parametrize(("form", "overrides"), [
    ("ort-fused", {"model_type": "phi3"}),
    ("standard", {"model_type": "phi3", "tie": False}),
    ("ort-fused", GRANITE),
], ids=["phi3-fused", "phi3-standard-untied", "granite-fused"])
def test_greedy_tokens_through_the_bundle_are_the_original_models_generate(form, overrides, tmp_path, record_property):
    """24 greedy tokens after a 6-token prompt through the bundle's runtime equal the original transformers model's
    generate (a repetition penalty over the whole context makes each step pick a new token); the logits too."""
    path = _model_dir(tmp_path, **overrides)
    bundle = build_tiny_bundle(tmp_path, _recipe(form, "fp32"), "host", model_dir=path)
    before, after = bundle.manifest["model"]["before"], bundle.manifest["model"]["after"]
    assert (before["architecture"], before["loaded_as"], after["architecture"]) == \
        (overrides["model_type"], "llama", "llama")
    bundle_follows_transformers(bundle.path, _original(path), PROMPT,
                                f"{form} {overrides['model_type']} bundle vs transformers", record_property)


def test_the_default_recipe_builds_a_phi3(tmp_path):
    """The default recipe's shape (QAT INT4 blocks of 64 with the embedding, fused graph, zlib weights), two steps."""
    recipe = ("name: d\nstages:\n  - stage: qat\n    config: {weight_bits: 4, steps: 2, block_size: 64, "
              "embedding_bits: 4, train_embedding: true, batch_size: 2, sequence_length: 24}\n"
              "export: {form: ort-fused, weights: int4, block_size: 64, embedding_bits: 4, weights_codec: zlib}\n")
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=_model_dir(tmp_path, model_type="phi3"),
                               generated_sequences=0)
    assert bundle.manifest["graph"]["dtype"].startswith("int4")
    assert bundle.manifest["model"]["before"]["architecture"] == "phi3"


def test_gguf_export_of_a_granite_bundle_writes_llama_and_keeps_the_folded_scales(tmp_path):
    """The bundle holds a Llama: GGUF export writes llama.cpp's llama with the folded (untied) tables."""
    from gguf import GGUFReader

    from edgesdk.export.gguf_export import export_gguf

    bundle = build_tiny_bundle(tmp_path, _recipe("ort-fused", "fp32"), "host", model_dir=_model_dir(tmp_path, **GRANITE))
    assert export_gguf(bundle.path, tmp_path / "model.gguf").architecture == "llama"
    tensors = {tensor.name: np.asarray(tensor.data) for tensor in GGUFReader(str(tmp_path / "model.gguf")).tensors}
    table = _original(tmp_path / "model").model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(tensors["token_embd.weight"], table * np.float32(3.0))
    np.testing.assert_allclose(tensors["output.weight"], table / np.float32(4.0), rtol=1e-7, atol=0)


# ---------------------------------------------------------------------------------------------- LoRA
def _peft_adapter(directory, model, targets: dict[str, int], rank: int = 2, alpha: float = 4.0):
    """A PEFT LoRA adapter directory as PeftModel.save_pretrained writes it, random factors for ``targets``
    (module name suffix -> its output rows), and the dense deltas it adds (alpha / r * B @ A)."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(3)
    tensors, deltas = {}, {}
    for name, module in model.named_modules():
        if not any(name.endswith(suffix) for suffix in targets):
            continue
        a = torch.randn(rank, module.in_features, generator=generator) * 0.3
        b = torch.randn(module.out_features, rank, generator=generator) * 0.3
        tensors[f"base_model.model.{name}.lora_A.weight"] = a
        tensors[f"base_model.model.{name}.lora_B.weight"] = b
        deltas[name] = alpha / rank * (b @ a)
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": sorted(targets), "bias": "none"}))
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return deltas


def test_a_lora_on_phi3_s_fused_projections_is_merged_before_the_conversion(tmp_path, record_property):
    """An adapter trained on Phi-3 targets qkv_proj and gate_up_proj: the build merges it into them, then splits
    them; the bundle's logits are those of the original model with the adapter merged (W + alpha / r * B @ A)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.models.lora import LoraAdapter
    from edgesdk.runtime.session import open_runtime

    path = _model_dir(tmp_path, model_type="phi3")
    model = _original(path)
    deltas = _peft_adapter(tmp_path / "adapter", model, {"qkv_proj": 0, "gate_up_proj": 0, "o_proj": 0})
    assert len(deltas) == 6
    (tmp_path / "recipe.yaml").write_text(_recipe("ort-fused", "fp32"))
    bundle = build(BuildConfig(target="host", model=str(path), out=tmp_path / "b", recipe=str(tmp_path / "recipe.yaml"),
                               adapters=(LoraAdapter(str(tmp_path / "adapter")),),
                               export=ExportConfig(max_context=64), progress=False))
    assert bundle.manifest["model"]["before"]["adapters"][0]["modules"] == 6
    with torch.no_grad():
        modules = dict(model.named_modules())
        for name, delta in deltas.items():
            modules[name].weight.add_(delta)
        ids = (PROMPT * 4)[:20]
        expected = model(torch.tensor([ids])).logits[0].numpy()
    got = bundle_scorer(open_runtime(bundle.path, threads=1))(np.array(ids))
    scale = float(np.abs(expected).max())
    report_max_abs_diff("phi3 + LoRA on qkv_proj / gate_up_proj bundle vs merged transformers model",
                        float(np.abs(got - expected).max()), 1e-4 * max(scale, 1.0), record_property)


def test_eval_reference_loads_the_merged_model_as_the_build_did(tmp_path):
    """--reference merges the recorded adapters into Phi-3's own modules, then loads it as the Llama."""
    from edgesdk.cli_eval import _load_reference_model
    from edgesdk.models.lora import LoraAdapter
    from edgesdk.models.sources import resolve_model

    path = _model_dir(tmp_path, model_type="phi3")
    model = _original(path)
    deltas = _peft_adapter(tmp_path / "adapter", model, {"qkv_proj": 0})
    reference = _load_reference_model((resolve_model(str(path)), (LoraAdapter(str(tmp_path / "adapter")),)), None)
    assert type(reference).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        modules = dict(model.named_modules())
        for name, delta in deltas.items():
            modules[name].weight.add_(delta)
        ids = torch.tensor([PROMPT])
        assert float((reference(ids).logits - model(ids).logits).abs().max()) < 1e-5


@pytest.mark.parametrize(("overrides", "targets"), [
    ({"model_type": "phi3"}, {"qkv_proj": "attn_qkv", "gate_up_proj": "ffn_up"}),
    (GRANITE, {"q_proj": "attn_q", "k_proj": "attn_k", "up_proj": "ffn_up"}),
], ids=["phi3", "granite"])
def test_a_gguf_adapter_merges_as_the_peft_adapter_of_the_same_factors(overrides, targets, tmp_path):
    """convert_lora_to_gguf.py's layout for each base: Phi3MiniModel keeps attn_qkv's and ffn_up's rows (gate
    first) as they are, GraniteModel(LlamaModel) permutes attn_q / attn_k's lora_b for llama.cpp's rotary. Merged
    into the source's modules and loaded as Llama, both adapters give the same weights."""
    from edgesdk.models.loader import load_as_llama
    from edgesdk.models.lora import LoraAdapter, gguf_architecture, merge_adapters
    from edgesdk.models.sources import resolve_model
    from tests.unit._lora_files41 import llama_cpp_permute, random_factors, write_gguf_adapter, write_peft

    path = _model_dir(tmp_path, **overrides)
    source = resolve_model(str(path))
    peft_loaded, gguf_loaded = _load(path, as_llama=False), _load(path, as_llama=False)
    architecture = gguf_architecture(source, gguf_loaded.model)
    assert architecture == overrides["model_type"]
    factors = random_factors(gguf_loaded.model, targets=tuple(targets))
    config = gguf_loaded.model.config
    pairs = {}
    for name, (a, b) in factors.items():
        kind = name.rsplit(".", 1)[-1]
        b = b.numpy()
        if kind in ("q_proj", "k_proj"):
            b = llama_cpp_permute(b, config.num_attention_heads,
                                  config.num_attention_heads if kind == "q_proj" else config.num_key_value_heads)
        pairs[f"blk.{name.split('.')[2]}.{targets[kind]}.weight"] = (a.numpy(), b)
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", architecture, pairs, alpha=8)
    merge_adapters(gguf_loaded.model, [LoraAdapter(str(adapter))], architecture)
    merge_adapters(peft_loaded.model, [LoraAdapter(str(write_peft(tmp_path / "peft", factors)))], architecture)
    merged = load_as_llama(gguf_loaded).model.state_dict()
    for name, value in load_as_llama(peft_loaded).model.state_dict().items():
        torch.testing.assert_close(merged[name], value, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------- GGUF files
def _gguf_header(path, arch: str, fields: dict | None = None, tensors: tuple = ()):
    """A GGUF file with the architecture's sizes (1 layer, width 64, 4 heads) and the given keys and tensors."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(128)
    writer.add_feed_forward_length(96)
    writer.add_layer_norm_rms_eps(1e-5)
    for key, (value, kind) in (fields or {}).items():
        writer.add_key_value(key, value, kind)
    for name in ("token_embd.weight", *tensors):
        writer.add_tensor(name, np.ones((8, 64) if name == "token_embd.weight" else (8,), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_files_whose_scales_or_rotary_the_reader_drops_are_refused_before_it_reads_them(tmp_path):
    """transformers' GGUF reader has no granite mapping (it would drop granite.*_scale), reads no Phi-3 longrope
    factors and no phi3.rope.dimension_count: each file is refused naming what, with the Hugging Face directory or
    another model as the fix."""
    from gguf import GGUFValueType

    from edgesdk.models.loader import check_gguf_model

    with pytest.raises(ModelSourceError, match="holds a Granite model \\(general.architecture granite\\)") as info:
        check_gguf_model(_gguf_header(tmp_path / "granite.gguf", "granite"))
    assert "Hugging Face directory" in info.value.fix
    longrope = _gguf_header(tmp_path / "phi35.gguf", "phi3", tensors=("rope_factors_long.weight",
                                                                      "rope_factors_short.weight"))
    with pytest.raises(ModelSourceError, match="longrope's rotary factors \\(rope_factors_long.weight, "
                                               "rope_factors_short.weight\\)"):
        check_gguf_model(longrope)
    partial = _gguf_header(tmp_path / "phi4.gguf", "phi3",
                           {"phi3.rope.dimension_count": (12, GGUFValueType.UINT32)})
    with pytest.raises(ModelSourceError, match="rotates 12 of each head's 16 dimensions"):
        check_gguf_model(partial)
    windowed = _gguf_header(tmp_path / "phi3.gguf", "phi3", {"phi3.attention.sliding_window": (2047, GGUFValueType.UINT32),
                                                             "phi3.rope.dimension_count": (16, GGUFValueType.UINT32)})
    assert check_gguf_model(windowed) == {"head_dim": 16, "sliding_window": 2047}
    none = _gguf_header(tmp_path / "phi4-window.gguf", "phi3", {"phi3.attention.sliding_window": (0, GGUFValueType.UINT32)})
    assert check_gguf_model(none) == {"head_dim": 16}  # the converter writes 0 for no window
