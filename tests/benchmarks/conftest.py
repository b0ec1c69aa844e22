"""Benchmarks build the real SmolLM2 bundles once (or reuse prebuilt ones, see bench_bundles.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.benchmarks.bench_bundles import FP32_RECIPE, FP32_VARIABLE, fp32_build_config, fp32_problem


def pytest_collection_modifyitems(items):
    """Benchmarks build and time real models for as long as they need: the default run's per-test timeout
    (pyproject.toml) does not hold them. Under ``-n`` (pytest-xdist) another worker would share the cores
    with the engine being timed, so they are skipped there."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    for item in items:
        if "tests/benchmarks/" in item.nodeid:
            item.add_marker(pytest.mark.timeout(0))
            if worker:
                item.add_marker(pytest.mark.skip(reason=f"benchmarks time one engine at a time, and this is "
                                                        f"pytest-xdist worker {worker}: run them without -n"))


@pytest.fixture(scope="session")
def smollm2_rpi5_bundle(tmp_path_factory):
    """The rpi5 target's default build ($EDGESDK_BENCH_BUNDLE reuses any bundle)."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.bundle import verify_bundle

    existing = os.environ.get("EDGESDK_BENCH_BUNDLE")
    if existing:
        return verify_bundle(Path(existing))
    return build(BuildConfig(target="rpi5", out=tmp_path_factory.mktemp("bench") / "smollm2-135m-rpi5",
                             progress=False))


@pytest.fixture(scope="session")
def smollm2_fp32_bundle(tmp_path_factory):
    """SmolLM2-135M uncompressed (recipe fp32-fused) for the comparisons with PyTorch's float32 model;
    $EDGESDK_BENCH_FP32_BUNDLE reuses a build, which must be uncompressed too."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import build
    from edgesdk.bundle import verify_bundle

    existing = os.environ.get(FP32_VARIABLE)
    if existing:
        bundle = verify_bundle(Path(existing))
        problem = fp32_problem(bundle.manifest)
        if problem:
            pytest.fail(f"${FP32_VARIABLE}={existing} is {problem}; build one with "
                        f"'edgesdk build --target rpi5 --recipe {FP32_RECIPE}' and point the variable at it",
                        pytrace=False)
        return bundle
    return build(fp32_build_config(tmp_path_factory.mktemp("bench") / "smollm2-135m-rpi5-fp32"))
