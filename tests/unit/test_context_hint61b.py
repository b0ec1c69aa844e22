"""The rest of the refusals of more tokens than a bundle's context name what the model allows. The ONNX Runtime
backends (ort-cpu, the default) were opened without the model's positions, so generate's refusal of a prompt past the
context said "rebuild the bundle with a larger --max-context" there even where the manifest records them; now
open_backend gives every backend they open the positions. The ONNX Runtime backends' own refusal (a prefill, an
embedding's hidden states), the block-sparse decoder's, the served prompt's (/v1/completions, chat, Anthropic's
/v1/messages) and the Python API's name the --max-context to rebuild with (build_bundle's max_context in Python), the
most the model's max_position_embeddings allow, or say that the bundle is at them; a bundle whose manifest does not
record them is told to rebuild with a larger --max-context."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import edgesdk  # noqa: E402
from edgesdk.errors import EdgeSDKError, RuntimeBackendError  # noqa: E402
from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit.test_context_hint61 import (  # noqa: E402, F401 - fixtures
    _triton,
    at_cap_bundle,
    older_bundle,
    sparse_export,
)
from tests.unit.test_serve import Served  # noqa: E402

REBUILD_512 = ("rebuild the bundle with 'edgesdk build --max-context 512', the most the model's "
               "max_position_embeddings (512) allows")
AT_256 = "the model's max_position_embeddings is 256, this bundle's context: no build of the model goes past it"
PYTHON_SHORTEN = ("shorten the {} (model.tokenize(text) counts a text's tokens, model.n_ctx() is the context)")
CHAT_TEXT = "word " * 60  # about 300 tokens of the tiny tokenizer: past the bundle's 256, within the model's 512


def _runtime(bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(bundle.path, threads=1)


def _ids(runtime, tokens: int) -> list[int]:
    """A prompt of exactly ``tokens`` token ids (the tokenizer's own, repeated)."""
    seed = runtime.tokenizer.prompt_ids("The quick brown fox jumps over the lazy dog. ", raw=True)
    return (seed * (tokens // len(seed) + 1))[:tokens]


@pytest.fixture(scope="module")
def tiny_runtime(tiny_bundle):
    """The tiny bundle (256 tokens of a 512-position model) opened on its default backend."""
    return _runtime(tiny_bundle)


@pytest.fixture(scope="module")
def older_runtime(older_bundle):  # noqa: F811
    return _runtime(older_bundle)


@pytest.fixture(scope="module")
def at_cap_runtime(at_cap_bundle):  # noqa: F811
    return _runtime(at_cap_bundle)


# ------------------------------------------------------------------------------------- the default backend, generate


def test_the_default_backend_is_opened_with_the_model_s_positions(tiny_runtime, older_runtime, at_cap_runtime):
    assert tiny_runtime.backend.name == "ort-cpu"
    assert tiny_runtime.backend.model_positions == 512
    assert older_runtime.backend.model_positions is None
    assert at_cap_runtime.backend.model_positions == 256


@pytest.mark.parametrize(("which", "tail"), [
    ("tiny_runtime", f", or {REBUILD_512}"),
    ("at_cap_runtime", f": {AT_256}"),
    ("older_runtime", ", or rebuild the bundle with a larger --max-context"),
])
def test_generate_on_the_default_backend_names_what_the_model_allows(request, which, tail):
    from edgesdk.runtime.generate import SamplingConfig, generate

    runtime = request.getfixturevalue(which)
    with pytest.raises(EdgeSDKError) as refused:
        generate(runtime.backend, _ids(runtime, 300), SamplingConfig(max_new_tokens=2), stop_ids=set())
    assert refused.value.problem == "the prompt has 300 tokens; the bundle's max_context is 256"
    assert refused.value.fix == "shorten the prompt" + tail


def test_a_prompt_past_the_model_s_positions_is_told_no_rebuild_holds_it(tiny_runtime):
    from edgesdk.runtime.generate import SamplingConfig, generate

    with pytest.raises(EdgeSDKError) as refused:
        generate(tiny_runtime.backend, _ids(tiny_runtime, 600), SamplingConfig(max_new_tokens=2), stop_ids=set())
    assert refused.value.fix == ("shorten the prompt: the model's max_position_embeddings is 512, fewer than the 600 "
                                 "tokens, and no build of the model goes past it ('edgesdk build --max-context 512' "
                                 "gives the most)")


# ------------------------------------------------------------------------------ the ONNX Runtime backends' own check


@pytest.mark.parametrize(("which", "tail"), [
    ("tiny_runtime", f", or {REBUILD_512}"),
    ("at_cap_runtime", f": {AT_256}"),
    ("older_runtime", ", or rebuild the bundle with a larger --max-context"),
])
def test_an_ort_prefill_past_the_context_names_what_the_model_allows(request, which, tail):
    backend = request.getfixturevalue(which).backend
    backend.reset()
    try:
        backend.prefill(np.arange(3, 203, dtype=np.int64))  # 200 tokens
        with pytest.raises(RuntimeBackendError) as refused:
            backend.prefill(np.arange(3, 103, dtype=np.int64))
    finally:
        backend.reset()
    assert refused.value.problem == "sequence of 300 tokens exceeds the bundle's max_context 256"
    assert refused.value.fix == "shorten the prompt or --max-new-tokens" + tail


@pytest.mark.parametrize(("which", "tail"), [
    ("tiny_runtime", f", or {REBUILD_512}"),
    ("older_runtime", ", or rebuild the bundle with a larger --max-context"),
])
def test_ort_hidden_states_past_the_context_name_what_the_model_allows(request, which, tail):
    backend = request.getfixturevalue(which).backend
    assert backend.gives_hidden_states
    with pytest.raises(RuntimeBackendError) as refused:
        backend.hidden_states(np.arange(3, 303, dtype=np.int64))
    assert refused.value.problem == "sequence of 300 tokens exceeds the bundle's max_context 256"
    assert refused.value.fix == "embed at most 256 tokens (truncate the input)" + tail


# ------------------------------------------------------------------------------------------ the block-sparse decoder


@pytest.mark.parametrize(("positions", "tail"), [
    (512, f", or {REBUILD_512}"),
    (64, ": the model's max_position_embeddings is 64, this bundle's context: no build of the model goes past it"),
    (None, ", or rebuild the bundle with a larger --max-context"),
])
def test_the_sparse_decoder_s_refusal_names_what_the_model_allows(sparse_export, monkeypatch,  # noqa: F811
                                                                  positions, tail):
    """The triton backend refuses first; the decoder's own refusal is for a caller that steps it directly."""
    backend = _triton(sparse_export, monkeypatch, positions)
    assert backend.decoder.model_positions == positions
    with pytest.raises(RuntimeBackendError) as refused:
        backend.decoder.step(torch.arange(3, 68), 1)  # 65 tokens
    assert refused.value.problem == "a step of 65 tokens after 0 cached ones makes 65, past the bundle's max_context 64"
    assert refused.value.fix == "shorten the prompt or the generation, rewind or reset the cache" + tail
    backend.close()
    assert backend.model_positions == positions


# ------------------------------------------------------------------------------------------------ the served routes


@pytest.fixture
def served(tiny_runtime):
    server = Served(tiny_runtime, ServeDefaults(max_tokens=4))
    yield server
    server.close()


def _chat_tokens(runtime) -> int:
    tokenizer = runtime.tokenizer
    return len(tokenizer.chat_ids(tokenizer.render_chat([{"role": "user", "content": CHAT_TEXT}])))


def test_a_completion_past_the_context_names_the_largest_max_context(served, tiny_runtime):
    status, body = served.post("/v1/completions", {"prompt": _ids(tiny_runtime, 300), "max_tokens": 2})
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"] == ("This model's maximum context length is 256 tokens. However, your prompt "
                                        "resulted in 300 tokens: shorten the prompt to fewer tokens (POST /tokenize "
                                        "counts them), or " + REBUILD_512)


def test_a_chat_past_the_context_names_the_largest_max_context(served, tiny_runtime):
    counted = _chat_tokens(tiny_runtime)
    assert 256 < counted <= 512, counted
    status, body = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": CHAT_TEXT}],
                                                        "max_tokens": 2})
    assert status == 400, body
    assert body["error"]["param"] == "messages"
    assert body["error"]["message"] == (f"This model's maximum context length is 256 tokens. However, your messages "
                                        f"resulted in {counted} tokens: shorten the messages to fewer tokens (POST "
                                        "/tokenize counts them), or " + REBUILD_512)


