"""Test doubles around real decoder backends."""

from __future__ import annotations


class NoRewind:
    """A real backend without ``rewind`` (as TensorRT's was before it repacked its past tensors): it decodes token by
    token (the rest delegates)."""

    def __init__(self, inner):
        self.inner, self.name, self.max_context = inner, inner.name, inner.max_context

    def __getattr__(self, name):
        if name == "rewind":
            raise AttributeError(name)
        return getattr(self.inner, name)
