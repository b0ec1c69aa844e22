"""A bundle built from a Hugging Face Hub cache entry, or one of its snapshots, is named after the model, not after
the cache's ``models--org--name`` directory or the snapshot's commit hash."""

from __future__ import annotations

from pathlib import Path

from edgesdk.build.pipeline import default_out


def test_a_hub_cache_entry_and_its_snapshot_name_the_bundle_after_the_model(tmp_path):
    entry = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    snapshot = entry / "snapshots" / ("ab" * 20)
    snapshot.mkdir(parents=True)
    assert default_out(str(entry), "rpi5") == Path("bundles") / "SmolLM2-135M-Instruct-rpi5"
    assert default_out(str(snapshot), "rpi5") == Path("bundles") / "SmolLM2-135M-Instruct-rpi5"


def test_other_directories_keep_their_whole_name(tmp_path):
    plain = tmp_path / "Qwen2.5-0.5B"
    plain.mkdir()
    assert default_out(str(plain), "host") == Path("bundles") / "Qwen2.5-0.5B-host"
    odd = tmp_path / "models--only-one-dash"
    odd.mkdir()
    assert default_out(str(odd), "host") == Path("bundles") / "models--only-one-dash-host"