def test_an_anthropic_message_past_the_context_names_the_largest_max_context(served, tiny_runtime):
    counted = _chat_tokens(tiny_runtime)
    status, body = served.post("/v1/messages", {"model": "tiny-host", "max_tokens": 4,
                                                "messages": [{"role": "user", "content": CHAT_TEXT}]})
    assert status == 400, body
    assert body["error"]["message"] == (f"prompt is too long: {counted} tokens > 256 maximum; This model's maximum "
                                        f"context length is 256 tokens. However, your messages resulted in {counted} "
                                        "tokens: shorten the messages to fewer tokens (POST /tokenize counts them), or "
                                        + REBUILD_512)


def test_a_model_the_pool_has_not_loaded_refuses_as_the_loaded_one(tiny_bundle, tiny_runtime):
    """serve with several models refuses a prompt to one it has not loaded from its tokenizer and manifest, no
    backend opened (edgesdk.serve.model_pool.described): in the words of the model loaded."""
    from edgesdk.serve.api import ApiError, parse_text_request
    from edgesdk.serve.completion import Completer
    from edgesdk.serve.model_pool import described

    body = {"prompt": _ids(tiny_runtime, 300), "max_tokens": 2}
    refusals = []
    for completer in (described(tiny_bundle, ServeDefaults(max_tokens=2), None),
                      Completer(tiny_runtime, ServeDefaults(max_tokens=2))):
        with pytest.raises(ApiError) as refused:
            completer.prompt_ids(parse_text_request(body))
        refusals.append(refused.value.message)
    assert refusals[0] == refusals[1]
    assert refusals[0].endswith(f", or {REBUILD_512}"), refusals[0]


