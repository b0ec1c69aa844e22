"""The block-sparse decoder (edgesdk/runtime/sparse_decoder.py) against the bundle's sparse record: weights that do
not fit the record are refused when the decoder is built, naming the tensor and the numbers, not at the first
step in torch's words."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.runtime.sparse_decoder import SparseDecoder  # noqa: E402


@pytest.fixture(scope="module")
def tiny_sparse(tmp_path_factory):
    """A tiny Llama (D 64, 4 heads over 2 KV heads of 16, FFN 112) exported block-sparse: (tensors, record)."""
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path_factory.mktemp("sparse55"), max_context=32)
    return tensors, record


def test_the_record_as_exported_opens_and_runs(tiny_sparse):
    tensors, record = tiny_sparse
    decoder = SparseDecoder(tensors, record, mode="reference")
    assert decoder.step(torch.as_tensor([5, 9, 11]), keep=1).shape == (1, 320)


def test_heads_that_do_not_fit_the_weights_are_refused_at_load_naming_the_layer(tiny_sparse):
    """6 query heads over 1 KV head make the same 128 fused Q|K|V rows as 4 over 2, so the decoder opened, and the
    first step failed in the O projection as "x must be (M, K=64), got (3, 96)", naming no layer or record."""
    tensors, record = tiny_sparse
    wrong = copy.deepcopy(record)
    wrong["layers"][1].update(heads=6, kv_heads=1)
    with pytest.raises(RuntimeBackendError, match=r"layers\.1\.o is 64x64, expected 64x96 \(heads=6, kv_heads=1, "
                                                  r"head_dim=16") as caught:
        SparseDecoder(tensors, wrong, mode="reference")
    assert "layers.1.qkv" not in str(caught.value)  # 128 rows either way
    assert "edgesdk verify" in caught.value.fix


def test_an_ffn_width_that_does_not_fit_is_refused(tiny_sparse):
    tensors, record = tiny_sparse
    wrong = copy.deepcopy(record)
    wrong["layers"][0]["ffn"] = 128
    with pytest.raises(RuntimeBackendError, match=r"layers\.0\.gate_up is 224x64, expected 256x64.*"
                                                  r"layers\.0\.down is 64x112, expected 64x128"):
        SparseDecoder(tensors, wrong, mode="reference")


def test_a_head_dim_that_does_not_fit_the_rotary_table_is_refused(tiny_sparse):
    """heads 2 / kv 1 of 32 give the same linears as 4 / 2 of 16; the rotary table (8 frequencies) tells them
    apart, where the first step failed broadcasting (T, 16) against (2, T, 32)."""
    tensors, record = tiny_sparse
    wrong = copy.deepcopy(record)
    wrong["head_dim"] = 32
    for layer in wrong["layers"]:
        layer.update(heads=2, kv_heads=1)
    with pytest.raises(RuntimeBackendError, match=r"rotary table inv_freq has 8 inverse frequencies, expected "
                                                  r"head_dim / 2 = 16"):
        SparseDecoder(tensors, wrong, mode="reference")


def test_weights_in_other_blocks_than_the_record_says_are_refused(tiny_sparse):
    """The bundle's compiled kernels are built and checked for the record's block and layout; weights in other
    tiles opened and found no kernel variant at their first token."""
    tensors, record = tiny_sparse
    wrong = dict(record, block=16)
    with pytest.raises(RuntimeBackendError, match=r"layers\.0\.qkv is in 32x32 plain blocks, but the record says "
                                                  r"16x16 plain"):
        SparseDecoder(tensors, wrong, mode="reference")
    with pytest.raises(RuntimeBackendError, match=r"32x32 plain blocks, but the record says 32x32 transposed"):
        SparseDecoder(tensors, dict(record, layout="transposed"), mode="reference")


def test_kv_heads_that_do_not_divide_the_heads_are_refused(tiny_sparse):
    """4 query heads over 3 KV heads: the decode kernel refused it at the first token ("Hq=4 must be a multiple of
    Hkv=3"), naming no layer."""
    tensors, record = tiny_sparse
    wrong = copy.deepcopy(record)
    wrong["layers"][0]["kv_heads"] = 3
    with pytest.raises(RuntimeBackendError, match=r"layer 0: heads=4 is not a multiple of kv_heads=3"):
        SparseDecoder(tensors, wrong, mode="reference")


def test_a_qkv_bias_that_does_not_fit_the_rows_is_refused(tiny_sparse):
    tensors, record = tiny_sparse
    biased = dict(tensors, **{"layers.0.qkv_bias": torch.zeros(96)})
    with pytest.raises(RuntimeBackendError, match=r"layers\.0\.qkv_bias has shape \(96,\), expected \(128,\)"):
        SparseDecoder(biased, record, mode="reference")
    fitting = dict(tensors, **{"layers.0.qkv_bias": torch.zeros(128)})
    SparseDecoder(fitting, record, mode="reference")
