"""GGUF export, review 53: head-size keys and the padding token as llama.cpp's converter writes them, and a
tokenizer whose added tokens lie past the model's embedding rows, which the build names at load time."""

from __future__ import annotations

import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import vocab_only_gguf
from tests._utils.tiny import save_tiny_model_dir, tiny_tokenizer

pytest.importorskip("gguf")
pytest.importorskip("torch")

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32, block_size: 32}\n"


def _fields(path) -> dict:
    from gguf import GGUFReader

    return {name: field.contents() for name, field in GGUFReader(str(path)).fields.items()}


def test_a_llama_export_gives_the_head_size_its_config_holds_as_the_converter_does(tmp_path):
    """transformers' LlamaConfig (and MistralConfig) always hold head_dim and save it in config.json, and
    convert_hf_to_gguf.py writes attention.key_length / value_length whenever config.json has head_dim; the export
    left them out where the head size equals width / heads."""
    import json

    from edgesdk.export.gguf_export import export_gguf

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128)
    assert json.loads((model_dir / "config.json").read_text())["head_dim"] == 16  # what the converter reads
    bundle = build_tiny_bundle(tmp_path, FUSED_FP32, "host", model_dir=model_dir)
    fields = _fields(export_gguf(bundle.path, tmp_path / "model.gguf").path)

    assert fields["general.architecture"] == "llama"
    assert fields["llama.attention.key_length"] == fields["llama.attention.value_length"] == 16


def test_the_tokenizers_padding_token_is_written_as_padding_token_id(tmp_path):
    """gguf-py's SpecialVocab writes the tokenizer's pad token as tokenizer.ggml.padding_token_id (SmolLM2's GGUF
    files carry it); the export wrote none."""
    from edgesdk.export.gguf_export import add_tokenizer
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    size = len(tokenizer)
    vocab = vocab_from_tokenizer_json(tmp_path / "tok" / "tokenizer.json", tokenizer.bos_token, tokenizer.eos_token,
                                      size, pad_token=tokenizer.pad_token)
    path = vocab_only_gguf(tmp_path / "vocab.gguf", lambda writer: add_tokenizer(writer, vocab, None))

    assert _fields(path)["tokenizer.ggml.padding_token_id"] == tokenizer.pad_token_id
    assert vocab_from_tokenizer_json(tmp_path / "tok" / "tokenizer.json", None, None, size).pad_id is None


def _model_dir_with_unembedded_token(tmp_path, as_eos: bool):
    """A tiny model directory whose tokenizer adds ``<|extra|>`` one id past the embedding's rows, as its EOS token
    (``as_eos``) or as a token nothing needs; returns the directory, the token's id and the rows."""
    from transformers import AutoTokenizer

    rows = len(tiny_tokenizer())
    model_dir = save_tiny_model_dir(tmp_path / "model", vocab_size=rows)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    if as_eos:
        tokenizer.eos_token = "<|extra|>"
    tokenizer.save_pretrained(model_dir)
    index = tokenizer.convert_tokens_to_ids("<|extra|>")
    assert index == rows
    return model_dir, index, rows


def test_a_needed_token_past_the_embedding_is_refused_at_load_naming_it(tmp_path):
    """The build took such a tokenizer; the bundle's runtime then refused every prompt ending in its EOS token."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    model_dir, index, rows = _model_dir_with_unembedded_token(tmp_path, as_eos=True)
    with pytest.raises(ModelSourceError) as caught:
        load_model(resolve_model(str(model_dir)), progress=False)
    message = str(caught.value)
    for part in ("'<|extra|>'", "EOS", f"id {index}", f"{rows} rows"):
        assert part in message


def test_an_unneeded_token_past_the_embedding_is_named_in_a_warning(tmp_path):
    """Gemma 3's <image_soft_token> case: nothing needs it, so the model loads, but the build says so."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    model_dir, index, rows = _model_dir_with_unembedded_token(tmp_path, as_eos=False)
    with pytest.warns(UserWarning, match=rf"'<\|extra\|>' \(id {index}\) past the model's {rows} embedding rows"):
        loaded = load_model(resolve_model(str(model_dir)), progress=False)
    assert loaded.model.get_input_embeddings().num_embeddings == rows
