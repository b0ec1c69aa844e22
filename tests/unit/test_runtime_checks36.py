"""Checks the runtime makes before it runs: ``keep_logits`` of a prefill below 1 or not a whole number is refused by
name on the Triton backend too (run here on the kernels' PyTorch twins), as on the ONNX Runtime ones, and a valid one
gives the last rows; ``--target`` with ``--ignore-target`` says the target is not checked."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.backend import checked_keep_logits


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path_factory.mktemp("sparse"), max_context=64)
    return TritonBackend(SparseDecoder(tensors, record, mode="reference"), "reference")


@pytest.mark.parametrize("keep", [0, -1, 1.5, True, "2"])
def test_the_triton_backend_refuses_a_keep_logits_that_is_no_count(twin, keep):
    twin.reset()
    with pytest.raises(RuntimeBackendError, match=f"keep_logits={keep!r}: expected a whole number of at least 1"):
        twin.prefill(np.array([1, 2, 3]), keep_logits=keep)


def test_the_triton_backend_keeps_the_last_rows(twin):
    twin.reset()
    every = twin.prefill(np.array([1, 2, 3, 4]), keep_logits=4)
    twin.reset()
    last_two = twin.prefill(np.array([1, 2, 3, 4]), keep_logits=np.int64(2))
    assert every.shape[0] == 4
    np.testing.assert_allclose(last_two, every[2:], atol=1e-5)


def test_the_check_returns_an_int():
    assert checked_keep_logits(np.int32(3)) == 3
    assert type(checked_keep_logits(np.int32(3))) is int


def test_target_with_ignore_target_says_the_target_is_not_checked(tiny_bundle):
    """``--target T --ignore-target``: the skip wins (a bundle for another board runs), and the note says that T was
    not checked, where it said nothing of it."""
    from tests.unit.test_cli import assert_ok, invoke

    both = invoke("run", tiny_bundle.path, "--prompt", "hello", "--target", "rpi5", "--ignore-target", "-n", 1,
                  "--stats")
    assert_ok(both)
    assert "target check skipped (--ignore-target, so --target rpi5 is not checked)" in both.stderr
