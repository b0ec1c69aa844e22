"""Draft models and embeddings (edgesdk/runtime/speculative.py, edgesdk/runtime/embedding.py, edgesdk/cli_embed.py):
a refused draft bundle's session given back at once, and a bad pooling in a manifest named with its bundle."""

from __future__ import annotations

import gc
import hashlib
import json
import shutil

import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("torch")


def live_sessions() -> set[int]:
    """The ids of the ONNX Runtime sessions alive now (after a collection)."""
    gc.collect()
    return {id(value) for value in gc.get_objects() if type(value) is ort.InferenceSession}


@pytest.fixture(scope="module")
def gemma_bundle(tmp_path_factory):
    """A tiny bundle with another vocabulary (Gemma's pieces), which no byte-level bundle takes as its draft."""
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("gemma")
    model_dir = save_tiny_model_dir(root / "model", tokenizer="gemma", vocab_size=384, hidden=64, heads=4, kv_heads=2)
    return build_tiny_bundle(root, "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                             model_dir=model_dir)


def test_a_refused_draft_bundle_gives_its_session_back_while_the_error_is_held(target, gemma_bundle):
    """A draft bundle opened and then refused for its vocabulary kept its ONNX Runtime session (the draft's weights)
    alive as long as the DraftError's traceback: a server or notebook that kept the error held both models."""
    from edgesdk.runtime.speculative import DraftConfig, DraftError, open_draft_model

    before = live_sessions()
    with pytest.raises(DraftError, match="has another tokenizer than the bundle") as caught:
        open_draft_model(target, gemma_bundle.path, DraftConfig(), threads=1)
    assert caught.value.__traceback__ is not None  # the frames that held the draft runtime are still referenced
    assert live_sessions() - before == set()


def _with_pooling(bundle, out, pooling: str):
    """A copy of ``bundle`` whose manifest declares ``pooling`` (its digest rewritten to match)."""
    from edgesdk.bundle import read_manifest

    shutil.copytree(bundle, out)
    manifest = read_manifest(out)
    manifest["model"]["before"]["pooling"] = pooling
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (out / "manifest.json").write_text(text, encoding="utf-8")
    (out / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    return out


def test_a_pooling_in_the_manifest_that_is_none_here_names_the_bundle(tiny_bundle, tmp_path):
    """The refusal said "the bundle's 'model.before.pooling' is 'max'" without saying which bundle."""
    from edgesdk.errors import BundleError
    from edgesdk.runtime.embedding import bundle_pooling
    from tests.unit.test_cli import invoke

    bundle = _with_pooling(tiny_bundle.path, tmp_path / "max-pooled", "max")
    with pytest.raises(BundleError) as caught:
        bundle_pooling({"model": {"before": {"pooling": "max"}}}, bundle)
    assert str(bundle) in caught.value.problem
    result = invoke("embed", bundle, "-p", "hello", "--threads", 1)
    assert result.exit_code != 0
    message = " ".join(result.stderr.split())
    assert f"'model.before.pooling' is 'max' in the manifest of the bundle {bundle}" in message, message
    assert "expected one of last, mean, cls, none" in message
    assert invoke("embed", bundle, "-p", "hello", "--threads", 1, "--pooling", "mean").exit_code == 0
