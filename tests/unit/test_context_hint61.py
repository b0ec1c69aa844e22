"""Every refusal of more tokens than a bundle's context names what the model allows: the prompt check before a
generation, the tensorrt and triton backends' sequence check, an accuracy task past the context and a
fill-in-the-middle prompt past it said "rebuild with a larger --max-context" alone, also for a bundle already at its
model's max_position_embeddings, which no rebuild gets past. Now each names the --max-context to rebuild with (the
most the model's positions allow, which the manifest records), or says that the bundle is at them and the shorter
request is the fix; a bundle whose manifest does not record them is told to rebuild with a larger --max-context. ``run -c``'s hint
(edgesdk/cli_llama.py) words the same phrases from the same place (edgesdk/bundle.py)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from edgesdk.bundle import context_fix, model_positions  # noqa: E402
from edgesdk.errors import EdgeSDKError, RuntimeBackendError  # noqa: E402
from tests.unit.test_gpu_runtime46 import HostDevice, OrtTensorRT, standard_bundle  # noqa: E402, F401 - fixture
from tests.unit.test_loose_ends61 import _with_positions  # noqa: E402
from tests.unit.test_serve_infill40 import fim_served, qwen_bundle, qwen_runtime  # noqa: E402, F401 - fixtures

REBUILD_512 = ("rebuild the bundle with 'edgesdk build --max-context 512', the most the model's "
               "max_position_embeddings (512) allows")
AT_256 = "the model's max_position_embeddings is 256, this bundle's context: no build of the model goes past it"


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def at_cap_bundle(tiny_bundle, tmp_path_factory):
    """The tiny bundle (256 tokens) with a model of 256 positions: at its model's limit."""
    return _with_positions(tiny_bundle, tmp_path_factory.mktemp("at-cap") / "b", 256)


@pytest.fixture(scope="module")
def older_bundle(tiny_bundle, tmp_path_factory):
    """The tiny bundle without the model's positions, as one built before the manifest recorded them."""
    return _with_positions(tiny_bundle, tmp_path_factory.mktemp("older") / "b", None)


# ------------------------------------------------------------------------------------------------ the shared words


def test_the_manifest_s_positions_are_read_from_the_model_s_facts(tiny_bundle, at_cap_bundle, older_bundle):
    assert model_positions(tiny_bundle.manifest) == 512
    assert model_positions(at_cap_bundle.manifest) == 256
    assert model_positions(older_bundle.manifest) is None
    assert model_positions({"model": {"before": {}, "after": {"max_position_embeddings": 300}}}) == 300


def test_the_fix_names_the_rebuild_or_says_none_gets_past_the_model():
    assert context_fix("shorten the prompt", 256, 512, 300) == f"shorten the prompt, or {REBUILD_512}"
    assert context_fix("shorten the prompt", 256, 512) == f"shorten the prompt, or {REBUILD_512}"
    assert context_fix("shorten the prompt", 256, 256, 300) == f"shorten the prompt: {AT_256}"
    past = context_fix("shorten the prompt", 256, 512, 600)
    assert past == ("shorten the prompt: the model's max_position_embeddings is 512, fewer than the 600 tokens, and no "
                    "build of the model goes past it ('edgesdk build --max-context 512' gives the most)")
    assert context_fix("shorten the prompt", 256, None, 300) == \
        "shorten the prompt, or rebuild the bundle with a larger --max-context"
    assert context_fix("shorten it", 256, None, 300, "the former words") == "the former words"


# ------------------------------------------------------------------------------------- the triton backend, generate


@pytest.fixture(scope="module")
def sparse_export(tmp_path_factory):
    """The block-sparse weights of a tiny Llama with a context of 64 (directory, record)."""
    from tests._utils.tiny import export_tiny_sparse

    out = tmp_path_factory.mktemp("sparse61")
    _, _, record = export_tiny_sparse(out, max_context=64)
    return out, record


def _triton(sparse_export, monkeypatch, positions):
    """The triton backend (the kernels' PyTorch twins) opened, as open_runtime opens it, from a bundle whose manifest
    records the model's ``positions`` (None: not recorded)."""
    from edgesdk.runtime.session import open_backend

    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)
    out, record = sparse_export
    facts = {"source": "tiny"} if positions is None else {"source": "tiny", "max_position_embeddings": positions}
    bundle = SimpleNamespace(manifest={"sparse": record, "model": {"before": facts, "after": dict(facts)}},
                             file=lambda name: out / name, path=out)
    return open_backend(bundle, ["triton"], threads=1)[0]


TRITON_CASES = [
    (512, ", or rebuild the bundle with 'edgesdk build --max-context 512', the most the model's "
          "max_position_embeddings (512) allows"),
    (64, ": the model's max_position_embeddings is 64, this bundle's context: no build of the model goes past it"),
    (None, ", or rebuild the bundle with a larger --max-context"),
]


