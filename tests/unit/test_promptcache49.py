"""``run --prompt-cache FILE`` never writes over a file no run wrote: a mistyped path to a text or a user's
archive was "not loaded ... the next answer rewrites it" and lost, where llama-cli refuses such a session file and
leaves it alone. A cache file of another bundle, or one cut short, is still a cache file and is rewritten."""

from __future__ import annotations

import zipfile

import pytest

from tests.unit.test_cache_file import _cached, _run
from tests.unit.test_cli import invoke


def _kept(path, tiny_bundle):
    before = path.read_bytes()
    result = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--prompt-cache", path)
    assert result.exit_code != 0, result.output
    assert "is not a prompt cache file" in result.output
    assert "it is left as it is" in result.output
    assert path.read_bytes() == before
    return result


def test_a_text_file_at_the_cache_path_is_refused_and_left_whole(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("the notes a user keeps\n" * 20)
    result = _kept(path, tiny_bundle)
    assert "does not begin as the .npz archive a cache file is" in result.output


def test_a_zip_archive_that_is_not_a_cache_file_is_refused_and_left_whole(tiny_bundle, tmp_path):
    path = tmp_path / "photos.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("holiday.txt", "not a cache")
    result = _kept(path, tiny_bundle)
    assert "without a cache file's entries" in result.output


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04cut short"])
def test_an_empty_file_or_a_cache_cut_short_is_written(tiny_bundle, tmp_path, content):
    path = tmp_path / "prompt.cache"
    path.write_bytes(content)
    _run(tiny_bundle, "--prompt-cache", path)
    assert _cached(_run(tiny_bundle, "--prompt-cache", path).stderr) > 0
