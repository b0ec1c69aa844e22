"""TensorRT's log goes to stderr, review 58: the default ``trt.Logger`` writes to stdout (NVIDIA/TensorRT#4306, its
docs say stderr), where ``edgesdk run`` writes the answer and the deploy smoke test reads the text generated, so a
TensorRT warning ended up in the answer. TensorRT cannot run on this host; ``tensorrt_engine.stderr_logger`` is run
against the tests' stand-in module (tests/_utils/tensorrt_standin.py: ``ILogger`` and its ``Severity`` as TensorRT 10
names them), and the builder and the backend are checked to take it."""

from __future__ import annotations

import inspect

from edgesdk.runtime import tensorrt_backend, tensorrt_engine
from tests._utils.tensorrt_standin import TensorRTModule


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


def test_the_builder_and_the_backend_take_the_stderr_logger():
    for source in (inspect.getsource(tensorrt_engine.build_engine), inspect.getsource(tensorrt_backend)):
        assert "stderr_logger(trt)" in source
        assert "trt.Logger(" not in source
