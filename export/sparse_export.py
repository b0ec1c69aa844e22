"""Block-compressed INT8 weights for the GPU kernels (``edgesdk.kernels``, backend ``triton``).

Each decoder layer's linears are stored as four block-sparse INT8 matrices, rows fused the way the
kernels read them (one launch each): ``qkv`` (Q, K and V rows), ``o``, ``gate_up`` (gate then up
rows) and ``down``. Only blocks holding a non-zero weight are stored (BSR: values, block-column
index, row offsets) with a float32 scale per output row, so a 50 %-dense weight costs about half
the bytes to read. The embedding (also the tied LM head) is float16; norms float32.

A Gemma 3 model (export/decoder_weights.py ``_gemma3_weights``; transformers' Gemma3ForCausalLM) also stores
each layer's ``attn_out_norm`` and ``ffn_out_norm`` (its norms as the 1 + w they scale by, like its other
norms) and, past the first rotary table ``inv_freq``, the next ones as ``inv_freq.1``, ...; the record adds
``embed_scale``, ``attention_scale``, ``activation`` and ``other_rope_scalings``, and per layer its rotary table
``rope`` and its sliding ``window``. A Llama / Qwen record has none of these, so what it holds is unchanged.
SmolLM3's layers without rotary (NoPE) carry ``"rope": null``.

Files (all listed in the bundle manifest, so hashed and verified):
    sparse/weights.safetensors   the tensors above
    sparsity.json                per weight: shape, block, density and block mask (one 0/1 string
                                 per block row); overall density and bytes against dense INT8

Weights must already sit on the symmetric per-row INT8 grid (QAT bakes them there); the codes are
re-derived exactly as the QDQ exporter derives them, so both forms compute the same weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesdk.errors import ExportError
from edgesdk.export.decoder_weights import DecoderWeights, decoder_weights_from_hf

WEIGHTS_FILE = "sparse/weights.safetensors"
SPARSITY_FILE = "sparsity.json"
GRID_TOLERANCE = 1e-4  # relative: baked weights are codes * scale up to float32 rounding


@dataclass(frozen=True)
class SparseExportConfig:
    block: int = 32  # square block edge (the profile's sparsity_block)
    layout: str = "plain"  # intra-block order: plain (N-major) | transposed (K-major, the seed's)


def int8_rows(weight: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) float on a per-row symmetric INT8 grid -> codes int8 (N, K), scales float32 (N,).

    A weight holding NaN or inf is refused (ExportError), as is one off the grid; NaN never passes the
    tolerance check (``not error <= tol``)."""
    finite = np.isfinite(weight)
    if not finite.all():
        row, col = (int(i) for i in np.argwhere(~finite)[0])
        raise ExportError(
            f"weight {name} holds {int((~finite).sum())} non-finite values (first: {weight[row, col]} at "
            f"[{row}, {col}]); an INT8 export needs finite weights",
            "the training stages diverged: rerun the build with a lower learning rate or fewer steps, or check "
            "the source checkpoint for NaN/inf",
        )
    absmax = np.abs(weight).max(axis=1)
    scales = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
    codes = np.clip(np.round(weight / scales[:, None]), -127, 127)
    # per row, against the row's own largest value: against the matrix's, a row of small values could sit anywhere
    error = float((np.abs(codes * scales[:, None] - weight).max(axis=1) / np.maximum(absmax, 1e-30)).max())
    if not error <= GRID_TOLERANCE:
        raise ExportError(
            f"weight {name} is not on a per-row INT8 grid (relative error {error:.2e} after rounding)",
            "run the qat stage with weight_bits: 8 and granularity: channel before a sparse export",
        )
    return codes.astype(np.int8), scales


def fused_linears(weights: DecoderWeights) -> list[dict[str, np.ndarray]]:
    """Per layer, the (N, K) torch-layout matrices the kernels multiply by."""
    layers = []
    for layer in weights.layers:
        layers.append({
            "qkv": np.concatenate([layer.q.T, layer.k.T, layer.v.T], axis=0),  # (Hq*hd + 2*Hkv*hd, D)
            "o": layer.o.T,  # (D, Hq*hd)
            "gate_up": np.concatenate([layer.gate.T, layer.up.T], axis=0),  # (2F, D)
            "down": layer.down.T,  # (D, F)
        })
    return layers


