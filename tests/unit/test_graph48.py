"""Review 48 of the graph exporters (export/*_graph.py, export/validate.py): defects found, each with a test that
fails without its fix."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.export.validate import ValidationConfig, validate_export, validate_fused  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402

WINDOW = 24  # Gemma 3's sliding window in these tests: longer than the validation's prompts of 12 (+ 4 decode)
CONTEXT = 64


@pytest.fixture(scope="module")
def windowed():
    """A tiny Gemma 3 (sliding and full layers) whose window is longer than a default validation prompt."""
    return tiny_llama(model_type="gemma3_text", head_dim=16, config_overrides={"sliding_window": WINDOW})


def _shift_window(path, form: str, by: int) -> None:
    """Rewrite the exported graph in place so that its sliding layers attend over ``WINDOW + by`` positions: the
    fused graph's GroupQueryAttention ``local_window_size`` (an onnxruntime before PR #25927 read it as one
    fewer than the query sees), the standard graph's window constant in ``key <= query - window``."""
    proto = onnx.load(str(path))
    changed = 0
    if form == "ort-fused":
        for node in proto.graph.node:
            for attribute in node.attribute:
                if attribute.name == "local_window_size":
                    assert attribute.i == WINDOW
                    attribute.i += by
                    changed += 1
    else:
        outputs = {output: node for node in proto.graph.node for output in node.output}
        window_inputs = {outputs[node.input[1]].input[1] for node in proto.graph.node if node.op_type == "LessOrEqual"}
        for tensor in proto.graph.initializer:
            if tensor.name in window_inputs:
                assert onnx.numpy_helper.to_array(tensor).tolist() == [WINDOW]
                tensor.CopyFrom(onnx.numpy_helper.from_array(np.array([WINDOW + by], np.int64), tensor.name))
                changed += 1
    assert changed
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data")


def _validate(model, path, spec, config: ExportConfig):
    if config.form == "ort-fused":
        return validate_fused(model, path, spec, config.fused(model), ValidationConfig(prompts=2))
    return validate_export(model, path, spec, ValidationConfig(prompts=2))


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_validation_runs_past_the_sliding_window_and_refuses_a_graph_whose_window_is_wrong(windowed, form, tmp_path):
    """Validation prompted 12 tokens and decoded 4, all within a window of 24 (Gemma 3's is 512 and more), so every
    key was in the window and a graph attending over 25 or 23 positions passed as equal to the model; the last
    prompt now runs past the window."""
    config = ExportConfig(max_context=CONTEXT, form=form, weights="fp32")
    spec = export_model(windowed, tmp_path, config)
    path = tmp_path / "model.onnx"
    report = _validate(windowed, path, spec, config)  # the graph as exported: equal to the model
    assert max(v for k, v in report.max_abs_diff.items() if k.startswith("logits")) < 1e-3
    for by in (1, -1):
        export_model(windowed, tmp_path, config)
        _shift_window(path, form, by)
        with pytest.raises(ExportError, match="differs from PyTorch"):
            _validate(windowed, path, spec, config)


def test_prompt_lengths_cross_the_longest_window_within_the_context(windowed):
    from edgesdk.export.validate import prompt_lengths

    config = ValidationConfig(prompts=3, prompt_length=12, decode_steps=4)
    assert prompt_lengths(windowed, CONTEXT, config) == [12, 12, WINDOW + 12]
    assert prompt_lengths(windowed, 30, config) == [12, 12, 26]  # the context bounds it: 26 + 4 decode steps = 30
    assert prompt_lengths(windowed, WINDOW, config) == [12, 12, 12]  # the window covers the whole context
    assert prompt_lengths(tiny_llama(), CONTEXT, config) == [12, 12, 12]  # no window: prompts as configured


def test_a_gated_graph_with_a_sliding_window_records_the_onnxruntime_its_window_needs(tmp_path):
    """The gated graph's attention is the fused graph's GroupQueryAttention, ``local_window_size`` included, but only
    emit_fused_decoder recorded SLIDING_WINDOW_ONNXRUNTIME: a gated Gemma 3 bundle loaded on onnxruntime 1.23 (the
    gated backend's own minimum) and its local layers attended over one position more than the model's."""
    from edgesdk.errors import RuntimeBackendError
    from edgesdk.export.fused_graph import SLIDING_WINDOW_ONNXRUNTIME
    from edgesdk.runtime.ort_backend import check_onnxruntime_version
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend
    from tests.unit.test_gated46 import _gated

    model, _, _ = _gated(tiny_llama(layers=3, model_type="gemma3_text"))  # sliding_window 4 < context 64
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=CONTEXT))
    assert spec.form == "ort-fused-gated"
    graph = spec.to_json()
    assert graph["min_onnxruntime"] == list(SLIDING_WINDOW_ONNXRUNTIME[0])
    assert graph["min_onnxruntime_for"] == SLIDING_WINDOW_ONNXRUNTIME[1]
    needed = ((graph["min_onnxruntime"][0], graph["min_onnxruntime"][1]), graph["min_onnxruntime_for"])
    check_onnxruntime_version("1.23.2", OrtGatedBackend.min_onnxruntime, graph["form"])  # the form alone: accepted
    with pytest.raises(RuntimeBackendError, match="needs onnxruntime >= 1.24"):
        check_onnxruntime_version("1.23.2", needed, graph["form"])  # the window: refused, as the backend reads it
    OrtGatedBackend(tmp_path / "model.onnx", graph, threads=1)  # and this onnxruntime loads it

    unwindowed = tiny_llama(layers=3, model_type="gemma3_text", config_overrides={"sliding_window": CONTEXT})
    _gated(unwindowed)
    assert "min_onnxruntime" not in export_model(unwindowed, tmp_path / "full", ExportConfig(
        form="ort-fused", weights="fp32", max_context=CONTEXT)).to_json()  # a window covering the context: no need
