"""Gemma 3 to and from GGUF: a bundle exported as llama.cpp's ``gemma3`` architecture with its SentencePiece
vocabulary, and a Gemma 3 GGUF file read back as the model it holds.

The tiny Gemma 3 here is laid out as llama.cpp fixes it (seven layers, the sixth global; a window of 4
tokens; query_pre_attn_scalar equal to the head size; local rotary base 10,000), with a Gemma-style
SentencePiece BPE tokenizer (spaces as U+2581, byte fallback, Gemma's special tokens). Text of 43 tokens
crosses the window ten times over, so a window, a rotary base or a norm written wrong changes the logits.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import ExportError, ModelSourceError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import llama_cpp_tokens_and_logits, rewrite_gguf
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")

LAYERS = 7
GEMMA3 = {"model_type": "gemma3_text", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32, "layers": LAYERS,
          "intermediate": 128, "vocab_size": 384, "tokenizer": "gemma",
          "config_overrides": {"sliding_window": 4, "query_pre_attn_scalar": 32,
                               "layer_types": ["full_attention" if i % 6 == 5 else "sliding_attention"
                                               for i in range(LAYERS)]}}
TEXT = "The quick brown fox jumps over the lazy dog. Edge boards  run small language models ж 🙂"
LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install llama-cpp-python, which compiles llama.cpp)"


def _recipe(weights: str) -> str:
    return f"name: r\nstages: []\nexport: {{form: ort-fused, weights: {weights}}}\n"


def _exported(tmp_path, weights: str = "fp32"):
    from edgesdk.export.gguf_export import export_gguf

    model_dir = save_tiny_model_dir(tmp_path / "model", **GEMMA3)
    bundle = build_tiny_bundle(tmp_path, _recipe(weights), "host", model_dir=model_dir)
    return bundle, export_gguf(bundle.path, tmp_path / "model.gguf")


def _source(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tmp_path / "model"))


def test_a_gemma3_bundle_exports_as_gguf_and_loads_back_as_the_source_model(tmp_path):
    """The file's architecture, window, head size and SentencePiece vocabulary are llama.cpp's gemma3; read back
    through edgesdk's loader it is the source model: the same logits (norms, window, both rotary bases,
    softmax scale) and the same token ids and chat prompt."""
    from gguf import GGUFReader

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    _, report = _exported(tmp_path)
    assert report.architecture == "gemma3"
    reader = GGUFReader(str(report.path))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["gemma3.attention.sliding_window"] == 4
    assert fields["gemma3.attention.key_length"] == 32
    assert fields["gemma3.rope.freq_base"] == pytest.approx(1e6, rel=1e-4)
    assert fields["tokenizer.ggml.model"] == "llama"
    assert fields["tokenizer.ggml.add_space_prefix"] is False
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert types[tokens.index("<0x41>")] == 6
    assert types[tokens.index("<bos>")] == 3
    assert types[tokens.index("<unk>")] == 2  # UNKNOWN
    assert {"blk.5.post_attention_norm.weight", "blk.5.post_ffw_norm.weight", "blk.6.attn_k_norm.weight"} <= \
        {tensor.name for tensor in reader.tensors}

    loaded = load_model(resolve_model(str(report.path)), progress=False)
    config = loaded.model.config
    assert config.query_pre_attn_scalar == 32  # transformers' GGUF mapping alone leaves Gemma 3's default, 256
    assert config.layer_types[5] == "full_attention"
    assert config.layer_types[6] == "sliding_attention"
    source, tokenizer = _source(tmp_path)
    ids = tokenizer(TEXT)["input_ids"]
    assert loaded.tokenizer(TEXT)["input_ids"] == ids
    assert loaded.tokenizer.decode(ids, skip_special_tokens=True) == TEXT
    with torch.no_grad():
        diff = (loaded.model(torch.tensor([ids])).logits - source(torch.tensor([ids])).logits).abs().max().item()
    assert diff < 1e-4
    messages = [{"role": "user", "content": "hi"}]
    assert loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_a_gemma3_gguf_file_builds_into_a_bundle_that_decodes_as_transformers(tmp_path):
    """`edgesdk build` from the GGUF file: 30 greedy tokens through the bundle equal transformers' generate
    on the source model, far past the window."""
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    _, report = _exported(tmp_path / "first")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(_recipe("fp32"))
    bundle = build(BuildConfig(target="host", model=str(report.path), out=tmp_path / "from-gguf", recipe=str(recipe),
                               data=DataConfig(files=(), generated_sequences=0), export=ExportConfig(max_context=64),
                               progress=False))
    assert bundle.manifest["model"]["after"]["architecture"] == "gemma3_text"
    runtime = open_runtime(bundle.path, threads=1)
    prompt = [2, 338, 329, 319, 282, 311]
    tokens, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=30), stop_ids=set())
    source, _ = _source(tmp_path / "first")
    with torch.no_grad():  # no stop id on either side: min_new_tokens would mask id 2 (the config's eos) instead
        expected = source.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)[0, len(prompt):].tolist()
    assert len(expected) == 30
    assert tokens == expected


@pytest.mark.parametrize("weights", ["fp32", "int4"])
def test_llama_cpp_runs_the_exported_gemma3_with_the_bundles_tokens_and_logits(weights, tmp_path):
    """llama.cpp tokenizes the text as the bundle does and computes its logits: float32 within 0.01 (ggml's
    GELU is a float16 table); INT4 (Q4_0 codes equal to the bundle's) within llama.cpp's rounding of the
    activations to Q8_0, which moves these logits by up to 0.2 (INT8 weights measure the same). llama.cpp
    runs in a child process without its AMX repacking of Q4_0 (tests/_utils/gguf_files.py says why)."""
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    bundle, report = _exported(tmp_path, weights)
    assert report.file_type == {"fp32": "F32", "int4": "Q4_0"}[weights]
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode(TEXT, add_special_tokens=True)
    expected = bundle_scorer(runtime)(np.array(ids))
    tokens, got = llama_cpp_tokens_and_logits(report.path, TEXT, ids, context=64)
    assert tokens == ids
    tolerance = 0.01 if weights == "fp32" else 0.05 * float(np.abs(expected).max())
    assert float(np.abs(got - expected).max()) < tolerance
    assert np.mean(got.argmax(-1) == expected.argmax(-1)) >= 0.9


def test_a_gemma3_bundle_llama_cpp_would_compute_differently_is_refused(tmp_path):
    """The other tiny Gemma 3 (layers alternating sliding and global, query_pre_attn_scalar 24): llama.cpp
    would slide the window over layer 1 and scale the softmax by 1/sqrt(32)."""
    from edgesdk.export.gguf_export import export_gguf

    overrides = {**GEMMA3, "layers": 3, "config_overrides": {"query_pre_attn_scalar": 24}}
    bundle = build_tiny_bundle(tmp_path, _recipe("fp32"), "host",
                               model_dir=save_tiny_model_dir(tmp_path / "model", **overrides))
    with pytest.raises(ExportError, match="llama.cpp's gemma3 would compute differently") as refused:
        export_gguf(bundle.path, tmp_path / "model.gguf")
    assert "attention scale" in str(refused.value)
    assert "sliding-window layers are [0, 2]" in str(refused.value)
    assert not (tmp_path / "model.gguf").exists()


def test_a_gemma3_gguf_with_soft_capped_logits_is_refused_at_load(tmp_path):
    """A key the graphs would silently not compute (Gemma 2's final soft-cap; scaled rotary of Gemma 3 4B+)."""
    import gguf

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    _, report = _exported(tmp_path)
    capped = rewrite_gguf(report.path, tmp_path / "capped.gguf",
                          fields={"gemma3.final_logit_softcapping": (30.0, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(ModelSourceError, match=r"soft-caps its logits \(gemma3.final_logit_softcapping = 30"):
        load_model(resolve_model(str(capped)), progress=False)


def test_a_sentencepiece_vocabulary_is_written_as_llama_cpp_s_llama_model(tmp_path):
    """Scores are minus the rank of the first merge that makes each token (llama.cpp merges the highest score
    first), below every merge where none does; <0xNN> tokens are BYTE; a normalizer that prepends U+2581 (Llama 2, TinyLlama) sets
    add_space_prefix."""
    from edgesdk.export.gguf_vocab import BYTE, CONTROL, NORMAL, vocab_from_tokenizer_json

    spec = {"model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>",
                      "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "\u2581": 3, "a": 4, "b": 5, "ab": 6, "\u2581ab": 7},
                      "merges": [["a", "b"], ["\u2581", "ab"]]},
            "added_tokens": [{"id": 1, "content": "<s>", "special": True}],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
            "pre_tokenizer": None,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "post_processor": {"type": "TemplateProcessing", "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    vocab = vocab_from_tokenizer_json(path, "<s>", None, 9)
    assert vocab.model == "llama"
    assert vocab.add_space_prefix
    assert vocab.add_bos
    assert vocab.bos_id == 1
    assert vocab.token_types[1:8] == [CONTROL, BYTE, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL]
    assert vocab.scores[6] == 0.0
    assert vocab.scores[7] == -1.0
    assert vocab.scores[4] == -2.0
    assert vocab.scores[1] == 0.0
    assert vocab.tokens[8] == "[PAD8]"
    assert vocab.merges == []


def test_llama_cpp_tokenizes_a_llama2_style_sentencepiece_bundle_as_the_bundle_does(tmp_path):
    """A Llama with Llama 2's kind of tokenizer (Metaspace, U+2581 put in front): written as llama.cpp's llama
    tokenizer model with add_space_prefix, llama.cpp gives the bundle's token ids and logits. Text that starts
    with a space is left out: transformers' Metaspace does not put a second U+2581 in front of it, where
    SentencePiece and llama.cpp do."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import tiny_llama, tiny_llama2_tokenizer

    tokenizer = tiny_llama2_tokenizer()
    model_dir = tmp_path / "model"
    tiny_llama(vocab_size=len(tokenizer) + 3).save_pretrained(model_dir)  # 3 padding rows: UNUSED tokens
    tokenizer.save_pretrained(model_dir)
    bundle = build_tiny_bundle(tmp_path, _recipe("fp32"), "host", model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    runtime = open_runtime(bundle.path, threads=1)
    model = llama_cpp.Llama(str(report.path), n_ctx=64, logits_all=True, n_threads=1, verbose=False)
    for text in ("The quick brown fox jumps.", "Überall ж  two spaces", TEXT):
        ids = runtime.tokenizer.encode(text, add_special_tokens=True)
        assert model.tokenize(text.encode(), add_bos=True) == ids
    model.eval(ids)
    expected = bundle_scorer(runtime)(np.array(ids))
    assert float(np.abs(np.array(model.scores[:len(ids)]) - expected).max()) < 1e-3


def test_a_gemma3_bundle_pruned_to_uneven_layers_is_refused_for_gguf(tmp_path):
    """llama.cpp's gemma3 reads one shape for every layer, and its per-layer architecture has no Gemma norms."""
    from edgesdk.export.gguf_export import export_gguf

    recipe = ("name: pruned\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.4, kv_group_ratio: 0.5, "
              "calibration_batches: 2, batch_size: 2, sequence_length: 24}\n"
              "export: {form: ort-fused, weights: fp32, block_size: 32}\n")
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=save_tiny_model_dir(tmp_path / "model", **GEMMA3))
    with pytest.raises(ExportError, match="llama.cpp's gemma3 architecture reads one shape for every layer"):
        export_gguf(bundle.path, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_a_sentencepiece_tokenizer_that_splits_before_merging_is_refused(tmp_path):
    """llama.cpp's llama tokenizer model splits nothing before merging: a pre-tokenizer that does (here digits
    one by one) would tokenize differently there without an error, so it is refused; Gemma's Split on a space
    its normalizer has already replaced is kept."""
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    spec = {"model": {"type": "BPE", "byte_fallback": True, "vocab": {"a": 0, "1": 1}, "merges": []},
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
            "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                              "invert": False},
            "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    assert vocab_from_tokenizer_json(path, None, None, 2).model == "llama"
    spec["pre_tokenizer"] = {"type": "Digits", "individual_digits": True}
    path.write_text(json.dumps(spec))
    with pytest.raises(ExportError, match="splits the text before a SentencePiece BPE"):
        vocab_from_tokenizer_json(path, None, None, 2)
