"""Write a decoder to ONNX (graph + one external-data file) and validate it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from edgesdk.export.decoder_weights import decoder_weights_from_hf
from edgesdk.export.llama_graph import GraphSpec, emit_decoder

from edgesdk.errors import ExportError

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"


@dataclass(frozen=True)
class ExportConfig:
    """Export settings."""

    max_context: int = 4096  # rotary table length; the runtime refuses longer sequences
    validate: bool = True  # re-run the export in ONNX Runtime against PyTorch


def export_model(model, out_dir: Path, config: ExportConfig = ExportConfig()) -> GraphSpec:
    """Emit ``model.onnx`` + ``model.onnx.data`` into ``out_dir`` and return the graph spec."""
    limit = int(getattr(model.config, "max_position_embeddings", config.max_context))
    max_context = min(config.max_context, limit)
    if max_context < 16:
        raise ExportError(f"max_context {max_context} is too short", "use --max-context 16 or more")
    weights = decoder_weights_from_hf(model)
    proto, spec = emit_decoder(weights, max_context)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (out_dir / MODEL_FILE, out_dir / DATA_FILE):
        stale.unlink(missing_ok=True)  # external data is appended to, never overwritten
    onnx.save_model(proto, str(out_dir / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=1024)
    onnx.checker.check_model(str(out_dir / MODEL_FILE))
    return spec
