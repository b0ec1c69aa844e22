"""Gemma 3 text models (270M, 1B): built, run and decoded past their sliding window like the Llama family.

Tiny Gemma 3 models here (tests/_utils/tiny.py) have a sliding window of 4 tokens on layers 0 and 2 and full
attention on layer 1, a head size of 32 over a width of 64, query_pre_attn_scalar 24 (so the scale is not
1/sqrt(head size)), and every RMSNorm weight away from 0 (Gemma's norms scale by 1 + weight, so a norm
left out or read as Llama's changes the logits). The graphs' numerics against PyTorch are in
test_export.py, test_fused_export.py and test_qdq_export.py (their gemma3 cases); here, whole generations
through the runtime, QAT's scaled embedding, and what is refused.
"""

from __future__ import annotations

import pytest

from edgesdk.errors import BuildError, ExportError, ModelSourceError, RuntimeBackendError
from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir, tiny_llama

torch = pytest.importorskip("torch")

GEMMA3 = {"model_type": "gemma3_text", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32, "layers": 3,
          "intermediate": 128}


def _gemma_dir(tmp_path):
    return save_tiny_model_dir(tmp_path / "model", **GEMMA3)


def _recipe(form: str, weights: str, stages: str = "[]") -> str:
    return f"name: r\nstages: {stages}\nexport: {{form: {form}, weights: {weights}}}\n"


@pytest.mark.parametrize("form", ["ort-fused", "standard"])
def test_greedy_decoding_far_past_the_window_gives_transformers_tokens(form, tmp_path):
    """40 greedy tokens after a 6-token prompt, ten times the window: the bundle's runtime (its KV cache, the
    fused graph's GroupQueryAttention window or the standard graph's mask) and transformers' generate agree.
    A repetition penalty over the whole context (llama.cpp's, as transformers' repetition_penalty computes it)
    makes each step pick a new token, so that every step's logits count."""
    from transformers import AutoModelForCausalLM

    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    bundle = build_tiny_bundle(tmp_path, _recipe(form, "fp32"), "host", model_dir=_gemma_dir(tmp_path))
    if form == "ort-fused":  # the window's meaning changed in onnxruntime 1.24; older ones are refused
        assert bundle.manifest["graph"]["min_onnxruntime"] == [1, 24]
    runtime = open_runtime(bundle.path, threads=1)
    prompt = [5, 17, 120, 33, 250, 9]
    sampling = SamplingConfig(max_new_tokens=40, repeat_penalty=3.0, repeat_last_n=-1)
    tokens, _ = generate(runtime.backend, prompt, sampling, stop_ids=set())
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()
    with torch.no_grad():  # no stop id on either side: min_new_tokens would mask id 2 (the eos) instead
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                                  pad_token_id=0, repetition_penalty=3.0)[0, len(prompt):].tolist()
    assert len(expected) == 40
    assert tokens == expected
    assert len(set(tokens)) > 20  # the steps' logits all count


def test_an_older_onnxruntime_is_refused_for_a_windowed_graph():
    from edgesdk.runtime.ort_backend import check_onnxruntime_version

    needed = ((1, 24), "GroupQueryAttention's local_window_size counting the query itself")
    with pytest.raises(RuntimeBackendError, match="needs onnxruntime >= 1.24"):
        check_onnxruntime_version("1.23.2", needed, "ort-fused")
    check_onnxruntime_version("1.24.0", needed, "ort-fused")


