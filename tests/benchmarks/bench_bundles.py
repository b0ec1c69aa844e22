"""Which SmolLM2 bundle a benchmark measures.

Two fixtures (``conftest.py``): the target's default build (``default``: QAT INT4, what ``edgesdk build``
makes), and an uncompressed float32 build for the benchmarks that compare the bundle against the
PyTorch source model (perplexity within 0.5 %, decode speed of the same weights).
"""

from __future__ import annotations

from pathlib import Path

FP32_RECIPE = "fp32-fused"  # the model's float32 weights as loaded, in the fused ONNX Runtime graph
FP32_VARIABLE = "EDGESDK_BENCH_FP32_BUNDLE"


def fp32_build_config(out: Path):
    """The build of the uncompressed rpi5 bundle that the fp32 benchmarks compare with PyTorch."""
    from edgesdk.build.pipeline import BuildConfig

    return BuildConfig(target="rpi5", recipe=FP32_RECIPE, out=out, progress=False)


def fp32_problem(manifest: dict) -> str | None:
    """Why a bundle does not hold the source model's float32 weights unchanged (None when it does)."""
    dtype = manifest["graph"].get("dtype")
    stages = [stage["stage"] for stage in manifest.get("stages", [])]
    if dtype == "fp32" and not stages:
        return None
    return (f"recipe '{manifest['recipe']['name']}' with {dtype} weights and stages "
            f"{', '.join(stages) or 'none'}; the float32 benchmarks need float32 weights and no stages")
