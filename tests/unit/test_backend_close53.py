"""The ONNX Runtime backends' close() and what edgesdk.load gives back (edgesdk/runtime/ort_backend.py,
ort_fused_backend.py, ort_gated_backend.py, edgesdk/api.py), on real tiny models and bundles."""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
import weakref

import numpy as np
import pytest

from edgesdk.errors import BundleError, RuntimeBackendError

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

MAX_CONTEXT = 32


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{form: (model path, graph spec)} of one tiny model in the standard and the fused graph form, and the gated
    fused graph of a power-gated one."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from tests._utils.tiny import tiny_llama
    from tests.unit.test_power_export import _gated_model

    forms = {}
    models = {"standard": tiny_llama(hidden=64, heads=4, kv_heads=2), "ort-fused": tiny_llama(hidden=64, heads=4,
              kv_heads=2), "ort-fused-gated": _gated_model("llama-gqa")[0]}
    for form, model in models.items():
        out = tmp_path_factory.mktemp(form)
        spec = export_model(model, out, ExportConfig(form=form.removesuffix("-gated"), weights="fp32",
                                                     max_context=MAX_CONTEXT))
        assert spec.form == form
        forms[form] = (out / "model.onnx", spec.to_json())
    return forms


def open_backend(exported, form: str):
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend

    path, graph = exported[form]
    return {"standard": OrtBackend, "ort-fused": OrtFusedBackend,
            "ort-fused-gated": OrtGatedBackend}[form](path, graph, threads=1)


def live_sessions() -> set[int]:
    """The ids of the ONNX Runtime sessions alive now (after a collection)."""
    gc.collect()
    return {id(value) for value in gc.get_objects() if type(value) is ort.InferenceSession}


@pytest.mark.parametrize("form", ["standard", "ort-fused", "ort-fused-gated"])
def test_close_frees_the_session_while_the_backend_is_still_referenced(exported, form):
    """llama-cpp-python's Llama.close() frees the model at once; the backends had no close(), so their session (the
    model's weights) lived as long as anything referenced the backend: a Model kept after close() held it."""
    backend = open_backend(exported, form)
    backend.prefill(np.arange(1, 6))
    backend.decode(3)  # the fused form's decode step binds the session too
    session = weakref.ref(backend.session)
    backend.close()
    gc.collect()
    assert session() is None
    assert backend.position == 0
    backend.close()  # again: nothing to do


@pytest.mark.parametrize("form", ["standard", "ort-fused", "ort-fused-gated"])
def test_every_use_of_a_closed_backend_names_it(exported, form):
    """After close(), a step, a rewind, a cache copy or the session itself is a RuntimeBackendError that says the
    backend is closed and what to do, not an AttributeError on None or a silently empty cache."""
    backend = open_backend(exported, form)
    backend.prefill(np.arange(1, 6))
    state, _ = backend.save_cache()
    backend.close()
    backend.reset()  # emptying a cache that is gone is no error (a server resets before it closes)
    uses = {"prefill": lambda: backend.prefill(np.arange(1, 4)), "decode": lambda: backend.decode(1),
            "hidden_states": lambda: backend.hidden_states(np.arange(1, 4)), "rewind": lambda: backend.rewind(0),
            "save_cache": backend.save_cache, "load_cache": lambda: backend.load_cache(state),
            "session.get_inputs": lambda: backend.session.get_inputs()}
    for call, use in uses.items():
        with pytest.raises(RuntimeBackendError, match=rf"^{call} on the closed ort-cpu backend: close\(\) gave back "
                                                      "its ONNX Runtime session") as caught:
            use()
        assert "open the bundle again" in caught.value.fix


def test_a_closed_model_gives_its_session_back_at_once(tiny_bundle):
    """edgesdk.load(...).close(): the engine closes the backend, so the session goes while the Model is kept."""
    import edgesdk

    model = edgesdk.load(tiny_bundle.path, threads=1)
    session = weakref.ref(model.runtime.backend.session)
    model.close()
    gc.collect()
    assert session() is None


def edited_copy(bundle_path, out, change=None, files=None):
    """A copy of the bundle at ``out`` with ``change`` applied to its manifest and ``files`` ({name: text}) written
    and relisted, manifest.sha256 rewritten to match: it verifies, so only what opening it finds can refuse it."""
    from edgesdk.bundle import sha256_file

    shutil.copytree(bundle_path, out)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    if change is not None:
        change(manifest)
    for name, text in (files or {}).items():
        (out / name).write_text(text, encoding="utf-8")
        manifest["files"][name] = {"size": (out / name).stat().st_size, "sha256": sha256_file(out / name)}
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (out / "manifest.json").write_text(text, encoding="utf-8")
    (out / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n", encoding="utf-8")
    return out


@pytest.mark.parametrize("damage", ["graph facts", "tokenizer"])
def test_a_bundle_refused_after_its_session_opened_gives_the_session_back(tiny_bundle, tmp_path, damage):
    """A manifest whose vocab_size is not the graph's (check_graph_matches) or a tokenizer.json that is none is
    refused after the backend opened: its session lived as long as the error's traceback (kept at a REPL, or in
    sys.last_exc), the model's weights with it."""
    from edgesdk.runtime.session import open_runtime

    if damage == "graph facts":
        path = edited_copy(tiny_bundle.path, tmp_path / "b", lambda manifest: manifest["graph"].update(
            vocab_size=manifest["graph"]["vocab_size"] + 1))
        match = "'graph.vocab_size' is"
    else:
        path = edited_copy(tiny_bundle.path, tmp_path / "b", files={"tokenizer.json": '{"version": "1.0"}'})
        match = "is not a tokenizer.json"
    before = live_sessions()
    with pytest.raises(BundleError, match=match) as caught:
        open_runtime(path, threads=1)
    assert caught.value.__traceback__ is not None
    assert live_sessions() - before == set()


def test_a_load_that_fails_after_the_draft_opened_gives_the_draft_back(tiny_bundle, tmp_path):
    """A bundle whose manifest names a pooling that is none (edited with its hashes) fails when the engine is made,
    after the draft bundle has opened: only the main backend was given back, and the draft's session lived as long as
    the error's traceback (kept at a REPL, or in sys.last_exc)."""
    import edgesdk

    main = edited_copy(tiny_bundle.path, tmp_path / "bad-pooling",
                       lambda manifest: manifest["model"].setdefault("before", {}).update(pooling="bogus"))
    before = live_sessions()
    with pytest.raises(BundleError, match="'model.before.pooling' is 'bogus'") as caught:
        edgesdk.load(main, threads=1, draft=tiny_bundle.path)
    assert caught.value.__traceback__ is not None  # the traceback, and the frames it holds, are still alive
    assert live_sessions() - before == set()
