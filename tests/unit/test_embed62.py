"""The pooling a GGUF file declares (edgesdk/models/pooling.py): a ``pooling_type`` that is no whole number."""

from __future__ import annotations

import pytest

from edgesdk.models.pooling import declared_pooling

gguf = pytest.importorskip("gguf")


def _gguf_declaring(path, add):
    """A GGUF file of architecture llama whose metadata ``add(writer)`` completes (no tensors)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    add(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("add", "shown"), [
    (lambda writer: writer.add_array("llama.pooling_type", [1, 2]), "[1, 2] (an array)"),
    (lambda writer: writer.add_bool("llama.pooling_type", True), "true (a bool)"),
    (lambda writer: writer.add_float32("llama.pooling_type", 3.0), "3.0 (a float)"),
    (lambda writer: writer.add_string("llama.pooling_type", "last"), '"last" (a string)'),
], ids=["array", "bool", "float", "string"])
def test_a_pooling_type_that_is_no_whole_number_is_named_not_followed(tmp_path, add, shown):
    """llama.cpp reads pooling_type as a uint32 and refuses a file holding another type. The old reader raised
    TypeError (unhashable list) for an array, a traceback ending the build, and took true as mean (1) and 3.0 as
    last (3)."""
    path = _gguf_declaring(tmp_path / "model.gguf", add)
    pooling, why = declared_pooling("gguf", path)
    assert pooling is None
    assert why == (f"its GGUF declares pooling_type {shown}, not the whole number llama.cpp reads (0 none, 1 mean, "
                   "2 cls, 3 last, 4 rank)")


def test_a_whole_number_pooling_type_is_still_read(tmp_path):
    path = _gguf_declaring(tmp_path / "model.gguf", lambda writer: writer.add_uint32("llama.pooling_type", 3))
    assert declared_pooling("gguf", path) == ("last", None)
