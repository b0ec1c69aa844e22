"""Model sources and loading (review 53): missing weights, LoRA adapter files, GGUF directories and files, Hub ids."""

from __future__ import annotations

import os
import shutil

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import resolve_model

torch = pytest.importorskip("torch")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def sharded_model(tmp_path_factory):
    """A tiny random Llama saved in four safetensors shards with their model.safetensors.index.json."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    directory = tmp_path_factory.mktemp("sharded") / "model"
    LlamaForCausalLM(config).save_pretrained(directory, max_shard_size="8KB")
    shards = sorted(directory.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3
    assert (directory / "model.safetensors.index.json").is_file()
    return directory


def _hub_cache_entry(root, source, leave_out=(), unfinished=()):
    """A Hugging Face Hub cache entry ``models--org--tiny`` as huggingface_hub writes it (refs/main, the snapshot's
    files linked into blobs/) holding ``source``'s files but ``leave_out``; each of ``unfinished`` is a blob still
    being written (``blobs/<etag>.incomplete``), not linked from the snapshot."""
    entry = root / "models--org--tiny"
    snapshot, blobs = entry / "snapshots" / COMMIT, entry / "blobs"
    for folder in (entry / "refs", snapshot, blobs):
        folder.mkdir(parents=True)
    (entry / "refs" / "main").write_text(COMMIT)
    for number, file in enumerate(sorted(source.iterdir())):
        blob = blobs / f"{number:040x}"
        if file.name in unfinished:
            blob.with_name(blob.name + ".incomplete").write_bytes(file.read_bytes()[:100])
        elif file.name not in leave_out:
            shutil.copy(file, blob)
            os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    return entry


def test_a_hub_snapshot_with_a_shard_still_downloading_is_refused_with_the_cache_download(sharded_model, tmp_path):
    """A Hub cache entry whose download was cut short (one shard's blob still .incomplete, so the snapshot has no
    link to it) resolved as complete; the load then stopped on transformers' FileNotFoundError for that shard, and
    the fix told to run 'hf download ORG/NAME --local-dir <the cache snapshot>', which writes plain files into
    huggingface_hub's cache. It is now refused before loading, naming the shard, the unfinished download and the
    repository's own download into the cache."""
    shard = sorted(sharded_model.glob("model-*-of-*.safetensors"))[1].name
    entry = _hub_cache_entry(tmp_path, sharded_model, unfinished=(shard,))
    for given in (entry, entry / "snapshots" / COMMIT):
        with pytest.raises(ModelSourceError) as refused:
            resolve_model(str(given))
        problem, fix = refused.value.problem, refused.value.fix
        assert f"lacks 1 of the {len(list(sharded_model.glob('model-*')))} weight shards" in problem, problem
        for named in (shard, "model.safetensors.index.json", "1 unfinished download(s)", ".incomplete"):
            assert named in problem, problem
        for named in (f"'hf download org/tiny --revision {COMMIT}'", f"--model {entry / 'snapshots' / COMMIT}"):
            assert named in fix, fix
        assert "--local-dir" not in fix, fix


def test_a_hub_snapshot_with_config_json_alone_is_refused(sharded_model, tmp_path):
    """A snapshot holding config.json and none of the weights (a download cut short after the first file, or
    'hf download org/tiny config.json') was taken as a model directory; it is refused naming the missing weights,
    with the cache download as the fix."""
    weights = {file.name for file in sharded_model.glob("model*")}
    entry = _hub_cache_entry(tmp_path, sharded_model, leave_out=weights)
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(entry), terms="python")
    assert "has a config.json but no model weights" in refused.value.problem, refused.value.problem
    assert "unfinished" not in refused.value.problem
    assert f"'hf download org/tiny --revision {COMMIT}'" in refused.value.fix
    assert f"model={str(entry / 'snapshots' / COMMIT)!r}" in refused.value.fix


def test_every_missing_shard_of_a_local_directory_is_named_at_once(sharded_model, tmp_path):
    """transformers stops on the first missing shard, so the user fetched them one failed build at a time; the
    refusal now names every shard the index names that the directory lacks, and the files to download."""
    model = tmp_path / "model"
    shutil.copytree(sharded_model, model)
    shards = sorted(model.glob("model-*-of-*.safetensors"))
    for shard in (shards[0], shards[-1]):
        shard.unlink()
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(model))
    problem, fix = refused.value.problem, refused.value.fix
    assert f"lacks 2 of the {len(shards)} weight shards" in problem, problem
    for shard in (shards[0], shards[-1]):
        assert shard.name in problem, problem
    assert f"hf download ORG/NAME {shards[0].name} {shards[-1].name} --local-dir {model}" in fix, fix


def test_a_complete_sharded_directory_and_snapshot_still_resolve(sharded_model, tmp_path):
    entry = _hub_cache_entry(tmp_path, sharded_model)
    assert resolve_model(str(entry)).path == entry / "snapshots" / COMMIT
    assert resolve_model(str(sharded_model)).kind == "hf-dir"


