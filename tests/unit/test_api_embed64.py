"""The refusal of embeddings names the fix for the bundle that runs (edgesdk/runtime/embedding.py
``hidden_states_fix``): the triton backend for one whose block-sparse weights give the hidden states (recipes jetson,
jetson-sparse), a rebuild for an int8-qdq bundle, whose QDQ graph no backend embeds, and never ``ort-cpu`` for a QDQ
graph, which ort-cpu runs too. And :meth:`edgesdk.Model.perplexity`'s default context on a bundle built shorter
than 512: the bundle's own, as ``edgesdk eval`` scores it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import edgesdk
from edgesdk.api import RequestError
from edgesdk.cli import main
from edgesdk.runtime.embedding import (
    EMBEDDING_RECIPES,
    NO_HIDDEN_STATES_FIX,
    EmbeddingConfig,
    embed_tokens,
    hidden_states_fix,
    hidden_states_problem,
    hidden_states_source,
    no_hidden_states_why,
)
from edgesdk.serve.api import ApiError
from tests._utils.tiny import CORPUS

TEXT = "The board runs cool in the shade."


@pytest.fixture(scope="module")
def qdq_bundle(tiny_model_dir, tmp_path_factory):
    """An int8-qdq build: the QDQ graph TensorRT builds from, no block-sparse weights."""
    from tests._utils.builds import QDQ_RECIPE, build_tiny_bundle

    return build_tiny_bundle(tmp_path_factory.mktemp("qdq64"), QDQ_RECIPE, "host", model_dir=tiny_model_dir)


@pytest.fixture(scope="module")
def sparse_bundle(tmp_path_factory):
    """A jetson build: the QDQ graph and block-sparse INT8 weights with their kernels."""
    from tests._utils.builds import build_tiny_jetson_bundle

    return build_tiny_jetson_bundle(tmp_path_factory.mktemp("sparse64"))


def _inspect_embeddings_line(bundle) -> str:
    shown = CliRunner().invoke(main, ["inspect", str(bundle.path)])
    assert shown.exit_code == 0, shown.output
    return next(line for line in shown.output.splitlines() if line.startswith("embeddings "))


def test_an_int8_qdq_bundle_is_told_to_rebuild_not_to_run_another_backend(qdq_bundle, monkeypatch):
    """ort-cpu runs the same QDQ graph and triton needs block-sparse weights the bundle has none of: the fix
    "--backend ort-cpu, or --backend triton on a Jetson" led to two more refusals."""
    manifest = qdq_bundle.manifest
    assert hidden_states_source(manifest) is None
    # the facts inspect's embeddings line gives, the same words
    assert _inspect_embeddings_line(qdq_bundle) == \
        f"embeddings none: {no_hidden_states_why(manifest)}; rebuild with {EMBEDDING_RECIPES} to embed"
    with edgesdk.load(qdq_bundle.path, threads=1) as model:
        assert model.runtime.backend.name == "ort-cpu"
        refusals = []
        with pytest.raises(RequestError, match="no 'hidden_states' output") as caught:  # the graph lacks it
            model.embed(TEXT)
        refusals.append(caught.value)
        monkeypatch.setattr(model.runtime.backend, "hidden_states", None)  # as a TensorRT engine gives none
        for call in (model.embed, model.create_embedding):
            with pytest.raises(RequestError, match="gives no hidden states") as caught:
                call(TEXT)
            refusals.append(caught.value)
        for refused in refusals:
            assert refused.status == 501
            assert refused.fix.startswith("no backend embeds this bundle (the QDQ graph (for TensorRT; recipe "
                                          "tiny-qdq) has no hidden-state output")
            assert "rebuild it with 'edgesdk build'" in refused.fix
            assert "fp32-standard" in refused.fix
            assert "backend=" not in refused.fix
        # serve's embedding routes: the same fix, a 501
        with pytest.raises(ApiError, match="no backend embeds this bundle") as served:
            model._completer.embed([TEXT], EmbeddingConfig())
        assert served.value.status == 501
        assert "--backend" not in served.value.message
        with pytest.raises(edgesdk.EdgeSDKError, match="gives no hidden states") as direct:
            embed_tokens(model.runtime.backend, [1, 2, 3], manifest=manifest)
        assert direct.value.fix == hidden_states_fix(manifest)
        assert "--backend" not in direct.value.fix


def test_a_jetson_bundle_is_told_to_run_on_triton_and_embeds_there(sparse_bundle, monkeypatch):
    """Its block-sparse weights give the hidden states on triton; ort-cpu, ort-cuda, ort-trt and tensorrt run its
    QDQ graph. Triton here runs its kernels' PyTorch twins (EDGESDK_KERNELS=reference)."""
    manifest = sparse_bundle.manifest
    assert hidden_states_source(manifest) == "sparse"
    assert _inspect_embeddings_line(sparse_bundle).endswith(", on the triton backend only (the QDQ graph has no "
                                                            "hidden-state output)")
    with edgesdk.load(sparse_bundle.path, backend="ort-cpu", ignore_target=True, threads=1) as model:
        with pytest.raises(RequestError, match="no 'hidden_states' output") as graph:
            model.embed(TEXT)
        monkeypatch.setattr(model.runtime.backend, "hidden_states", None)  # as its TensorRT engine gives none
        with pytest.raises(RequestError, match="gives no hidden states") as engine:
            model.embed(TEXT)
        for refused in (graph.value, engine.value):
            assert refused.fix.startswith("load the bundle with backend='triton', on a machine with an NVIDIA GPU")
            assert "ort-cpu" not in refused.fix
            assert "rebuild" not in refused.fix
        with pytest.raises(ApiError, match="run the bundle with --backend triton") as served:
            model._completer.embed([TEXT], EmbeddingConfig())
        assert served.value.status == 501
        assert "--backend ort-cpu" not in served.value.message
    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    with edgesdk.load(sparse_bundle.path, backend="triton", ignore_target=True, threads=1) as model:
        assert hidden_states_problem(model.runtime.backend, manifest) is None
        vector = model.embed(TEXT)  # the fix, followed
        assert len(vector) == model.n_embd()


