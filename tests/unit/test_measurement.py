"""The measurement code the benchmarks rely on, run on the tiny model: which bundle the fp32
benchmarks build, and the helpers the speed benchmarks time their two sides with."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("onnxruntime")


def test_fp32_benchmarks_build_the_uncompressed_model(tmp_path):
    from edgesdk.build.recipes import load_recipe
    from tests.benchmarks.bench_bundles import fp32_build_config

    config = fp32_build_config(tmp_path / "b")
    recipe = load_recipe(config.recipe)
    assert config.target == "rpi5"
    assert recipe.validated() == []  # no stage changes the weights
    assert recipe.export.weights == "fp32"


def test_fp32_check_accepts_an_uncompressed_bundle_and_names_a_compressed_one(tiny_bundle):
    from tests.benchmarks.bench_bundles import fp32_problem

    assert fp32_problem(tiny_bundle.manifest) is None  # the host target's default: fp32-fused
    compressed = copy.deepcopy(tiny_bundle.manifest)
    compressed["recipe"]["name"] = "default"
    compressed["graph"]["dtype"] = "int4"
    compressed["stages"] = [{"stage": "qat"}]
    problem = fp32_problem(compressed)
    assert all(part in problem for part in ("'default'", "int4", "qat"))
