"""The standard-form ONNX Runtime backend (edgesdk/runtime/ort_backend.py): hidden states in the passes an ort-trt
profile holds, the closed backend named by the call an embedding makes, and a session that started without a
provider asked for given back with its error."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.runtime.ort_backend import ClosedSession, OrtBackend  # noqa: E402

VOCAB = 320  # tiny_llama's
IDS = np.random.default_rng(57).integers(0, VOCAB, 20)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny standard-form model: (model path, graph facts)."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from tests._utils.tiny import tiny_llama

    out = tmp_path_factory.mktemp("standard")
    spec = export_model(tiny_llama(heads=4, kv_heads=2), out, ExportConfig(form="standard", max_context=64))
    return out / "model.onnx", spec.to_json()


class ProfileLimit:
    """The backend's real ONNX Runtime session, refusing a run of more input ids than ``max_seq`` as an ort-trt
    session refuses a shape outside its optimization profile; everything else goes to the session."""

    def __init__(self, session, max_seq: int):
        self._session, self._max_seq = session, max_seq
        self.passes: list[int] = []

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def run(self, output_names, feeds, *args):
        length = feeds["input_ids"].shape[1]
        if length > self._max_seq:
            raise RuntimeError(f"input_ids of {length} tokens is outside the profile's 1..{self._max_seq}")
        self.passes.append(length)
        return self._session.run(output_names, feeds, *args)


def test_hidden_states_run_in_passes_of_max_prefill_and_equal_one_pass(exported):
    """ort-trt sets max_prefill to its profile's largest input: prefill ran a longer prompt in passes of that many,
    but hidden_states fed every id in one run, a TensorRT shape error for an input longer than the profile. They
    now run in passes, each on the keys and values of the ones before, and equal the one-pass hidden states; the
    conversation in the KV cache is left as it was."""
    backend = OrtBackend(*exported, threads=1)
    whole = backend.hidden_states(IDS)  # (20, D) in one pass
    backend.prefill(IDS[:3])
    backend.session = ProfileLimit(backend.session, max_seq=6)
    backend.max_prefill = 6
    chunked = backend.hidden_states(IDS)
    assert backend.session.passes == [6, 6, 6, 2]
    assert chunked.shape == whole.shape
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    assert backend.position == 3
    fresh = OrtBackend(*exported, threads=1)
    fresh.prefill(IDS[:3])
    np.testing.assert_allclose(backend.decode(int(IDS[3])), fresh.decode(int(IDS[3])), atol=1e-5)


def test_embedding_on_a_closed_backend_names_hidden_states_and_reopening(exported):
    """embed_tokens asks gives_hidden_states first: on a closed backend its error read "session.get_outputs on the
    closed ort-cpu backend", a call the user never made."""
    from edgesdk.runtime.embedding import embed_tokens

    backend = OrtBackend(*exported, threads=1)
    backend.close()
    with pytest.raises(RuntimeBackendError, match=r"^hidden_states on the closed ort-cpu backend") as caught:
        embed_tokens(backend, [5, 17, 99])
    assert "session.get_outputs" not in str(caught.value)
    assert "open the bundle again" in caught.value.fix


@pytest.mark.filterwarnings("ignore:Specified provider")  # onnxruntime's word that it lacks the provider
def test_a_session_without_a_requested_provider_is_given_back_with_the_error(exported):
    """ONNX Runtime opens the session on the CPU where a GPU provider asked for cannot start; the backend refused it
    but kept the session (the model's weights) on itself, alive for as long as the error's traceback is kept (a REPL's
    last traceback, an error chained by the opener)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: it may start")
    with pytest.raises(RuntimeBackendError, match="could not start CUDAExecutionProvider") as caught:
        OrtBackend(*exported, threads=1, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    frames = []
    tb = caught.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    backends = [frame.f_locals["self"] for frame in frames
                if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), OrtBackend)]
    assert backends
    assert all(isinstance(backend.session, ClosedSession) for backend in backends)
