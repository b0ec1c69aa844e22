"""Model sources and text handling against the reference tools: huggingface_hub's cache location (its
``constants.HF_HUB_CACHE``, read from the same environment in a child Python)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import hub_cache_dir, resolve_model

HUB_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


def _huggingface_hub_cache(env: dict) -> str:
    """huggingface_hub's own HF_HUB_CACHE under ``env``."""
    pytest.importorskip("huggingface_hub")
    return subprocess.run([sys.executable, "-c", "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("setting", [
    {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy"},
    {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy", "HF_HUB_CACHE": "{tmp}/new"},
    {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy", "HF_HOME": "{tmp}/home"},
    {"HF_HOME": "{tmp}/home"},
    {"XDG_CACHE_HOME": "{tmp}/xdg"},
    {"HF_HUB_CACHE": "$EDGESDK_TEST_ROOT/expanded"},
])
def test_the_hub_cache_is_where_huggingface_hub_puts_it(tmp_path, monkeypatch, setting):
    for variable in HUB_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("EDGESDK_TEST_ROOT", str(tmp_path))
    for variable, value in setting.items():
        monkeypatch.setenv(variable, value.format(tmp=tmp_path))
    assert str(hub_cache_dir()) == _huggingface_hub_cache(dict(os.environ))


def test_a_hub_id_cached_under_the_legacy_variable_is_named_as_cached(tmp_path, monkeypatch):
    for variable in HUB_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    entry = tmp_path / "legacy" / "models--someorg--somemodel"
    (entry / "snapshots").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError) as caught:
        resolve_model("someorg/somemodel")
    assert "pass its cached copy" in caught.value.fix
    assert "models--someorg--somemodel" in caught.value.fix
    assert "download it first" not in caught.value.fix


def test_an_empty_refs_main_is_named_not_taken_as_a_snapshot(tmp_path):
    """huggingface_hub's refs/main holds the commit whose snapshots/<commit> folder is the model; an empty one
    (a write cut short) names none, and the snapshots folder itself is no snapshot."""
    entry = tmp_path / "models--someorg--somemodel"
    (entry / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (entry / "snapshots" / ("a" * 40) / "config.json").write_text("{}")
    (entry / "blobs").mkdir()
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("\n")
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(entry))
    assert "refs/main names commit ''" in caught.value.problem
    assert "hf download" in caught.value.fix
