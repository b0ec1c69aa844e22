"""Text inputs read once: a pipe gives its bytes on the first read only."""

from __future__ import annotations

import os
import threading

import pytest

from edgesdk.errors import EdgeSDKError, read_utf8


def _piped(tmp_path, data: bytes):
    """A named pipe that a writer thread fills once with ``data`` (as ``<(zcat ...)`` or ``-f /dev/stdin``)."""
    fifo = tmp_path / "text.fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "wb") as sink:
            sink.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return fifo, writer


def test_utf16_text_without_a_mark_piped_in_is_refused_by_name(tmp_path):
    """The NUL check read the path a second time for its bytes: on a pipe that read is empty, so BOM-less UTF-16
    text piped in was taken as text with a NUL after each character."""
    fifo, writer = _piped(tmp_path, "the cat sat on the mat\n".encode("utf-16-le"))
    with pytest.raises(EdgeSDKError, match="bytes are NUL, where utf-16le text without a byte-order mark"):
        read_utf8(fifo, "--text")
    writer.join(timeout=10)


def test_piped_utf8_text_reads_as_a_file_does(tmp_path):
    text = "line one\r\nline two\rline three\n"
    (tmp_path / "file.txt").write_bytes(text.encode("utf-8"))
    fifo, writer = _piped(tmp_path, text.encode("utf-8"))
    assert read_utf8(fifo, "--text") == read_utf8(tmp_path / "file.txt", "--text") == \
        (tmp_path / "file.txt").read_text(encoding="utf-8")
    writer.join(timeout=10)
