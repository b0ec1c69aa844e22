"""TensorRT's log goes to stderr, review 58: the default ``trt.Logger`` writes to stdout (NVIDIA/TensorRT#4306, its
docs say stderr), where ``edgesdk run`` writes the answer and the deploy smoke test reads the text generated, so a
TensorRT warning ended up in the answer. TensorRT cannot run on this host; ``tensorrt_engine.stderr_logger`` is run
against the tests' stand-in module (tests/_utils/tensorrt_standin.py: ``ILogger`` and its ``Severity`` as TensorRT 10
names them), and the builder and the backend are run against the stand-ins of test_trt48 (TensorRT 10's build API)
and test_gpu_runtime46 (its execution API, the bundle's real graph run with ONNX Runtime), recording the logger
``trt.Builder``, ``trt.OnnxParser`` and ``trt.Runtime`` are given."""

from __future__ import annotations

import sys

from edgesdk.runtime import tensorrt_engine
from tests._utils.tensorrt_standin import TensorRTModule
from tests.unit.test_gpu_runtime46 import HostDevice, OrtTensorRT
from tests.unit.test_trt48 import standard_bundle, tensorrt  # noqa: F401 - fixtures: a tiny fp32-standard bundle, the stand-in


def test_warnings_and_errors_go_to_stderr_and_nothing_to_stdout(capsys):
    trt = TensorRTModule()
    logger = tensorrt_engine.stderr_logger(trt)
    assert isinstance(logger, trt.ILogger)
    for severity in trt.ILogger.Severity:
        logger.log(severity, f"message {severity.name}")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["[TRT] [F] message INTERNAL_ERROR", "[TRT] [E] message ERROR",
                                "[TRT] [W] message WARNING"]


def test_one_logger_per_tensorrt_module():
    trt = TensorRTModule()
    assert tensorrt_engine.stderr_logger(trt) is tensorrt_engine.stderr_logger(trt)


def _recording(cls, seen: dict, name: str):
    """``cls`` (a stand-in's Builder, OnnxParser or Runtime) noting in ``seen`` the logger it is given."""
    class Recording(cls):
        def __init__(self, *args):
            seen[name] = args[-1]  # the logger is the last argument of each
            super().__init__(*args)

    return Recording


def _assert_the_stderr_logger(logger, trt, capsys) -> None:
    assert isinstance(logger, trt.ILogger)  # not trt.Logger, which writes to stdout
    assert logger is tensorrt_engine.stderr_logger(trt)
    capsys.readouterr()
    logger.log(trt.ILogger.Severity.WARNING, "a warning")
    assert capsys.readouterr() == ("", "[TRT] [W] a warning\n")


def test_the_builder_gives_the_stderr_logger_to_trt_builder_and_onnx_parser(standard_bundle, tensorrt,  # noqa: F811
                                                                             tmp_path, capsys):
    seen = {}
    tensorrt.Builder = _recording(tensorrt.Builder, seen, "Builder")
    tensorrt.OnnxParser = _recording(tensorrt.OnnxParser, seen, "OnnxParser")
    tensorrt_engine.build_engine(standard_bundle.path, out=tmp_path / "engine")
    assert tensorrt.builds == 1
    assert set(seen) == {"Builder", "OnnxParser"}
    for logger in seen.values():
        _assert_the_stderr_logger(logger, tensorrt, capsys)


def test_the_backend_gives_the_stderr_logger_to_trt_runtime(standard_bundle, monkeypatch, tmp_path,  # noqa: F811
                                                            capsys):
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend

    graph = standard_bundle.manifest["graph"]
    device = HostDevice()
    trt = OrtTensorRT(standard_bundle.file(graph["file"]), graph, device, max_seq=4)
    seen = {}
    trt.Runtime = _recording(trt.Runtime, seen, "Runtime")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"plan")
    backend = TensorRTBackend(plan, graph, device=device)
    assert backend.max_seq == 4
    assert set(seen) == {"Runtime"}
    _assert_the_stderr_logger(seen["Runtime"], trt, capsys)
