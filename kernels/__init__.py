"""GPU decode kernels (Triton) with PyTorch reference twins. None ship yet: the ORT backends run bundles."""
