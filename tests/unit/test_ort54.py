"""ONNX Runtime backends and huge pages (edgesdk/runtime/ort_backend.py, huge_pages.py): the fix an embedding's
length refusal names, and glibc's reading of a ``glibc.malloc.hugetlb`` number past 2**64 - 1."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.huge_pages import UINT64_MAX, _tunable_number, commands_use_huge_pages

OVERFLOW = str(2**64 + 1)  # one digit past what _dl_strtoul can hold


@pytest.mark.parametrize(("text", "version", "expected"), [
    ("-" + OVERFLOW, (2, 35), UINT64_MAX),  # glibc returns 2**64 - 1 at the overflow, not negated
    (OVERFLOW, (2, 35), UINT64_MAX),
    (OVERFLOW, (2, 39), None),  # the overflowing digit is left unread: tunable_parse_num ignores the value
    ("-1", (2, 35), UINT64_MAX),  # an ordinary negative number still wraps
    ("0x10", (2, 39), 16),
])
def test_a_number_past_2_64_reads_as_glibc_reads_it(text, version, expected):
    assert _tunable_number(text, version) == expected


def test_a_negative_overflowing_hugetlb_is_not_counted_as_thp_madvise(tmp_path):
    """It was read as -(2**64 - 1) wrapped, 1: huge pages reported on where glibc took no page size."""
    environ = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=-" + OVERFLOW}
    assert not commands_use_huge_pages(environ, "madvise", ("glibc", "2.35"), root=tmp_path)


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from tests._utils.tiny import on_sparse_grid, tiny_llama

    model = on_sparse_grid(tiny_llama(hidden=64, heads=4, kv_heads=2))
    opened = {}
    for form, backend_class in (("standard", OrtBackend), ("ort-fused", OrtFusedBackend)):
        out = tmp_path_factory.mktemp(form)
        spec = export_model(model, out, ExportConfig(form=form, weights="fp32", max_context=16))
        opened[form] = backend_class(out / "model.onnx", spec.to_json(), threads=1)
    return opened


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_hidden_states_past_max_context_name_no_generation_option(backends, form):
    """An embedding generates nothing: its refusal named "--max-new-tokens" as the fix."""
    backend = backends[form]
    with pytest.raises(RuntimeBackendError) as caught:
        backend.hidden_states(np.arange(17))
    assert "17 tokens" in str(caught.value)
    assert "max_context 16" in str(caught.value)
    assert "max-new-tokens" not in caught.value.fix
    assert "at most 16 tokens" in caught.value.fix
    assert backend.hidden_states(np.arange(16)).shape == (16, 64)
