"""GGUF export, review 50: what llama.cpp does with the exported file, read back with gguf's own reader and checked
against llama.cpp's rules (src/llama-vocab.cpp)."""

from __future__ import annotations

import warnings

import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import tiny_llama, tiny_llama2_tokenizer, tiny_tokenizer

pytest.importorskip("gguf")
pytest.importorskip("torch")

FUSED = "name: fused\nstages: []\nexport: {form: ort-fused, weights: int8, block_size: 32}\n"
END_OF_TURN = "<|end_of_turn|>"  # OpenChat's end of turn: not among llama.cpp's end-of-generation texts


def _bundle_with_end_of_turn(tmp_path, tokenizer):
    """A tiny Llama whose generation config stops at its EOS (2) and at ``tokenizer``'s added END_OF_TURN."""
    tokenizer.add_special_tokens({"additional_special_tokens": [END_OF_TURN]})
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    model = tiny_llama(hidden=64, heads=4, kv_heads=2, intermediate=128, vocab_size=len(tokenizer))
    model.generation_config.eos_token_id = [2, end]
    model.save_pretrained(tmp_path / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp_path / "model")
    bundle = build_tiny_bundle(tmp_path, FUSED, "host", model_dir=tmp_path / "model", generated_sequences=0)
    assert end in bundle.manifest["tokenizer"]["eos_token_ids"]
    return bundle, end


def _llama_cpp_end_ids(fields) -> set[int]:
    """The ids llama.cpp's vocab loader ends generation at for a file with these fields (special_eog_ids: the tokens
    of its own texts, then the EOS, EOT and EOM ids the file names)."""
    from edgesdk.runtime.text import end_of_generation_ids

    tokens = fields["tokenizer.ggml.tokens"].contents()
    ids = {token: index for index, token in enumerate(tokens)}
    named = [fields[key].contents() for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                                 "tokenizer.ggml.eom_token_id") if key in fields]
    return end_of_generation_ids(ids.get, named)


@pytest.mark.parametrize("kind", ["byte-level", "llama2"])
def test_llama_cpp_stops_at_an_end_of_turn_token_whose_text_it_does_not_know(kind, tmp_path):
    """The bundle stops at <|end_of_turn|> (its generation config's second EOS id); llama.cpp reads no list of end
    ids and stops at the EOS token, the tokens of its own texts (<|im_end|>, <|endoftext|>, </s> ...) and the EOT /
    EOM tokens only. The export wrote neither key, so llama-cli and llama-server ran past the end of each turn
    (Ollama's eos_token_ids is no help to llama.cpp). The id goes in eot_token_id, or eom_token_id where the
    vocabulary holds a token llama.cpp takes as its EOT by text (the byte-level tokenizer's <|im_end|>)."""
    from gguf import GGUFReader, GGUFValueType

    from edgesdk.export.gguf_export import export_gguf

    tokenizer = tiny_tokenizer(319) if kind == "byte-level" else tiny_llama2_tokenizer()
    bundle, end = _bundle_with_end_of_turn(tmp_path, tokenizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = export_gguf(bundle.path, tmp_path / "model.gguf")
    assert not [w for w in caught if "does not end generation" in str(w.message)]  # the keys hold every end id
    fields = GGUFReader(str(report.path)).fields
    assert set(bundle.manifest["tokenizer"]["eos_token_ids"]) <= _llama_cpp_end_ids(fields)
    key = "tokenizer.ggml.eom_token_id" if kind == "byte-level" else "tokenizer.ggml.eot_token_id"
    assert fields[key].contents() == end
    assert fields[key].types == [GGUFValueType.UINT32]  # gguf-py's add_eot_token_id / add_eom_token_id
    other = ({"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} - {key}).pop()
    assert other not in fields  # the byte-level vocabulary's <|im_end|> stays llama.cpp's EOT


def _vocab(tokens, eos_ids):
    from edgesdk.export.gguf_vocab import GGUFVocab

    return GGUFVocab(tokens=tokens, token_types=[1] * len(tokens), merges=[], pre="gpt-2", bos_id=None, eos_id=0,
                     unk_id=None, add_bos=False, eos_ids=tuple(eos_ids))


def _keys(tmp_path, vocab) -> dict:
    from gguf import GGUFWriter

    from edgesdk.export.gguf_export import add_tokenizer

    writer = GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    add_tokenizer(writer, vocab, None)
    return {key: value.value for kv in writer.kv_data for key, value in kv.items()}


def test_no_end_of_turn_key_where_llama_cpp_knows_every_end_token(tmp_path):
    """A ChatML vocabulary whose ends are all llama.cpp's texts gets no EOT / EOM key, which would replace the EOT
    token llama.cpp finds by text."""
    keys = _keys(tmp_path, _vocab(["</s>", "a", "<|im_end|>", "<|endoftext|>"], (0, 2, 3)))
    assert "tokenizer.ggml.eot_token_id" not in keys
    assert "tokenizer.ggml.eom_token_id" not in keys


def test_two_unknown_end_tokens_fill_eot_and_eom_and_a_third_is_named_in_a_warning(tmp_path):
    """llama.cpp has two keys for end tokens beside EOS; a third unknown end token cannot be written, and the export
    says which one llama.cpp runs past (with the fix: a stop string)."""
    from edgesdk.export.gguf_export import end_of_turn_keys

    vocab = _vocab(["<eos>", "a", "<|END_OF_TURN_TOKEN|>", "<|end_of_turn|>", "<|end_of_message|>"], (0, 2, 3, 4))
    keys = _keys(tmp_path, vocab)
    assert keys["tokenizer.ggml.eot_token_id"] == 2
    assert keys["tokenizer.ggml.eom_token_id"] == 3
    assert end_of_turn_keys(vocab)[1] == [4]
    assert "tokenizer.ggml.eot_token_id" not in _keys(tmp_path, _vocab(vocab.tokens, (0,)))


def test_the_file_reaches_the_disk_before_it_is_renamed_over_an_earlier_export(tmp_path, monkeypatch):
    """The export wrote NAME.gguf.partial, read it back and renamed it over NAME.gguf without fsync: ext4 may write
    the rename before the data, so a power cut soon after (a board's SD card) left an empty file where the earlier
    export was. The partial is now synced before the rename and the directory after it, as a bundle's commit does
    (fsync and os.replace still run; they are only recorded, by the path of each descriptor)."""
    import os
    from pathlib import Path

    from edgesdk.export.gguf_export import export_gguf
    from tests._utils.tiny import save_tiny_model_dir

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to name a descriptor's file")
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128)
    bundle = build_tiny_bundle(tmp_path, FUSED, "host", model_dir=model_dir, generated_sequences=0)
    destination = tmp_path / "out" / "model.gguf"
    destination.parent.mkdir()
    destination.write_bytes(b"an earlier export")
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(handle):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{handle}")))
        return real_fsync(handle)

    def replace(source, target, **kwargs):
        events.append(("replace", os.fspath(source), os.fspath(target)))
        return real_replace(source, target, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    export_gguf(bundle.path, destination)
    publish, partial = next((index, event[1]) for index, event in enumerate(events)
                            if event[0] == "replace" and event[2] == str(destination))
    assert partial.endswith(".partial")
    assert ("fsync", partial) in events[:publish]
    assert ("fsync", str(destination.parent)) in events[publish:]
