"""Write a decoder to ONNX (graph + one external-data file) in the chosen form.

Two graph forms come from the same weights:

* ``standard``: standard ONNX ops only (opset 17), concatenating KV cache; runs on any ONNX
  Runtime and is the form TensorRT builds from. With ``weights=int8`` the linears are INT8 with
  explicit QuantizeLinear/DequantizeLinear (QDQ, export/qdq_graph.py), TensorRT's INT8 form.
* ``ort-fused``: ONNX Runtime contrib ops (GroupQueryAttention with rotary and an in-place KV
  buffer, SkipSimplifiedLayerNormalization, MatMulNBits), 10 ops per layer instead of ~40; the
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
from edgesdk.export.qdq_graph import QDQConfig, emit_qdq_decoder, qdq_config, qdq_scheme
from edgesdk.kernels.layouts import LAYOUTS as SPARSE_LAYOUTS  # the stored blocks' order
from edgesdk.weights_file import CODECS as WEIGHTS_CODECS

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
FORMS = ("standard", "ort-fused")


@dataclass(frozen=True)
class ExportConfig:
    """Export settings."""

    max_context: int = 4096  # rotary table length; the runtime refuses longer sequences
    form: str = "standard"  # standard (portable, TensorRT) | ort-fused (fast on ONNX Runtime CPU)
    weights: str = "fp32"  # fp32 | int8 | int4 (ort-fused: block-wise; standard: int8 per channel, QDQ)
    block_size: int = 32  # quantization block along K (ort-fused); must equal qat.block_size after QAT
    embedding_bits: int | None = None  # embedding / LM head bits. ort-fused (tied or not): None = as the layers;
    # standard (QDQ): None = float32, 8 = INT8 per row
    sparse: bool = False  # also store block-compressed INT8 weights + AOT kernels (export/sparse_export.py)
    sparse_layout: str = "plain"  # plain (N-major blocks) | transposed (the seed's K-major blocks)
    weights_codec: str = "none"  # none | zlib: the bundle's weights file entropy-coded (edgesdk/weights_file.py)

    def __post_init__(self):
        if self.form not in FORMS:
            raise ExportError(f"export form '{self.form}' is unknown; choose one of {', '.join(FORMS)}",
                              "set export.form in the recipe")
        if self.weights not in ("fp32", "int8", "int4"):
            raise ExportError(f"export weights '{self.weights}' is unknown; choose fp32, int8 or int4",
                              "set export.weights in the recipe")
        if self.form == "standard" and self.weights == "int4":
            raise ExportError(
                "the standard form exports float32 or int8 (QDQ) weights, got weights=int4: INT4 QDQ needs "
                "opset 21 and TensorRT takes INT4 only as weight-only block quantization",
                "use form: ort-fused for int4 weights, or weights: int8 for the standard (TensorRT) form",
            )
        if self.embedding_bits not in (None, 4, 8):
            raise ExportError(f"export embedding_bits={self.embedding_bits} is not a width the graphs store; "
                              "choose 4, 8 or null (as the layers)", "set export.embedding_bits in the recipe")
        if self.weights == "fp32" and self.embedding_bits is not None:
            raise ExportError(
                f"export embedding_bits={self.embedding_bits} with weights=fp32: the float32 graphs store the "
                "embedding and LM head in float32, so the setting would be ignored",
                "set export.embedding_bits: null for float32 weights, or export quantized layers "
                "(export.weights: int8 or int4)")
        if self.form == "standard" and self.weights == "int8":
            self.qdq(None)  # validates embedding_bits
        if self.form == "ort-fused" and self.weights != "fp32":
            self._check_block_size()
        if self.sparse_layout not in SPARSE_LAYOUTS:
            raise ExportError(f"export sparse_layout '{self.sparse_layout}' is unknown; choose one of "
                              f"{', '.join(SPARSE_LAYOUTS)}", "set export.sparse_layout in the recipe")
        if not self.sparse and self.sparse_layout != "plain":
            raise ExportError(
                f"export sparse_layout={self.sparse_layout} with sparse=false: the layout orders the stored "
                "block-compressed weights, which only export.sparse stores, so the setting would be ignored",
                "set export.sparse: true (a recipe with a sparsify stage), or leave sparse_layout out")
        if self.weights_codec not in WEIGHTS_CODECS:
            raise ExportError(f"export weights_codec '{self.weights_codec}' is unknown; choose one of "
                              f"{', '.join(WEIGHTS_CODECS)}", "set export.weights_codec in the recipe")
        if self.weights_codec != "none" and self.form == "standard":
            raise ExportError(
                f"weights_codec '{self.weights_codec}' needs the ort-fused form: the standard form is what "
                "TensorRT parses, and its parser reads the weights file from disk as it is",
                "use form: ort-fused, or weights_codec: none for the standard (TensorRT) form",
            )

    def _check_block_size(self) -> None:
        """Refuse a block the fused graph's quantized ops cannot read: MatMulNBits and GatherBlockQuantized
        (ONNX Runtime contrib ops) take a power of two of at least 16 (export/blockwise.py)."""
        size = self.block_size
        if not isinstance(size, int) or size < 16 or size & (size - 1):
            raise ExportError(
                f"export block_size={size} with {self.weights} weights in the ort-fused form: MatMulNBits and "
                "GatherBlockQuantized quantize in blocks of a power of two of at least 16",
                "set export.block_size to 16, 32, 64 or 128 (the qat stage's block_size when it has one)")

    def qdq(self, scheme) -> QDQConfig:
        """The QDQ graph settings for a model quantized with ``scheme`` (None: weights only)."""
        if scheme is None:
            return QDQConfig(embedding_bits=self.embedding_bits)
        return qdq_config(scheme, self.embedding_bits)

    def fused(self, model=None) -> FusedConfig:
        """The fused graph settings; ``model``'s recorded quantization scheme adds its 8-bit linears."""
        scheme = None
        if model is not None and self.weights == "int4":
            from edgesdk.compress.fake_quant import QuantScheme

            scheme = QuantScheme.of(model)
        return FusedConfig(weights=self.weights, block_size=self.block_size, embedding_bits=self.embedding_bits,
                           eight_bit_linears=scheme.eight_bit_linears if scheme is not None else ())


