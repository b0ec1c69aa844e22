"""``--model`` in the shapes models have on disk: a Hugging Face Hub cache entry, GGUF files in a directory or
split in parts, PyTorch pickles, tokenizers without tokenizer.json, mistyped aliases. Each loads as transformers
loads the same files, or is refused naming the path and the fix."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.loader import load_model
from edgesdk.models.sources import ModelSource, resolve_model

torch = pytest.importorskip("torch")

IDS = [[1, 5, 9, 30, 200, 7, 64]]


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tests._utils.tiny import save_tiny_model_dir

    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def transformers_logits(directory: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


def edgesdk_logits(spec: str):
    loaded = load_model(resolve_model(spec), progress=False)
    with torch.no_grad():
        return loaded.model(torch.tensor(IDS)).logits


def hub_cache_entry(root: Path, files: dict[str, Path], commits: list[str], main: str | None) -> Path:
    """``root/models--org--tiny`` as huggingface_hub lays it out: each file stored once in blobs/ (named by
    its sha256), each snapshot's files relative links into blobs/, refs/main holding the commit."""
    entry = root / "models--org--tiny"
    (entry / "blobs").mkdir(parents=True)
    for commit in commits:
        snapshot = entry / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for name, file in files.items():
            blob = hashlib.sha256(file.read_bytes()).hexdigest()
            if not (entry / "blobs" / blob).exists():
                shutil.copyfile(file, entry / "blobs" / blob)
            os.symlink(f"../../blobs/{blob}", snapshot / name)
    if main is not None:
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text(main)
    return entry


OLD, NEW = "1" * 40, "2" * 40


def test_a_hub_cache_entry_loads_the_snapshot_refs_main_names(model_dir, tmp_path):
    """The top directory of a cache entry used to be refused for having no config.json."""
    files = {file.name: file for file in model_dir.iterdir()}
    stale = dict(files, **{"config.json": tmp_path / "stale-config.json"})
    (tmp_path / "stale-config.json").write_text("{not json")  # an older commit: loading it would fail
    entry = hub_cache_entry(tmp_path / "hub", files, [NEW], NEW)
    (entry / "snapshots" / OLD).mkdir()
    for name, file in stale.items():
        shutil.copyfile(file, entry / "snapshots" / OLD / name)
    snapshot = entry / "snapshots" / NEW
    assert (snapshot / "model.safetensors").is_symlink()
    source = resolve_model(str(entry))
    assert source == ModelSource("hf-dir", snapshot, str(snapshot.resolve()))
    assert resolve_model(str(snapshot)) == source  # the snapshot itself, as before
    assert torch.equal(edgesdk_logits(str(entry)), transformers_logits(snapshot))


def test_a_hub_cache_entry_without_refs_main_takes_its_only_snapshot(model_dir, tmp_path):
    entry = hub_cache_entry(tmp_path / "hub", {f.name: f for f in model_dir.iterdir()}, [OLD], None)
    assert resolve_model(str(entry)).path == entry / "snapshots" / OLD


def test_a_hub_cache_entry_that_names_no_snapshot_is_refused(model_dir, tmp_path):
    files = {file.name: file for file in model_dir.iterdir() if file.suffix == ".json"}
    several = hub_cache_entry(tmp_path / "a", files, [OLD, NEW], None)
    with pytest.raises(ModelSourceError, match=rf"cache entry {several} has no refs/main and 2 snapshots "
                                               rf"\({OLD}, {NEW}\)") as info:
        resolve_model(str(several))
    assert f"--model {several / 'snapshots' / OLD}" in info.value.fix
    dangling = hub_cache_entry(tmp_path / "b", files, [OLD], NEW)
    with pytest.raises(ModelSourceError, match=rf"refs/main names commit '{NEW}', which is not in") as info:
        resolve_model(str(dangling))
    assert "download the model again" in info.value.fix
    empty = hub_cache_entry(tmp_path / "c", files, [], None)
    with pytest.raises(ModelSourceError, match="has no refs/main and no snapshot") as info:
        resolve_model(str(empty))
    assert "did not finish" in info.value.fix


def test_a_gguf_linked_from_a_cache_snapshot_is_recorded_by_its_own_name(tmp_path):
    """The source recorded used to be blobs/<sha256>, which resolve_model then refused for its suffix."""
    blob = tmp_path / "blobs" / ("a" * 64)
    blob.parent.mkdir()
    blob.write_bytes(b"GGUF" + bytes(60))
    link = tmp_path / "snapshots" / OLD / "Model Q4_K_M.gguf"
    link.parent.mkdir(parents=True)
    os.symlink(f"../../blobs/{blob.name}", link)
    source = resolve_model(str(link))
    assert source.name == str(link)
    assert resolve_model(source.name) == source


def test_a_directory_of_gguf_files_is_refused_naming_them(tmp_path):
    """It used to be refused for having no config.json, without a word about the GGUF files in it."""
    for name in ("m-Q8_0.gguf", "m-F16.gguf"):
        (tmp_path / name).write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelSourceError, match=rf"model directory {tmp_path} has no config\.json and holds 2 GGUF "
                                               r"file\(s\) \(m-F16\.gguf, m-Q8_0\.gguf\)") as info:
        resolve_model(str(tmp_path))
    assert info.value.fix == f"pass one GGUF file with --model, e.g. --model {tmp_path / 'm-F16.gguf'}"


