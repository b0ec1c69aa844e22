"""Model sources: a cached alias that is not the pinned file where fetching is off, and a weights index that
transformers cannot read."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models import sources
from edgesdk.models.sources import cached_alias_path, resolve_model

ALIAS = "smollm2-135m"


# ---------------------------------------------------------------------------------------------------- cached alias
@pytest.fixture
def small_alias(tmp_path, monkeypatch):
    """The default alias pinned to a small file (its content, size and sha256), cached under a fresh
    $EDGESDK_CACHE: (the pinned content, the path of its cached copy)."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    pinned = b"GGUF" + bytes(range(256)) * 4
    alias = dataclasses.replace(sources.ALIASES[ALIAS], size=len(pinned), sha256=hashlib.sha256(pinned).hexdigest())
    monkeypatch.setitem(sources.ALIASES, ALIAS, alias)
    cached = cached_alias_path(ALIAS)
    cached.parent.mkdir(parents=True)
    return pinned, cached


def test_a_cached_alias_cut_short_is_refused_where_fetching_is_off(small_alias):
    """resolve_model(alias, fetch=False) returned a cached copy of the wrong size as the model, where fetch_alias
    fetches such a copy again and never uses it."""
    pinned, cached = small_alias
    cached.write_bytes(pinned[:100])
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(ALIAS, fetch=False)
    assert f"model alias '{ALIAS}': the cached copy {cached} is damaged (100 bytes, expected {len(pinned):,})" \
        in refused.value.problem
    assert f"run 'edgesdk models fetch {ALIAS}'" in refused.value.fix


def test_a_cached_alias_with_another_sha256_is_refused_where_fetching_is_off(small_alias):
    """A cached copy of the right size whose bytes were written over (its sha256 not the pinned one) was used."""
    pinned, cached = small_alias
    cached.write_bytes(pinned[:-1] + b"!")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(ALIAS, fetch=False, terms="python")
    assert "is damaged (sha256 " in refused.value.problem
    assert f"expected {sources.ALIASES[ALIAS].sha256}" in refused.value.problem
    assert "as build_bundle()'s model" in refused.value.fix


def test_the_pinned_cached_alias_is_taken_where_fetching_is_off(small_alias):
    pinned, cached = small_alias
    cached.write_bytes(pinned)
    source = resolve_model(ALIAS, fetch=False)
    assert (source.kind, source.path, source.name) == ("gguf", cached, ALIAS)


def test_an_alias_not_fetched_is_still_named_as_not_fetched(small_alias):
    _, cached = small_alias
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(ALIAS, fetch=False)
    assert refused.value.problem == f"model alias '{ALIAS}' is not fetched yet (no {cached})"


# ---------------------------------------------------------------------------------------------------- weights index
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def _sharded_directory(path, index_text: str, name: str = "model.safetensors.index.json"):
    """A Hugging Face directory with two shards present and the index ``index_text`` beside them."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    for shard in SHARDS:
        (path / shard).write_bytes(b"\0" * 16)
    (path / name).write_text(index_text, encoding="utf-8")
    return path


WHOLE_INDEX = {"metadata": {"total_size": 32}, "weight_map": {"a.weight": SHARDS[0], "b.weight": SHARDS[1]}}


@pytest.mark.parametrize(("index_text", "named"), [
    # a download cut short: transformers said only "JSONDecodeError: Expecting ',' delimiter ..."
    (json.dumps(WHOLE_INDEX)[:40], "is not readable JSON (Unterminated string"),
    ("[]", "holds a JSON list, not the object save_pretrained writes"),
    # transformers: "KeyError: 'weight_map'" / "AttributeError: 'list' object has no attribute 'values'"
    (json.dumps({"metadata": {}}), "has no weight_map object (tensor name -> shard file)"),
    (json.dumps({"metadata": {}, "weight_map": [SHARDS[0]]}), "has no weight_map object (tensor name -> shard "
                                                               "file), which transformers finds the shards by; it "
                                                               "holds list"),
    (json.dumps({"metadata": {}, "weight_map": {"a.weight": 1}}), "maps the tensor 'a.weight' to 1 in its "
                                                                  "weight_map, not a shard file name"),
    # was "lacks 1 of the 1 weight shards ... ('../x.safetensors')" with the fix 'hf download ORG/NAME ../x...'
    (json.dumps({"metadata": {}, "weight_map": {"a.weight": "../x.safetensors"}}),
     "names the shard '../x.safetensors' outside the model directory, which transformers refuses"),
])
def test_a_weights_index_transformers_cannot_read_is_refused_naming_it(tmp_path, index_text, named):
    """An index transformers reads and cannot was passed on to it, whose refusal ("KeyError: 'weight_map'", a bare
    JSONDecodeError) names neither the index nor the download that fetches it again."""
    directory = _sharded_directory(tmp_path / "my model", index_text)
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory))
    problem, fix = refused.value.problem, refused.value.fix
    assert problem.startswith(f"model directory {directory}: its weights index model.safetensors.index.json {named}")
    command = fix.split("'", 1)[1].rsplit("'", 1)[0]
    assert shlex.split(command) == ["hf", "download", "ORG/NAME", "model.safetensors.index.json", "--local-dir",
                                    str(directory)]


def test_a_pytorch_weights_index_cut_short_is_named(tmp_path):
    directory = _sharded_directory(tmp_path / "m", "{\"weight_map\": {", name="pytorch_model.bin.index.json")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory))
    assert "its weights index pytorch_model.bin.index.json is not readable JSON" in refused.value.problem


def test_a_hub_snapshot_index_is_fetched_again_into_the_cache(tmp_path):
    """The fix for a Hub cache snapshot's index fetches it into the cache at the snapshot's commit, not with
    --local-dir into the snapshot."""
    snapshot = _sharded_directory(tmp_path / "models--org--name" / "snapshots" / "abc123", "{")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(snapshot))
    assert ("hf download org/name model.safetensors.index.json --revision abc123 --force-download"
            in refused.value.fix)


def test_an_index_transformers_reads_and_whose_shards_are_there_is_taken(tmp_path):
    directory = _sharded_directory(tmp_path / "m", json.dumps(WHOLE_INDEX))
    assert resolve_model(str(directory)).kind == "hf-dir"


def test_an_index_transformers_does_not_read_is_not_checked(tmp_path):
    """model.safetensors is what transformers reads first: a damaged index beside it changes nothing."""
    directory = _sharded_directory(tmp_path / "m", "{")
    (directory / "model.safetensors").write_bytes(b"\0" * 16)
    assert resolve_model(str(directory)).kind == "hf-dir"
