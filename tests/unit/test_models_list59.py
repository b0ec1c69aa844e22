"""`edgesdk models list` on a damaged cached copy of an alias, and the commands suggested for a refused adapter
under a path with a space."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import ModelSourceError
from edgesdk.models.lora import LoraAdapter, _peft_config, check_adapter
from edgesdk.models.sources import ALIASES, DEFAULT_MODEL, cached_alias_path

ALIAS = DEFAULT_MODEL


def _list(*options: str) -> str:
    result = CliRunner().invoke(main, ["models", "list", *options], prog_name="edgesdk")
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return next(line for line in result.output.splitlines() if line.startswith(ALIAS))


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """The alias's cache path under a fresh $EDGESDK_CACHE, its folder made, no file in it."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    path = cached_alias_path(ALIAS)
    path.parent.mkdir(parents=True)
    return path


def test_an_alias_not_fetched_is_listed_as_not_fetched(cached):
    assert "not fetched)" in _list()


def test_a_cached_copy_cut_short_is_listed_as_damaged_with_the_fetch_that_replaces_it(cached):
    """A copy cut short (a copy of the cache, a disk that filled) was listed as 'cached', though every use of the
    alias fetches it again (and a board offline cannot)."""
    cached.write_bytes(b"GGUF" + bytes(996))
    line = _list()
    assert ", cached" not in line
    assert (f"the cached copy {cached} is damaged (1,000 bytes, expected {ALIASES[ALIAS].size:,}); "
            f"run 'edgesdk models fetch {ALIAS}' to fetch it again") in line


def test_a_cached_copy_of_the_right_size_and_other_content_is_told_apart_by_verify(cached):
    """The sha256 takes a whole read of the file (seconds from a Raspberry Pi's SD card), so a plain list checks the
    size only; --verify checks the sha256 as every use of the alias does."""
    with open(cached, "wb") as handle:  # sparse: the pinned size, all zeros
        handle.truncate(ALIASES[ALIAS].size)
    assert _list().endswith(", cached) [default]")
    line = _list("--verify")
    digest = hashlib.sha256(bytes(ALIASES[ALIAS].size)).hexdigest()
    assert (f"the cached copy {cached} is damaged (sha256 {digest}, expected {ALIASES[ALIAS].sha256}); "
            f"run 'edgesdk models fetch {ALIAS}' to fetch it again") in line


def test_a_cached_copy_of_the_pinned_file_is_listed_as_cached_and_checked(cached, monkeypatch):
    content = b"GGUF" + bytes(60)
    monkeypatch.setitem(ALIASES, ALIAS, dataclasses.replace(ALIASES[ALIAS], size=len(content),
                                                            sha256=hashlib.sha256(content).hexdigest()))
    cached.write_bytes(content)
    assert _list().endswith(", cached) [default]")
    assert _list("--verify").endswith(", cached, sha256 checked) [default]")


def _peft_files(directory):
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4}))
    (directory / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return directory


def _suggested(fix: str) -> list[str]:
    """The words a shell makes of the command a fix suggests after 'e.g. '."""
    return shlex.split(fix.split("e.g. ", 1)[1])


@pytest.mark.parametrize("adapter", [dict(option="--lora"), dict(scale=0.5, option="--lora-scaled")])
def test_the_adapter_suggested_for_a_folder_of_adapters_is_quoted_for_a_shell(tmp_path, adapter):
    """`--lora "my runs/out"`, a Trainer's output folder holding checkpoint-<step>/ adapters, suggested
    `--lora my runs/out/checkpoint-500`, which a shell splits in two."""
    out = tmp_path / "my runs" / "out"
    checkpoint = _peft_files(out / "checkpoint-500")
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(out), **adapter))
    assert _suggested(refused.value.fix) == [adapter["option"], str(checkpoint), *(["0.5"] if "scale" in adapter
                                                                                      else [])]


def test_the_task_adapter_suggested_for_an_arrow_router_is_quoted_for_a_shell(tmp_path):
    saved = tmp_path / "my adapters"
    task = _peft_files(saved / "task_0")
    router = saved / "arrow_router"
    router.mkdir()
    (router / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "arrow_config": {"task_adapter_names": ["task_0"]}}))
    with pytest.raises(ModelSourceError) as refused:
        _peft_config(LoraAdapter(str(router)), router)
    assert _suggested(refused.value.fix) == ["--lora", str(task)]


def test_the_fuse_command_suggested_for_an_mlx_adapter_is_quoted_for_a_shell(tmp_path):
    directory = tmp_path / "mlx adapters" / "run 1"
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "lora", "lora_parameters": {}}))
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(directory)))
    command = refused.value.fix.split("(", 1)[1].split(")", 1)[0]
    assert shlex.split(command)[:6] == ["mlx_lm.fuse", "--model", "BASE", "--adapter-path", str(directory),
                                        "--save-path"]
