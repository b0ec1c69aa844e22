"""resolve_model on a path whose ~user names no user, an unfinished download, a split GGUF lacking parts, and a
model file in the format llama.cpp wrote before GGUF."""

from __future__ import annotations

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import resolve_model


def test_a_home_of_a_user_this_machine_lacks_is_refused_naming_it_not_crashed_on():
    spec = "~no-such-user-58/models/SmolLM2.gguf"
    with pytest.raises(ModelSourceError) as error:
        resolve_model(spec)
    text = str(error.value)
    assert "'no-such-user-58'" in text
    assert spec in text
    assert "--model ~/no-such-user-58/models/SmolLM2.gguf" in text  # unquoted, so a shell expands it


@pytest.mark.parametrize("suffix", [".part", ".crdownload", ".incomplete"])
def test_an_unfinished_download_is_not_told_to_be_renamed(tmp_path, suffix):
    partial = tmp_path / f"SmolLM2-Q8_0.gguf{suffix}"
    partial.write_bytes(b"GGUF" + bytes(60))  # the first bytes of a GGUF, the rest not written yet
    with pytest.raises(ModelSourceError) as error:
        resolve_model(str(partial))
    text = str(error.value)
    assert "download not finished" in text
    assert "64 bytes so far" in text
    assert "mv " not in text
    assert f"{suffix}.gguf" not in text
    assert "SmolLM2-Q8_0.gguf with --model" in text


def split_parts(folder, numbers, count=3):
    for number in numbers:
        (folder / f"Model-F16-{number:05d}-of-{count:05d}.gguf").write_bytes(b"GGUF" + bytes(20))


def test_split_parts_without_the_first_are_told_to_fetch_it_and_merge_from_it(tmp_path):
    split_parts(tmp_path, (2, 3))
    with pytest.raises(ModelSourceError) as error:
        resolve_model(str(tmp_path))
    text = str(error.value)
    # llama-gguf-split --merge takes the first part only ("unexpected input file name" for another)
    assert f"--merge {tmp_path / 'Model-F16-00001-of-00003.gguf'} merged.gguf" in text
    assert "1 of them not there (Model-F16-00001-of-00003.gguf)" in text
    assert "--merge " + str(tmp_path / "Model-F16-00002-of-00003.gguf") not in text


def test_split_parts_lacking_a_middle_one_name_it(tmp_path):
    split_parts(tmp_path, (1, 3))
    with pytest.raises(ModelSourceError, match=r"not there \(Model-F16-00002-of-00003\.gguf\)"):
        resolve_model(str(tmp_path))


def test_all_split_parts_are_still_told_to_merge_from_the_first(tmp_path):
    split_parts(tmp_path, (1, 2, 3))
    with pytest.raises(ModelSourceError) as error:
        resolve_model(str(tmp_path))
    text = str(error.value)
    assert f"--merge {tmp_path / 'Model-F16-00001-of-00003.gguf'} merged.gguf" in text
    assert "not there" not in text


# 'ggjt' as llama.cpp wrote it before GGUF: a little-endian uint32, on disk b"tjgg" (llama.cpp now reports it as
# "invalid magic number 67676a74"), then the version 3
GGJT_V3 = (0x67676A74).to_bytes(4, "little") + (3).to_bytes(4, "little") + bytes(40)


@pytest.mark.parametrize("name", ["llama-2-7b.ggmlv3.q4_0.bin", "llama-2-7b.q4_0.gguf"])
def test_a_pre_gguf_ggml_file_is_named_as_one_not_told_to_be_renamed(tmp_path, name):
    old = tmp_path / name
    old.write_bytes(GGJT_V3)
    with pytest.raises(ModelSourceError) as error:
        resolve_model(str(old))
    text = str(error.value)
    assert "GGJT" in text
    assert "before GGUF" in text
    assert "convert_llama_ggml_to_gguf.py" in text
    assert "suffix" not in text


def test_a_hub_cache_entrys_snapshots_folder_resolves_as_the_entry(tmp_path):
    entry = tmp_path / "models--org--name"
    snapshot = entry / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("0123abcd")
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"")
    source = resolve_model(str(entry / "snapshots"))
    assert source.kind == "hf-dir"
    assert source.path == snapshot
