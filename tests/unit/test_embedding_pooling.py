"""The pooling a model source declares (a GGUF's pooling_type, a sentence-transformers Pooling module) is read at
build time and recorded in the bundle manifest."""

from __future__ import annotations

import json

import pytest

from edgesdk.models.pooling import declared_pooling, gguf_pooling, sentence_transformers_pooling


def _fields(values: dict):
    return values.get


@pytest.mark.parametrize(("value", "pooling"), [(0, "none"), (1, "mean"), (2, "cls"), (3, "last")])
def test_a_gguf_pooling_type_is_llama_cpps_enum(value, pooling):
    assert gguf_pooling(_fields({"general.architecture": "qwen3", "qwen3.pooling_type": value})) == (pooling, None)


def test_a_gguf_without_pooling_type_declares_none_and_a_reranker_is_named():
    assert gguf_pooling(_fields({"general.architecture": "llama"})) == (None, None)
    pooling, why = gguf_pooling(_fields({"general.architecture": "qwen3", "qwen3.pooling_type": 4}))
    assert pooling is None
    assert "rank (a reranker's classification head)" in why


def test_a_real_gguf_files_pooling_type_is_read(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "embedder.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_uint32("qwen3.pooling_type", 3)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert declared_pooling("gguf", path) == ("last", None)


def _sentence_transformers(directory, **modes):
    (directory / "1_Pooling").mkdir(parents=True)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    config = {"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
              "pooling_mode_max_tokens": False, "pooling_mode_lasttoken": False, **modes}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(("mode", "pooling"), [("pooling_mode_lasttoken", "last"), ("pooling_mode_mean_tokens", "mean"),
                                               ("pooling_mode_cls_token", "cls")])
def test_a_sentence_transformers_pooling_module_is_read(mode, pooling, tmp_path):
    assert sentence_transformers_pooling(_sentence_transformers(tmp_path, **{mode: True})) == (pooling, None)


def test_a_pooling_edgesdk_does_not_compute_is_named_and_no_declaration_is_none(tmp_path):
    pooling, why = sentence_transformers_pooling(_sentence_transformers(tmp_path / "a", pooling_mode_max_tokens=True))
    assert pooling is None
    assert "pooling_mode_max_tokens" in why
    assert sentence_transformers_pooling(tmp_path) == (None, None)  # a plain transformers directory
    (tmp_path / "modules.json").write_text("{not json")
    assert sentence_transformers_pooling(tmp_path) == (None, None)


def test_the_bundle_records_the_declared_pooling(tmp_path):
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = _sentence_transformers(save_tiny_model_dir(tmp_path / "embedder"), pooling_mode_lasttoken=True)
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b",
                               export=ExportConfig(max_context=64), progress=False))
    assert bundle.manifest["model"]["before"]["pooling"] == "last"