@pytest.mark.parametrize(("positions", "tail"), TRITON_CASES)
def test_the_triton_backend_s_refusal_names_what_the_model_allows(sparse_export, monkeypatch, positions, tail):
    backend = _triton(sparse_export, monkeypatch, positions)
    assert backend.model_positions == positions
    with pytest.raises(RuntimeBackendError) as refused:
        backend.prefill(np.arange(3, 68, dtype=np.int64))  # 65 tokens
    assert refused.value.problem == "sequence of 65 tokens exceeds the bundle's max_context 64"
    assert refused.value.fix == "shorten the prompt or --max-new-tokens" + tail


@pytest.mark.parametrize(("positions", "tail"), [
    (512, ", or rebuild the bundle with 'edgesdk build --max-context 512', the most the model's "
          "max_position_embeddings (512) allows"),
    (64, ": the model's max_position_embeddings is 64, this bundle's context: no build of the model goes past it"),
    (None, ", or rebuild the bundle with a larger --max-context"),
])
def test_a_prompt_past_the_context_is_told_what_the_model_allows(sparse_export, monkeypatch, positions, tail):
    from edgesdk.runtime.generate import SamplingConfig, generate

    backend = _triton(sparse_export, monkeypatch, positions)
    with pytest.raises(EdgeSDKError) as refused:
        generate(backend, list(range(3, 73)), SamplingConfig(max_new_tokens=2), stop_ids=set())
    assert refused.value.problem == "the prompt has 70 tokens; the bundle's max_context is 64"
    assert refused.value.fix == "shorten the prompt" + tail


def test_a_prompt_past_the_model_s_positions_is_told_no_rebuild_holds_it(sparse_export, monkeypatch):
    from edgesdk.runtime.generate import SamplingConfig, generate

    backend = _triton(sparse_export, monkeypatch, 100)
    with pytest.raises(EdgeSDKError) as refused:
        generate(backend, [5] * 120, SamplingConfig(max_new_tokens=2), stop_ids=set())
    assert refused.value.fix == ("shorten the prompt: the model's max_position_embeddings is 100, fewer than the 120 "
                                 "tokens, and no build of the model goes past it ('edgesdk build --max-context 100' "
                                 "gives the most)")


# ------------------------------------------------------------------------------------------------ the tensorrt backend


def _tensorrt(bundle, monkeypatch, tmp_path):
    """The tensorrt backend opened, as open_runtime opens it, on ``bundle`` with the stand-in TensorRT of
    test_gpu_runtime46 (the bundle's ONNX graph run by ONNX Runtime, device buffers in host memory) and an engine
    found for it."""
    from edgesdk.runtime import tensorrt_backend
    from edgesdk.runtime import tensorrt_engine as te
    from edgesdk.runtime.session import open_backend

    graph = bundle.manifest["graph"]
    device = HostDevice()
    monkeypatch.setitem(sys.modules, "tensorrt", OrtTensorRT(bundle.file(graph["file"]), graph, device, 16))
    monkeypatch.setattr(te, "require_sm", lambda *target: 87)
    monkeypatch.setattr(te, "board_jetpack", lambda: "6.2")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / te.ENGINE_FILE).write_bytes(b"plan")
    monkeypatch.setattr(te, "find_engine", lambda *args, **kwargs: (tmp_path / "engine", {}))
    monkeypatch.setattr(tensorrt_backend, "open_device", lambda: device)
    return open_backend(bundle, ["tensorrt"], threads=1)[0]


def test_the_tensorrt_backend_s_refusal_names_what_the_model_allows(standard_bundle, monkeypatch,  # noqa: F811
                                                                    tmp_path):
    """The fp32-standard tiny bundle is 64 tokens of a 512-position model."""
    backend = _tensorrt(standard_bundle, monkeypatch, tmp_path)
    assert backend.model_positions == 512
    backend.prefill(np.arange(3, 63, dtype=np.int64))  # 60 tokens
    with pytest.raises(RuntimeBackendError) as refused:
        backend.prefill(np.arange(3, 8, dtype=np.int64))
    assert refused.value.problem == "sequence of 65 tokens exceeds the bundle's max_context 64"
    assert refused.value.fix == f"shorten the prompt or --max-new-tokens, or {REBUILD_512}"


def test_the_tensorrt_backend_says_a_larger_context_without_the_positions(standard_bundle, monkeypatch,  # noqa: F811
                                                                         tmp_path):
    older = _with_positions(standard_bundle, tmp_path / "older", None)
    backend = _tensorrt(older, monkeypatch, tmp_path)
    assert backend.model_positions is None
    backend.prefill(np.arange(3, 67, dtype=np.int64))  # 64 tokens: the context
    with pytest.raises(RuntimeBackendError) as refused:
        backend.decode(5)
    assert refused.value.fix == ("shorten the prompt or --max-new-tokens, or rebuild the bundle with a larger "
                                 "--max-context")


