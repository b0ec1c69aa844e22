"""TensorRT engine builder, review 58: the typing reason a QDQ build records, a ``max_seq`` the profile cannot take,
and the command the refusal of ``$EDGESDK_ENGINE_DIR`` gives. All pure Python: TensorRT is not needed (real builds:
tests/gpu/test_tensorrt.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import tensorrt_engine as te

GRAPH = {"max_context": 16, "head_dim": 8, "kv_heads": [2, 2], "vocab_size": 32}


def test_the_weak_typing_reason_names_the_float_type_of_the_graph_not_its_quantization():
    """A QDQ graph's dtype is "int8-qdq": the reason engine.json records read "the graph is int8-qdq outside its Q/DQ
    pairs", and a float32 graph without any pairs was said to be float32 "outside its Q/DQ pairs"."""
    qdq = te.plan_build("10.3.0", {"dtype": te.QDQ_DTYPE}, {"name": "orin-nano-8gb"})
    assert qdq.reasons[0].startswith("weakly typed: the graph is float32 outside its Q/DQ pairs;")
    assert "int8-qdq" not in qdq.reasons[0]
    plain = te.plan_build("10.3.0", {"dtype": "float32"}, {"name": "orin-nano-8gb"})
    assert plain.reasons[0].startswith("weakly typed: the graph is float32;")
    assert "Q/DQ" not in plain.reasons[0]


@pytest.mark.parametrize("max_seq", [0, -3, 2.5, "8", True])
def test_a_max_seq_that_is_no_whole_number_of_at_least_1_is_refused_by_name(max_seq):
    """0 was taken as the default (min(512, max_context)), -3 as 1 (a prefill run token by token) and 2.5 as 2,
    each without a word; --max-seq's own range is 1 or more."""
    with pytest.raises(RuntimeBackendError) as info:
        te.profile_shapes(GRAPH, max_seq)
    assert info.value.problem.startswith(f"max_seq={max_seq!r}: expected a whole number of at least 1")
    assert "1 to 16" in info.value.fix


def test_a_max_seq_of_numpy_s_integer_type_is_taken():
    assert te.profile_shapes(GRAPH, np.int64(4)).max_seq == 4
    assert te.profile_shapes(GRAPH, None).max_seq == 16


def test_the_engine_dir_refusal_gives_the_whole_build_command_in_its_quotes(tmp_path, monkeypatch):
    """The fix read "build one with 'edgesdk engine build B' --out D --force": the quoted command, copied, lost --out
    and --force, and built into the default directory, which $EDGESDK_ENGINE_DIR still overrode."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    explicit = tmp_path / "mine"
    explicit.mkdir()
    (explicit / te.ENGINE_FILE).write_bytes(b"plan")
    (explicit / te.INFO_FILE).write_text(json.dumps({"bundle_id": "other", "tensorrt": "10.3.0", "sm": 87}))
    bundle = tmp_path / "bundle"
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(explicit))
    with pytest.raises(RuntimeBackendError) as info:
        te.find_engine(bundle, "mine", "10.3.0", 87, "6.2", module="orin-nano-8gb")
    assert "built for bundle other, not mine" in info.value.problem
    assert f"'edgesdk engine build {bundle} --out {explicit} --force'" in info.value.fix
    assert f"unset ${te.ENGINE_DIR_ENV}" in info.value.fix
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(tmp_path / "empty"))
    with pytest.raises(RuntimeBackendError) as info:
        te.find_engine(bundle, "mine", "10.3.0", 87, "6.2", module="orin-nano-8gb")
    assert f"'edgesdk engine build {bundle} --out {tmp_path / 'empty'}'" in info.value.fix
