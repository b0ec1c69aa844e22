"""ONNX export of decoder LMs with a KV cache, and validation against PyTorch (host only)."""
