"""Board detection reads only regular files of a kernel file's size: /tmp/nv_jetson_model is anyone's to create."""

from __future__ import annotations

import os
import threading

import pytest

from edgesdk.board import detect_board

TEGRA_R36_4_3 = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8\n"


def _jetson_container_root(root):
    """A Jetson userland whose device tree is hidden (a container), so the model comes from /tmp/nv_jetson_model."""
    (root / "etc").mkdir()
    (root / "etc/nv_tegra_release").write_text(TEGRA_R36_4_3)
    (root / "tmp").mkdir()
    return root / "tmp/nv_jetson_model"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_at_nv_jetson_model_is_not_read(tmp_path):
    """A FIFO at /tmp/nv_jetson_model blocked the detection (edgesdk run, env, serve) until someone opened it for
    writing, and what they wrote became the board's model."""
    fifo = _jetson_container_root(tmp_path)
    os.mkfifo(fifo)

    stop = threading.Event()

    def writer():
        """Writes to the FIFO once a reader waits on it (opening it for writing without blocking fails with ENXIO
        until one does); a writer that blocked could wait for ever on a detection that never opens the FIFO."""
        while not stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                stop.wait(0.001)
                continue
            try:
                os.write(fd, b"NVIDIA Jetson AGX Orin Developer Kit\n")
            except OSError:  # the reader had gone (EPIPE)
                pass
            finally:
                os.close(fd)
            return

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        board = detect_board(tmp_path)
    finally:
        stop.set()
        thread.join()
    assert board.model is None
    assert board.family == "jetson"
    assert board.l4t == "36.4.3"


def test_an_oversized_nv_jetson_model_is_not_taken_for_the_model(tmp_path):
    """A link at /tmp/nv_jetson_model to a large file (or /dev/zero, read without end) was read whole."""
    _jetson_container_root(tmp_path).write_bytes(b"NVIDIA Jetson AGX Orin Developer Kit " + b"x" * (5 * 1024 * 1024))
    board = detect_board(tmp_path)
    assert board.model is None
    assert board.suggested_target is None


def test_a_copied_model_file_is_still_read(tmp_path):
    """What jetson-containers' run.sh copies there (cat /proc/device-tree/model > /tmp/nv_jetson_model) still names
    the board."""
    _jetson_container_root(tmp_path).write_bytes(b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00")
    board = detect_board(tmp_path)
    assert board.model == "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
    assert board.family == "jetson"


def test_a_non_regular_cpuinfo_is_no_cpu(tmp_path):
    """/proc/cpuinfo replaced by a character device (a link to /dev/null here) gives no CPU facts, not an error."""
    (tmp_path / "proc").mkdir()
    os.symlink(os.devnull, tmp_path / "proc/cpuinfo")
    board = detect_board(tmp_path)
    assert board.cpu_features == frozenset()
    assert board.cpu_model_name is None
