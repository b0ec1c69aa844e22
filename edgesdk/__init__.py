"""edgesdk: compress small language models on a host and run them on Jetson and Raspberry Pi boards.

From Python: ``edgesdk.load(bundle)`` opens a bundle and answers OpenAI-shaped requests
(:class:`edgesdk.api.Model`); ``edgesdk.build_bundle(target)`` builds one on a host
(:func:`edgesdk.api.build_bundle`; ``edgesdk.build`` is the build pipeline's package);
``edgesdk.export_gguf(bundle, out)`` writes a bundle as a GGUF file for llama.cpp (``edgesdk export``).

Importing this package stays lean: it pulls in neither torch nor transformers nor onnxruntime.
The host-side pieces (model loading, build stages, ONNX export) import their heavy dependencies
inside the functions that need them; the board runtime needs only the base install.
"""

__version__ = "0.1.0"

from edgesdk.errors import EdgeSDKError

__all__ = ["EdgeSDKError", "LoadedPromptCache", "Model", "RequestError", "__version__", "build_bundle", "export_gguf",
           "load"]

# edgesdk.api's public names, imported on first use so that ``import edgesdk`` stays lean
_API = ("LoadedPromptCache", "Model", "RequestError", "build_bundle", "load")


def export_gguf(bundle, out, *, verify: bool = True):
    """Write the bundle directory ``bundle`` as a GGUF file for llama.cpp and the tools built on it, as
    ``edgesdk export BUNDLE OUT`` does: ``out`` is a ``.gguf`` file or a directory (the file is then named after the
    bundle). The weights are the bundle's own, re-encoded without rounding again (INT4 blocks as Q4_0, INT8 as Q8_0,
    float as F32); ``verify`` reads the file back and compares every tensor with the bundle's before it is renamed into
    place. Returns the report (``path``, ``size_bytes``, ``architecture``, ``file_type``, ``tensor_types``,
    ``verified_tensors``, ``notes`` / ``file_notes``: what llama.cpp does differently, also warned as
    :class:`edgesdk.export.gguf_export.GGUFExportNote`). Raises :class:`EdgeSDKError` (an ExportError) naming what
    the file cannot hold. Needs the host extra (``pip install 'edgesdk[host]'``: gguf, onnx).

    A function here rather than in :mod:`edgesdk.api` so that it is imported only when called: the exporter reads
    the bundle's graph with onnx, which the board runtime does not install."""
    from pathlib import Path

    from edgesdk.export.gguf_export import GGUFExportConfig
    from edgesdk.export.gguf_export import export_gguf as write

    return write(Path(bundle), Path(out), GGUFExportConfig(verify=verify))


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
