"""edgesdk: compress small language models on a host and run them on Jetson and Raspberry Pi boards.

From Python: ``edgesdk.load(bundle)`` opens a bundle and answers OpenAI-shaped requests
(:class:`edgesdk.api.Model`); ``edgesdk.build_bundle(target)`` builds one on a host
(:func:`edgesdk.api.build_bundle`; ``edgesdk.build`` is the build pipeline's package).

Importing this package stays lean: it pulls in neither torch nor transformers nor onnxruntime.
The host-side pieces (model loading, build stages, ONNX export) import their heavy dependencies
inside the functions that need them; the board runtime needs only the base install.
"""

__version__ = "0.1.0"

from edgesdk.errors import EdgeSDKError

__all__ = ["EdgeSDKError", "LoadedPromptCache", "Model", "RequestError", "__version__", "build_bundle", "load"]

# edgesdk.api's public names, imported on first use so that ``import edgesdk`` stays lean
_API = ("LoadedPromptCache", "Model", "RequestError", "build_bundle", "load")


def __getattr__(name: str):
    """``edgesdk.load`` and the other names of :mod:`edgesdk.api`, imported when first asked for (PEP 562)."""
    if name in _API:
        from edgesdk import api

        return getattr(api, name)
    raise AttributeError(f"module 'edgesdk' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with :mod:`edgesdk.api`'s lazy ones, so ``dir(edgesdk)`` and a REPL's tab completion
    (``edgesdk.lo<Tab>``) offer ``load`` before it is first used (PEP 562)."""
    return sorted(set(globals()) | set(_API))
