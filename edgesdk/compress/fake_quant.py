"""Fake quantization with a straight-through estimator (seed 004 §2; Jacob et al. 2018, Bengio et
al. 2013), numerically identical to what the exported INT8/INT4 graphs compute.

Weights are symmetric integers times a float scale, either per output channel (the QDQ form
TensorRT builds from: Q, K and V are separate matrices, so each carries its own scales) or per
block of ``block_size`` input features per output channel (ONNX Runtime ``MatMulNBits``, the
layout of ``export/blockwise.py``). Activations are either left in float, quantized per weight
block of ``block_size`` at run time (what MatMulNBits ``accuracy_level=4`` does, up to its integer
summation order), or quantized per tensor with a static scale from an observer (the QDQ form). Norm weights are never quantized (seed §2.2).

A linear is switched to fake quantization by swapping its class (``QuantLinear`` is an
``nn.Linear``; a subclass such as the power stage's query projection keeps its own forward on
top), so parameter names and checkpoints stay those of the original model. The scheme
travels between stages in ``model.config.edgesdk_quant``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from edgesdk.errors import BuildError
from edgesdk.export.blockwise import INT4_SCALE_DIVISORS, SMALLEST_SCALE  # the exporter's: same codes

CONFIG_KEY = "edgesdk_quant"
LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
SCALE_REFRESH = 8  # weight updates between 4-bit scale searches during training


@dataclass(frozen=True)
class QuantScheme:
    """How weights and activations are quantized; stored in the model config between stages."""

    weight_bits: int = 8  # 8 (INT8) or 4 (INT4 weight-only)
    granularity: str = "block"  # block: MatMulNBits layout (ORT CPU form); channel: QDQ per-channel
    block_size: int = 32  # input features per scale for granularity=block (MatMulNBits: a power of two >= 16)
    activations: str = "block"  # none | block (dynamic per weight block, MatMulNBits acc-4) | tensor (static, QDQ)
    embedding_bits: int | None = 8  # embedding and LM head bits (tied or not); None leaves them in float32
    activation_scales: dict[str, float] = field(default_factory=dict)  # per linear, activations=tensor
    eight_bit_linears: tuple[str, ...] = ()  # linears kept at 8 bits under weight_bits=4 (mixed precision)

    def __post_init__(self):
        object.__setattr__(self, "eight_bit_linears", tuple(self.eight_bit_linears))  # JSON gives a list
        if self.weight_bits not in (4, 8):
            raise ValueError(f"weight_bits must be 4 or 8, got {self.weight_bits}")
        if self.granularity not in ("block", "channel"):
            raise ValueError(f"granularity must be block or channel, got {self.granularity!r}")
        if self.activations not in ("none", "block", "tensor"):
            raise ValueError(f"activations must be none, block or tensor, got {self.activations!r}")
        if self.embedding_bits not in (None, 4, 8):
            raise ValueError(f"embedding_bits must be 4, 8 or None, got {self.embedding_bits!r}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {self.block_size}")

    @property
    def groups_hidden_channels(self) -> bool:
        """Do scales span several hidden channels (blocks along a linear's input, or a block-quantized
        embedding / head)? Then a permutation of the hidden channels regroups what shares a scale."""
        return self.granularity == "block" or self.embedding_bits is not None

    def to_json(self) -> dict:
        return asdict(self)

    def bits_of(self, linear_name: str) -> int:
        """Weight bits of the decoder linear ``model.layers.{i}.{module}``."""
        return 8 if linear_name in self.eight_bit_linears else self.weight_bits

    @classmethod
    def of(cls, model) -> QuantScheme | None:
        """The scheme recorded in ``model.config`` by an earlier stage, if any."""
        stored = getattr(model.config, CONFIG_KEY, None)
        return cls(**stored) if stored else None


def _blocks(weight: torch.Tensor, block_size: int) -> tuple[torch.Tensor, int]:
    """(out, in) -> (out, blocks, block), zero-padding ``in``; also returns the original ``in``."""
    out_features, in_features = weight.shape
    blocks = -(-in_features // block_size)
    padded = F.pad(weight, (0, blocks * block_size - in_features))
    return padded.reshape(out_features, blocks, block_size), in_features


def half_scales(scales: torch.Tensor) -> torch.Tensor:
    """Scales rounded to float16 (magnitude at least SMALLEST_SCALE): the block layout stores them
    as float16 (``export.blockwise.half_scales`` is the numpy twin)."""
    magnitude = scales.abs().clamp_min(SMALLEST_SCALE)
    return torch.where(scales < 0, -magnitude, magnitude).half().float()


def weight_scales(grouped: torch.Tensor, bits: int, half: bool = False, symmetric: bool = False) -> torch.Tensor:
    """Per-group scales for (…, group) weights: absmax / qmax, and for 4 bits the signed scale
    with the least squared rounding error (the same candidates and order as export/blockwise.py).
    ``half`` rounds every candidate to float16 first (the block layout's stored scales);
    ``symmetric`` measures that error with the codes in [-qmax, qmax] that per-channel weights use."""
    qmax = 2 ** (bits - 1) - 1
    low = _lowest_code(qmax, symmetric)
    absmax = grouped.abs().amax(dim=-1, keepdim=True)
    rounded = half_scales if half else (lambda s: s)
    step = absmax / qmax  # 0 for an all-zero group, or one whose absmax is so small its step underflows
    scales = rounded(torch.where(step > 0, step, torch.ones_like(step)))
    if bits == 4:
        best_error = _rounding_error(grouped, scales, low, qmax)
        for divisor in INT4_SCALE_DIVISORS:
            for sign in (1.0, -1.0):
                candidate = rounded(torch.where(absmax > 0, sign * absmax / divisor, torch.ones_like(absmax)))
                error = _rounding_error(grouped, candidate, low, qmax)
                better = error < best_error  # False for a NaN error (an infinite float16 candidate)
                scales = torch.where(better, candidate, scales)
                best_error = torch.where(better, error, best_error)  # torch.minimum would keep a NaN
    return scales


def _lowest_code(qmax: int, symmetric: bool) -> int:
    """-qmax for symmetric codes (QDQ weights, [-127, 127]), else -qmax - 1 (the block layout's)."""
    return -qmax if symmetric else -qmax - 1


def _rounding_error(grouped: torch.Tensor, scales: torch.Tensor, low: int, qmax: int) -> torch.Tensor:
    """Per group, the squared rounding error: float32 terms summed in float64, as
    ``export.blockwise._rounding_error`` sums them, so near ties between candidate scales break the
    same way in training and in the export (a float32 sum depends on the summation order)."""
    codes = torch.clamp(torch.round(grouped / scales), low, qmax)
    return ((codes * scales - grouped) ** 2).sum(dim=-1, keepdim=True, dtype=torch.float64)


def _grouped(weight: torch.Tensor, granularity: str, block_size: int) -> tuple[torch.Tensor, int]:
    if granularity == "channel":
        return weight.unsqueeze(1), weight.shape[1]  # (out, 1, in)
    return _blocks(weight, block_size)  # (out, blocks, block)


def quantize_weight(weight: torch.Tensor, bits: int, granularity: str, block_size: int,
                    scales: torch.Tensor | None = None) -> torch.Tensor:
    """The dequantized weight (same shape): what the exported graph multiplies by. No gradient.
    ``scales`` (from :func:`grouped_scales`) skips the scale choice."""
    return quantize_weight_and_range(weight, bits, granularity, block_size, scales)[0]


def quantize_weight_and_range(weight: torch.Tensor, bits: int, granularity: str, block_size: int,
                              scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_weight`, and where each weight's rounded code lies inside the code range (not clamped):
    the entries the straight-through gradient reaches (``torch.fake_quantize_per_channel_affine``'s mask)."""
    with torch.no_grad():
        grouped, in_features = _grouped(weight, granularity, block_size)
        qmax = 2 ** (bits - 1) - 1
        if scales is None:
            scales = weight_scales(grouped, bits, half=granularity == "block", symmetric=granularity == "channel")
        low = _lowest_code(qmax, symmetric=granularity == "channel")  # QDQ weights are symmetric [-127, 127]
        rounded = torch.round(grouped / scales)
        codes = torch.clamp(rounded, low, qmax)

        def ungrouped(values: torch.Tensor) -> torch.Tensor:
            return values.reshape(weight.shape[0], -1)[:, :in_features]

        return ungrouped(codes * scales), ungrouped((rounded >= low) & (rounded <= qmax))


def grouped_scales(weight: torch.Tensor, bits: int, granularity: str, block_size: int) -> torch.Tensor:
    with torch.no_grad():
        return weight_scales(_grouped(weight, granularity, block_size)[0], bits, half=granularity == "block",
                             symmetric=granularity == "channel")


def straight_through(value: torch.Tensor, quantized: torch.Tensor, inside: torch.Tensor | None = None) -> torch.Tensor:
    """Forward: ``quantized``; backward: the identity to ``value`` (straight-through estimator), and where
    ``inside`` is given, zero on the entries it marks False: values the quantizer clamped to its end codes,
    whose output does not move with them (PyTorch's ``fake_quantize_per_tensor_affine`` /
    ``fake_quantize_per_channel_affine`` gradient; Jacob et al. 2018 §3).

    The forward is ``quantized`` plus an exact zero, bit for bit the graph's value: ``value + (quantized -
    value)`` rounds twice, and for a value far past the end code (a static activation scale's saturated
    outliers) it missed ``127 * scale`` by up to an ulp of the value."""
    if inside is not None:
        value = torch.where(inside, value, value.detach())
    return quantized.detach() + (value - value.detach())


def quantize_activation_blocks(x: torch.Tensor, block_size: int = 32) -> torch.Tensor:
    """Dynamic symmetric int8 per block of ``block_size`` along the last dim (MatMulNBits acc-4), in float32 as
    ONNX Runtime's ``QuantizeARow_CompInt8`` computes it: ``scale = amax / 127``, ``q = round(a * (1 / scale))``
    (0 where the scale is 0). ``127 / amax`` differs from ``1 / (amax / 127)`` in the last bit for about a third
    of the blocks, which moved values near a rounding tie to the next code."""
    with torch.no_grad():
        *lead, k = x.shape
        blocks = -(-k // block_size)
        grouped = F.pad(x, (0, blocks * block_size - k)).reshape(*lead, blocks, block_size)
        scale = grouped.abs().amax(dim=-1, keepdim=True) / 127.0
        inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        codes = torch.clamp(torch.round(grouped * inverse), -128, 127)
        return (codes * scale).reshape(*lead, -1)[..., :k]


def quantize_activation_tensor(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Static per-tensor int8 (ONNX QuantizeLinear/DequantizeLinear, zero point 0): round half to even of
    x / scale, saturated to [-128, 127], times scale, in float32 as ONNX Runtime computes it."""
    return quantize_activation_tensor_and_range(x, scale)[0]


def quantize_activation_tensor_and_range(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_activation_tensor`, and where x's rounded code lies inside [-128, 127] (not saturated)."""
    with torch.no_grad():
        rounded = torch.round(x / scale)
        return torch.clamp(rounded, -128, 127) * scale, (rounded >= -128) & (rounded <= 127)


class QuantLinear(nn.Linear):
    """``nn.Linear`` whose weight (and input) pass through fake quantization in forward.

    Created by class swap from an existing ``nn.Linear`` (see :func:`attach`), so the parameters
    are the original ones. ``observing`` makes it record the running input absmax (EMA) for the
    per-tensor activation scale.
    """

    scheme: QuantScheme
    bits: int
    qualified_name: str
    observing: bool
    input_absmax: float | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scheme = self.scheme
        if scheme.activations == "block":
            x = straight_through(x, quantize_activation_blocks(x, scheme.block_size))
        elif scheme.activations == "tensor":
            if self.observing:
                self.observe(x)
            scale = self.activation_scale()
            if scale is not None:
                x = straight_through(x, *quantize_activation_tensor_and_range(x, scale))
        return F.linear(x, straight_through(self.weight, self.quantized_weight(), self._inside), self.bias)

    def observe(self, x: torch.Tensor) -> None:
        """Fold this input's absmax into the running one (EMA, the first input's absmax to start)."""
        peak = float(x.detach().abs().amax())
        if not math.isfinite(peak):  # it would stay in the running absmax and become the static scale
            raise BuildError(f"{self.qualified_name} received an input holding {peak} while the observers measured "
                             "its range: its per-tensor INT8 activation scale would not be finite",
                             "the model computes NaN or infinity on the calibration text before any quantization; "
                             "check that its weights are finite and that it runs in float32")
        self.input_absmax = peak if self.input_absmax is None else 0.9 * self.input_absmax + 0.1 * peak

    def quantized_weight(self) -> torch.Tensor:
        """Cached until the optimizer changes the weight (micro-batches of one step share it).

        The 4-bit scale search (26 candidate scales per block) is redone every
        ``SCALE_REFRESH`` weight updates only; the codes follow every update. Baking re-chooses
        the scales, so the shipped codes are always those the export derives."""
        version = (self.weight._version, self.weight.data_ptr())
        if getattr(self, "_cached_version", None) != version:
            scheme = self.scheme
            age = getattr(self, "_scale_age", SCALE_REFRESH)
            if self.bits == 8 or age >= SCALE_REFRESH:
                self._scales = grouped_scales(self.weight, self.bits, scheme.granularity, scheme.block_size)
                age = 0
            self._scale_age = age + 1
            self._cached, self._inside = quantize_weight_and_range(self.weight, self.bits, scheme.granularity,
                                                                  scheme.block_size, self._scales)
            self._cached_version = version
        return self._cached

    def activation_scale(self) -> float | None:
        if self.input_absmax is not None:
            return max(self.input_absmax, 1e-8) / 127.0
        return self.scheme.activation_scales.get(self.qualified_name)


class QuantEmbedding(nn.Embedding):
    """``nn.Embedding`` whose gathered rows are fake-quantized per block along the hidden size:
    the same codes as the tied LM head (``GatherBlockQuantized`` in the exported graph)."""

    scheme: QuantScheme
    bits: int

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = nn.Embedding.forward(self, ids)  # (B, S, D), the table's rows as stored
        flat = rows.reshape(-1, rows.shape[-1])  # (B*S, D)
        quantized, inside = quantize_weight_and_range(flat, self.bits, "block", self.scheme.block_size)
        rows = straight_through(rows, quantized.reshape(rows.shape), inside.reshape(rows.shape))
        # A scaled embedding (Gemma's, times sqrt(D)) scales the quantized rows, as the graph does after its Gather
        scale = getattr(self, "embed_scale", None)
        return rows if scale is None else rows * scale.to(rows.dtype)


def decoder_linears(model) -> dict[str, nn.Linear]:
    """Qualified name -> linear for every decoder projection (``model.layers.{i}.self_attn.q_proj`` …)."""
    found = {}
    for index, layer in enumerate(model.model.layers):
        for name in LINEAR_NAMES:
            module = layer.get_submodule(name)
            found[f"model.layers.{index}.{name}"] = module
    return found


def is_tied(model) -> bool:
    return model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def attach(model, scheme: QuantScheme) -> None:
    """Switch the decoder linears (and the embedding / LM head) to fake quantization, in place."""
    for name, linear in decoder_linears(model).items():
        _make_quant_linear(linear, scheme, scheme.bits_of(name), name)
    if scheme.embedding_bits is not None:
        # The LM head and the embedding, tied or not, at embedding_bits in blocks along D: the layout the
        # fused export stores both in (FusedConfig.head_bits). An untied embedding is a second table on
        # the same grid, baked by detach() like the head. The head is a MatMulNBits like the layers, so under
        # activations=block its input is quantized per block at run time too.
        head_activations = "block" if scheme.activations == "block" else "none"
        head_scheme = QuantScheme(**{**scheme.to_json(), "granularity": "block", "activations": head_activations})
        _make_quant_linear(model.lm_head, head_scheme, scheme.embedding_bits, "lm_head")
        embedding = model.model.embed_tokens
        if not isinstance(embedding, QuantEmbedding):  # attached already: its plain class is kept from then
            embedding.plain_class = type(embedding)  # nn.Embedding, or a subclass that scales (detach puts it back)
            embedding.__class__ = QuantEmbedding
        embedding.scheme, embedding.bits = head_scheme, scheme.embedding_bits
    else:  # attached already with embedding_bits: the head and the table go back to float
        _plain_again(model.lm_head)
        _plain_again(model.model.embed_tokens)
    setattr(model.config, CONFIG_KEY, scheme.to_json())


def _plain_again(module: nn.Module) -> None:
    """A fake-quantized LM head or embedding back to its plain class (weights untouched); others as they are."""
    if isinstance(module, QuantLinear):
        module.__class__ = module.__dict__.pop("plain_class", nn.Linear)
        _drop_cached_weight(module)
    elif isinstance(module, QuantEmbedding):
        module.__class__ = module.__dict__.pop("plain_class", nn.Embedding)


_QUANT_CLASSES: dict[type, type] = {}


def _quant_class(plain: type) -> type:
    """QuantLinear for a plain ``nn.Linear``; for a subclass whose forward adds to the product (the power
    stage's ScaledQueryProjection scales the query heads after ``super().forward``), that subclass over
    QuantLinear, so its forward does its own work on the fake-quantized product."""
    if plain is nn.Linear:
        return QuantLinear
    if plain not in _QUANT_CLASSES:
        _QUANT_CLASSES[plain] = type(f"Quant{plain.__name__}", (plain, QuantLinear), {})
    return _QUANT_CLASSES[plain]


def _make_quant_linear(linear: nn.Linear, scheme: QuantScheme, bits: int, name: str) -> None:
    if not isinstance(linear, QuantLinear):  # attached already: its plain class is kept from then
        linear.plain_class = type(linear)  # nn.Linear, or a subclass with work of its own (detach puts it back)
        linear.__class__ = _quant_class(linear.plain_class)
    linear.scheme, linear.bits, linear.qualified_name = scheme, bits, name
    linear.observing, linear.input_absmax = False, None
    _drop_cached_weight(linear)  # re-attached: the codes cached under the earlier scheme (its bits, its blocks) are stale


_CACHED_WEIGHT = ("_cached", "_inside", "_cached_version", "_scales", "_scale_age")


def _drop_cached_weight(linear: nn.Linear) -> None:
    """Forget :meth:`QuantLinear.quantized_weight`'s cache, keyed by the weight's version only."""
    for cached in _CACHED_WEIGHT:
        linear.__dict__.pop(cached, None)


def set_observing(model, observing: bool) -> None:
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.observing = observing


def detach(model, bake: bool = True) -> QuantScheme:
    """Back to plain modules. ``bake`` writes the dequantized weights into the parameters, so the
    float model computes exactly what the exported integer graph does (and a later export
    re-derives the same codes); observed activation scales go into the recorded scheme."""
    scheme = QuantScheme.of(model)
    if scheme is None:
        raise ValueError("the model carries no quantization scheme; call attach() first")
    scales = dict(scheme.activation_scales)
    tied = is_tied(model)
    with torch.no_grad():
        for module in list(model.modules()):
            if isinstance(module, QuantLinear):
                if module.activation_scale() is not None and module.scheme.activations == "tensor":
                    scales[module.qualified_name] = module.activation_scale()
                if bake:
                    module.weight.copy_(quantize_weight(module.weight, module.bits, module.scheme.granularity,
                                                        module.scheme.block_size))
                module.__class__ = module.__dict__.pop("plain_class", nn.Linear)
                _drop_cached_weight(module)
            elif isinstance(module, QuantEmbedding):
                if bake and not tied:  # a tied table is baked once, as the LM head
                    module.weight.copy_(quantize_weight(module.weight, module.bits, "block", module.scheme.block_size))
                module.__class__ = module.__dict__.pop("plain_class", nn.Embedding)
    scheme = QuantScheme(**{**scheme.to_json(), "activation_scales": scales})
    setattr(model.config, CONFIG_KEY, scheme.to_json())
    return scheme


def reattach(model) -> QuantScheme | None:
    """Re-enable the fake quantization recorded in the config (stages after QAT train with it on)."""
    scheme = QuantScheme.of(model)
    if scheme is not None:
        attach(model, scheme)
    return scheme
