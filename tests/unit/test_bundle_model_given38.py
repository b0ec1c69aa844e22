"""A model passed where a bundle goes (``edgesdk run model.gguf``, as llama-cli takes ``-m``; ``edgesdk deploy
MODEL_DIR``): the error says it is a model and how to build a bundle from it, not 'unpack it' or 'rebuild it'."""

from __future__ import annotations

import numpy as np
import pytest

from tests._utils.deploy import edgesdk


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    gguf = pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def build_fix(model) -> str:
    return f"fix: build a bundle from it first: edgesdk build --model {model} --target TARGET"


@pytest.mark.parametrize("command", [["verify"], ["inspect"], ["run", "--prompt", "hi", "-n", "1"]])
def test_a_gguf_file_given_as_the_bundle_is_named_with_the_build_command(gguf_file, command):
    refused = edgesdk(command[0], gguf_file, *command[1:], timeout=120)
    assert refused.returncode == 5
    assert f"error: {gguf_file} is a GGUF model file, not an edgesdk bundle" in refused.stderr
    assert build_fix(gguf_file) in refused.stderr
    assert "unpack" not in refused.stderr


def test_a_gguf_file_given_to_deploy_is_named_with_the_build_command(gguf_file, tmp_path):
    refused = edgesdk("deploy", gguf_file, "--to", tmp_path / "board", timeout=120)
    assert refused.returncode == 5
    assert f"error: {gguf_file} is a GGUF model file, not an edgesdk bundle" in refused.stderr
    assert build_fix(gguf_file) in refused.stderr
    assert not (tmp_path / "board").exists()


@pytest.mark.parametrize("command", [["verify"], ["deploy", "--to", "{board}"]])
def test_a_hugging_face_directory_given_as_the_bundle_is_named_with_the_build_command(tiny_model_dir, tmp_path,
                                                                                      command):
    args = [arg.format(board=tmp_path / "board") for arg in command[1:]]
    refused = edgesdk(command[0], tiny_model_dir, *args, timeout=120)
    assert refused.returncode == 5
    assert (f"error: {tiny_model_dir} is a Hugging Face model directory (config.json), not an edgesdk bundle"
            in refused.stderr)
    assert build_fix(tiny_model_dir) in refused.stderr
    assert "rebuild it" not in refused.stderr
