"""The entropy-coded weights file: a zlib bundle runs exactly like the plain one, through both
ways ONNX Runtime can be handed the inflated bytes, and a damaged or mismatched file is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

pytest.importorskip("torch")

from edgesdk.errors import BundleError, ExportError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig  # noqa: E402
from edgesdk.runtime.ort_backend import make_session_options  # noqa: E402
from edgesdk.runtime.session import open_runtime  # noqa: E402
from edgesdk.weights_file import inflate_weights, open_session, store_weights  # noqa: E402
from tests._utils.builds import build_codec_bundles  # noqa: E402

RECIPE = """name: tiny-int4-{codec}
stages: []
export: {{form: ort-fused, weights: int4, embedding_bits: 8, weights_codec: {codec}}}
"""


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return build_codec_bundles(tmp_path_factory.mktemp("codec"), RECIPE, "rpi5")


def _logits(bundle, ids):
    runtime = open_runtime(bundle.path, threads=1, ignore_target=True)
    prefill = runtime.backend.prefill(ids, keep_logits=len(ids))
    return np.concatenate([prefill.reshape(len(ids), -1), runtime.backend.decode(5)[None]])


def test_zlib_bundle_is_smaller_and_computes_the_same_logits(bundles):
    plain, packed = bundles["none"], bundles["zlib"]
    record = packed.manifest["graph"]["weights"]
    assert "model.onnx.data" not in packed.manifest["files"]
    assert packed.manifest["files"][record["file"]]["size"] < record["bytes"]
    assert record["bytes"] == plain.manifest["files"]["model.onnx.data"]["size"]
    assert "weights" not in plain.manifest["graph"]
    ids = np.array([3, 17, 42, 8, 1])
    assert np.array_equal(_logits(plain, ids), _logits(packed, ids))


@pytest.mark.parametrize("in_memory", [True, False])
def test_both_loading_paths_give_the_plain_sessions_outputs(bundles, in_memory):
    """In-memory external data (ONNX Runtime >= 1.23) and the temporary-directory fallback."""
    plain, packed = bundles["none"], bundles["zlib"]
    graph = packed.manifest["graph"]
    session = open_session(packed.file(graph["file"]), make_session_options(1), ["CPUExecutionProvider"],
                           graph["weights"], in_memory=in_memory, provider_options=[{}])
    reference = open_session(plain.file(graph["file"]), make_session_options(1), ["CPUExecutionProvider"], None)
    feeds = {}
    for spec in reference.get_inputs():
        shape = [1 if not isinstance(d, int) else d for d in spec.shape]
        if spec.name == "input_ids":
            feeds[spec.name] = np.array([[4, 9, 2]], np.int64)
        elif spec.name.startswith("past_key_values"):
            shape[2] = 8
            feeds[spec.name] = np.zeros(shape, np.float32)
        elif spec.name == "seqlens_k":
            feeds[spec.name] = np.array([2], np.int32)
        elif spec.name == "total_sequence_length":
            feeds[spec.name] = np.array(3, np.int32)
        else:
            feeds[spec.name] = np.array([3], np.int64)
    assert np.array_equal(session.run(["logits"], feeds)[0], reference.run(["logits"], feeds)[0])


def test_inflated_bytes_that_differ_from_the_manifest_are_refused(bundles, tmp_path):
    packed = bundles["zlib"]
    record = dict(packed.manifest["graph"]["weights"])
    data = zlib.decompress((packed.path / record["file"]).read_bytes())
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0xFF
    (tmp_path / record["file"]).write_bytes(zlib.compress(bytes(changed)))
    with pytest.raises(BundleError, match="differ from the manifest"):
        inflate_weights(tmp_path, record)
    (tmp_path / record["file"]).write_bytes(b"not deflate data")
    with pytest.raises(BundleError, match="could not be inflated"):
        inflate_weights(tmp_path, record)
    with pytest.raises(BundleError, match="weights codec 'lzma'"):
        inflate_weights(packed.path, {**record, "codec": "lzma"})


def test_a_stream_that_inflates_past_the_manifests_length_stops_there(tmp_path):
    """A small file can inflate to gigabytes; only the manifest's length plus one byte is ever inflated."""
    (tmp_path / "w.zlib").write_bytes(zlib.compress(bytes(64 << 20), 9))  # 64 MiB of zeros in ~65 kB
    record = {"file": "w.zlib", "codec": "zlib", "bytes": 1000, "sha256": "0" * 64}
    with pytest.raises(BundleError, match=r"length more than 1,000, expected 1,000"):
        inflate_weights(tmp_path, record)
    (tmp_path / "w.zlib").write_bytes(zlib.compress(bytes(1000))[:-8])  # truncated: a short length, refused too
    with pytest.raises(BundleError, match="differ from the manifest"):
        inflate_weights(tmp_path, record)