# ------------------------------------------------------------------------------------------------ an accuracy task


def _too_long_task(bundle, words: int) -> EdgeSDKError:
    from edgesdk.accuracy import HELLASWAG, ChoiceTask, TaskTooLong, bundle_accuracy
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(bundle.path, threads=1)
    tasks = [ChoiceTask("a cat sat " * words, (" on a mat", " by the door"), (1, 0), "line 1")]
    with pytest.raises(TaskTooLong) as refused:
        bundle_accuracy(runtime, HELLASWAG, tasks)
    return refused.value


def test_a_task_past_the_context_names_the_largest_max_context(tiny_bundle):
    refused = _too_long_task(tiny_bundle, 50)
    assert 256 < refused.longest <= 512, refused.longest
    assert refused.fix == f"remove that task from the file, or {REBUILD_512}"


def test_a_task_past_the_context_of_a_bundle_at_its_model_s_limit_says_no_rebuild_holds_it(at_cap_bundle):
    assert _too_long_task(at_cap_bundle, 50).fix == f"remove that task from the file: {AT_256}"


def test_a_task_past_the_context_of_an_older_bundle_keeps_the_former_words(older_bundle):
    assert _too_long_task(older_bundle, 50).fix == \
        "rebuild the bundle with a larger --max-context, or remove that task from the file"


def test_eval_s_refusal_of_a_task_past_the_context_names_the_largest_max_context(tiny_bundle, tmp_path):
    from click.testing import CliRunner

    from edgesdk.cli import main

    tasks = tmp_path / "hellaswag.txt"
    tasks.write_text("\n".join(["a cat sat " * 50, "1", " on a mat", " by the door", " in a box", " at home"]) + "\n")
    result = CliRunner().invoke(main, ["eval", str(tiny_bundle.path), "--hellaswag", "-f", str(tasks), "-t", "1"])
    said = _flat(result.output)
    assert result.exit_code != 0, said
    assert f"fix: remove that task from the file, or {REBUILD_512}" in said, said


# ------------------------------------------------------------------------------------- a fill-in-the-middle prompt


def test_a_suffix_past_the_context_names_the_largest_max_context(fim_served):  # noqa: F811
    """The qwen bundle is 256 tokens of a 512-position model."""
    status, body = fim_served.post("/v1/completions", {"prompt": "x", "suffix": "y = 2\n" * 60, "max_tokens": 2})
    assert status == 400, body
    assert body["error"]["code"] == "context_length_exceeded"
    message = body["error"]["message"]
    assert message.startswith("This model's maximum context length is 256 tokens. However, your fill-in-the-middle "
                              "prompt resulted in "), message
    assert "special tokens around them): shorten the suffix (or the prompt) to fewer tokens (POST /tokenize " \
           f"counts them), or {REBUILD_512}" in message, message


@pytest.mark.parametrize(("positions", "tail"), [
    (256, f": {AT_256}"),
    (None, ", or rebuild the bundle with a larger --max-context"),
])
def test_a_suffix_past_the_context_of_another_bundle(qwen_bundle, tmp_path, positions, tail):  # noqa: F811
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.api import ApiError, parse_text_request
    from edgesdk.serve.completion import Completer, ServeDefaults

    bundle = _with_positions(qwen_bundle, tmp_path / "b", positions)
    completer = Completer(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=2))
    with pytest.raises(ApiError) as refused:
        parse_text_request({"prompt": "x", "suffix": "y = 2\n" * 60, "max_tokens": 2}, completer=completer)
    assert refused.value.message.startswith("This model's maximum context length is 256 tokens. However, your "
                                            "fill-in-the-middle prompt resulted in "), refused.value.message
    assert refused.value.message.endswith("special tokens around them): shorten the suffix (or the prompt) to "
                                          "fewer tokens (POST /tokenize counts them)" + tail), refused.value.message


def test_the_python_api_s_suffix_past_the_context_names_the_largest_max_context(qwen_bundle):  # noqa: F811
    """load().create_completion(prompt, suffix): the refusal carried no facts, so the Python fix fell back to
    build_bundle(..., max_context=N)."""
    import edgesdk
    from edgesdk.api import RequestError

    with edgesdk.load(qwen_bundle.path, threads=1) as model, pytest.raises(RequestError) as refused:
        model.create_completion("x", "y = 2\n" * 60, max_tokens=2)
    assert refused.value.fix.endswith("build the bundle again with build_bundle(..., max_context=512), the most the "
                                      "model's max_position_embeddings (512) allows"), refused.value.fix
