"""Review of the export settings (export/onnx_export.py ExportConfig) and of the validation settings
(export/validate.py ValidationConfig): values the export or the check would fail on only after the stages ran."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edgesdk.errors import ExportError
from edgesdk.export.onnx_export import ExportConfig
from edgesdk.export.validate import ValidationConfig


@pytest.mark.parametrize("seed", [-1, 1.5, "0", None, True])
def test_a_validation_seed_numpy_cannot_take_is_refused_by_name(seed):
    """A negative or fractional seed was taken and failed in numpy's words ("expected non-negative integer") at the
    validation, after every stage had run; None drew other random prompts on every build."""
    with pytest.raises(ExportError, match=rf"ValidationConfig seed is {seed!r}; expected an integer of at least 0"):
        ValidationConfig(seed=seed)


def test_a_numpy_integer_seed_is_taken_as_the_python_integer():
    config = ValidationConfig(seed=np.int64(7))
    assert config.seed == 7
    assert type(config.seed) is int


@pytest.mark.parametrize("layout", ["Transposed", "k-major", ""])
def test_an_unknown_sparse_layout_is_refused_by_its_setting(layout):
    """export.sparse_layout was checked only against sparse=false: an unknown one was taken and failed in the block
    compression's ValueError (not an ExportError naming the setting) after the stages had run."""
    with pytest.raises(ExportError, match=rf"export sparse_layout '{layout}' is unknown; choose one of plain, "
                                          "transposed") as refused:
        ExportConfig(form="standard", weights="int8", sparse=True, sparse_layout=layout)
    assert "export.sparse_layout" in refused.value.fix


def test_the_sparse_layouts_taken_are_those_the_block_compression_writes_without_torch():
    """The export settings kept their own copy of the block compression's layouts (its module imports torch), and
    the check that the two agreed was skipped on an install without torch: both read one torch-free tuple now."""
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from edgesdk.export.onnx_export import SPARSE_LAYOUTS, ExportConfig\n"
        "from edgesdk.kernels.layouts import LAYOUTS\n"
        "assert SPARSE_LAYOUTS is LAYOUTS == ('plain', 'transposed')\n"
        "for layout in LAYOUTS:\n"
        "    assert ExportConfig(form='standard', weights='int8', sparse=True, sparse_layout=layout).sparse_layout "
        "== layout\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
