"""The board runtime core: ONNX Runtime's TensorRT EP options (edgesdk/runtime/session.py,
edgesdk/runtime/tensorrt_engine.py)."""

from __future__ import annotations

import pytest

from edgesdk.runtime.session import ort_trt_options, ort_trt_profile


@pytest.fixture(scope="module")
def standard_bundle(tiny_model_dir, tmp_path_factory):
    """A real standard-form bundle for a Jetson (the form ONNX Runtime's TensorRT EP runs whole)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    out = tmp_path_factory.mktemp("jetson") / "tiny-orin"
    return build(BuildConfig(target="orin-nano-8gb", model=str(tiny_model_dir), out=out, recipe="fp32-standard",
                             export=ExportConfig(max_context=24), progress=False))


def parse_profile(text: str) -> dict[str, list[int]]:
    """A ``trt_profile_*_shapes`` option read as onnxruntime's ParseProfileShapes reads it: ``name:AxB,...``."""
    parsed = {}
    for entry in text.split(","):
        name, _, shape = entry.partition(":")
        parsed[name] = [int(value) for value in shape.split("x")]
    return parsed


def test_the_ort_trt_profile_holds_every_shape_the_backend_feeds(standard_bundle, tmp_path, monkeypatch):
    """Without an explicit profile the TensorRT EP rebuilt its engine at every decode step (the past grew past the
    largest length it had seen). The profile must name every dynamic input of the graph and hold each prefill and
    decode step the ONNX Runtime backend runs: T tokens after P cached ones, P + T <= max_context, keeping 1..T."""
    import onnx

    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    options = ort_trt_options(standard_bundle)
    low, opt, high = (parse_profile(options[f"trt_profile_{bound}_shapes"]) for bound in ("min", "opt", "max"))
    model = onnx.load(str(standard_bundle.file(standard_bundle.manifest["graph"]["file"])), load_external_data=False)
    dynamic = {value.name: len(value.type.tensor_type.shape.dim) for value in model.graph.input
               if any(not dim.HasField("dim_value") for dim in value.type.tensor_type.shape.dim)}
    assert dynamic
    assert set(dynamic) <= set(low)
    assert set(low) == set(opt) == set(high) <= {value.name for value in model.graph.input}
    for name, rank in dynamic.items():
        assert len(low[name]) == len(opt[name]) == len(high[name]) == rank, name
    for name in low:
        assert all(a <= b <= c for a, b, c in zip(low[name], opt[name], high[name], strict=True)), name

    graph = standard_bundle.manifest["graph"]
    context, head_dim = graph["max_context"], graph["head_dim"]

    def inside(name: str, shape: list[int]) -> bool:
        return all(a <= s <= c for a, s, c in zip(low[name], shape, high[name], strict=True))

    longest = ort_trt_profile(graph).max_seq  # the backend's max_prefill: a longer prompt runs in passes
    for past in range(context):
        for tokens in (1, min(context - past, longest)):  # a decode step, the longest pass that fits
            assert inside("input_ids", [1, tokens]), (past, tokens)
            assert inside("num_logits_to_keep", [tokens])
            assert inside("num_logits_to_keep", [1])
            for layer, heads in enumerate(graph["kv_heads"]):
                for kind in ("key", "value"):
                    assert inside(f"past_key_values.{layer}.{kind}", [1, heads, past, head_dim]), (past, layer)
    assert opt["input_ids"] == [1, 1]  # decode is the hot path


def test_the_ort_trt_profile_sizes_a_pass_not_the_context(standard_bundle):
    """A 4096-token context: the profile's input_ids end at 512 tokens (the engine's activation memory sized for a
    pass, as the tensorrt backend's), and the ort-trt backend runs a longer prompt in passes of that many; the past
    still reaches max_context - 1."""
    from edgesdk.runtime.tensorrt_engine import DEFAULT_MAX_SEQ

    graph = dict(standard_bundle.manifest["graph"], max_context=4096)
    profile = ort_trt_profile(graph)
    assert profile.max_seq == DEFAULT_MAX_SEQ == 512
    assert profile.shapes["input_ids"][2] == (1, 512)
    assert profile.shapes["past_key_values.0.key"][2][2] == 4095
    assert ort_trt_profile(dict(graph, form="ort-fused")) is None
