"""Opening the ``triton`` backend (edgesdk/runtime/triton_backend.py): weights that fail to load are the backend's
reason not to open (a RuntimeBackendError the chain notes before it tries the next backend), as a session that
fails to open is for the ONNX Runtime backends, not an exception that ends the chain."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402


@pytest.fixture
def unreadable_bundle(tmp_path, monkeypatch):
    """A bundle record whose block-sparse weights file is not a safetensors file torch can read, opened on the
    kernels' PyTorch twins (the CPU path)."""
    weights = tmp_path / "sparse" / "weights.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)
    record = {"weights": "sparse/weights.safetensors"}
    return SimpleNamespace(manifest={"sparse": record}, file=lambda name: tmp_path / name, path=tmp_path)


def test_weights_that_do_not_load_are_the_backends_reason_not_to_open(unreadable_bundle):
    from edgesdk.runtime.triton_backend import open_triton_backend

    with pytest.raises(RuntimeBackendError, match=r"^the block-sparse weights did not load onto cpu \(") as caught:
        open_triton_backend(unreadable_bundle, threads=1)
    assert "--backend ort-cuda or ort-cpu" in caught.value.fix


def test_the_chain_notes_the_failed_load(unreadable_bundle):
    """The chain's refusal names every backend it tried with its reason; before, the load's own exception
    (safetensors' error) came out of the chain, which never reached the next backend."""
    from edgesdk.runtime.session import open_backend

    with pytest.raises(RuntimeBackendError, match=r"^no backend could run bundle ") as caught:
        open_backend(unreadable_bundle, ["triton"], threads=1)
    assert "triton: the block-sparse weights did not load onto cpu" in caught.value.problem