def test_store_weights_round_trip_and_plain_copy(tmp_path):
    source = tmp_path / "model.onnx.data"
    payload = np.random.default_rng(0).integers(0, 16, 100_000, dtype=np.uint8).tobytes()
    source.write_bytes(payload)
    (tmp_path / "out").mkdir()
    name, record = store_weights(source, tmp_path / "out", "zlib")
    assert name == "model.onnx.data.zlib"
    assert json.loads(json.dumps(record)) == record
    assert inflate_weights(tmp_path / "out", record) == payload
    name, record = store_weights(source, tmp_path / "out", "none")
    assert name == "model.onnx.data"
    assert record is None
    assert (tmp_path / "out" / name).read_bytes() == payload


def test_inspect_shows_the_coded_and_inflated_sizes(bundles):
    from click.testing import CliRunner

    from edgesdk.cli import main

    result = CliRunner().invoke(main, ["inspect", str(bundles["zlib"].path)])
    assert result.exit_code == 0, result.output
    assert "model.onnx.data.zlib: zlib" in result.output
    assert "MB in memory" in result.output


def test_codec_needs_the_fused_form():
    with pytest.raises(ExportError, match="needs the ort-fused form"):
        ExportConfig(form="standard", weights="int8", weights_codec="zlib")
    with pytest.raises(ExportError, match="weights_codec 'brotli' is unknown"):
        ExportConfig(form="ort-fused", weights="int4", weights_codec="brotli")


def test_temporary_directory_session_cannot_change_providers_later(bundles):
    """Why ort-trt passes its options when the session is made: set_providers() reloads the model
    from its path, and the fallback's temporary directory is gone by then."""
    graph = bundles["zlib"].manifest["graph"]
    session = open_session(bundles["zlib"].file(graph["file"]), make_session_options(1), ["CPUExecutionProvider"],
                           graph["weights"], in_memory=False)
    with pytest.raises(Exception, match="edgesdk-weights-"):
        session.set_providers(["CPUExecutionProvider"], [{}])


FULL_TEMPORARY_DIRECTORY = """
import resource, signal, sys
from pathlib import Path
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.ort_backend import make_session_options
from edgesdk.weights_file import open_session

model, weights = Path(sys.argv[1]), __import__("json").loads(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    open_session(model, make_session_options(1), ["CPUExecutionProvider"], weights, in_memory=False)
except EdgeSDKError as exc:
    print(type(exc).__name__, exc)
"""


def test_no_room_for_the_temporary_copy_names_the_directory_and_tmpdir(bundles, tmp_path):
    """The fallback writes the inflated weights to a temporary directory: when they do not fit, the
    error names that directory and TMPDIR, not a raw OSError (or 'run edgesdk verify' on a sound bundle)."""
    graph = bundles["zlib"].manifest["graph"]
    child = subprocess.run([sys.executable, "-c", FULL_TEMPORARY_DIRECTORY, str(bundles["zlib"].file(graph["file"])),
                            json.dumps(graph["weights"])], capture_output=True, text=True,
                           env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("RuntimeBackendError the inflated weights of"), child.stdout
    assert f"temporary directory {tmp_path}" in child.stdout
    assert "File too large" in child.stdout
    assert f"free 1 MB in {tmp_path}, or point TMPDIR at a directory" in child.stdout
    assert not list(tmp_path.glob("edgesdk-weights-*"))  # the partial copy is gone
