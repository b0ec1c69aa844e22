"""The bundle's weights file (the graph's external data), stored plain or entropy-coded.

Quantized codes are far from uniformly distributed: the 4-bit codes of bell-shaped weights (and
the INT8 codes of an 8-bit embedding) carry fewer bits of information than they occupy. DEFLATE
(``zlib``, in every Python's standard library, so on every board) stores the default bundle's
INT4 SmolLM2-135M weights file (INT4 embedding, float16 scales) in 91 % of its bytes: 66.1 of
72.6 MB (README.md). This is the last step of Deep Compression (Han et al. 2016: pruning, trained
quantization, then Huffman coding), with DEFLATE's Huffman stage in place of a hand-made code.

The board inflates the file into memory, checks its length and SHA-256 against the manifest, and
hands the bytes to ONNX Runtime as the graph's external data
(``SessionOptions.add_external_initializers_from_files_in_memory``, ONNX Runtime >= 1.23). Older
releases (JetPack images often carry one) get the bytes through a private temporary directory
that is removed once the session has loaded. Either way the weights in memory are the same bytes
as a plain bundle's, so speed and numerics do not change; only the bundle on disk and over the
wire is smaller, and loading takes the inflate time (~0.5 s per 100 MB on a 2-core x86 host).

The manifest's ``graph.weights`` record::

    {"file": "model.onnx.data.zlib", "codec": "zlib", "external_name": "model.onnx.data",
     "bytes": <inflated length>, "sha256": <of the inflated bytes>}
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
import zlib
from pathlib import Path

from edgesdk.errors import BundleError, RuntimeBackendError

CODECS = ("none", "zlib")
CHUNK = 1 << 22  # bytes read per step while deflating (bounded memory)
ZLIB_LEVEL = 9  # DEFLATE's smallest output; inflating costs the same at any level
DEFLATE_MAX_RATIO = 1032  # the most bytes DEFLATE inflates one byte to (zlib's technical details: 1032:1)


def store_weights(source: Path, destination_dir: Path, codec: str) -> tuple[str, dict | None]:
    """Write ``source`` into ``destination_dir`` with ``codec``.

    Returns the file name written and the manifest record (None for a plain copy)."""
    if codec not in CODECS:
        raise ValueError(f"weights codec must be one of {CODECS}, got {codec!r}")
    if codec == "none":
        shutil.copyfile(source, destination_dir / source.name)
        return source.name, None
    name = f"{source.name}.{codec}"
    digest, length = hashlib.sha256(), 0
    deflater = zlib.compressobj(ZLIB_LEVEL)
    with open(source, "rb") as plain, open(destination_dir / name, "wb") as packed:
        while chunk := plain.read(CHUNK):
            digest.update(chunk)
            length += len(chunk)
            packed.write(deflater.compress(chunk))
        packed.write(deflater.flush())
    return name, {"file": name, "codec": codec, "external_name": source.name, "bytes": length,
                  "sha256": digest.hexdigest()}


def inflate_weights(bundle_dir: Path, record: dict) -> bytes:
    """The weights file's bytes as the graph expects them; a damaged file is refused here."""
    path = Path(bundle_dir) / record["file"]
    if record.get("codec") != "zlib":
        raise BundleError(f"{path} uses weights codec {record.get('codec')!r}; this edgesdk inflates 'zlib' (a plain "
                          "weights file has no graph.weights record)",
                          "upgrade edgesdk on this machine, or rebuild the bundle with export.weights_codec: none")
    inflater = zlib.decompressobj()
    try:
        coded = path.read_bytes()
        # At most one byte past the manifest's length: a stream that would inflate further (a bundle whose
        # manifest was rewritten to match it) is refused below instead of filling the memory first. No stream
        # inflates past DEFLATE's ratio either, which keeps a manifest's huge length within what zlib can count.
        limit = min(max(int(record["bytes"]), 0), DEFLATE_MAX_RATIO * len(coded))
        data = inflater.decompress(coded, limit + 1)
    except (OSError, zlib.error) as exc:
        raise BundleError(f"{path} could not be inflated ({exc})",
                          "run 'edgesdk verify' on the bundle, then re-copy or rebuild it") from exc
    if len(data) == record["bytes"] and not (inflater.eof and not inflater.unused_data):
        # store_weights writes one whole stream: one cut before its check value, or followed by other bytes, is not it
        raise BundleError(f"{path} is not one whole zlib stream ("
                          + ("bytes follow its end" if inflater.eof else "it ends before its check value") + ")",
                          "re-copy the bundle from the host or rebuild it")
    if len(data) != record["bytes"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise BundleError(f"{path} inflates to bytes that differ from the manifest's (length {len(data):,}, "
                          f"expected {record['bytes']:,}, or a different sha256)",
                          "re-copy the bundle from the host or rebuild it")
    return data


def open_session(model_path: Path, options, providers: list[str], record: dict | None, in_memory: bool | None = None,
                 provider_options: list[dict] | None = None):
    """An ``onnxruntime.InferenceSession`` for ``model_path`` whose external data is plain on disk
    (``record`` None) or stored by :func:`store_weights`. ``in_memory`` (default: when ONNX Runtime
    offers it) passes the inflated bytes without touching the disk; otherwise they go to a temporary
    directory that is gone once the session exists, so the execution providers and their options
    (``provider_options``, one dict per provider) must be final here: ``set_providers`` would
    reload the model from that directory. ``options`` are single-use with in-memory weights: ONNX
    Runtime keeps a pointer to bytes that are freed on return, so make fresh options for every
    session (``edgesdk.runtime.ort_backend.make_session_options``)."""
    import onnxruntime as ort

    if record is None:
        return ort.InferenceSession(str(model_path), options, providers=providers, provider_options=provider_options)
    data = inflate_weights(model_path.parent, record)
    if in_memory is None:
        in_memory = hasattr(options, "add_external_initializers_from_files_in_memory")
    if in_memory:
        options.add_external_initializers_from_files_in_memory([record["external_name"]], [data], [len(data)])
        return ort.InferenceSession(str(model_path), options, providers=providers, provider_options=provider_options)
    with tempfile.TemporaryDirectory(prefix="edgesdk-weights-") as tmp:
        try:
            shutil.copyfile(model_path, Path(tmp) / model_path.name)
            (Path(tmp) / record["external_name"]).write_bytes(data)
        except OSError as exc:
            raise _temporary_copy_error(model_path, tmp, len(data), exc, ort.__version__) from exc
        return ort.InferenceSession(str(Path(tmp) / model_path.name), options, providers=providers,
                                    provider_options=provider_options)


def _temporary_copy_error(model_path: Path, directory: str, size: int, exc: OSError, version: str):
    """The error for inflated weights that could not be written to the temporary directory (a full
    disk, a quota): it names that directory and the room needed, not the bundle, which is fine."""
    needed_mb = math.ceil((size + model_path.stat().st_size) / 1e6)
    return RuntimeBackendError(
        f"the inflated weights of {model_path.parent} could not be written to the temporary directory "
        f"{directory}: {exc.strerror or exc} (onnxruntime {version} is handed them as files there, "
        f"{needed_mb} MB with the graph, removed once the session has loaded)",
        f"free {needed_mb} MB in {Path(directory).parent}, or point TMPDIR at a directory with that much room "
        "(e.g. TMPDIR=/var/tmp); onnxruntime >= 1.23 takes the weights from memory and needs no copy",
    )
