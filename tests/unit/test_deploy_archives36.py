"""``edgesdk deploy ARCHIVE``: every archive 'edgesdk pack' writes is deployed, and an archive compressed with a
format edgesdk cannot read is named with the command that decompresses it, as 'edgesdk unpack' does."""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess

import pytest

from edgesdk.bundle import COMPRESSED_SUFFIXES, pack_bundle
from edgesdk.deploy.session import unpack_if_archive
from edgesdk.errors import BundleError
from tests._utils.deploy import edgesdk


@pytest.mark.parametrize("name", ["b.tar", *(f"b{suffix}" for suffix in COMPRESSED_SUFFIXES), "b.bundle", "b"])
def test_every_archive_pack_writes_is_unpacked_for_deploy(tiny_bundle, tmp_path, name):
    """'edgesdk pack' writes a plain tar under any name it does not read as a compressor's; deploy took such a
    file for 'a file, not a bundle directory'."""
    archive = pack_bundle(tiny_bundle.path, tmp_path / name)
    with contextlib.ExitStack() as stack:
        unpacked = unpack_if_archive(archive, stack)
        assert unpacked.is_dir()
        assert (unpacked / "manifest.json").read_bytes() == (tiny_bundle.path / "manifest.json").read_bytes()
    assert not unpacked.exists()  # the temporary copy goes with the deploy


@pytest.mark.parametrize(("tool", "suffix", "kind"), [("zstd", ".tar.zst", "zstd"), ("zstd", ".zst", "zstd"),
                                                      ("lz4", ".tar.lz4", "lz4")])
def test_deploy_names_a_compression_it_cannot_read_and_its_command(tiny_bundle, tmp_path, tool, suffix, kind):
    """A .tar.zst or .tar.lz4 was refused as 'a file, not a bundle directory' with the fix to unpack it first,
    which 'edgesdk unpack' then refused too."""
    if shutil.which(tool) is None:
        pytest.skip(f"needs the {tool} command")
    plain = pack_bundle(tiny_bundle.path, tmp_path / "b.tar")
    archive = tmp_path / f"b{suffix}"
    subprocess.run([tool, "-q", str(plain), *(["-o"] if tool == "zstd" else []), str(archive)], check=True)
    proc = edgesdk("deploy", archive, "--to", tmp_path / "board")
    assert proc.returncode == 5, proc.stderr
    assert f"{archive} is {kind}-compressed, which edgesdk cannot read" in proc.stderr
    assert f"{kind} -dc {shlex.quote(str(archive))} > " in proc.stderr  # to stdout: works whatever the suffix
    assert "not a bundle directory" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "board").exists()  # nothing was written


def test_a_file_that_is_no_archive_is_named(tmp_path):
    stray = tmp_path / "model.onnx"
    stray.write_bytes(b"\x08\x07" * 600)
    with contextlib.ExitStack() as stack, pytest.raises(BundleError) as info:
        unpack_if_archive(stray, stack)
    assert f"{stray} is a file, but neither a bundle directory nor a bundle archive" in info.value.problem
    assert "'edgesdk pack'" in info.value.fix
