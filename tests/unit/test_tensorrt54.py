"""TensorRT engine step and builder, review 54.

TensorRT is not installed here: the board side of deploy runs for real through a local transport, with a stand-in
``edgesdk engine check`` that prints what the real one prints. Real builds: tests/gpu/test_tensorrt.py.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from edgesdk.deploy import engine
from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import LocalTransport
from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import tensorrt_engine as te
from tests.unit.test_deploy_checks import ORIN
from tests.unit.test_trt48 import BuildingTensorRT, standard_bundle  # noqa: F401 - the fixture: a tiny fp32-standard bundle


def _answering(tmp_path, printed: str) -> tuple[Board, list[str]]:
    """A board whose ``edgesdk engine check`` prints ``printed`` and succeeds."""
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    return board, [sys.executable, "-c", f"print({printed!r})"]


def test_deploy_keys_the_engine_by_the_tensorrt_and_sm_the_boards_builder_uses(tmp_path):
    """The engine directory was named from the probe's system-Python TensorRT and the bundle's target SM (None for
    a bundle of the host profile: ``...-smunknown-...``), while the builder put an engine of its own TensorRT and
    GPU in it; the runtime, looking for the key of that TensorRT and GPU, missed it."""
    board, edgesdk = _answering(tmp_path, "10.7.0 sm72")
    status = engine.builder_status(board, edgesdk)
    assert (status.available, status.tensorrt, status.sm) == (True, "10.7.0", 72)
    facts = BoardFacts.from_probe(ORIN)  # the probe's system Python: TensorRT 10.3.0
    for target_sm in (None, 87):
        decision = engine.decide(facts, target_sm, "abc", board, status)
        assert decision.build
        assert decision.cache_dir.endswith("/engines/abc/jp6.2-trt10.7.0-sm72-orin-nx-16gb")
        assert "jp6.2-trt10.7.0-sm72-orin-nx-16gb" in decision.message


def test_an_engine_check_that_prints_no_sm_leaves_the_probes_key(tmp_path):
    board, edgesdk = _answering(tmp_path, "10.3.0")  # an older board edgesdk printed the version only
    status = engine.builder_status(board, edgesdk)
    assert (status.available, status.tensorrt, status.sm) == (True, None, None)
    decision = engine.decide(BoardFacts.from_probe(ORIN), 87, "abc", board, status)
    assert decision.cache_dir.endswith("/engines/abc/jp6.2-trt10.3.0-sm87-orin-nx-16gb")


class WeightOwningTensorRT(BuildingTensorRT):
    """The stand-in builder, with the parser owning the weights the network points into (as onnx-tensorrt's does):
    freeing the parser frees them, and the plan is built from whatever the network points at then."""

    def __init__(self):
        super().__init__()

        class OnnxParser(self.OnnxParser):
            def parse_from_file(self, path):
                self.network.weights = b"weights"
                return super().parse_from_file(path)

            def __del__(self):
                self.network.weights = b"freed memory"

        class Builder(self.Builder):
            def build_serialized_network(self, network, config):
                return b"engine of " + network.weights

        self.OnnxParser, self.Builder = OnnxParser, Builder


@pytest.fixture
def weight_owning_tensorrt(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(te.ENGINE_DIR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "tensorrt", WeightOwningTensorRT())
    monkeypatch.setattr(te, "require_sm", lambda *target: 87)
    monkeypatch.setattr(te, "board_jetpack", lambda: "6.2")
    monkeypatch.setattr(te, "board_module", lambda: "orin-nano-8gb")


def test_the_parser_that_owns_the_weights_lives_until_the_engine_is_built(standard_bundle, weight_owning_tensorrt,  # noqa: F811
                                                                          tmp_path):
    """The parser was a local of the parse step, freed (with the weights it owns) when that step returned and
    before build_serialized_network read them: TensorRT's developer guide says not to delete it before the
    builder has run."""
    built = te.build_engine(standard_bundle.path, out=tmp_path / "engine")
    assert (tmp_path / "engine" / te.ENGINE_FILE).read_bytes() == b"engine of weights"
    assert built["engine_bytes"] == len(b"engine of weights")


class ProfileRefusingTensorRT(BuildingTensorRT):
    """The stand-in builder, with TensorRT's answer to an invalid optimization profile: ``add_optimization_profile``
    returns -1, and the network then has dynamic inputs but no profile, so ``build_serialized_network`` gives None."""

    def __init__(self):
        super().__init__()

        class Builder(self.Builder):
            def create_builder_config(self):
                config = super().create_builder_config()
                config.add_optimization_profile = lambda profile: -1
                return config

            def build_serialized_network(self, network, config):
                return None

        self.Builder = Builder


def test_a_profile_tensorrt_refuses_is_named_not_taken_for_a_short_workspace(standard_bundle, tmp_path,  # noqa: F811
                                                                             monkeypatch):
    """The index add_optimization_profile returns was not looked at: a refused profile surfaced as "failed to build
    an engine" with the fix "try a larger --workspace-mb, or free GPU memory", which changes nothing."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(te.ENGINE_DIR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "tensorrt", ProfileRefusingTensorRT())
    monkeypatch.setattr(te, "require_sm", lambda *target: 87)
    monkeypatch.setattr(te, "board_jetpack", lambda: "6.2")
    monkeypatch.setattr(te, "board_module", lambda: "orin-nano-8gb")
    with pytest.raises(RuntimeBackendError) as info:
        te.build_engine(standard_bundle.path, out=tmp_path / "engine")
    assert "refused the optimization profile" in info.value.problem
    assert "input_ids 1x1/1x1/1x16" in info.value.problem  # the bundle's max_context is 16
    assert "workspace" not in info.value.fix
    assert not (tmp_path / "engine").exists()


class ClosingHostDevice:
    """The review-46 host "device" (bounds-checked host buffers), counting its closes."""

    def __init__(self):
        from tests.unit.test_gpu_runtime46 import HostDevice

        self.inner, self.closes = HostDevice(), 0
        self.handle, self.label = self.inner.handle, self.inner.label
        self.sizes = self.inner.sizes

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def close(self):
        self.closes += 1


def test_a_closed_tensorrt_backend_refuses_to_run_and_gives_back_its_engine(standard_bundle, monkeypatch,  # noqa: F811
                                                                            tmp_path):
    """close() only closed the device: the engine, its context and the KV buffers stayed held (with torch's buffers,
    the GPU memory of the weights and the cache until the last reference went), and a later prefill ran on; with
    cuda-python's buffers, freed by that close, the engine wrote into memory given back. The ONNX Runtime backends
    refuse a call after close() by name."""
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend
    from tests.unit.test_gpu_runtime46 import OrtTensorRT

    graph = standard_bundle.manifest["graph"]
    device = ClosingHostDevice()
    monkeypatch.setitem(sys.modules, "tensorrt", OrtTensorRT(standard_bundle.file(graph["file"]), graph, device, 4))
    (tmp_path / "engine.plan").write_bytes(b"plan")
    backend = TensorRTBackend(tmp_path / "engine.plan", graph, device=device)
    prompt = np.arange(3, 9, dtype=np.int64)
    assert backend.prefill(prompt).shape == (1, graph["vocab_size"])
    backend.close()
    backend.close()
    assert device.closes == 1
    assert (backend.engine, backend.context, backend.position) == (None, None, 0)
    for call, run in (("prefill", lambda: backend.prefill(prompt)), ("decode", lambda: backend.decode(5))):
        with pytest.raises(RuntimeBackendError) as info:
            run()
        assert info.value.problem.startswith(f"{call} on the closed tensorrt backend")