def test_a_bundle_whose_graph_gives_hidden_states_is_told_to_run_on_ort_cpu(tiny_bundle, monkeypatch):
    assert hidden_states_source(tiny_bundle.manifest) == "graph"
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        monkeypatch.setattr(model.runtime.backend, "hidden_states", None)
        problem = hidden_states_problem(model.runtime.backend, tiny_bundle.manifest)
        assert problem.cause == "backend"
        assert problem.fix.startswith("run the bundle with --backend ort-cpu")
        assert "triton" not in problem.fix


def test_without_its_bundle_the_refusal_names_each_kind_of_bundle(qdq_bundle, monkeypatch):
    """A caller that passes no manifest: the fix cannot be the bundle's, so it says which kind embeds where and how
    to tell which kind a bundle is, not that ort-cpu embeds any bundle."""
    with edgesdk.load(qdq_bundle.path, threads=1) as model:
        monkeypatch.setattr(model.runtime.backend, "hidden_states", None)
        problem = hidden_states_problem(model.runtime.backend)
        assert problem.fix == NO_HIDDEN_STATES_FIX
        for words in ("--backend ort-cpu", "block-sparse weights (recipes jetson, jetson-sparse) only on --backend "
                      "triton", "(int8-qdq) on no backend", "edgesdk inspect BUNDLE"):
            assert words in problem.fix
        python = hidden_states_problem(model.runtime.backend, terms="python").fix
        assert "backend='triton'" in python
        assert "--backend" not in python


def test_perplexity_defaults_to_the_bundle_context_where_it_is_shorter_than_512(tiny_bundle):
    """``edgesdk eval`` scores a bundle built with --max-context 256 at 256 when no --context is given; the API's
    default 512 refused it. A context asked for past the bundle's stays refused."""
    text = " ".join(CORPUS * 30)
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        assert model.max_context == 256
        default = model.perplexity(text, max_chars=4000)
        assert default == model.perplexity(text, context=256, max_chars=4000)
        assert default != model.perplexity(text, context=128, max_chars=4000)
        with pytest.raises(RequestError, match="context is 512, longer than the bundle's max_context 256") as caught:
            model.perplexity(text, context=512)
        assert caught.value.fix == "pass context=256 or less"
