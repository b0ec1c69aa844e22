"""Review 48 of export validation (export/validate.py): a prompt prefilled on top of cached tokens.

The runtime prefills every chat turn after the first, and every prompt whose prefix the prompt cache holds, on
top of the KV cache (past > 0, more than one token): ONNX Runtime's GroupQueryAttention with past length > 0 and
sequence length > 1, and the standard graph's position ids and causal mask offset by the past length
(export/llama_graph.py ``Range(past, past + seq)``). Validation only ever prefilled from an empty cache and then
decoded one token at a time, so a graph wrong in that path alone passed it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.export.validate import (  # noqa: E402
    ValidationConfig,
    empty_past,
    prompt_lengths,
    validate_export,
    validate_fused,
)
from tests._utils.tiny import tiny_llama  # noqa: E402

CONTEXT = 64
WINDOW = 8  # Gemma 3's sliding window here: shorter than the windowed prompt's first chunk
ARCHS = {
    "llama": {},
    "qwen3": {"model_type": "qwen3", "head_dim": 32},
    "gemma3-window": {"model_type": "gemma3_text", "head_dim": 16, "layers": 3,
                      "config_overrides": {"sliding_window": WINDOW}},
}


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def _save(proto, path) -> None:
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data")


def _break_standard(path, what: str) -> None:
    """Rewrite an exported standard graph so that a run of more than one token takes positions 0 .. seq-1 as if the
    cache were empty, for its causal mask (``what="mask"``: each query sees the first keys of the past, not its
    own) or for its rotary (``"positions"``: position ids ``arange(seq)``, ignoring the past). A first prompt
    (past 0) and a decode step (one token) compute what the exported graph does."""
    proto = onnx.load(str(path))
    graph = proto.graph
    producer = {output: node for node in graph.node for output in node.output}
    less = next(node for node in graph.node if node.op_type == "Less")  # future = Less(query_at, key_at)
    positions = producer[less.input[0]].input[0]  # query_at = Unsqueeze(positions): Range(past, total)
    assert producer[positions].op_type == "Range"
    rotary = [node for node in graph.node if node.op_type == "Gather" and node.input[1] == positions]
    assert rotary  # cos and sin gathered at the positions
    graph.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), "bad.axis0"),
                              numpy_helper.from_array(np.array([1], np.int64), "bad.axis1"),
                              numpy_helper.from_array(np.array(0, np.int64), "bad.zero"),
                              numpy_helper.from_array(np.array(1, np.int64), "bad.one")])
    wrong = [
        helper.make_node("Shape", ["input_ids"], ["bad.seq"], start=1, end=2),
        helper.make_node("Squeeze", ["bad.seq", "bad.axis0"], ["bad.seq_scalar"]),
        helper.make_node("Range", ["bad.zero", "bad.seq_scalar", "bad.one"], ["bad.from_zero"]),
        helper.make_node("Equal", ["bad.seq_scalar", "bad.one"], ["bad.one_token"]),
        helper.make_node("Where", ["bad.one_token", positions, "bad.from_zero"], ["bad.positions"]),
        helper.make_node("Unsqueeze", ["bad.positions", "bad.axis1"], ["bad.query_at"]),
    ]
    at = list(graph.node).index(producer[positions]) + 1
    for offset, node in enumerate(wrong):
        graph.node.insert(at + offset, node)
    if what == "mask":
        less.input[0] = "bad.query_at"
    else:
        for node in rotary:
            node.input[1] = "bad.positions"
    _save(proto, path)


def _break_fused(path) -> None:
    """Rewrite an exported fused graph so that GroupQueryAttention reads a run of more than one token as a first
    prompt: ``seqlens_k`` = seq - 1 instead of the runtime's past + seq - 1 (right when the cache is empty)."""
    proto = onnx.load(str(path))
    graph = proto.graph
    graph.initializer.append(numpy_helper.from_array(np.array([1], np.int32), "bad.one"))
    wrong = [
        helper.make_node("Shape", ["input_ids"], ["bad.seq"], start=1, end=2),
        helper.make_node("Cast", ["bad.seq"], ["bad.seq32"], to=TensorProto.INT32),
        helper.make_node("Sub", ["bad.seq32", "bad.one"], ["bad.prompt_seqlens"]),
        helper.make_node("Greater", ["bad.seq32", "bad.one"], ["bad.prompt"]),
        helper.make_node("Where", ["bad.prompt", "bad.prompt_seqlens", "seqlens_k"], ["bad.seqlens_k"]),
    ]
    for offset, node in enumerate(wrong):
        graph.node.insert(offset, node)
    attentions = [node for node in graph.node if node.op_type == "GroupQueryAttention"]
    assert attentions
    for node in attentions:
        assert node.input[5] == "seqlens_k"
        node.input[5] = "bad.seqlens_k"
    _save(proto, path)


def _validate(model, path, spec, config: ExportConfig, prompts: int = 2):
    check = ValidationConfig(prompts=prompts)
    if config.form == "ort-fused":
        return validate_fused(model, path, spec, config.fused(model), check)
    return validate_export(model, path, spec, check)