MIN_CONTEXT = 16  # shortest graph context the export writes
FUSED_HEAD_DIM_MULTIPLE = 16  # ONNX Runtime's GroupQueryAttention with its rotary (do_rotary, as the fused
# graphs use it) refuses other head sizes: "head_size shall be a multiple of 16"


def check_exportable(model_config, config: ExportConfig) -> None:
    """Refuse a model the chosen form cannot run, from its config alone: the build calls this right after
    loading, before any stage, instead of failing in ONNX Runtime at validation."""
    layers = getattr(model_config, "num_hidden_layers", None)
    if isinstance(layers, int) and layers < 1:  # the graphs chain each layer's output into the next and the final norm
        raise ExportError(f"the model's config has num_hidden_layers {layers}; an exported decoder needs at least "
                          "one decoder layer", "build a model whose config has num_hidden_layers of 1 or more")
    head_dim = getattr(model_config, "head_dim", None) or \
        model_config.hidden_size // model_config.num_attention_heads
    if config.form == "ort-fused" and head_dim % FUSED_HEAD_DIM_MULTIPLE:
        raise ExportError(
            f"the model's head_dim is {head_dim}; the ort-fused form's GroupQueryAttention needs a multiple of "
            f"{FUSED_HEAD_DIM_MULTIPLE}",
            "export it in the standard form (e.g. --recipe fp32-standard, or --set export.form=standard with "
            "fp32 or int8 weights)")
    context = bundle_context(model_config, config)
    check_rope(model_config, context)
    window = sliding_window(model_config)
    if window is not None and window < context:
        raise ExportError(
            f"the model attends over a sliding window of {window} tokens, shorter than the bundle's context of "
            f"{context}; the exported graph attends over the whole context, so it would differ past {window} tokens",
            shorter_context_fix(window, "sliding window", "within the window the two are the same"))


def bundle_context(model_config, config: ExportConfig) -> int:
    """The context the graph is exported for: ``config.max_context``, bounded by the model's
    ``max_position_embeddings`` (the rotary table's length); refused when under MIN_CONTEXT, naming which of the
    two sets it."""
    limit = int(getattr(model_config, "max_position_embeddings", config.max_context))
    context = min(config.max_context, limit)
    if context >= MIN_CONTEXT:
        return context
    if limit < config.max_context:
        raise ExportError(
            f"the model's max_position_embeddings is {limit}, which bounds the bundle's context (the graph's rotary "
            f"table covers the model's positions only); a bundle needs a context of at least {MIN_CONTEXT} tokens",
            f"use a model whose max_position_embeddings is {MIN_CONTEXT} or more")
    raise ExportError(f"max_context {config.max_context} is too short: a bundle needs a context of at least "
                      f"{MIN_CONTEXT} tokens", f"use --max-context {MIN_CONTEXT} or more")


