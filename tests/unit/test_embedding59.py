"""A sentence-transformers model's modules after its Pooling (Dense layers, as EmbeddingGemma's 768 -> 3072 -> 768)
are not in a bundle's graph: the build names them and says the bundle's vectors are the pooled hidden states, not
the vectors sentence-transformers gives."""

from __future__ import annotations

import json

import pytest

from edgesdk.models.pooling import sentence_transformers_unapplied, unapplied_modules

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"}


def _dense(index: int, in_features: int, out_features: int, activation: str = "torch.nn.modules.linear.Identity"):
    return ({"idx": index, "name": str(index), "path": f"{index}_Dense", "type": "sentence_transformers.models.Dense"},
            {"in_features": in_features, "out_features": out_features, "bias": True,
             "activation_function": activation})


def _sentence_transformers(directory, modules, configs=None, hidden: int = 64):
    """``directory`` made a sentence-transformers model: ``modules.json`` listing ``modules``, mean pooling, and each
    of ``configs`` ({path: config}) written as that module's config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False,
         "pooling_mode_max_tokens": False, "pooling_mode_lasttoken": False}))
    for path, config in (configs or {}).items():
        (directory / path).mkdir(exist_ok=True)
        (directory / path / "config.json").write_text(json.dumps(config))
    return directory


def test_dense_modules_after_pooling_are_named_with_their_sizes(tmp_path):
    first, first_config = _dense(2, 64, 96)
    second, second_config = _dense(3, 96, 48, "torch.nn.modules.activation.Tanh")
    model = _sentence_transformers(tmp_path, [TRANSFORMER, POOLING, first, second, NORMALIZE],
                                   {"2_Dense": first_config, "3_Dense": second_config})
    warning = unapplied_modules("hf-dir", model)
    assert warning.startswith("its modules.json lists 2_Dense (Dense, 64 to 96 values), "
                              "3_Dense (Dense, 96 to 48 values, torch.nn.modules.activation.Tanh), which edgesdk's "
                              "embeddings do not apply: the bundle's embeddings are the model's pooled hidden states")
    assert "after those modules (48 values each)" in warning
    assert "Normalize" not in warning  # the Euclidean norm edgesdk applies by default


def test_only_the_modules_a_bundle_computes_give_no_warning(tmp_path):
    assert sentence_transformers_unapplied(_sentence_transformers(tmp_path / "a", [TRANSFORMER, POOLING])) is None
    assert unapplied_modules("hf-dir", _sentence_transformers(tmp_path / "b", [TRANSFORMER, POOLING, NORMALIZE])) \
        is None
    assert unapplied_modules("hf-dir", tmp_path) is None  # a plain transformers directory
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "modules.json").write_text("{not json")  # sentence_transformers_pooling names this one
    assert unapplied_modules("hf-dir", tmp_path / "c") is None


def test_another_module_or_an_unreadable_dense_config_is_still_named(tmp_path):
    layer_norm = {"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}
    dense, _ = _dense(3, 64, 32)
    warning = sentence_transformers_unapplied(_sentence_transformers(tmp_path, [TRANSFORMER, POOLING, layer_norm,
                                                                                dense]))
    assert warning.startswith("its modules.json lists 2_LayerNorm (LayerNorm), 3_Dense (Dense), which edgesdk's ")
    assert "give after those modules, so" in warning  # no size to name: 3_Dense/config.json is not there


def test_a_build_warns_of_dense_modules_its_embeddings_do_not_apply(tmp_path, capfd):
    """Built from a model whose modules.json lists Pooling (mean), two Dense layers and Normalize, the build warns,
    and what it says holds: the bundle's vector is the normalised mean of the hidden states, not the vector
    sentence-transformers computes (mean pooling, the Linear layers, normalize), built here with torch."""
    torch = pytest.importorskip("torch")
    import numpy as np
    from safetensors.torch import save_file
    from transformers import AutoModel

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir

    first, first_config = _dense(2, 64, 96)
    second, second_config = _dense(3, 96, 48)
    model_dir = _sentence_transformers(save_tiny_model_dir(tmp_path / "embedder"),
                                       [TRANSFORMER, POOLING, first, second, NORMALIZE],
                                       {"2_Dense": first_config, "3_Dense": second_config})
    torch.manual_seed(1)
    linears = [torch.nn.Linear(64, 96), torch.nn.Linear(96, 48)]
    for path, linear in zip(("2_Dense", "3_Dense"), linears, strict=True):
        save_file({"linear.weight": linear.weight.detach().contiguous(), "linear.bias": linear.bias.detach()},
                  str(model_dir / path / "model.safetensors"))
    capfd.readouterr()
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b",
                               export=ExportConfig(max_context=64), progress=False))
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning: its modules.json lists" in line]
    assert warnings == [
        "edgesdk build:   warning: its modules.json lists 2_Dense (Dense, 64 to 96 values), 3_Dense (Dense, 96 to 48 "
        "values), which edgesdk's embeddings do not apply: the bundle's embeddings are the model's pooled hidden "
        "states, not the vectors sentence-transformers and llama.cpp give after those modules (48 values each), so "
        "they cannot be compared with vectors those make of this model; compare them only with embeddings of this "
        "bundle, or build a model whose modules.json lists none"]
    assert bundle.manifest["model"]["before"]["pooling"] == "mean"

    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode("the board runs cool")
    vector = embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling="mean")).vectors
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(model_dir).eval()(torch.tensor([ids])).last_hidden_state[0]
        pooled = hidden.mean(dim=0)
        dense = torch.nn.functional.normalize(linears[1](linears[0](pooled)), dim=0)
    np.testing.assert_allclose(vector, torch.nn.functional.normalize(pooled, dim=0).numpy(), atol=1e-4)
    assert vector.shape == (64,)
    assert dense.shape == (48,)  # sentence-transformers' vector, which the bundle does not give
