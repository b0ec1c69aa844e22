"""Bundle writing, review 53: the tokenizer's padding token recorded in the manifest (and written by the GGUF
export as tokenizer.ggml.padding_token_id), and archive names read as GNU tar's ``tar -a`` reads them."""

from __future__ import annotations

import hashlib
import json

import pytest

from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, pack_bundle, unpack_bundle, verify_bundle
from edgesdk.errors import BundleError
from tests.unit.test_bundle52 import write_bundle

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32, block_size: 32}\n"
GZIP_MAGIC = b"\x1f\x8b"


def _rewrite_manifest(path, change) -> None:
    """Change a bundle's manifest.json in place and write its digest again (as an edit on purpose would)."""
    manifest = json.loads((path / MANIFEST).read_text())
    change(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / MANIFEST).write_text(text)
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")


def test_a_bundle_records_its_tokenizers_pad_token_and_the_gguf_export_writes_its_id(tmp_path):
    """write_bundle recorded the BOS and EOS tokens but not the padding token, so the GGUF export (which writes
    tokenizer.ggml.padding_token_id from manifest tokenizer.pad_token, as llama.cpp's converter writes it from
    tokenizer_config.json) wrote none for any real bundle."""
    pytest.importorskip("torch")
    gguf = pytest.importorskip("gguf")
    from edgesdk.export.gguf_export import export_gguf
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    assert tokenizer.pad_token == "<|endoftext|>"  # the tiny model directory's tokenizer has one
    bundle = build_tiny_bundle(tmp_path, FUSED_FP32, "host")
    assert bundle.manifest["tokenizer"]["pad_token"] == tokenizer.pad_token

    path = export_gguf(bundle.path, tmp_path / "model.gguf").path
    fields = {name: field.contents() for name, field in gguf.GGUFReader(str(path)).fields.items()}
    assert fields["tokenizer.ggml.padding_token_id"] == tokenizer.pad_token_id


def test_the_pad_token_is_checked_as_the_other_special_tokens_and_may_be_absent(tmp_path):
    """A manifest's tokenizer.pad_token is a string or null like bos_token and eos_token; a bundle written before
    it was recorded (no such key) still verifies."""
    bundle = write_bundle(tmp_path / "b")
    _rewrite_manifest(bundle, lambda manifest: manifest["tokenizer"].update(pad_token=None))
    assert verify_bundle(bundle).manifest["tokenizer"]["pad_token"] is None
    _rewrite_manifest(bundle, lambda manifest: manifest["tokenizer"].pop("pad_token"))
    assert "pad_token" not in verify_bundle(bundle).manifest["tokenizer"]

    _rewrite_manifest(bundle, lambda manifest: manifest["tokenizer"].update(pad_token=0))
    with pytest.raises(BundleError, match=r"'tokenizer\.pad_token' must be a string or null, got 0"):
        verify_bundle(bundle)


@pytest.mark.parametrize("name", ["b.tar.z", "b.z"])
def test_pack_gzips_an_archive_named_dot_z_as_gnu_tar_does(tmp_path, name):
    """GNU tar's suffix table (src/suffix.c, 1.35 and later) reads a lower-case ``.z`` as gzip and only a capital ``.Z`` as
    compress; pack refused ``b.tar.z`` as asking for compress (.Z)."""
    bundle = write_bundle(tmp_path / "b")
    archive = pack_bundle(bundle, tmp_path / name)
    assert archive.read_bytes().startswith(GZIP_MAGIC)
    assert (unpack_bundle(archive, tmp_path / "out").path / "report.md").read_text() == "a small bundle\n"

