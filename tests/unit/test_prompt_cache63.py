"""The prompt cache, review 63 (edgesdk/runtime/cache_file.py, edgesdk/cli_prompt_cache.py): a cache file over which
no file can be renamed (a file bind-mounted into a container, a writable file in a directory this user may not write
to) is written in place, as llama-cli writes it; and ``--prompt-cache-all`` after a context shift no longer replaces
the prompt's cache with one that lacks the prompt."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgesdk.cli_prompt_cache import writable_prompt_cache
from edgesdk.runtime import cache_file
from tests.unit.test_prompt_cache61 import BUNDLE_ID, _filled, backend  # noqa: F401 - backend: the fixture

ENV = {**os.environ, "EDGESDK_HUGE_PAGES": "0"}


def _tokens(path: Path) -> list[int]:
    with np.load(path) as data:
        return [int(token) for token in data["tokens"]]


def test_a_cache_file_bind_mounted_over_is_written_in_place(backend, tmp_path):  # noqa: F811
    """``docker run -v $PWD/prompt.cache:/app/prompt.cache``: the file is a mount point, and the write's rename over
    it failed "Device or resource busy" after every answer (exit 1), where llama-cli's fopen("wb") writes it."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    source, target = tmp_path / "host.cache", tmp_path / "app" / "prompt.cache"
    target.parent.mkdir()
    cache_file.save(source, _filled(backend, 8, seed=1), BUNDLE_ID)
    target.write_bytes(b"")
    if subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        newer = _filled(backend, 12, seed=2)
        cache_file.save(target, newer, BUNDLE_ID)
        assert _tokens(target) == newer.tokens
        assert _tokens(source) == newer.tokens  # the mounted file itself, not a file renamed in its place
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert not [name for name in os.listdir(target.parent) if name.endswith(".partial")]


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EBUSY])  # EBUSY: a file bind-mounted over
def test_a_writable_file_whose_directory_refuses_the_copy_is_written_in_place(backend, tmp_path, monkeypatch, code):  # noqa: F811
    """A shared cache file this user may write in a directory of root's (EACCES creating the copy beside it), or
    another user's writable file in a sticky directory such as /tmp (EPERM renaming over it): written in place."""
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 8, seed=1), BUNDLE_ID)

    def refused(path, partial, mode, entries):  # as os.open / os.replace refuse it there
        raise OSError(code, os.strerror(code), str(partial))

    monkeypatch.setattr(cache_file, "_write_beside", refused)
    newer = _filled(backend, 12, seed=2)
    cache_file.save(path, newer, BUNDLE_ID)
    assert _tokens(path) == newer.tokens


def test_a_new_file_in_a_directory_that_refuses_it_is_still_an_error(backend, tmp_path, monkeypatch):  # noqa: F811
    def refused(path, partial, mode, entries):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(partial))

    monkeypatch.setattr(cache_file, "_write_beside", refused)
    with pytest.raises(PermissionError):
        cache_file.save(tmp_path / "new.cache", _filled(backend, 8, seed=1), BUNDLE_ID)
    assert not (tmp_path / "new.cache").exists()


def test_a_writable_file_in_a_directory_this_user_may_not_write_is_taken(tmp_path, monkeypatch):
    """``--prompt-cache /srv/cache/prompt.cache`` (mode 666, its directory root's) was refused before the bundle
    loaded ("its directory is not writable"), where llama-cli writes the file; it is written in place now. A new file
    there is still refused, as nothing can create it."""
    directory = tmp_path / "shared"
    directory.mkdir()
    path = directory / "prompt.cache"
    path.write_bytes(b"")
    access = os.access
    monkeypatch.setattr(os, "access", lambda where, mode: (Path(where) != directory or not mode & os.W_OK)
                        and access(where, mode))
    assert writable_prompt_cache(path) == path
    with pytest.raises(Exception, match="its directory .* is not writable by this user"):
        writable_prompt_cache(directory / "new.cache")


def _run(bundle, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgesdk", "run", str(bundle), "--threads", "1",
                           "--temperature", "0", *options], capture_output=True, env=ENV, text=True, timeout=300)


def test_prompt_cache_all_keeps_the_prompts_cache_after_a_context_shift(tiny_bundle, tmp_path):
    """``--prompt-cache-all --context-shift`` with an answer that fills the context: the cache after the shift
    begins with --keep's tokens (none by default) and goes on with the answer's end, and it was written over a
    file that held the whole prompt, so the next run prefilled the prompt again. llama-cli stops writing its file at
    a context shift; the file is left with the prompt's cache, and the answer is the one no cache gives."""
    path = tmp_path / "prompt.cache"
    prompt = ("-p", "the quick brown fox")
    written = _run(tiny_bundle.path, *prompt, "-n", "0", "--prompt-cache", str(path))
    assert written.returncode == 0, written.stderr
    held = _tokens(path)
    shifting = (*prompt, "-n", "300", "--ignore-eos", "--context-shift")
    plain = _run(tiny_bundle.path, *shifting)
    cached = _run(tiny_bundle.path, *shifting, "--prompt-cache", str(path), "--prompt-cache-all", "--stats")
    assert cached.returncode == 0, cached.stderr
    assert "context shifted" in cached.stderr
    assert cached.stdout == plain.stdout
    assert _tokens(path) == held
    assert (f"the prompt cache {path} is not rewritten: the context was shifted during the answer, so the KV cache "
            f"no longer holds the whole prompt; it keeps the {len(held)} tokens") in cached.stderr
    again = _run(tiny_bundle.path, *prompt, "-n", "4", "--prompt-cache", str(path), "--stats")
    assert f"prompt {len(held)} tok ({len(held) - 1} from the cache)" in again.stderr, again.stderr


def test_prompt_cache_all_after_a_context_shift_writes_the_kept_start_of_the_prompt(tiny_bundle, tmp_path):
    """Without a file that held the prompt, the shifted cache is written cut to the part of the prompt it still
    begins with (--keep's tokens), never the answer's end that follows them: the next run reuses that part, and its
    answer is the one no cache gives."""
    path, whole = tmp_path / "prompt.cache", tmp_path / "whole.cache"
    prompt = ("-p", "the quick brown fox")
    assert _run(tiny_bundle.path, *prompt, "-n", "0", "--prompt-cache", str(whole)).returncode == 0
    shifting = (*prompt, "-n", "300", "--ignore-eos", "--context-shift", "--keep", "4")
    cached = _run(tiny_bundle.path, *shifting, "--prompt-cache", str(path), "--prompt-cache-all")
    assert cached.returncode == 0, cached.stderr
    kept = _tokens(path)
    assert 0 < len(kept) < len(_tokens(whole))
    assert kept == _tokens(whole)[: len(kept)]
    assert f"is written with the first {len(kept)} of the prompt's {len(_tokens(whole))} tokens" in cached.stderr
    again = _run(tiny_bundle.path, *prompt, "-n", "12", "--prompt-cache", str(path), "--stats")
    assert f"({len(kept)} from the cache)" in again.stderr, again.stderr
    assert again.stdout == _run(tiny_bundle.path, *prompt, "-n", "12").stdout
