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
    pooling, why = sentence_transformers_pooling(tmp_path)  # named: the runtime's default pooling is a guess
    assert pooling is None
    assert why.startswith("its modules.json is not JSON text (")


def test_a_bundle_pools_as_its_model_declares_unless_asked_otherwise(tmp_path, tiny_bundle):
    """Built from a sentence-transformers directory with last-token pooling, the bundle records it, and the server,
    the Python API and the command pool with it when no pooling is asked for; a bundle of a model that declares
    none pools with mean."""
    pytest.importorskip("torch")
    import numpy as np
    from click.testing import CliRunner

    import edgesdk
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.cli import main
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import Completer, ServeDefaults
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = _sentence_transformers(save_tiny_model_dir(tmp_path / "embedder"), pooling_mode_lasttoken=True)
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b",
                               export=ExportConfig(max_context=64), progress=False))
    assert bundle.manifest["model"]["before"]["pooling"] == "last"
    assert "pooling" not in tiny_bundle.manifest["model"]["before"]
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode("the board runs cool")
    last, mean = (embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling=p)).vectors for p in ("last", "mean"))
    assert not np.allclose(last, mean)
    assert Completer(runtime).defaults.pooling == "last"
    assert Completer(runtime, ServeDefaults(pooling="mean")).defaults.pooling == "mean"
    assert Completer(open_runtime(tiny_bundle.path, threads=1)).defaults.pooling == "mean"
    with edgesdk.load(bundle.path, threads=1) as model:
        np.testing.assert_allclose(model.embed("the board runs cool", normalize=True), last, atol=1e-6)
    result = CliRunner().invoke(main, ["embed", str(bundle.path), "-p", "the board runs cool",
                                       "--embd-output-format", "array"])
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(json.loads(result.stdout)[0], last, atol=1e-6)
    for path, line in ((bundle.path, "embeddings last pooling (the model's)"),
                       (tiny_bundle.path, "embeddings mean pooling (the model declares none)")):
        shown = CliRunner().invoke(main, ["inspect", str(path)])
        assert line in shown.output.splitlines(), shown.output


def test_a_pooling_in_the_manifest_that_is_none_here_is_named():
    from edgesdk.errors import BundleError
    from edgesdk.runtime.embedding import bundle_pooling

    assert bundle_pooling({"model": {"before": {"pooling": "cls"}}}) == "cls"
    assert bundle_pooling({"model": {"before": {}}}) == "mean"
    with pytest.raises(BundleError, match="'model.before.pooling' is 'max'"):
        bundle_pooling({"model": {"before": {"pooling": "max"}}})
