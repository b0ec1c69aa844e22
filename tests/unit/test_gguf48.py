"""GGUF export, review 48: what the file says to the other tools that read it (Ollama's own engine)."""

from __future__ import annotations

import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

pytest.importorskip("gguf")
pytest.importorskip("torch")

LAYERS = 7  # the sixth layer attends globally (llama.cpp's and Ollama's gemma3: (il + 1) % 6 == 0)
GLOBAL_BASE = 500_000.0  # a global rotary base other than Gemma 3's 1,000,000


def test_a_gemma3_files_rotary_bases_are_written_under_the_keys_ollamas_gemma3_reads(tmp_path):
    """Ollama runs a gemma3 file in its own engine (fs/ggml/ggml.go, OllamaEngineRequired), whose gemma3 took the
    global layers' rotary base from ``gemma3.rope.global.freq_base`` (default 1,000,000) and the sliding layers'
    from ``gemma3.rope.local.freq_base`` (model/models/gemma3/model_text.go), the keys Ollama's converter writes
    (convert/convert_gemma3.go). The export wrote only ``rope.freq_base`` (llama.cpp's key), so a Gemma 3 whose
    global base is not 1,000,000 rotated its global layers at 1,000,000 there."""
    from gguf import GGUFReader

    from edgesdk.export.gguf_export import export_gguf

    rope = {"full_attention": {"rope_type": "default", "rope_theta": GLOBAL_BASE},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
    model_dir = save_tiny_model_dir(
        tmp_path / "model", model_type="gemma3_text", hidden=64, heads=4, kv_heads=2, head_dim=32, layers=LAYERS,
        intermediate=128, vocab_size=384, tokenizer="gemma",
        config_overrides={"sliding_window": 4, "query_pre_attn_scalar": 32, "rope_parameters": rope,
                          "layer_types": ["full_attention" if i % 6 == 5 else "sliding_attention"
                                          for i in range(LAYERS)]})
    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    fields = {name: field.contents() for name, field in GGUFReader(str(report.path)).fields.items()}
    assert fields["gemma3.rope.freq_base"] == GLOBAL_BASE  # llama.cpp's key, as before
    assert fields["gemma3.rope.global.freq_base"] == GLOBAL_BASE
    assert fields["gemma3.rope.local.freq_base"] == 10_000.0


def test_a_directory_at_the_old_partial_files_name_is_left_alone(tmp_path):
    """The file was written as ``<name>.partial`` beside its destination, then renamed. A directory of that name made
    the first unlink fail, and the ``finally`` that removes the partial file failed again, so a bare
    IsADirectoryError escaped in place of the ExportError (and the CLI printed a traceback). The partial file now has a
    name of its own (``<name>.<random>.partial``): the directory is no concern of the export's."""
    from edgesdk.export.gguf_export import export_gguf

    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host")
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.gguf.partial").mkdir()
    report = export_gguf(bundle.path, out / "model.gguf")
    assert report.path.read_bytes()[:4] == b"GGUF"
    assert (out / "model.gguf.partial").is_dir()
