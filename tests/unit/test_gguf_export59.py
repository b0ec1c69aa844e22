"""GGUF export, review 59: the model's sampling settings are written with any gguf release edgesdk takes."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")


def _fields(path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return {name: (field.contents(), field.types[0].name) for name, field in reader.fields.items()}


def _writer_without_sampling_adders(path):
    """A GGUFWriter as gguf 0.16 and 0.17 have it (both within pyproject's gguf>=0.16): no ``add_sampling_*``
    methods, which later gguf releases added."""
    from gguf import GGUFWriter

    class OlderWriter(GGUFWriter):
        def __getattribute__(self, name):
            if name.startswith("add_sampling_"):
                raise AttributeError(f"'GGUFWriter' object has no attribute {name!r}")
            return super().__getattribute__(name)

    return OlderWriter(str(path), "llama")


def test_sampling_settings_are_written_without_gguf_s_newer_sampling_adders(tmp_path):
    """The export called writer.add_sampling_temp and its kin, which gguf 0.17.1 (and 0.16) lack: every bundle that
    records its model's sampling settings (an instruct model's generation_config.json) stopped with an
    AttributeError. The keys are now written by name, of the types llama.cpp reads."""
    from edgesdk.export.gguf_export import add_sampling
    from tests._utils.gguf_files import close_gguf

    path = tmp_path / "sampling.gguf"
    writer = _writer_without_sampling_adders(path)
    add_sampling(writer, {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05, "repeat_penalty": 1.05,
                          "repeat_last_n": 64, "samplers": ["top_k", "top_p", "temperature"]})
    fields = _fields(close_gguf(writer, path))

    assert fields["general.sampling.temp"] == (pytest.approx(0.7), "FLOAT32")
    assert fields["general.sampling.top_p"] == (pytest.approx(0.8), "FLOAT32")
    assert fields["general.sampling.top_k"] == (20, "INT32")
    assert fields["general.sampling.min_p"] == (pytest.approx(0.05), "FLOAT32")
    assert fields["general.sampling.penalty_repeat"] == (pytest.approx(1.05), "FLOAT32")
    assert fields["general.sampling.penalty_last_n"] == (64, "INT32")
    assert fields["general.sampling.sequence"] == ("top_k;top_p;temperature", "STRING")


def test_a_bundle_with_sampling_settings_exports_them_as_llama_cpp_reads_them(tmp_path):
    """End to end: the settings a bundle recorded from its model's generation_config.json are in the file, as the
    same keys and types (edgesdk's own GGUF reading gives them back)."""
    import json
    import warnings

    pytest.importorskip("torch")
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.models.generation_defaults import read_model_sampling
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2)
    (model_dir / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}))
    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: int4}\n", "host",
                               model_dir=model_dir, generated_sequences=0)
    recorded = bundle.manifest["generation"]["sampling"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = export_gguf(bundle.path, tmp_path / "model.gguf")

    assert read_model_sampling("gguf", report.path).values == recorded
