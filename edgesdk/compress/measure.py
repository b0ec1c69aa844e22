"""What the build report records after each stage: parameters, the bytes the exported weights
will take, quick held-out perplexity (with the recorded fake quantization on, as the export computes), and the
per-layer structure."""

from __future__ import annotations

import contextlib
import contextvars

import torch

from edgesdk.compress.fake_quant import (
    CONFIG_KEY,
    QuantLinear,
    QuantScheme,
    attach,
    decoder_linears,
    detach,
    is_tied,
    quantize_weight,
)
from edgesdk.compress.structure import layer_records
from edgesdk.evaluate import exp_or_inf


def _quantized_bytes(shape: torch.Size, bits: int, granularity: str, block: int = 32) -> int:
    """Bytes of one (rows, cols) weight stored per output channel (QDQ: codes, a float32 scale and an INT8 zero point
    per row) or per block of ``block`` inputs (MatMulNBits: codes and a float16 scale per block, each row's last
    block zero-padded to the full block)."""
    rows, cols = shape
    if granularity == "channel":
        return rows * cols * bits // 8 + (4 + 1) * rows
    blocks = rows * -(-cols // block)
    return blocks * (block * bits // 8 + 2)


def weight_bytes(model, scheme: QuantScheme | None) -> int:
    """Bytes of the exported weights: codes plus one scale per block (float16, the MatMulNBits
    layout, each row's input padded to whole blocks) or per channel (QDQ: a float32 scale and an INT8
    zero point per output channel, the three initializers of export/qdq_graph.py's DequantizeLinear,
    whose zero point ONNX makes a tensor of the scale's shape); norms and float weights at 4 bytes.
    The embedding and the LM head take the scheme's embedding_bits; tied, they are stored once."""
    total = 0
    linears = decoder_linears(model)
    counted = {id(m.weight) for m in linears.values()}
    for name, linear in linears.items():
        w = linear.weight
        if scheme is None:
            total += 4 * w.numel()
        else:
            total += _quantized_bytes(w.shape, scheme.bits_of(name), scheme.granularity, scheme.block_size)
    embed = model.model.embed_tokens.weight
    counted.add(id(embed))
    bits = scheme.embedding_bits if scheme is not None else None
    block = scheme.block_size if scheme is not None else 32
    total += _quantized_bytes(embed.shape, bits, "block", block) if bits else 4 * embed.numel()
    if not is_tied(model):  # an untied head: its own matrix at the embedding's bits (fake_quant.attach)
        head = model.lm_head.weight
        counted.add(id(head))
        total += _quantized_bytes(head.shape, bits, "block", block) if bits else 4 * head.numel()
    total += sum(4 * p.numel() for p in model.parameters() if id(p) not in counted)
    return total


def exported_weight_bytes(model, export) -> int:
    """Bytes of the weights that the export with settings ``export`` (export/onnx_export.py ExportConfig) writes
    for ``model``, counted by :func:`weight_bytes`'s rules. The stored layout is the export's, not the fake
    quantization a stage recorded, which differs where the export stores what QAT does not train:

    * ``weights: fp32``: every weight in float32 (a QAT-baked model is stored as it is);
    * standard int8 (QDQ, export/qdq_graph.py): the linears INT8 per output channel; the LM head INT8 per row with
      ``embedding_bits: 8`` (the tied table once; an untied embedding stays float32), else float32. QAT for this
      form records ``embedding_bits: null``, so the recorded scheme counted the head in float32, 4x its bytes;
    * ort-fused int8 / int4 (MatMulNBits, export/fused_graph.py): blocks of ``block_size`` at the export's bits
      (a QAT stage's 8-bit linears of a mixed int4 model at 8), the embedding and head at ``embedding_bits`` or
      the layers' bits, as the graph stores them with or without a QAT stage before it.
    """
    if export.weights == "fp32":
        return weight_bytes(model, None)
    if export.form == "standard":  # QDQ: INT8 per channel; weight_bytes counts the table(s) in float32 here
        total = weight_bytes(model, QuantScheme(weight_bits=8, granularity="channel", activations="none",
                                                embedding_bits=None))
        if export.embedding_bits == 8:  # the head (for a tied model, the one table) INT8 per row instead
            head = model.lm_head.weight
            total += _quantized_bytes(head.shape, 8, "channel") - 4 * head.numel()
        return total
    bits = 4 if export.weights == "int4" else 8
    recorded = QuantScheme.of(model)
    eight_bit = recorded.eight_bit_linears if recorded is not None and bits == 4 else ()  # ExportConfig.fused
    return weight_bytes(model, QuantScheme(weight_bits=bits, granularity="block", block_size=export.block_size,
                                           activations="none", embedding_bits=export.embedding_bits or bits,
                                           eight_bit_linears=eight_bit))


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


HELDOUT_WINDOW = 256  # tokens per window of the per-stage held-out perplexity


def windows_after_bos(ids: list[int], bos_id: int | None, length: int = HELDOUT_WINDOW) -> list[int]:
    """``ids`` laid out as windows of ``length`` tokens that each start with ``bos_id`` and go on with the
    next ``length - 1`` text tokens, as a model whose tokenizer puts BOS in front of every text (Gemma,
    Llama 2) always sees it; ``ids`` as they are where ``bos_id`` is None."""
    if bos_id is None:
        return list(ids)
    step = length - 1
    return [token for start in range(0, len(ids), step) for token in (bos_id, *ids[start: start + step])]


@torch.no_grad()
def heldout_perplexity(model, ids: torch.Tensor, length: int = HELDOUT_WINDOW) -> float:
    """Perplexity over non-overlapping windows of ``ids`` (a quick per-stage figure; the bundle's
    perplexity through the runtime is ``edgesdk eval``). Laid out by :func:`windows_after_bos`, each
    window starts with the tokenizer's BOS where it adds one. Fewer than ``length`` tokens (or a window too
    short to predict a token) are refused: no token scored is no perplexity, not exp(0) = 1, a perfect model."""
    if length < 2 or ids.numel() < length:
        raise ValueError(f"held-out perplexity needs at least one whole window of {length} tokens (and windows of "
                         f"2 tokens or more), got {ids.numel()} tokens: pass more held-out text (check "
                         "holds_a_window() first) or a shorter length")
    windows = ids[: (ids.numel() // length) * length].reshape(-1, length)  # (W, length)
    total, count = 0.0, 0
    for row in windows:
        logits = model(row[None]).logits[0, :-1]  # (length-1, V)
        total += float(torch.nn.functional.cross_entropy(logits.float(), row[1:], reduction="sum"))
        count += length - 1
    return exp_or_inf(total / max(count, 1))  # a diverged stage's loss past 709.8 nats is inf, not an OverflowError


def quantized_heldout_perplexity(model, ids: torch.Tensor, scheme: QuantScheme | None) -> float:
    """:func:`heldout_perplexity` of the model the export computes: with ``scheme``'s fake quantization on, so
    the inputs of the linears are quantized as the exported graph quantizes them (per tensor with the observed
    scales for the QDQ / TensorRT form, per block at run time for MatMulNBits accuracy level 4). A stage leaves
    its weights baked on the integer grid, which re-quantizing leaves as they are, but its activations in float:
    measured plain, a W8A8 build's figure would be that of a weight-only model. Fake quantization is switched
    off again afterwards (weights untouched); a model that carries it already is measured as it is."""
    if scheme is None or any(isinstance(module, QuantLinear) for module in model.modules()):
        return heldout_perplexity(model, ids)
    had_scheme = hasattr(model.config, CONFIG_KEY)  # a float model (none recorded): measured as PTQ computes it
    recorded = getattr(model.config, CONFIG_KEY, None)
    attach(model, scheme)
    try:
        return heldout_perplexity(model, ids)
    finally:
        detach(model, bake=False)
        if had_scheme:
            setattr(model.config, CONFIG_KEY, recorded)  # the scheme as the stage left it
        else:  # the config as it came, without the key (its config.json gains none)
            delattr(model.config, CONFIG_KEY)


def qdq_head_perplexity(model, eval_ids: torch.Tensor | None, export) -> float | None:
    """The held-out perplexity of what a standard-form INT8 export with ``embedding_bits: 8`` computes, where
    :func:`stage_metrics`' figure is not that: the graph stores the LM head (a tied model's embedding too) INT8 per
    row (export/qdq_graph.py), which the QAT scheme of this form (``embedding_bits: null``) leaves in float. Measured
    as :func:`quantized_heldout_perplexity` with the head on those codes for the time of the measurement, as the
    export's check builds its reference (export/validate.py ``qdq_reference``). None for any other export (the
    stage's figure is the export's), before any recorded quantization (a stage before QAT is measured in float),
    and without a whole window of held-out tokens."""
    scheme = QuantScheme.of(model)
    if scheme is None or not holds_a_window(eval_ids) or (export.form, export.weights, export.embedding_bits) != (
            "standard", "int8", 8):
        return None
    head = model.lm_head.weight  # (V, D); tied: the embedding table as well
    saved = head.detach().clone()
    with torch.no_grad():
        head.copy_(quantize_weight(saved, 8, "channel", scheme.block_size))
    try:
        return round(quantized_heldout_perplexity(model, eval_ids, scheme), 4)
    finally:
        with torch.no_grad():
            head.copy_(saved)


def structure_summary(model) -> list[dict]:
    """Per remaining layer: its index in the unpruned model, query heads, KV heads and FFN channels kept."""
    return [{"layer": int(r.get("layer", i)), "heads": len(r["heads"]), "kv_heads": len(r["kv_heads"]),
             "ffn": len(r["ffn"])} for i, r in enumerate(layer_records(model))]


def holds_a_window(eval_ids: torch.Tensor | None) -> bool:
    """Whether ``eval_ids`` hold at least one whole window of HELDOUT_WINDOW tokens, what
    :func:`heldout_perplexity` scores: 256 tokens are one window, as 257 are."""
    return eval_ids is not None and eval_ids.numel() >= HELDOUT_WINDOW


# The export settings (export/onnx_export.py ExportConfig) of the build whose stage is running, set by the build
# pipeline (:func:`measured_as_exported`): stage_metrics counts and measures the model as that export stores it.
_EXPORT: contextvars.ContextVar = contextvars.ContextVar("edgesdk_stage_export", default=None)


@contextlib.contextmanager
def measured_as_exported(export):
    """While a build's stage runs, :func:`stage_metrics` gives the figures of what the export with settings
    ``export`` stores: :func:`exported_weight_bytes`, and for a standard-form INT8 export with ``embedding_bits: 8``
    the perplexity with the INT8 head (:func:`qdq_head_perplexity`), measured once, in place of the figure of the
    recorded scheme's float head (measured, then measured again with the head, before)."""
    token = _EXPORT.set(export)
    try:
        yield
    finally:
        _EXPORT.reset(token)


def stage_metrics(model, eval_ids: torch.Tensor | None) -> dict:
    """Parameters, exported weight bytes, per-layer structure and, where ``eval_ids`` hold at least one whole
    window of HELDOUT_WINDOW tokens (what :func:`heldout_perplexity` scores), the held-out perplexity. Inside
    :func:`measured_as_exported` the bytes are those of the export's stored layout, and so is the perplexity of a
    model with a recorded scheme (a float32 export's: the baked weights with float activations,
    :func:`computed_scheme`); a model without one (no qat stage yet) is measured in float, whatever the export."""
    scheme = QuantScheme.of(model)
    export = _EXPORT.get()
    metrics = {"parameters": parameters(model),
               "weight_bytes": weight_bytes(model, scheme) if export is None else exported_weight_bytes(model, export),
               "layers": structure_summary(model)}
    if holds_a_window(eval_ids):
        measured = None if export is None else qdq_head_perplexity(model, eval_ids, export)
        metrics["heldout_perplexity"] = measured if measured is not None else \
            round(quantized_heldout_perplexity(model, eval_ids, computed_scheme(scheme, export)), 4)
    return metrics


def computed_scheme(scheme: QuantScheme | None, export) -> QuantScheme | None:
    """The recorded ``scheme``'s fake quantization as the export with settings ``export`` computes it: None (the
    model as it is) for a float32 export, whose graph multiplies the baked weights by float activations, neither
    the per-tensor Q/DQ of the QDQ form nor MatMulNBits' per-block run-time quantization; the scheme otherwise."""
    if export is not None and export.weights == "fp32":
        return None
    return scheme