def shorter_context_fix(limit: int, what: str, why: str) -> str:
    """The fix for a model that is the same as its graph over ``limit`` tokens only (``what`` names the limit):
    export a bundle context of ``limit`` or less, where a bundle can have one (MIN_CONTEXT or more)."""
    if limit >= MIN_CONTEXT:
        return f"pass --max-context {limit} (or less): {why}"
    return (f"no --max-context avoids it: a bundle's context is at least {MIN_CONTEXT} tokens, longer than the "
            f"model's {what} of {limit}; use a model whose {what} is {MIN_CONTEXT} tokens or more")


# Rotary types (transformers' rope_type) whose frequencies are fixed: the graph's cos/sin tables are theirs.
FIXED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


def rope_parameters(model_config) -> dict:
    """The model's rotary settings: ``rope_parameters`` (transformers 5) or ``rope_scaling`` (older), {} if none."""
    params = getattr(model_config, "rope_parameters", None) or getattr(model_config, "rope_scaling", None)
    return dict(params) if isinstance(params, dict) else {}


def check_rope(model_config, context: int) -> None:
    """Refuse a rotary embedding the exported graph would compute differently over ``context`` tokens.

    The graph holds one fixed cos/sin table per rotary setting. That is exact for the fixed types, and for
    ``dynamic`` (unscaled up to ``max_position_embeddings``, which bounds the context) and ``longrope`` up to
    its ``original_max_position_embeddings`` (the short factors). Past that, longrope switches every
    position to its long factors once the sequence is longer, which no fixed table follows.

    A config whose ``rope_parameters`` hold one setting per layer type (Gemma 3: ``sliding_attention`` and
    ``full_attention``, transformers' Gemma3RotaryEmbedding) has each of its layer types' settings checked.
    """
    params = rope_parameters(model_config)
    if params and all(isinstance(value, dict) for value in params.values()):
        layer_types = set(getattr(model_config, "layer_types", None) or params)
        for layer_type, setting in params.items():
            if layer_type in layer_types:
                _check_rope_setting(setting, model_config, context, f" of its {layer_type} layers")
        return
    _check_rope_setting(params, model_config, context, "")


def _check_rope_setting(params: dict, model_config, context: int, where: str) -> None:
    """check_rope for one rotary setting; ``where`` names the layers it rotates (empty: all of them)."""
    kind = params.get("rope_type", params.get("type", "default"))
    _check_whole_head_rotary(params, kind, model_config, where)
    if kind in FIXED_ROPE_TYPES or kind == "dynamic":
        return
    if kind == "longrope":
        original = params.get("original_max_position_embeddings") or \
            getattr(model_config, "original_max_position_embeddings", None)
        if original is not None and context <= int(original):
            return
        limit = f"{original} tokens" if original is not None else "its original context (not in the config)"
        raise ExportError(
            f"the model's rotary embedding{where} is longrope, which switches every position to its long factors "
            f"once the sequence is longer than {limit}; the exported graph's rotary table is fixed, so over the "
            f"bundle's context of {context} it would differ from the model",
            shorter_context_fix(int(original), "longrope original_max_position_embeddings",
                                "up to it the short factors apply and the two are the same")
            if original is not None else "set rope_parameters.original_max_position_embeddings in the model config")
    raise ExportError(
        f"the model's rotary embedding type{where} '{kind}' is not one the exporter implements "
        f"({', '.join(FIXED_ROPE_TYPES)}, dynamic, longrope)",
        "use a model whose rope type is one of those (rope_parameters / rope_scaling in its config.json)")


