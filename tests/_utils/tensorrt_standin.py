"""What every stand-in for the ``tensorrt`` module (not installed here) shares: the version, the logger, the I/O modes
and ``nptype``, as TensorRT 10's Python API names them. Each stand-in adds its own ``Runtime`` and engine."""

from __future__ import annotations

import enum

import numpy as np


class TensorRTModule:
    __version__ = "10.3.0"

    class ILogger:  # the base class of a logger of one's own (edgesdk's writes to stderr)
        class Severity(enum.IntEnum):
            INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

        def __init__(self):
            pass

    class Logger:
        WARNING = 2

        def __init__(self, severity):
            self.severity = severity

    class TensorIOMode:
        INPUT, OUTPUT = "input", "output"

    @staticmethod
    def nptype(dtype):
        return np.dtype(dtype).type