def test_a_directory_of_split_gguf_parts_is_told_to_merge_them(tmp_path):
    for part in (1, 2):
        (tmp_path / f"m-0000{part}-of-00002.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelSourceError, match="holds 2 GGUF file") as info:
        resolve_model(str(tmp_path))
    assert f"llama-gguf-split --merge {tmp_path / 'm-00001-of-00002.gguf'} merged.gguf" in info.value.fix


def test_a_split_gguf_part_is_refused_naming_the_merge(tmp_path):
    """Part 1 of a split model used to load as a model whose other weights were missing ("would be random")."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama", split_max_tensors=2)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "output_norm.weight"):
        writer.add_tensor(name, np.ones((8, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = sorted(tmp_path.glob("m-*-of-00002.gguf"))
    assert [p.name for p in parts] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    for number, part in enumerate(parts, 1):
        with pytest.raises(ModelSourceError, match=rf"the GGUF file {part} is part {number} of a model split into 2 "
                                                   r"files \(split\.count\)") as info:
            load_model(resolve_model(str(part)), progress=False)
        assert f"llama-gguf-split --merge {parts[0]} merged.gguf" in info.value.fix


@pytest.mark.parametrize("typo", ["smollm2-13m", "smolm2-135m", "SmolLM2-135M"])
def test_a_mistyped_alias_names_the_closest_one(tmp_path, monkeypatch, typo):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError, match=rf"unknown model '{typo}': .*; did you mean 'smollm2-135m'\?"):
        resolve_model(typo)


def test_a_name_far_from_any_alias_suggests_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError) as info:
        resolve_model("tinyllama")
    assert "did you mean" not in str(info.value)


def test_a_hub_id_is_pointed_at_its_cached_copy(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelSourceError) as info:
        resolve_model("org/tiny")
    assert "hf download org/tiny" in info.value.fix
    entry = hub_cache_entry(tmp_path / "hub", {f.name: f for f in model_dir.iterdir()}, [OLD], OLD)
    with pytest.raises(ModelSourceError) as info:
        resolve_model("org/tiny")
    assert f"pass its cached copy {entry}" in info.value.fix
    assert resolve_model(str(entry)).path == entry / "snapshots" / OLD


def test_pytorch_bin_weights_load_as_transformers_loads_them(model_dir, tmp_path):
    from safetensors.torch import load_file

    directory = tmp_path / "bin"
    shutil.copytree(model_dir, directory, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save(load_file(model_dir / "model.safetensors"), directory / "pytorch_model.bin")
    assert torch.equal(edgesdk_logits(str(directory)), transformers_logits(model_dir))


def test_a_pytorch_pickle_holding_code_is_refused_without_running_it(model_dir, tmp_path):
    """torch.load(weights_only=True) refuses it; the refusal used to call the file damaged."""
    directory = tmp_path / "pickle"
    shutil.copytree(model_dir, directory, ignore=shutil.ignore_patterns("*.safetensors"))
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model.embed_tokens.weight": Payload()}, directory / "pytorch_model.bin")
    with pytest.raises(ModelSourceError, match=r"pickle \(\.bin\) holds what torch\.load\(weights_only=True\) does "
                                               r"not read.*GLOBAL posix\.system") as info:
        load_model(resolve_model(str(directory)), progress=False)
    assert "safetensors" in info.value.fix
    assert not marker.exists()


def test_a_directory_without_tokenizer_files_says_so(model_dir, tmp_path):
    """transformers' own message asks to install sentencepiece or tiktoken."""
    directory = tmp_path / "weights-only"
    shutil.copytree(model_dir, directory, ignore=shutil.ignore_patterns("tokenizer*", "chat_template*"))
    with pytest.raises(ModelSourceError, match=rf"cannot load the tokenizer of {directory}: it has no tokenizer "
                                               r"file \(tokenizer\.json, tokenizer\.model") as info:
        load_model(resolve_model(str(directory)), progress=False)
    assert "tokenizer.json" in info.value.fix
    assert "sentencepiece" not in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("sentencepiece") is not None, reason="sentencepiece converts it")
def test_a_sentencepiece_model_without_tokenizer_json_names_sentencepiece(model_dir, tmp_path):
    """transformers falls back to reading tokenizer.model as tiktoken and asks to install tiktoken."""
    import json

    from transformers.utils import sentencepiece_model_pb2_new as proto

    from tests._utils.tiny import tiny_llama2_tokenizer

    directory = tmp_path / "spm"
    shutil.copytree(model_dir, directory, ignore=shutil.ignore_patterns("tokenizer.json"))
    spm = proto.ModelProto()
    spm.trainer_spec.model_type = 2  # BPE
    spm.trainer_spec.byte_fallback = True
    vocab = json.loads(tiny_llama2_tokenizer().backend_tokenizer.to_str())["model"]["vocab"]
    for token, index in sorted(vocab.items(), key=lambda item: item[1]):
        piece = spm.pieces.add()
        piece.piece, piece.score = token, -float(index)
        piece.type = 2 if token == "<unk>" else 3 if token in ("<s>", "</s>") else 6 if token.startswith("<0x") else 1
    (directory / "tokenizer.model").write_bytes(spm.SerializeToString())
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(ModelSourceError, match=rf"cannot load the tokenizer of {directory}: it has a SentencePiece "
                                               r"tokenizer\.model and no tokenizer\.json.*sentencepiece package") \
            as info:
        load_model(resolve_model(str(directory)), progress=False)
    assert "pip install sentencepiece" in info.value.fix
    assert "tiktoken" not in str(info.value)
