"""Qwen3 beyond test_qwen3.py's shapes: config options the export must refuse, GGUF head sizes read as
llama.cpp reads them, and llama.cpp on a Qwen3 whose head size is width / heads (no key_length written)."""

from __future__ import annotations

import pytest

from edgesdk.errors import ExportError

torch = pytest.importorskip("torch")


def _qwen3_config(**kw):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, **kw)


def test_a_qwen3_sliding_window_shorter_than_the_context_is_refused():
    """Qwen3Attention attends over ``sliding_window`` tokens on its sliding layers when use_sliding_window is
    set; the exported graph attends over the whole context, so such a model is refused before any stage."""
    from edgesdk.export.onnx_export import ExportConfig, check_exportable, sliding_window

    sliding = _qwen3_config(use_sliding_window=True, sliding_window=8, max_window_layers=0)
    with pytest.raises(ExportError, match="sliding window of 8 tokens, shorter than the bundle's context of 64"):
        check_exportable(sliding, ExportConfig(max_context=64))
    assert sliding_window(_qwen3_config(use_sliding_window=False, sliding_window=8)) is None
    assert sliding_window(_qwen3_config(use_sliding_window=True, sliding_window=8, max_window_layers=2)) is None
    check_exportable(_qwen3_config(use_sliding_window=True, sliding_window=64, max_window_layers=0),
                     ExportConfig(max_context=64))