def _session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run(session, spec, ids: np.ndarray, past: dict | None = None) -> tuple[np.ndarray, dict]:
    """(logits, presents as the next run's past) of the standard graph on ``ids`` (1, T) after ``past``."""
    feeds = {"input_ids": ids, "num_logits_to_keep": np.array([ids.shape[1]], np.int64),
             **(past if past is not None else empty_past(spec))}
    outputs = session.run(None, feeds)
    names = [output.name for output in session.get_outputs()]
    presents = {name.replace("present", "past_key_values"): value
                for name, value in zip(names, outputs, strict=True) if name.startswith("present.")}
    return outputs[0], presents


@pytest.mark.parametrize("what", ["mask", "positions"])
def test_standard_graph_wrong_only_after_cached_tokens_is_refused(llama, what, tmp_path):
    """A standard graph whose causal mask (or rotary positions) of a multi-token run ignores the past equals the
    model on a first prompt and on decode steps, the only runs validation made, and was accepted; the prompt's
    tail, now prefilled on top of its head's cache, shows the difference."""
    config = ExportConfig(max_context=CONTEXT, weights="fp32")
    spec = export_model(llama, tmp_path / "good", config)
    spec = export_model(llama, tmp_path / "bad", config)
    _break_standard(tmp_path / "bad" / "model.onnx", what)
    good, bad = _session(tmp_path / "good" / "model.onnx"), _session(tmp_path / "bad" / "model.onnx")
    ids = np.random.default_rng(1).integers(0, spec.vocab_size, (1, 12), dtype=np.int64)
    # the wrong graph computes the right thing from an empty cache and one token at a time ...
    good_logits, good_past = _run(good, spec, ids)
    bad_logits, bad_past = _run(bad, spec, ids)
    np.testing.assert_allclose(bad_logits, good_logits, atol=1e-5)
    next_token = ids[:, :1]
    np.testing.assert_allclose(_run(bad, spec, next_token, bad_past)[0], _run(good, spec, next_token, good_past)[0],
                               atol=1e-5)
    # ... and not for a prompt after cached tokens (beyond validation's tolerance)
    _, good_head = _run(good, spec, ids[:, :6])
    _, bad_head = _run(bad, spec, ids[:, :6])
    tail = np.abs(_run(bad, spec, ids[:, 6:], bad_head)[0] - _run(good, spec, ids[:, 6:], good_head)[0]).max()
    assert tail > ValidationConfig().atol

    with pytest.raises(ExportError, match=r"differs from PyTorch[\s\S]*logits/prefill: max \|diff\|"):
        _validate(llama, tmp_path / "bad" / "model.onnx", spec, config, prompts=1)


def test_fused_graph_wrong_only_after_cached_tokens_is_refused(llama, tmp_path):
    """A fused graph whose GroupQueryAttention takes every multi-token run for a first prompt (its seqlens_k
    counting the run only) passed compare_backend, which prefilled each prompt in one run from an empty cache."""
    config = ExportConfig(max_context=CONTEXT, form="ort-fused", weights="fp32")
    spec = export_model(llama, tmp_path, config)
    _break_fused(tmp_path / "model.onnx")
    with pytest.raises(ExportError, match=r"differs from PyTorch[\s\S]*logits/prefill: max \|diff\|"):
        _validate(llama, tmp_path / "model.onnx", spec, config, prompts=1)


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_correct_graphs_still_pass_with_a_chunked_prefill(arch, form, tmp_path):
    """The graphs as exported equal the model on the chunked prefill too: Llama, Qwen3 (query / key norms) and
    Gemma 3 with a sliding window that both chunks of the last prompt cross."""
    model = tiny_llama(**ARCHS[arch])
    config = ExportConfig(max_context=CONTEXT, form=form, weights="fp32")
    spec = export_model(model, tmp_path, config)
    report = _validate(model, tmp_path / "model.onnx", spec, config)
    logits = {k: v for k, v in report.max_abs_diff.items() if k.startswith("logits")}
    assert set(logits) == {"logits/prefill", "logits/decode"}
    assert max(logits.values()) < 1e-4, report.max_abs_diff
    assert report.top1_agree == 1.0


def test_chunk_split_leaves_a_multi_token_tail_and_crosses_the_window_in_both_chunks():
    from edgesdk.export.validate import chunk_split

    config = ValidationConfig(prompts=2, prompt_length=12, decode_steps=4)
    assert chunk_split(12, config) == 6  # 6 from an empty cache, 6 on top of them
    gemma = tiny_llama(**ARCHS["gemma3-window"])
    windowed = prompt_lengths(gemma, CONTEXT, config)[-1]
    assert windowed == WINDOW + 12
    assert WINDOW < chunk_split(windowed, config) < windowed  # the first chunk alone runs past the window
    assert chunk_split(1, config) == 1  # one token: nothing to split
    assert chunk_split(3, ValidationConfig(prompt_length=3)) == 2
    assert chunk_split(2, ValidationConfig(prompt_length=1)) == 1
