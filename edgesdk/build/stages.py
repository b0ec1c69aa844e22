"""Imports every module that registers a build stage, so that recipes can name them."""

from edgesdk.compress import distill, prune, qat, smooth, sparsify  # noqa: F401
from edgesdk.power import stage  # noqa: F401