def export_sparse(model, out_dir: Path, config: SparseExportConfig, max_context: int) -> dict:
    """Write the block-compressed weights and sparsity.json; returns the manifest's ``sparse`` record.

    The record's ``max_context`` is the bundle's context, ``max_context`` bounded by the model's
    ``max_position_embeddings`` as the ONNX graph's is (export/onnx_export.py ``bundle_context``): the
    triton backend refuses sequences past it and allocates its KV cache to it."""
    import torch
    from safetensors.torch import save_file

    from edgesdk.export.onnx_export import ExportConfig, bundle_context
    from edgesdk.kernels.block_sparse import BlockSparseWeight
    from edgesdk.runtime.sparse_decoder import ACTIVATIONS, rope_table_key

    context = bundle_context(model.config, ExportConfig(max_context=max_context))
    weights = decoder_weights_from_hf(model)
    tensors: dict[str, torch.Tensor] = {
        "embed": torch.from_numpy(weights.embed).half(),
        "final_norm": torch.from_numpy(weights.final_norm),
        "inv_freq": torch.from_numpy(weights.inv_freq),
    }
    if weights.lm_head is not None:
        tensors["lm_head"] = torch.from_numpy(weights.lm_head).half()
    for index, (inv_freq, _) in enumerate(weights.ropes()[1:], start=1):  # Gemma 3: the global layers' table
        tensors[rope_table_key(index)] = torch.from_numpy(inv_freq)
    if weights.activation not in ACTIVATIONS:
        raise ExportError(f"the FFN activation {weights.activation!r} of {weights.architecture} is not one the "
                          f"block-sparse decoder computes ({', '.join(ACTIVATIONS)})",
                          "set export.sparse=false for this model")
    report: dict[str, dict] = {}
    stored = dense = 0
    layers = []
    for index, (layer, linears) in enumerate(zip(weights.layers, fused_linears(weights), strict=True)):
        tensors[f"layers.{index}.input_norm"] = torch.from_numpy(layer.input_norm)
        tensors[f"layers.{index}.post_attention_norm"] = torch.from_numpy(layer.post_attention_norm)
        if layer.q_bias is not None:
            bias = np.concatenate([layer.q_bias, layer.k_bias, layer.v_bias])
            tensors[f"layers.{index}.qkv_bias"] = torch.from_numpy(bias)
        if layer.q_norm is not None:  # Qwen3's and Gemma 3's per-head query / key RMSNorm weights (hd,)
            tensors[f"layers.{index}.q_norm"] = torch.from_numpy(layer.q_norm)
            tensors[f"layers.{index}.k_norm"] = torch.from_numpy(layer.k_norm)
        for norm in ("attn_out_norm", "ffn_out_norm"):  # Gemma 3: on the attention's and the FFN's outputs (D,)
            if getattr(layer, norm) is not None:
                tensors[f"layers.{index}.{norm}"] = torch.from_numpy(getattr(layer, norm))
        for kind, matrix in linears.items():
            name = f"layers.{index}.{kind}"
            codes, scales = int8_rows(matrix, name)
            sparse = BlockSparseWeight.from_dense(torch.from_numpy(codes), torch.from_numpy(scales),
                                                  block=(config.block, config.block), layout=config.layout)
            tensors.update(sparse.state_dict(name))
            stored += sparse.nbytes
            dense += codes.nbytes + scales.nbytes
            mask = _block_mask(codes, config.block)
            report[name] = {"shape": list(codes.shape), "block": [config.block, config.block],
                            "density": round(sparse.density, 4), "mask": ["".join("1" if v else "0" for v in row)
                                                                          for row in mask]}
        heads, kv_heads = layer.heads(weights.head_dim)
        layers.append({"heads": heads, "kv_heads": kv_heads, "ffn": layer.ffn_width})
        if layer.rope is None:  # SmolLM3's NoPE layers: no rotary at all (null)
            layers[-1]["rope"] = None
        elif layer.rope:  # Gemma 3: a layer rotating by another table than the first layer's
            layers[-1]["rope"] = layer.rope
        if layer.window is not None:  # Gemma 3's sliding layers: a query sees the last `window` positions
            layers[-1]["window"] = int(layer.window)
    path = out_dir / WEIGHTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    blocks = sum(len(r["mask"]) * len(r["mask"][0]) for r in report.values())
    kept = sum(row.count("1") for r in report.values() for row in r["mask"])
    summary = {"block": [config.block, config.block], "layout": config.layout,
               "density": round(kept / max(blocks, 1), 4), "bytes_sparse": stored, "bytes_dense_int8": dense,
               "weights": report}
    (out_dir / SPARSITY_FILE).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    record = {
        "weights": WEIGHTS_FILE, "sparsity": SPARSITY_FILE, "block": config.block, "layout": config.layout,
        "density": summary["density"], "bytes_sparse": stored, "bytes_dense_int8": dense,
        "head_dim": weights.head_dim, "rms_eps": weights.rms_eps, "rope_scaling": weights.rope_scaling,
        "vocab_size": weights.vocab_size, "hidden_size": weights.hidden_size, "tied": weights.lm_head is None,
        "max_context": context, "layers": layers,
    }
    # what Gemma 3 computes otherwise than Llama (SparseDecoder reads each, defaulting to Llama's)
    if weights.embed_scale != 1.0:
        record["embed_scale"] = weights.embed_scale
    if weights.attention_scale is not None:
        record["attention_scale"] = weights.attention_scale
    if weights.activation != "silu":
        record["activation"] = weights.activation
    if weights.other_ropes:
        record["other_rope_scalings"] = [float(scaling) for _, scaling in weights.other_ropes]
    return record


