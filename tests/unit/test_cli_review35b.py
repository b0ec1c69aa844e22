"""run --prompt-cache FILE whose directory cannot hold the file: refused before the bundle loads. The run
answered in full (seconds to minutes on a board) and only then failed to write the cache, with exit 1 and a fix
about a directory this user may write to where the directory did not exist."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.unit.test_bundle import flip_byte
from tests.unit.test_cli import invoke


def _run(bundle, cache):
    return invoke("run", bundle, "--prompt", "hello", "-n", 4, "--threads", 1, "--stats", "--prompt-cache", cache)


def _refused(result, cache, *fragments):
    assert result.exit_code == 2, result.output  # a usage error, not a crash
    assert "Traceback" not in result.output
    assert result.stdout == ""  # nothing was generated
    assert "[ort-cpu] prompt" not in result.stderr
    assert f"Invalid value for '--prompt-cache': cannot write the prompt cache {cache}: " in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_a_cache_in_a_directory_that_does_not_exist_is_refused_before_the_bundle_loads(tiny_bundle, tmp_path):
    damaged = shutil.copytree(tiny_bundle.path, tmp_path / "bundle")
    flip_byte(damaged / "model.onnx", 100)  # loading this bundle fails its verification
    assert _run(damaged, tmp_path / "prompt.cache").exit_code != 0
    cache = tmp_path / "caches" / "prompt.cache"
    result = _run(damaged, cache)
    _refused(result, cache, f"its directory {cache.parent} does not exist",
             f"create it first (mkdir -p {cache.parent}) or pass a path in an existing directory")
    assert "verif" not in result.stderr.lower()  # the path was checked first
    assert not cache.parent.exists()


def test_a_cache_under_a_file_is_refused(tiny_bundle, tmp_path):
    (tmp_path / "notes").write_text("a file")
    cache = tmp_path / "notes" / "prompt.cache"
    _refused(_run(tiny_bundle.path, cache), cache, f"{cache.parent} is not a directory",
             "pass a path in an existing directory")
    deeper = tmp_path / "notes" / "caches" / "prompt.cache"
    _refused(_run(tiny_bundle.path, deeper), deeper,
             f"its directory {deeper.parent} cannot exist: {tmp_path / 'notes'} is a file")


def test_a_link_to_a_cache_in_a_missing_directory_names_that_directory(tiny_bundle, tmp_path):
    """The write goes beside the file the link points to, so that directory is the one that must exist."""
    link = tmp_path / "prompt.cache"
    link.symlink_to(tmp_path / "data" / "prompt.cache")
    _refused(_run(tiny_bundle.path, link), link, f"its directory {tmp_path / 'data'} does not exist")
    (tmp_path / "data").mkdir()
    result = _run(tiny_bundle.path, link)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "data" / "prompt.cache").is_file()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to any directory")
def test_a_cache_in_a_directory_this_user_may_not_write_is_refused(tiny_bundle, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        cache = locked / "prompt.cache"
        _refused(_run(tiny_bundle.path, cache), cache, f"its directory {locked} is not writable by this user",
                 f"or make {locked} writable")
    finally:
        locked.chmod(0o755)


def test_a_cache_in_the_current_directory_is_written(tiny_bundle, tmp_path, monkeypatch):
    """A bare file name has the directory '.', which is checked as the current directory."""
    monkeypatch.chdir(tmp_path)
    result = _run(tiny_bundle.path, "prompt.cache")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "prompt.cache").is_file()