def _check_whole_head_rotary(params: dict, kind: str, model_config, where: str) -> None:
    """Refuse a rotary setting whose frequencies cover only part of each head.

    transformers' rope functions for the scaled types (its ``ROPE_INIT_FUNCTIONS``: linear, dynamic, yarn,
    longrope, llama3) give ``int(head_dim * partial_rotary_factor) / 2`` frequencies, while the attention of these
    architectures (``apply_rotary_pos_emb``) multiplies the whole head by cos/sin: such a model fails in PyTorch at
    its first forward, and the exported graph's rotary cannot be built over the head either. The families' own
    default rotary ignores the factor and ``proportional`` pads the rest with zero frequencies: both cover the head.
    """
    factor = params.get("partial_rotary_factor", getattr(model_config, "partial_rotary_factor", None))
    if kind in ("default", "proportional") or factor is None:
        return
    head_dim = getattr(model_config, "head_dim", None) or \
        model_config.hidden_size // model_config.num_attention_heads
    rotated = len(range(0, int(head_dim * float(factor)), 2))  # transformers' torch.arange(0, dim, 2)
    if rotated != head_dim // 2:
        raise ExportError(
            f"the model's rotary embedding{where} ({kind}) sets partial_rotary_factor {factor}: its table has "
            f"{rotated} frequencies for a head of {head_dim} dimensions ({head_dim // 2} needed), and transformers' "
            f"{model_config.model_type} attention rotates the whole head, so the model fails in PyTorch too and no "
            "graph can compute it",
            "remove partial_rotary_factor from rope_parameters in the model's config.json (these architectures "
            "rotate every dimension of the head)")


def sliding_window(model_config) -> int | None:
    """The attention window of a Mistral (``sliding_window``) or Qwen2 / Qwen3 / SmolLM3 (``use_sliding_window``)
    config, or None.

    Where a Qwen2 / Qwen3 / SmolLM3 config lists its ``layer_types`` (Qwen2 and Qwen3 derive them from
    ``max_window_layers``, SmolLM3 makes its NoPE layers sliding), the window counts only when some layer is
    ``sliding_attention`` (transformers' Qwen3Attention, SmolLM3Attention). A Mistral config's ``layer_types`` does
    not: MistralModel masks every layer with ``sliding_window`` whatever the list says (transformers warns
    "Detected Mistral model with layer_types" and reads only ``sliding_window``).

    A Llama config converted from a Phi-3 model (edgesdk/models/as_llama.py) holds Phi-3's window as
    ``edgesdk_source_sliding_window``: Phi3Model masks every layer with it (create_sliding_window_causal_mask), the
    converted Llama and the graphs attend over the whole context.
    """
    model_type = getattr(model_config, "model_type", None)
    source_window = getattr(model_config, "edgesdk_source_sliding_window", None)
    if model_type == "llama" and source_window:
        return int(source_window)
    window = getattr(model_config, "sliding_window", None)
    if model_type in USE_SLIDING_WINDOW and not getattr(model_config, "use_sliding_window", False):
        return None
    layer_types = getattr(model_config, "layer_types", None)
    if model_type in USE_SLIDING_WINDOW and layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window) if model_type in ("mistral", *USE_SLIDING_WINDOW) and window else None


# model types whose sliding_window applies only where use_sliding_window is true
USE_SLIDING_WINDOW = ("qwen2", "qwen3", "smollm3")


def export_model(model, out_dir: Path, config: ExportConfig = ExportConfig()) -> GraphSpec:
    """Emit ``model.onnx`` + ``model.onnx.data`` into ``out_dir`` and return the graph spec."""
    check_exportable(model.config, config)
    max_context = bundle_context(model.config, config)
    weights = decoder_weights_from_hf(model)
    power = getattr(model.config, "edgesdk_power", None)  # power adapters (edgesdk/power): the gated graph
    if power and config.form == "standard":
        raise ExportError("a model with power adapters exports to the fused ONNX Runtime form only",
                          "set export.form: ort-fused in the recipe, or drop the power stage")
    if config.form == "standard" and config.weights == "int8":
        proto, spec = emit_qdq_decoder(weights, max_context, config.qdq(qdq_scheme(model)))
    elif config.form == "standard":
        proto, spec = emit_decoder(weights, max_context)
    elif power:
        from edgesdk.export.gated_graph import adapter_weights_from_hf, emit_gated_decoder

        proto, spec = emit_gated_decoder(weights, adapter_weights_from_hf(model), power, max_context,
                                         config.fused(model))
    else:
        proto, spec = emit_fused_decoder(weights, max_context, config.fused(model))
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (out_dir / MODEL_FILE, out_dir / DATA_FILE):
        stale.unlink(missing_ok=True)  # external data is appended to, never overwritten
    onnx.save_model(proto, str(out_dir / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=1024)
    if config.form == "standard":  # the fused form uses ONNX Runtime ops the onnx checker does not know;
        onnx.checker.check_model(str(out_dir / MODEL_FILE))  # its check is loading and running it in ORT
    return spec