def _block_mask(codes: np.ndarray, block: int) -> np.ndarray:
    """(N, K) -> (ceil(N/b), ceil(K/b)) True where the block holds a non-zero code."""
    rows, cols = codes.shape
    padded = np.pad(codes != 0, ((0, -rows % block), (0, -cols % block)))
    return padded.reshape(padded.shape[0] // block, block, padded.shape[1] // block, block).any(axis=(1, 3))


def validate_sparse(model, out_dir: Path, record: dict, config) -> dict:
    """The kernels' decoder (PyTorch twins, on the CPU) against the PyTorch model carrying the same
    float16 embedding: same weights, so only float32 summation order may differ.

    The block-sparse weights hold no power adapters (the ``triton`` backend has no gates, and ``run
    --gating`` is refused for it), so they compute the model with its adapters off: the comparison
    bypasses them (edgesdk/power/adapter.py ``PowerState.enabled``) rather than hold the weights to the
    gated model, whose channel and query scales act at the build's threshold."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_file

    from edgesdk.export.validate import ExportMismatchError, compare_backend, scaled_atol
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend

    decoder = SparseDecoder(load_file(str(out_dir / record["weights"])), record, device="cpu", mode="reference")
    heads = list({id(m): m for m in (model.model.embed_tokens, model.lm_head)}.values())  # one when tied
    saved = [module.weight.detach().clone() for module in heads]
    power = getattr(model, "_power_state", None)  # edgesdk.power.adapter.power_state, without importing it
    adapters_on = power.enabled if power is not None else None
    try:  # the model with the stored float16 embedding / head, in place (no copy of the model)
        if power is not None:
            power.enabled = False
        with torch.no_grad():
            for module in heads:
                module.weight.copy_(module.weight.half().float())
        diffs, agree, scale = compare_backend(TritonBackend(decoder, "reference"), model.eval(),
                                              SimpleNamespace(vocab_size=record["vocab_size"]), config, False)
    finally:
        if power is not None:
            power.enabled = adapters_on
        with torch.no_grad():
            for module, weight in zip(heads, saved, strict=True):
                module.weight.copy_(weight)
    atol = scaled_atol(config, scale)
    if any(diff > atol for diff in diffs.values()) or not np.isfinite(list(diffs.values())).all():
        raise ExportMismatchError({f"{k} (block-sparse kernels' twins vs PyTorch)": v for k, v in diffs.items()}, atol)
    return {"max_abs_diff": diffs, "top1_agree": agree}
