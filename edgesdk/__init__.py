"""edgesdk: compress small language models on a host and run them on Jetson and Raspberry Pi boards.

Importing this package stays lean: it pulls in neither torch nor transformers nor onnxruntime.
The host-side pieces (model loading, build stages, ONNX export) import their heavy dependencies
inside the functions that need them; the board runtime needs only the base install.
"""

__version__ = "0.1.0"

from edgesdk.errors import EdgeSDKError

__all__ = ["EdgeSDKError", "__version__"]
