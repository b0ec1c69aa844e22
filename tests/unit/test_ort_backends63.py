"""The ONNX Runtime backends (edgesdk/runtime/ort_backend.py, ort_fused_backend.py, ort_gated_backend.py) on real tiny
graphs of each export form: a prompt in one pass, in chunks or token by token gives the same logits and greedy text,
reset() equals a fresh backend, max_context is held exactly, the thread settings reach the session, closing gives
back every file, and a graph without hidden states says which recipes give them."""

from __future__ import annotations

import gc
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import edgesdk
from edgesdk.errors import RuntimeBackendError

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

MAX_CONTEXT = 32
FORMS = ["standard", "standard-int8", "ort-fused", "ort-fused-gated"]
PROMPT = np.array([5, 17, 99, 3, 250, 42, 7, 7, 130, 12, 64, 201], np.int64)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{form: (model path, graph spec)}: one tiny model in the standard form (float32, and int8, the QDQ graph), the
    fused form, and the gated fused graph of a power-gated one."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from tests._utils.tiny import tiny_llama
    from tests.unit.test_power_export import _gated_model

    settings = {"standard": ("standard", "fp32"), "standard-int8": ("standard", "int8"),
                "ort-fused": ("ort-fused", "fp32"), "ort-fused-gated": ("ort-fused", "fp32")}
    forms = {}
    for form, (graph_form, weights) in settings.items():
        model = _gated_model("llama-gqa")[0] if form.endswith("gated") else tiny_llama(hidden=64, heads=4,
                                                                                       kv_heads=2)
        out = tmp_path_factory.mktemp(form)
        spec = export_model(model, out, ExportConfig(form=graph_form, weights=weights, max_context=MAX_CONTEXT))
        forms[form] = (out / "model.onnx", spec.to_json())
    return forms


def open_backend(exported, form: str, threads: int = 1, spinning: bool = True):
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend

    path, graph = exported[form]
    backend_class = {"ort-fused": OrtFusedBackend, "ort-fused-gated": OrtGatedBackend}.get(graph["form"], OrtBackend)
    return backend_class(path, graph, threads=threads, spinning=spinning)


def greedy(backend, logits: np.ndarray, steps: int = 12) -> list[int]:
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits)))
        logits = backend.decode(tokens[-1])
    return tokens


@pytest.mark.parametrize("form", FORMS)
def test_a_prompt_in_one_pass_in_chunks_or_token_by_token_gives_the_same_logits_and_text(exported, form):
    backend = open_backend(exported, form)
    whole = backend.prefill(PROMPT, len(PROMPT))
    text = greedy(backend, whole[-1])
    backend.reset()
    chunks = np.concatenate([backend.prefill(PROMPT[start:end], end - start)
                             for start, end in ((0, 5), (5, 6), (6, len(PROMPT)))])
    assert backend.position == len(PROMPT)
    chunked_text = greedy(backend, chunks[-1])
    backend.reset()
    steps = np.stack([backend.prefill(PROMPT[:1])[0]] + [backend.decode(int(token)) for token in PROMPT[1:]])
    assert backend.position == len(PROMPT)
    stepped_text = greedy(backend, steps[-1])
    scale = float(np.ptp(whole))
    np.testing.assert_allclose(chunks, whole, atol=1e-4 * scale)
    np.testing.assert_allclose(steps, whole, atol=1e-4 * scale)
    assert chunked_text == text == stepped_text


@pytest.mark.parametrize("form", FORMS)
def test_reset_then_a_prompt_equals_a_fresh_backend(exported, form):
    used = open_backend(exported, form)
    used.prefill(np.arange(3, 3 + MAX_CONTEXT - 4))
    used.decode(9)
    used.reset()
    assert used.position == 0
    np.testing.assert_array_equal(used.prefill(PROMPT, len(PROMPT)),
                                  open_backend(exported, form).prefill(PROMPT, len(PROMPT)))


@pytest.mark.parametrize("form", FORMS)
def test_max_context_tokens_run_and_one_more_is_refused_leaving_the_cache_as_it_was(exported, form):
    backend = open_backend(exported, form)
    backend.prefill(np.arange(3, 3 + MAX_CONTEXT))
    assert backend.position == MAX_CONTEXT
    with pytest.raises(RuntimeBackendError, match=f"{MAX_CONTEXT + 1} tokens exceeds the bundle's max_context "
                                                  f"{MAX_CONTEXT}"):
        backend.decode(3)
    assert backend.position == MAX_CONTEXT
    backend.reset()
    backend.prefill(PROMPT[:4])
    with pytest.raises(RuntimeBackendError, match="exceeds the bundle's max_context") as refused:
        backend.prefill(np.arange(3, 3 + MAX_CONTEXT - 3))
    assert refused.value.fix
    assert backend.position == 4  # the refused prompt left the first four tokens, which still decode
    assert backend.decode(7).shape == (exported[form][1]["vocab_size"],)


@pytest.mark.parametrize(("threads", "spinning"), [(1, True), (2, False), (2, True)])
@pytest.mark.parametrize("form", ["standard", "ort-fused-gated"])
def test_the_thread_settings_reach_the_session(exported, form, threads, spinning):
    backend = open_backend(exported, form, threads=threads, spinning=spinning)
    options = backend.session.get_session_options()
    assert options.intra_op_num_threads == threads
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts the process's open files in /proc")
@pytest.mark.parametrize("form", FORMS)
def test_twenty_opens_and_closes_leave_no_file_open(exported, form):
    def open_files() -> int:
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    open_backend(exported, form).close()
    before = open_files()
    for _ in range(20):
        backend = open_backend(exported, form)
        backend.prefill(PROMPT[:3])
        backend.decode(4)
        backend.close()
    del backend
    # the fewest of a few counts: a file another thread of this process has open for a moment is not a leak
    after = min(open_files() for _ in range(3) if not time.sleep(0.05))
    assert after <= before


def test_the_qdq_graph_s_refusal_names_the_recipes_that_lack_hidden_states_and_those_that_give_them(exported):
    """The QDQ graph (the standard form with int8 weights, which the int8-qdq recipe builds for any board) has no
    hidden-state output; its refusal told the user to rebuild "in a standard or fused graph form", and the bundle
    was already of the standard form. It names the recipes that export the QDQ graph, and ones that give the
    output."""
    from edgesdk.runtime.embedding import EmbeddingConfig, embed_tokens

    recipes = {}
    for path in sorted((Path(edgesdk.__file__).parent / "recipes").glob("*.yaml")):
        export = yaml.safe_load(path.read_text(encoding="utf-8")).get("export") or {}
        recipes[path.stem] = export.get("form", "ort-fused") == "standard" and export.get("weights") == "int8"
    backend = open_backend(exported, "standard-int8")
    assert not backend.gives_hidden_states
    with pytest.raises(RuntimeBackendError, match="no 'hidden_states' output") as refused:
        embed_tokens(backend, PROMPT.tolist(), EmbeddingConfig())
    named = {name for name in recipes if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", refused.value.fix)}
    assert named, refused.value.fix
    assert not any(recipes[name] for name in named), "the fix names a recipe that exports the QDQ graph"
    qdq = {name for name, is_qdq in recipes.items() if is_qdq}
    assert qdq
    assert all(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", refused.value.problem) for name in qdq)
    # the named recipes' graphs give the output: the fused and the float32 standard forms here do
    for form in ("standard", "ort-fused"):
        assert open_backend(exported, form).hidden_states(PROMPT).shape == (len(PROMPT), 64)