def test_qat_keeps_the_embedding_scale_and_puts_gemma_s_embedding_back():
    """QAT swaps the embedding's class for fake quantization: Gemma's sqrt(D) scale must apply to the quantized
    rows, and detach must give back Gemma's scaled embedding."""
    from edgesdk.compress import fake_quant

    model = tiny_llama(**GEMMA3)
    kind = type(model.model.embed_tokens)
    ids = torch.tensor([[5, 17, 120, 33]])
    with torch.no_grad():
        before = model(ids).logits
    scheme = fake_quant.QuantScheme(weight_bits=8, granularity="block", block_size=32, activations="none",
                                    embedding_bits=8)
    fake_quant.attach(model, scheme)
    with torch.no_grad():
        quantized = model(ids).logits
    assert float((quantized - before).abs().max()) < 0.05 * float(before.abs().max())  # 8-bit rounding, not sqrt(D)
    fake_quant.detach(model, bake=False)
    assert type(model.model.embed_tokens) is kind
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_a_qat_int4_build_and_a_pruned_build_validate(tmp_path):
    """QAT (int4 layers and embedding), then GQA groups, FFN channels and a layer removed with distillation:
    each build's own validation compares its graph with the PyTorch model."""
    qat = ("[{stage: qat, config: {weight_bits: 4, block_size: 32, embedding_bits: 4, steps: 2, batch_size: 2, "
           "sequence_length: 24}}]")
    bundle = build_tiny_bundle(tmp_path / "qat", _recipe("ort-fused", "int4", qat), "host",
                               model_dir=_gemma_dir(tmp_path / "qat"))
    assert bundle.manifest["model"]["after"]["architecture"] == "gemma3_text"
    pruned = ("[{stage: prune, config: {ffn_ratio: 0.3, kv_group_ratio: 0.5, layers_removed: 1, calibration_batches: "
              "2, batch_size: 2, sequence_length: 24, layer_calibration_batches: 1}}, {stage: distill, config: "
              "{steps: 2, batch_size: 2, sequence_length: 24}}]")
    bundle = build_tiny_bundle(tmp_path / "pruned", _recipe("ort-fused", "int8", pruned), "host",
                               model_dir=_gemma_dir(tmp_path / "pruned"))
    assert bundle.manifest["model"]["after"]["layers"] == 2


@pytest.mark.parametrize(("stages", "export", "named"), [
    ("[{stage: power}]", "{form: ort-fused, weights: fp32}", "power"),
])
def test_stages_that_assume_llama_norms_are_refused_before_any_stage(stages, export, named, tmp_path):
    recipe = f"name: r\nstages: {stages}\nexport: {export}\n"
    with pytest.raises(BuildError, match=f"a Gemma 3 model cannot go through {named}"):
        build_tiny_bundle(tmp_path, recipe, "orin-nx", model_dir=_gemma_dir(tmp_path))
    assert not (tmp_path / "b.build").exists()


def test_gguf_export_of_this_layout_and_an_ffn_other_than_geglu_are_refused(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.tiny import tiny_tokenizer

    bundle = build_tiny_bundle(tmp_path, _recipe("ort-fused", "fp32"), "host", model_dir=_gemma_dir(tmp_path))
    with pytest.raises(ExportError, match="llama.cpp's gemma3 would compute differently"):  # test_gemma3_gguf.py
        export_gguf(bundle.path, tmp_path / "model.gguf")
    config = AutoConfig.for_model("gemma3_text", vocab_size=320, hidden_size=64, intermediate_size=112, head_dim=16,
                                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                  hidden_activation="silu")
    path = tmp_path / "silu"
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tiny_tokenizer(320).save_pretrained(path)
    with pytest.raises(ModelSourceError, match="uses hidden_activation 'silu'"):
        load_model(resolve_model(str(path)))


def test_the_rotary_tables_of_both_layer_kinds_are_in_the_graph(tmp_path):
    """Local layers rotate at base 10,000, global ones at 1,000,000 (Gemma 3's two rope_parameters)."""
    import onnx

    bundle = build_tiny_bundle(tmp_path, _recipe("ort-fused", "fp32"), "host", model_dir=_gemma_dir(tmp_path))
    graph = onnx.load(str(bundle.path / bundle.manifest["graph"]["file"]), load_external_data=False).graph
    names = {initializer.name for initializer in graph.initializer}
    assert {"rotary.cos", "rotary.sin", "rotary.1.cos", "rotary.1.sin"} <= names
    windows = [next((a.i for a in node.attribute if a.name == "local_window_size"), None)
               for node in graph.node if node.op_type == "GroupQueryAttention"]
    assert windows == [4, None, 4]
