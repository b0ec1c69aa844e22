"""export/sparse_export.py: the INT8 grid check that guards the block-sparse export."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ExportError
from edgesdk.export.sparse_export import int8_rows


def _on_grid(rows: int = 4, cols: int = 8) -> np.ndarray:
    codes = np.random.default_rng(0).integers(-127, 128, (rows, cols)).astype(np.float32)
    codes[:, 0] = 127  # each row's absmax sets its scale
    return codes * np.float32(0.01)


def test_int8_rows_accepts_weights_on_the_grid():
    codes, scales = int8_rows(_on_grid(), "w")
    assert codes.dtype == np.int8
    assert scales.dtype == np.float32


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_int8_rows_refuses_non_finite_weights(bad):
    """NaN compared with the tolerance is False, so the old ``error > tol`` check let a NaN weight through."""
    weight = _on_grid()
    weight[2, 3] = bad
    with pytest.raises(ExportError, match=r"weight layers.0.o holds 1 non-finite values.*\[2, 3\]"):
        int8_rows(weight, "layers.0.o")


def test_a_row_of_small_values_off_its_own_grid_is_refused():
    """The error was measured against the matrix's largest value, so a row of values small beside it could hold
    any floats and pass, quantized with up to half a step of error instead of sent back to QAT."""
    weight = _on_grid()
    weight[3] = np.random.default_rng(1).uniform(-0.02, 0.02, weight.shape[1]).astype(np.float32)  # off any grid
    with pytest.raises(ExportError, match="not on a per-row INT8 grid"):
        int8_rows(weight, "w")
    weight[3] = _on_grid()[3] * np.float32(0.01)  # the same row scaled onto its own (small) grid
    int8_rows(weight, "w")
