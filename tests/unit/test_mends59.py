"""Shared helpers in edgesdk/errors.py: a bundle whose staging directory a quota (EDQUOT) or a file size limit
(EFBIG) refuses is told to free space as a full disk is (it was told to make the directory writable), and
``run -f`` reads its file through read_utf8, so BOM-less UTF-16 piped in is refused as a file of it is."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from edgesdk.build.checkpoint import DISK_FULL as CHECKPOINT_DISK_FULL
from edgesdk.build.checkpoint import disk_full as checkpoint_disk_full
from edgesdk.bundle import BundleWriter
from edgesdk.errors import DISK_FULL, BundleError, did_you_mean, disk_full
from tests.unit.test_cli import invoke


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_staging_directory_with_no_room_is_told_to_free_space(tmp_path, monkeypatch, code):
    def no_room(self, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "mkdir", no_room)
    with pytest.raises(BundleError) as refused:
        BundleWriter(tmp_path / "b", terms="cli")
    assert refused.value.problem == f"the bundle {tmp_path / 'b'} cannot be written: the disk of {tmp_path} is full"
    assert refused.value.fix == "free space there, or pass --out a path on another disk"


def test_a_staging_directory_not_writable_is_still_told_so(tmp_path, monkeypatch):
    def refused_write(self, *args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refused_write)
    with pytest.raises(BundleError) as refused:
        BundleWriter(tmp_path / "b", terms="python")
    assert "(Permission denied)" in refused.value.problem
    assert refused.value.fix == f"pass out a path in a directory you may write, or make {tmp_path} writable"


def test_the_helpers_are_the_ones_checkpoint_names():
    assert CHECKPOINT_DISK_FULL is DISK_FULL
    assert checkpoint_disk_full is disk_full
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert disk_full(RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert did_you_mean("qatt", ["prune", "qat"]) == "; did you mean 'qat'?"
    assert did_you_mean("zzz", ["prune", "qat"]) == ""


def test_run_file_with_utf16_without_a_mark_piped_in_is_refused(tiny_bundle, tmp_path):
    """``run -f <(cmd)``: a pipe's bytes were decoded by read_utf8_as_is itself, skipping read_utf8's check for
    UTF-16 without a byte-order mark, so ASCII text in it became a prompt with a NUL after each character."""
    fifo = tmp_path / "prompt.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as out:  # blocks until a reader opens the pipe
            out.write("tell me about the cat on the mat\n".encode("utf-16-le"))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        result = invoke("run", tiny_bundle.path, "-f", fifo, "--raw", "-n", 4, "--threads", 1)
    finally:  # a run that never opened the pipe leaves the writer waiting for a reader: be that reader
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer.join(timeout=10)
        os.close(reader)
    assert result.exit_code != 0, result.output
    assert f"--file {fifo} is not UTF-8 text" in result.output, result.output
    assert "where utf-16le text without a byte-order mark has them" in result.output, result.output
    assert "iconv -f utf-16le -t utf-8" in result.output, result.output
