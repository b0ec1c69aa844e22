"""Write a decoder to ONNX (graph + one external-data file) in the chosen form.

Two graph forms come from the same weights:

* ``standard``: standard ONNX ops only (opset 17), concatenating KV cache; runs on any ONNX
  Runtime and is the form TensorRT builds from.
* ``ort-fused``: ONNX Runtime contrib ops (GroupQueryAttention with rotary and an in-place KV
  buffer, SkipSimplifiedLayerNormalization, MatMulNBits), ~7 ops per layer instead of ~40; the
  fast form for ONNX Runtime on CPUs, with fp32, int8 or int4 block-quantized weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from edgesdk.errors import ExportError
from edgesdk.export.decoder_weights import decoder_weights_from_hf
from edgesdk.export.fused_graph import FusedConfig, emit_fused_decoder
from edgesdk.export.llama_graph import GraphSpec, emit_decoder

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
FORMS = ("standard", "ort-fused")


@dataclass(frozen=True)
class ExportConfig:
    """Export settings."""

    max_context: int = 4096  # rotary table length; the runtime refuses longer sequences
    form: str = "standard"  # standard (portable, TensorRT) | ort-fused (fast on ONNX Runtime CPU)
    weights: str = "fp32"  # fp32 | int8 | int4 (block-wise weight quantization; ort-fused only)
    block_size: int = 32  # quantization block along K (MatMulNBits minimum, best quality)
    embedding_bits: int | None = None  # tied embedding / LM head bits (ort-fused); None = as the layers

    def __post_init__(self):
        if self.form not in FORMS:
            raise ExportError(f"export form '{self.form}' is unknown; choose one of {', '.join(FORMS)}",
                              "set export.form in the recipe")
        if self.weights not in ("fp32", "int8", "int4"):
            raise ExportError(f"export weights '{self.weights}' is unknown; choose fp32, int8 or int4",
                              "set export.weights in the recipe")
        if self.form == "standard" and self.weights != "fp32":
            raise ExportError(
                f"the standard form exports float32 weights only, got weights={self.weights}",
                "use form: ort-fused for int8/int4 weights (the QDQ form for TensorRT is another export)",
            )

    def fused(self) -> FusedConfig:
        return FusedConfig(weights=self.weights, block_size=self.block_size, embedding_bits=self.embedding_bits)


def export_model(model, out_dir: Path, config: ExportConfig = ExportConfig()) -> GraphSpec:
    """Emit ``model.onnx`` + ``model.onnx.data`` into ``out_dir`` and return the graph spec."""
    limit = int(getattr(model.config, "max_position_embeddings", config.max_context))
    max_context = min(config.max_context, limit)
    if max_context < 16:
        raise ExportError(f"max_context {max_context} is too short", "use --max-context 16 or more")
    weights = decoder_weights_from_hf(model)
    if config.form == "standard":
        proto, spec = emit_decoder(weights, max_context)
    else:
        proto, spec = emit_fused_decoder(weights, max_context, config.fused())
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (out_dir / MODEL_FILE, out_dir / DATA_FILE):
        stale.unlink(missing_ok=True)  # external data is appended to, never overwritten
    onnx.save_model(proto, str(out_dir / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=1024)
    if config.form == "standard":  # the fused form uses ONNX Runtime ops the onnx checker does not know;
        onnx.checker.check_model(str(out_dir / MODEL_FILE))  # its check is loading and running it in ORT
    return spec
