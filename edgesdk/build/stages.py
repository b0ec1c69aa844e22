"""Imports every module that registers a build stage, so that recipes can name them."""

from edgesdk.compress import distill, prune, qat, sparsify  # noqa: F401
from edgesdk.power import stage  # noqa: F401
