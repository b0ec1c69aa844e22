"""Benchmarks build the real SmolLM2 bundle once (or reuse $EDGESDK_BENCH_BUNDLE)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_rpi5_bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.bundle import verify_bundle

    existing = os.environ.get("EDGESDK_BENCH_BUNDLE")
    if existing:
        return verify_bundle(Path(existing))
    return build(BuildConfig(target="rpi5", out=tmp_path_factory.mktemp("bench") / "smollm2-135m-rpi5",
                             progress=False))
