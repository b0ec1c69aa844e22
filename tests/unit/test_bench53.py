"""``edgesdk bench`` against llama-bench (ggml-org/llama.cpp tools/llama-bench/llama-bench.cpp), review 53: the
record's model_size of a bundle whose weights file is entropy-coded, and the refusal of a test too long for a
bundle's context naming the test and the bundle."""

from __future__ import annotations

import pytest

from edgesdk.bundle import read_manifest
from edgesdk.runtime.bench import bench_model_facts
from tests._utils.builds import build_codec_bundles
from tests.unit.test_cli import invoke

pytest.importorskip("torch")

RECIPE = """name: tiny-int8-{codec}
stages: []
export: {{form: ort-fused, weights: int8, weights_codec: {codec}}}
"""


@pytest.fixture(scope="module")
def plain_and_coded(tmp_path_factory):
    """The same tiny model built twice, its weights file stored plain and zlib-coded."""
    return build_codec_bundles(tmp_path_factory.mktemp("codec53"), RECIPE, "host")


def _model_size(bundle) -> int:
    return bench_model_facts(bundle.path, read_manifest(bundle.path), "ort-cpu", "edgesdk")["model_size"]


def test_model_size_counts_a_coded_weights_file_as_the_bytes_it_holds(plain_and_coded):
    """llama-bench's model_size is the bytes of the model's tensors; a zlib bundle's was its compressed file's size,
    smaller than the same weights stored plain, though the same bytes are in memory."""
    plain, coded = plain_and_coded["none"], plain_and_coded["zlib"]
    plain_files = read_manifest(plain.path)["files"]
    assert _model_size(plain) == plain_files["model.onnx"]["size"] + plain_files["model.onnx.data"]["size"]
    coded_manifest = read_manifest(coded.path)
    weights = coded_manifest["graph"]["weights"]
    assert coded_manifest["files"][weights["file"]]["size"] < weights["bytes"]  # the coding did shrink the file
    assert _model_size(coded) == coded_manifest["files"]["model.onnx"]["size"] + weights["bytes"]
    assert _model_size(coded) - coded_manifest["files"]["model.onnx"]["size"] == plain_files["model.onnx.data"]["size"]


def test_a_test_too_long_for_the_context_is_named_with_its_option_and_bundle(plain_and_coded):
    """Of several tests (-p, -n, -pg lists) on several bundles, the refusal said only "the bench needs N positions"
    and a fix naming -p, -n and -pg at once: not which test, nor which bundle."""
    plain, coded = plain_and_coded["none"].path, plain_and_coded["zlib"].path
    limit = read_manifest(plain)["graph"]["max_context"]
    result = invoke("bench", plain, "-m", coded, "-p", 8, "-n", 4, "-pg", f"{limit - 3},4", "-r", 1, "-t", 1)
    assert result.exit_code != 0
    assert (f"the bench needs {limit + 1} positions; the bundle {plain}'s max_context is {limit}, too few for the "
            f"test pp{limit - 3}+tg4") in result.output
    assert f"lower -pg {limit - 3},4 to PP + TG at most {limit}" in result.output
    result = invoke("bench", plain, "-p", 8, "-n", 4, "-n", limit, "-r", 1, "-t", 1)
    assert result.exit_code != 0
    assert f"max_context is {limit}, too few for the test tg{limit}" in result.output
    assert f"lower -n {limit} to at most {limit - 1}" in result.output


def test_eval_names_which_of_context_and_stride_is_wrong_and_the_fix(tiny_bundle, tmp_path):
    """"need context >= 2 and 1 <= stride <= context, got 64/128" left the user to work out which number was which,
    and named no fix."""
    text = tmp_path / "text.txt"
    text.write_text("Small language models run on boards at the edge of a network. " * 20)
    result = invoke("eval", tiny_bundle.path, "-f", text, "--context", 64, "--stride", 128, "-t", 1)
    assert result.exit_code == 2, result.output
    assert "stride 128 is outside 1 .. 64 (the context)" in result.output
    assert "pass a stride of 1 to 64, or none for non-overlapping windows" in result.output
    result = invoke("eval", tiny_bundle.path, "-f", text, "--context", 1, "-t", 1)
    assert result.exit_code == 2, result.output
    assert "context 1 is too short" in result.output
    assert "pass a context of 2 or more" in result.output
