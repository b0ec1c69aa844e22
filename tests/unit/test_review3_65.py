"""Review 65, third pass: an existing .npy file at a --kl-divergence-base path raised a TypeError out of the check
meant to refuse it; the --method windows note said every token of each window but its first is scored, untrue with
--stride below --context; ``chunk_perplexities`` under --method windows was documented as llama-perplexity's only;
``deploy --remove --json`` gave ``"release": null``; a GGUF export's partial file was locked through a read-only
descriptor (which an exclusive lock emulated as a POSIX lock, Linux on NFS, refuses) and a file whose lock could not
be tested was said to be held by another export."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.evaluate import check_divergence_base_writable, read_divergence_base
from tests._utils.deploy import bundle_variant, edgesdk
from tests._utils.tiny import CORPUS
from tests.unit.test_cli import assert_ok, invoke

README = Path(__file__).resolve().parents[2] / "README.md"
SETTINGS = ("--context", 64, "--max-chars", 3000, "-t", 1)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("review3_65") / "text.txt"
    path.write_text("\n".join(CORPUS * 30), encoding="utf-8")
    return path


# --- 1. a .npy file at a --kl-divergence-base path ---------------------------------------------------------------


def test_an_existing_npy_file_is_refused_by_name_as_no_base_file(tmp_path):
    path = tmp_path / "base.npy"
    np.save(path, np.arange(5))
    before = path.read_bytes()
    with pytest.raises(EdgeSDKError) as info:
        check_divergence_base_writable(path)
    assert f"--kl-divergence-base {path} exists and is no file eval --kl-divergence-base wrote (a single .npy " \
           "array, not the .npz archive eval writes)" in info.value.problem
    assert path.read_bytes() == before
    with pytest.raises(EdgeSDKError) as read:  # reading it says the same, through the same opener
        read_divergence_base(path)
    assert "a single .npy array, not the .npz archive eval writes" in read.value.problem


# --- 2. the --method windows note with --stride --------------------------------------------------------------------


def test_the_windows_note_is_true_for_strided_windows(tiny_bundle, text):
    strided = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--stride", 16)
    assert_ok(strided)
    assert "every token of each 64-token window but its first" not in strided.stderr
    assert "of each later window, started 16 tokens on, only the 16 past its overlap with the one before (each " \
           "with at least 48 tokens before it)" in strided.stderr
    plain = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS)
    assert_ok(plain)
    assert "scores every token of each 64-token window but its first, the early ones with little context, so its " \
           "figure is higher than llama-perplexity's" in plain.stderr


# --- 3. chunk_perplexities under --method windows --------------------------------------------------------------


def test_chunk_perplexities_under_windows_is_the_running_figure_and_documented_so(tiny_bundle, text):
    said = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--json")
    assert_ok(said)
    bundle = json.loads(said.stdout)["bundle"]
    assert len(bundle["chunk_perplexities"]) == bundle["windows"]
    assert bundle["chunk_perplexities"][-1] == pytest.approx(bundle["perplexity"], rel=1e-9)
    readme = README.read_text(encoding="utf-8")
    assert "`chunk_perplexities`, the same running values; under `--method windows` too, the running perplexity " \
           "after each window" in readme
    assert "with `--stride` below `--context`, a later window only its tokens past the overlap" in readme


# --- 4. deploy --remove --json names the release the board is on ---------------------------------------------


def test_remove_json_carries_the_release_the_board_is_on(tiny_bundle, tmp_path):
    root = tmp_path / "root"
    first = bundle_variant(tiny_bundle.path, tmp_path / "a", "a")
    second = bundle_variant(tiny_bundle.path, tmp_path / "b", "b")
    for bundle in (first, second):
        done = edgesdk("deploy", bundle.path, "--to", root, "--keep", "5")
        assert done.returncode == 0, done.stderr
    removed = edgesdk("deploy", "--remove", first.bundle_id, "--to", root, "--json")
    assert removed.returncode == 0, removed.stderr
    entry = json.loads(removed.stdout)
    assert (entry["ok"], entry["removed"], entry["release"]) == (True, first.bundle_id, second.bundle_id)


# --- 5. the partial file's lock -------------------------------------------------------------------------------


def _stale_partial(directory: Path) -> Path:
    path = directory / "model.gguf.0123456789ab.partial"
    path.write_bytes(b"GGUF half a file")
    os.utime(path, (1e9 - 7200, 1e9 - 7200))
    return path


def test_the_partial_file_is_locked_through_a_descriptor_with_write_access(tmp_path):
    fcntl = pytest.importorskip("fcntl")
    from edgesdk.export.gguf_export import _lock_holder, _lock_partial, _open_partial

    partial, handle = _open_partial(tmp_path / "model.gguf")
    with handle:
        lock = _lock_partial(handle)
    assert lock is not None
    try:  # kept after the write handle closes, for the verification that follows
        assert fcntl.fcntl(lock, fcntl.F_GETFL) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
        assert _lock_holder(partial) == "another export still holds it open"
    finally:
        os.close(lock)
    assert _lock_holder(partial) is None


def test_an_unlocked_stale_partial_file_is_removed(tmp_path):
    pytest.importorskip("fcntl")
    from edgesdk.export.gguf_export import clear_stale_partials

    stale = _stale_partial(tmp_path)
    notes = clear_stale_partials(tmp_path / "model.gguf", now=1e9)
    assert not stale.exists()
    assert notes[0].startswith(f"removed {stale}")


@pytest.mark.parametrize("code", [errno.EBADF, errno.ENOLCK])
def test_a_lock_the_file_system_cannot_take_is_said_so_not_called_held(tmp_path, code):
    pytest.importorskip("fcntl")
    from edgesdk.export.gguf_export import _lock_holder

    stale = _stale_partial(tmp_path)

    def no_locks(descriptor, operation):  # a file system's answer (NFS without a lock manager: ENOLCK)
        raise OSError(code, os.strerror(code))

    why = _lock_holder(stale, flock=no_locks)
    assert why == f"its file system cannot lock it ({os.strerror(code)}), so whether another export is writing it " \
                  "cannot be told"
    assert "holds it open" not in why
    assert stale.exists()
