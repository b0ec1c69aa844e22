"""Review 50 of the embed area.

- edgesdk/models/pooling.py: a sentence-transformers 5 model directory names its Pooling module
  ``sentence_transformers.sentence_transformer.modules.pooling.Pooling`` in modules.json and saves its mode as
  ``"pooling_mode": "lasttoken"`` (sentence_transformer/modules/pooling.py, ``config_keys``); the reader knew only
  ``sentence_transformers.models.Pooling`` and the ``pooling_mode_*`` booleans, so such a model (a Qwen3-Embedding
  fine-tuned and saved with sentence-transformers 5) was built as declaring nothing and pooled with mean, not the
  last token it was trained for.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.models.pooling import declared_pooling, sentence_transformers_pooling

ST5_TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
ST5_POOLING = "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
ST5_NORMALIZE = "sentence_transformers.sentence_transformer.modules.normalize.Normalize"


def _sentence_transformers5(directory, pooling_type: str = ST5_POOLING, **config):
    """A model directory as sentence-transformers 5's ``save`` writes it: modules.json's types are the module's
    ``__module__`` and class name, the Pooling config holds ``embedding_dimension``, ``pooling_mode`` and
    ``include_prompt``."""
    (directory / "1_Pooling").mkdir(parents=True)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": ST5_TRANSFORMER},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": pooling_type},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": ST5_NORMALIZE}]))
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 64, **config}))
    return directory


@pytest.mark.parametrize(("mode", "pooling"), [("lasttoken", "last"), ("mean", "mean"), ("cls", "cls"),
                                               (["lasttoken"], "last")])
def test_a_sentence_transformers_5_pooling_mode_is_read(mode, pooling, tmp_path):
    """Qwen3-VL-Embedding's form (``"pooling_mode": "lasttoken"``): the old reader gave (None, None)."""
    model = _sentence_transformers5(tmp_path, pooling_mode=mode, include_prompt=True)
    assert sentence_transformers_pooling(model) == (pooling, None)
    assert declared_pooling("hf-dir", model) == (pooling, None)


def test_the_pooling_mode_wins_over_the_legacy_booleans_and_the_old_module_name_is_read(tmp_path):
    """sentence-transformers 5's ``Pooling.load_config`` drops the ``pooling_mode_*`` keys where ``pooling_mode`` is
    there; a directory whose modules.json still says ``sentence_transformers.models.Pooling`` reads the same."""
    model = _sentence_transformers5(tmp_path, pooling_type="sentence_transformers.models.Pooling",
                                    pooling_mode="lasttoken", pooling_mode_mean_tokens=True)
    assert sentence_transformers_pooling(model) == ("last", None)


@pytest.mark.parametrize("mode", ["max", "weightedmean", ["cls", "mean"]])
def test_a_sentence_transformers_5_mode_edgesdk_does_not_compute_is_named(mode, tmp_path):
    pooling, why = sentence_transformers_pooling(_sentence_transformers5(tmp_path, pooling_mode=mode))
    assert pooling is None
    assert f"pooling_mode {json.dumps(mode)}" in why
    assert "edgesdk's embeddings do not compute" in why


def test_a_bundle_of_a_sentence_transformers_5_model_pools_with_its_last_token(tmp_path):
    """Built through the real pipeline, the bundle records the model's pooling and ``edgesdk embed`` pools with it
    when none is asked for (the old build recorded none: mean)."""
    pytest.importorskip("torch")
    import numpy as np
    from click.testing import CliRunner

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.cli import main
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = _sentence_transformers5(save_tiny_model_dir(tmp_path / "embedder"), pooling_mode="lasttoken",
                                        include_prompt=True)
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b",
                               export=ExportConfig(max_context=64), progress=False))
    assert bundle.manifest["model"]["before"].get("pooling") == "last"
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode("the board runs cool")
    last = embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling="last")).vectors
    result = CliRunner().invoke(main, ["embed", str(bundle.path), "--threads", "1", "-p", "the board runs cool",
                                       "--embd-output-format", "array"])
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(json.loads(result.stdout)[0], last, atol=1e-6)
