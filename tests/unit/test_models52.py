"""Model loading: sources resolved and refused with the file that is wrong named (review 52)."""

from __future__ import annotations

import json
import shutil

import pytest

from edgesdk.errors import ModelSourceError
from edgesdk.models.sources import resolve_model

gguf = pytest.importorskip("gguf")


def _gguf_repository(directory):
    """A GGUF repository as some publishers upload it: GGUF files of two quantizations, with the model's
    config.json beside them (so that the Hub shows the architecture) and no safetensors weights."""
    from tests._utils.gguf_files import one_layer_llama_gguf

    directory.mkdir()
    tokens = ["<unk>", "<s>", "</s>"] + [chr(code) for code in range(97, 123)]
    first = one_layer_llama_gguf(directory / "Tiny-Q4_K_M.gguf", "gpt2", tokens, [2, 3, 3] + [1] * 26,
                                 merges=["a b"], pre="smollm")
    shutil.copy(first, directory / "Tiny-Q8_0.gguf")
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                       "hidden_size": 64, "num_hidden_layers": 1}))
    return directory


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_a_gguf_repository_with_a_config_json_is_refused_naming_its_gguf_files(tmp_path, terms):
    """A directory with config.json was taken as a Hugging Face model directory though it holds GGUF files and no
    model weights (a GGUF repository that carries its model's config.json): the load then failed with transformers'
    'no file named model.safetensors' and a fix to download the model's complete files again. It is now refused as
    a directory of GGUF files, naming them and the one to pass, which resolves."""
    directory = _gguf_repository(tmp_path / "Tiny-GGUF")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(directory), terms=terms)
    problem, fix = refused.value.problem, refused.value.fix
    assert f"model directory {directory} has a config.json but no model weights" in problem
    assert "holds 2 GGUF file(s) (Tiny-Q4_K_M.gguf, Tiny-Q8_0.gguf)" in problem
    chosen = directory / "Tiny-Q8_0.gguf"  # the more precise of the two (review 53: it was the first by name)
    assert (f"model={str(chosen)!r}" if terms == "python" else f"--model {chosen}") in fix
    assert "download" not in fix
    source = resolve_model(str(chosen))
    assert (source.kind, source.path) == ("gguf", chosen)


def test_a_model_directory_with_weights_and_a_gguf_beside_them_is_still_a_model_directory(tmp_path):
    """A Hugging Face directory whose weights are there stays one, whatever GGUF file lies beside them."""
    directory = _gguf_repository(tmp_path / "both")
    (directory / "model.safetensors").write_bytes(b"\0" * 16)
    source = resolve_model(str(directory))
    assert (source.kind, source.path) == ("hf-dir", directory)


def test_a_shard_cut_short_is_named_with_its_size(tmp_path):
    """A sharded model one of whose safetensors files was cut short (an interrupted download) failed with
    transformers' 'SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered',
    naming no file of the nine; the refusal now names the shard, its size, and the download of that file."""
    pytest.importorskip("torch")
    from edgesdk.models.loader import load_model
    from tests._utils.tiny import tiny_llama, tiny_tokenizer

    directory = tmp_path / "sharded"
    tiny_llama(tie=False).save_pretrained(directory, max_shard_size="60KB")
    tiny_tokenizer().save_pretrained(directory)
    shards = sorted(directory.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2
    cut = shards[1]
    data = cut.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(ModelSourceError) as refused:
        load_model(resolve_model(str(directory)), progress=False)
    problem, fix = refused.value.problem, refused.value.fix
    assert f"1 weight file(s) cannot be read: {cut.name} ({len(data) // 2:,} bytes" in problem
    assert all(shard.name not in problem for shard in shards if shard != cut)
    assert f"hf download ORG/NAME {cut.name} --local-dir {directory}" in fix


def test_a_gguf_special_token_id_past_the_vocabulary_is_refused_naming_the_key_and_the_fix_loads(tmp_path):
    """A GGUF file whose padding_token_id is past its vocabulary (llama2.c's converted files write 4294967295, -1 as a
    uint32, for no padding token; llama.cpp drops such an id) failed the embedding's padding_idx check and was
    reported as a damaged file to download again; the tokenizer would then have failed with a bare IndexError. It is
    now refused naming the key, its value and the vocabulary, with gguf-new-metadata's command to drop the key, after
    which the file loads, with no padding token as in llama.cpp."""
    import subprocess
    import sys

    from edgesdk.models.loader import load_model
    from tests._utils.gguf_files import one_layer_llama_gguf, rewrite_gguf

    tokens = ["<unk>", "<s>", "</s>"] + [chr(code) for code in range(97, 123)] + ["ab"]
    base = one_layer_llama_gguf(tmp_path / "base.gguf", "gpt2", tokens, [2, 3, 3] + [1] * 27, merges=["a b"],
                                pre="smollm")
    path = rewrite_gguf(base, tmp_path / "stories.gguf",
                        fields={"tokenizer.ggml.padding_token_id": (4294967295, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ModelSourceError) as refused:
        load_model(resolve_model(str(path)), progress=False)
    problem, fix = refused.value.problem, refused.value.fix
    assert "names the padding token 4294967295 (tokenizer.ggml.padding_token_id), past its vocabulary of " \
           f"{len(tokens)} tokens" in problem
    assert "damaged" not in problem
    assert "download" not in fix
    command = f"--force --remove-metadata tokenizer.ggml.padding_token_id {path} fixed.gguf"
    assert f"gguf-new-metadata {command}" in fix
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", *command.split()], cwd=tmp_path,
                   check=True, capture_output=True, stdin=subprocess.DEVNULL)
    loaded = load_model(resolve_model(str(tmp_path / "fixed.gguf")), progress=False)
    assert loaded.model.config.pad_token_id is None
    assert loaded.tokenizer.convert_ids_to_tokens(loaded.tokenizer("ab")["input_ids"])[-1] == "ab"