# ---------------------------------------------------------------------------------------------------- LoRA
def _peft_adapter(directory):
    """A PEFT LoRA adapter directory as PeftModel.save_pretrained writes it: adapter_config.json (r 2, lora_alpha 4)
    and adapter_model.safetensors with one q_proj's lora_A (r, in) and lora_B (out, r)."""
    import json

    from safetensors.torch import save_file

    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4,
                                                               "target_modules": ["q_proj"]}))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(2, 16),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(16, 2)},
              str(directory / "adapter_model.safetensors"))
    return directory


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "adapter_config.json"])
def test_a_file_of_a_peft_adapter_given_as_the_adapter_names_its_directory(tmp_path, name):
    """--lora DIR/adapter_model.safetensors (llama.cpp's --lora takes a file) was refused as 'the file is not GGUF
    (first bytes ...)' with a fix naming no directory; the refusal now names the adapter directory the file belongs
    to, and the fix passes it, which check_adapter takes."""
    from edgesdk.models.lora import LoraAdapter, check_adapter

    adapter = _peft_adapter(tmp_path / "adapter")
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(adapter / name)))
    assert f"the file is the {name} of the PEFT adapter directory {adapter}" in refused.value.problem
    assert "not GGUF" not in refused.value.problem
    assert refused.value.fix == f"pass the adapter's directory with --lora: {adapter}"
    assert check_adapter(LoraAdapter(str(adapter))) == "peft"


# ---------------------------------------------------------------------------------------------------- GGUF
@pytest.mark.parametrize("terms", ["cli", "python"])
def test_a_directory_of_gguf_quantizations_suggests_the_most_precise_file(tmp_path, terms):
    """A GGUF repository's directory given as the model was refused with the first file by name as the example,
    for a bartowski-style repository the 3-bit IQ3_M one (capitals sort first): edgesdk de-quantizes the file and
    compresses it itself, so the example now is the most precise file the names give, the F16 one."""
    directory = tmp_path / "SmolLM2-135M-Instruct-GGUF"
    directory.mkdir()
    for quantization in ("IQ3_M", "Q2_K", "Q4_K_M", "Q8_0", "f16"):
        (directory / f"SmolLM2-135M-Instruct-{quantization}.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory), terms=terms)
    chosen = str(directory / "SmolLM2-135M-Instruct-f16.gguf")
    assert refused.value.fix.endswith(f"model={chosen!r}" if terms == "python" else f"--model {chosen}")


@pytest.mark.parametrize(("name", "bits"), [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", 4), ("Llama-3.2-1B-Instruct-IQ3_XS.gguf", 3), ("ggml-model-f16.gguf", 16),
    ("Model-BF16.gguf", 16), ("model-F32.gguf", 32), ("Qwen2.5-0.5B-Instruct-Q8_0.gguf", 8),
    ("Model-UD-Q4_K_XL.gguf", 4), ("Qwen2.5-0.5B.gguf", 0), ("model.gguf", 0)])
def test_the_quantization_a_gguf_name_ends_with(name, bits):
    from pathlib import Path

    from edgesdk.models.sources import gguf_name_bits

    assert gguf_name_bits(Path(name)) == bits


# ---------------------------------------------------------------------------------------------------- Hub ids
@pytest.mark.parametrize("spec", ["./SmolLM2-135M", "../models", ".hidden/model", "org/model-"])
def test_a_missing_relative_path_is_not_called_a_hub_id(tmp_path, monkeypatch, spec):
    """'./SmolLM2-135M' (a mistyped directory) was told it 'looks like a Hugging Face Hub id' and to run
    'hf download ./SmolLM2-135M', which huggingface_hub refuses: a Hub id's parts start and end with a letter or
    digit and hold no '..' (validate_repo_id). Such a path is now refused as the missing path it is."""
    (tmp_path / "cwd" / "here").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd" / "here")  # ../models is the empty cwd's models: not there
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(spec)
    assert "no such file or directory" in refused.value.problem
    assert "Hub id" not in refused.value.fix
    assert "hf download" not in refused.value.fix


def test_a_hub_id_is_still_told_to_download_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelSourceError) as refused:
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "(hf download HuggingFaceTB/SmolLM2-135M-Instruct)" in refused.value.fix


def test_a_web_page_saved_as_a_gguf_file_is_named_as_one(tmp_path):
    """wget of a Hugging Face file's page (.../blob/main/model.gguf) saves HTML under the .gguf name; it was refused
    as 'not a GGUF file (first bytes b'<!DO')' and told to 'pass a .gguf file written by llama.cpp's converter',
    which the user thought it was. It is now named as a web page, and the fix gives the file's own link."""
    page = tmp_path / "model.gguf"
    page.write_text("<!DOCTYPE html>\n<html class=\"\" lang=\"en\">\n<head><title>model.gguf</title></head>"
                    + "<body>" + "x" * 2000 + "</body></html>\n")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(page))
    assert f"{page} is a web page (HTML, first bytes b'<!DO'), not a GGUF file" in refused.value.problem
    assert "/resolve/" in refused.value.fix
    assert "hf download ORG/NAME FILE.gguf" in refused.value.fix


def test_an_empty_gguf_file_is_told_to_be_downloaded_again(tmp_path):
    empty = tmp_path / "model.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(empty))
    assert refused.value.problem == f"{empty} is empty (0 bytes), not a GGUF file: a download or copy that wrote nothing"
    assert refused.value.fix.startswith("download the file again")