@pytest.mark.parametrize(("which", "tail"), [
    ("at_cap_runtime", f": {AT_256}"),
    ("older_runtime", ", or rebuild the bundle with a larger --max-context"),
])
def test_a_completion_past_the_context_of_another_bundle(request, which, tail):
    runtime = request.getfixturevalue(which)
    server = Served(runtime, ServeDefaults(max_tokens=4))
    try:
        status, body = server.post("/v1/completions", {"prompt": _ids(runtime, 300), "max_tokens": 2})
    finally:
        server.close()
    assert status == 400, body
    assert body["error"]["message"] == ("This model's maximum context length is 256 tokens. However, your prompt "
                                        "resulted in 300 tokens: shorten the prompt to fewer tokens (POST /tokenize "
                                        "counts them)" + tail)


# ------------------------------------------------------------------------------------------------ the Python API


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        yield loaded


def _read(call):
    """``call``'s answer, a stream read to its end."""
    answer = call()
    return answer if isinstance(answer, dict) else list(answer)


def _refusal(call) -> edgesdk.RequestError:
    """The refusal ``call`` raises, whole or as its stream is read."""
    with pytest.raises(edgesdk.RequestError, match="maximum context length is 256") as refused:
        _read(call)
    return refused.value


def test_the_python_api_names_the_largest_max_context_in_its_terms(model):
    ids = model.tokenize("The tide came in. " * 25, add_special=False)
    assert 256 < len(ids) <= 512, len(ids)
    rebuild = ("or build the bundle again with build_bundle(..., max_context=512), the most the model's "
               "max_position_embeddings (512) allows")
    for call, field in ((lambda: model(ids, max_tokens=2), "prompt"),
                        (lambda: model(ids, max_tokens=2, stream=True), "prompt"),
                        (lambda: model.create_chat_completion([{"role": "user", "content": CHAT_TEXT}]), "messages")):
        refused = _refusal(call)
        assert refused.fix == f"{PYTHON_SHORTEN.format(field)}, {rebuild}", refused.fix


def test_the_python_api_says_no_build_holds_a_prompt_past_the_model_s_positions(model):
    ids = model.tokenize("The tide came in. " * 60, add_special=False)
    assert len(ids) > 512, len(ids)
    refused = _refusal(lambda: model(ids, max_tokens=2))
    assert refused.fix == (f"{PYTHON_SHORTEN.format('prompt')}: the model's max_position_embeddings is 512, fewer than "
                           f"the {len(ids)} tokens, and no build of the model goes past it (build_bundle(..., "
                           "max_context=512) gives the most)")


@pytest.mark.parametrize(("which", "tail"), [
    ("at_cap_bundle", f": {AT_256}"),
    ("older_bundle", ", or build the bundle again with a larger context (build_bundle(..., max_context=N))"),
])
def test_the_python_api_on_another_bundle(request, which, tail):
    with edgesdk.load(request.getfixturevalue(which).path, threads=1) as loaded:
        ids = loaded.tokenize("The tide came in. " * 25, add_special=False)
        refused = _refusal(lambda: loaded(ids, max_tokens=2))
    assert refused.fix == PYTHON_SHORTEN.format("prompt") + tail
