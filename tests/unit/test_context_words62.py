"""A request past the context of a bundle whose manifest records no model positions was told of a rebuild in three
wordings: the backends (ort, tensorrt, triton, the block-sparse decoder) said "rebuild with a larger --max-context",
the served prompt and fill-in-the-middle prompt "rebuild the bundle with a larger max_context", and generate (the
default of edgesdk.bundle.context_fix) "rebuild the bundle with a larger --max-context". Now every one says the
default's words; the served ones too, as the server's operator rebuilds with the command line's option."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from edgesdk.bundle import CONTEXT_TERMS, context_fix  # noqa: E402
from edgesdk.errors import EdgeSDKError, RuntimeBackendError  # noqa: E402
from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit.test_context_hint61 import (  # noqa: E402, F401 - fixtures
    _tensorrt,
    _triton,
    older_bundle,
    sparse_export,
)
from tests.unit.test_gpu_runtime46 import standard_bundle  # noqa: E402, F401 - fixture
from tests.unit.test_loose_ends61 import _with_positions  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402
from tests.unit.test_serve_infill40 import qwen_bundle  # noqa: E402, F401 - fixture

REBUILD = "rebuild the bundle with a larger --max-context"
BACKEND_SHORTEN = "shorten the prompt or --max-new-tokens"


def _unknown(shorten: str) -> str:
    """The words of a bundle without the model's positions: ``shorten``, or the default rebuild."""
    return f"{shorten}, or {REBUILD}"


def test_the_default_words_are_the_command_line_s():
    assert CONTEXT_TERMS["cli"][2] == REBUILD
    assert context_fix("shorten the prompt", 256, None, 300) == _unknown("shorten the prompt")


@pytest.fixture(scope="module")
def older_runtime(older_bundle):  # noqa: F811
    """The tiny bundle (256 tokens) without the model's positions, on its default backend (ort-cpu)."""
    from edgesdk.runtime.session import open_runtime

    return open_runtime(older_bundle.path, threads=1)


def test_an_ort_prefill_says_the_default_words(older_runtime):
    backend = older_runtime.backend
    assert backend.model_positions is None
    backend.reset()
    try:
        backend.prefill(np.arange(3, 203, dtype=np.int64))  # 200 tokens
        with pytest.raises(RuntimeBackendError) as refused:
            backend.prefill(np.arange(3, 103, dtype=np.int64))
    finally:
        backend.reset()
    assert refused.value.problem == "sequence of 300 tokens exceeds the bundle's max_context 256"
    assert refused.value.fix == _unknown(BACKEND_SHORTEN)


def test_ort_hidden_states_say_the_default_words(older_runtime):
    with pytest.raises(RuntimeBackendError) as refused:
        older_runtime.backend.hidden_states(np.arange(3, 303, dtype=np.int64))
    assert refused.value.fix == _unknown("embed at most 256 tokens (truncate the input)")


def test_generate_and_the_backend_say_the_same_words(older_runtime):
    """generate's prompt check and the backend's own check differ only in what each can shorten."""
    from edgesdk.runtime.generate import SamplingConfig, generate

    with pytest.raises(EdgeSDKError) as refused:
        generate(older_runtime.backend, [5] * 300, SamplingConfig(max_new_tokens=2), stop_ids=set())
    assert refused.value.fix == _unknown("shorten the prompt")


def test_the_triton_backend_says_the_default_words(sparse_export, monkeypatch):  # noqa: F811
    backend = _triton(sparse_export, monkeypatch, None)
    with pytest.raises(RuntimeBackendError) as refused:
        backend.prefill(np.arange(3, 68, dtype=np.int64))  # 65 tokens of a 64-token context
    assert refused.value.fix == _unknown(BACKEND_SHORTEN)


def test_the_sparse_decoder_says_the_default_words(sparse_export, monkeypatch):  # noqa: F811
    backend = _triton(sparse_export, monkeypatch, None)
    with pytest.raises(RuntimeBackendError) as refused:
        backend.decoder.step(torch.arange(3, 68), 1)  # 65 tokens
    assert refused.value.fix == _unknown("shorten the prompt or the generation, rewind or reset the cache")
    backend.close()


def test_the_tensorrt_backend_says_the_default_words(standard_bundle, monkeypatch, tmp_path):  # noqa: F811
    older = _with_positions(standard_bundle, tmp_path / "older", None)
    backend = _tensorrt(older, monkeypatch, tmp_path)
    assert backend.model_positions is None
    backend.prefill(np.arange(3, 67, dtype=np.int64))  # 64 tokens: the context
    with pytest.raises(RuntimeBackendError) as refused:
        backend.decode(5)
    assert refused.value.fix == _unknown(BACKEND_SHORTEN)


def test_a_served_prompt_is_told_the_command_line_s_option(older_runtime):
    server = Served(older_runtime, ServeDefaults(max_tokens=4))
    try:
        status, body = server.post("/v1/completions", {"prompt": [5] * 300, "max_tokens": 2})
    finally:
        server.close()
    assert status == 400, body
    assert body["error"]["message"] == ("the prompt has 300 tokens; this model's context holds 256: "
                                        + _unknown("shorten the prompt to fewer tokens (POST /tokenize counts them)"))


def test_a_served_suffix_is_told_the_command_line_s_option(qwen_bundle, tmp_path):  # noqa: F811
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.api import ApiError, parse_text_request
    from edgesdk.serve.completion import Completer

    bundle = _with_positions(qwen_bundle, tmp_path / "b", None)
    completer = Completer(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=2))
    with pytest.raises(ApiError) as refused:
        parse_text_request({"prompt": "x", "suffix": "y = 2\n" * 60, "max_tokens": 2}, completer=completer)
    assert refused.value.message.endswith(
        "this model's context holds 256: "
        + _unknown("shorten the suffix (or the prompt) to fewer tokens (POST /tokenize counts them)")), \
        refused.value.message
