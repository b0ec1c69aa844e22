"""GGUF export: outputs that cannot be written, and the tokenizer metadata llama.cpp reads."""

from __future__ import annotations

import os
import resource
import signal

import numpy as np
import pytest

from edgesdk.errors import ExportError
from tests.unit.test_gguf_export import _bundle

pytest.importorskip("gguf")
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def int4_bundle(tmp_path_factory):
    return _bundle(tmp_path_factory.mktemp("int4"), "int4", block=64)


def test_an_output_in_a_missing_directory_is_refused_by_name_without_a_traceback(int4_bundle, tmp_path):
    from click.testing import CliRunner

    from edgesdk.cli import main

    out = tmp_path / "missing" / "model.gguf"
    result = CliRunner().invoke(main, ["export", str(int4_bundle.path), str(out)])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code != 0
    assert f"its directory {out.parent} does not exist" in result.output
    assert "mkdir -p" in result.output
    assert not out.parent.exists()


def _open_files() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to list open files")
def test_a_write_that_fails_midway_is_refused_closes_the_file_and_keeps_the_old_output(int4_bundle, tmp_path):
    """A file size limit (RLIMIT_FSIZE) makes the write fail part way, as a full disk does."""
    from edgesdk.export.gguf_export import export_gguf

    out = tmp_path / "model.gguf"
    out.write_bytes(b"an earlier export")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16_384, hard))
        with pytest.raises(ExportError, match="cannot write .*model.gguf") as refused:
            export_gguf(int4_bundle.path, out)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert "writable directory with room" in refused.value.fix
    assert out.read_bytes() == b"an earlier export"
    assert not (tmp_path / "model.gguf.partial").exists()
    assert not [name for name in _open_files() if name.startswith(str(tmp_path))]


def test_a_tokenizer_without_an_eos_token_still_gives_llama_cpp_the_bundles_end_of_generation_id(tmp_path):
    """Without tokenizer.ggml.eos_token_id llama.cpp's gpt2 vocabulary takes id 11 (an ordinary byte
    token here) as end of generation; the bundle stops at its manifest's eos_token_ids."""
    import json

    from gguf import GGUFReader

    from edgesdk.export.gguf_export import export_gguf
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = model_dir / name
        if path.is_file():
            spec = json.loads(path.read_text())
            spec.pop("eos_token", None)
            path.write_text(json.dumps(spec))
    recipe = "name: fused\nstages: []\nexport: {form: ort-fused, weights: int8}\n"
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=model_dir)
    tokenizer = bundle.manifest["tokenizer"]
    assert tokenizer["eos_token"] is None
    assert tokenizer["eos_token_ids"]
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    fields = GGUFReader(str(report.path)).fields
    assert "tokenizer.ggml.eos_token_id" in fields
    assert fields["tokenizer.ggml.eos_token_id"].contents() in tokenizer["eos_token_ids"]


@pytest.mark.parametrize("bits", [4, 8])
def test_block_scales_that_are_not_float16_values_are_written_exactly_as_f32(bits, tmp_path):
    """Bundles of schema 1 (still readable) stored float32 block scales; a ggml block's float16 d
    would round them, and the read-back refused the file as a bug in the export."""
    from gguf import GGMLQuantizationType, GGUFWriter

    from edgesdk.export.blockwise import BlockQuantized, quantize_blockwise
    from edgesdk.export.gguf_export import verify_gguf
    from edgesdk.export.gguf_tensors import decoded_values, encode_matrix, exact_ggml_type

    weight = np.random.default_rng(bits).standard_normal((128, 48)).astype(np.float32)  # (K, N)
    half = quantize_blockwise(weight, bits, 64)
    assert exact_ggml_type(half) == ("Q4_0" if bits == 4 else "Q8_0")
    scales = (half.scales * np.float32(1 + 2.0 ** -20)).astype(np.float32)  # float32 values between float16 ones
    assert not np.array_equal(scales.astype(np.float16).astype(np.float32), scales)
    single = BlockQuantized(half.packed, scales, bits, half.block_size, half.k, half.n)
    encoded = encode_matrix(single)
    assert encoded.quant is None
    assert np.array_equal(encoded.data, decoded_values(single))

    path = tmp_path / "one.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.ffn_down.weight", encoded.data,
                      raw_dtype=None if encoded.quant is None else GGMLQuantizationType[encoded.quant])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert verify_gguf(path, {"blk.0.ffn_down.weight": single}) == 1
