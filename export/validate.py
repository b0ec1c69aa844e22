"""Re-run an exported decoder in ONNX Runtime against the PyTorch model it came from.

Random prompts go through prefill and then several greedy decode steps; at every step the
logits of both are compared. Each prompt is prefilled in two chunks, the second on top of the first's
KV cache (:func:`chunk_split`), as the runtime prefills every chat turn after the first and every prompt
whose prefix it reuses from the prompt cache. A difference above the tolerance raises ExportMismatchError
listing each output's max absolute difference (the optimum exporter's AtolError idea).
Where the model attends over a sliding window shorter than the graph's context (Gemma 3's local
layers), the last prompt runs past that window (:func:`prompt_lengths`), so the graph's window
is checked too.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgesdk.errors import ExportError
from edgesdk.export.llama_graph import GraphSpec
from edgesdk.runtime.ort_backend import EXACT_INT8_QDQ


class ExportMismatchError(ExportError):
    """ONNX Runtime and PyTorch disagree beyond the tolerance."""

    def __init__(self, diffs: dict[str, float], atol: float):
        self.diffs = diffs
        self.atol = atol
        worst = "\n".join(f"    {name}: max |diff| = {diff:.3e}" for name, diff in diffs.items())
        super().__init__(
            f"exported graph differs from PyTorch by more than atol={atol:g}:\n{worst}",
            "this is an exporter bug for this architecture; report it with the model config",
        )


@dataclass(frozen=True)
class ValidationConfig:
    """How an export is checked."""

    prompts: int = 5  # random prompts, each prefilled then decoded
    prompt_length: int = 12  # tokens per random prompt (the last runs past a sliding window: prompt_lengths)
    decode_steps: int = 4  # greedy decode steps after each prefill
    atol: float = 1e-3  # max abs logit difference allowed per 10 units of the logits' range (scaled_atol)
    seed: int = 0

    def __post_init__(self):
        """A check that compares nothing (no prompt, an empty prompt) or whose tolerance no difference exceeds (NaN,
        infinity) would pass every graph; refused by name, as is a seed NumPy's generator refuses (negative, not an
        integer) only once the stages have run, or None, which would check other prompts on every build. NumPy numbers
        are taken, as the Python number they hold (the build writes the config to JSON)."""
        for name, least in (("prompts", 1), ("prompt_length", 1), ("decode_steps", 0)):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
                raise ExportError(f"ValidationConfig {name} is {value!r}; expected an integer of at least {least}",
                                  f"pass ValidationConfig({name}={least}) or more (the default is "
                                  f"{getattr(ValidationConfig, name)})")
            object.__setattr__(self, name, operator.index(value))
        atol = self.atol
        if not isinstance(atol, numbers.Real) or isinstance(atol, bool) or not math.isfinite(atol) or atol < 0:
            raise ExportError(f"ValidationConfig atol is {atol!r}; expected a finite number of at least 0 (the "
                              "largest logit difference allowed per 10 units of the logits' range)",
                              "pass ValidationConfig(atol=1e-3) (the default) or another tolerance")
        object.__setattr__(self, "atol", float(atol))
        seed = self.seed  # numpy's default_rng takes a non-negative integer; None would draw new prompts every build
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
            raise ExportError(f"ValidationConfig seed is {seed!r}; expected an integer of at least 0 (the random "
                              "prompts' seed, so that a rebuild checks the same prompts)",
                              "pass ValidationConfig(seed=0) (the default) or another non-negative integer")
        object.__setattr__(self, "seed", operator.index(seed))


def check_fits_context(config: ValidationConfig, max_context: int) -> None:
    """Each random prompt and its decode steps fit the graph's ``max_context`` positions (its rotary table): past
    it, ONNX Runtime fails deep in the graph ('Gather ... indices element out of data bounds')."""
    needed = config.prompt_length + config.decode_steps
    if needed > max_context:
        raise ExportError(f"ValidationConfig prompt_length {config.prompt_length} + decode_steps "
                          f"{config.decode_steps} = {needed} tokens, more than the graph's context of {max_context}",
                          f"pass a ValidationConfig prompt_length and decode_steps that add up to at most "
                          f"{max_context}, or export a larger context")


def scaled_atol(config: ValidationConfig, scale: float) -> float:
    """The largest logit difference a check allows: ``config.atol`` per 10 units of ``scale``, the largest |logit|
    the PyTorch model gave (at least 1), i.e. about 1e-4 of the logit range.

    Two float32 computations of the same function (ONNX Runtime's kernels and PyTorch's sum in other orders) differ
    by rounding that grows with the size of the values, not by a fixed amount: SmolLM2-135M's logits reach about
    35, and its correct float32 graphs differ from the model by up to 1.4e-3 on some random prompts (one
    activation-heavy position), which an absolute 1e-3 refused as an exporter bug. A wrong graph (mask, positions,
    rotary, a weight) is off by a good part of the range. The quantized and block-sparse checks scale alike."""
    return config.atol * max(scale, 1.0) / 10


@dataclass
class ValidationReport:
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    top1_agree: float | None = 1.0  # greedy top-1 agreement over the decode steps; None: not measured (none ran)

    def to_json(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "top1_agree": self.top1_agree}


def sliding_windows(model) -> list[int]:
    """The sliding windows the PyTorch ``model`` attends over: each decoder layer's ``self_attn.sliding_window``
    (transformers' Gemma3Attention, Qwen3Attention, SmolLM3Attention: set on the ``sliding_attention`` layers
    only), and a Mistral config's ``sliding_window``, which transformers' MistralModel applies to every layer
    (create_sliding_window_causal_mask)."""
    windows = [getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers]
    if model.config.model_type == "mistral":
        windows.append(getattr(model.config, "sliding_window", None))
    return sorted({int(window) for window in windows if window})


def prompt_lengths(model, max_context: int | None, config: ValidationConfig) -> list[int]:
    """Each random prompt's length: ``config.prompt_length``, except that the last prompt runs past the longest
    sliding window shorter than the graph's ``max_context`` (``window + prompt_length`` tokens, or as many as
    the context leaves room for beside the decode steps).

    A query at position p of such a layer sees keys p - window + 1 .. p only (transformers'
    sliding_window_overlay; export/llama_graph.py's mask, GroupQueryAttention's ``local_window_size`` in
    export/fused_graph.py). Within the window every key is seen, so prompts of ``prompt_length`` tokens
    (Gemma 3's window is 512 or more) compare a graph whose window is wrong, or is missing, as equal."""
    lengths = [config.prompt_length] * config.prompts
    windows = [window for window in sliding_windows(model) if max_context is None or window < max_context]
    if lengths and windows:
        reach = max(windows) + config.prompt_length
        if max_context is not None:
            reach = min(reach, max_context - config.decode_steps)
        lengths[-1] = max(lengths[-1], reach)
    return lengths


def chunk_split(length: int, config: ValidationConfig) -> int:
    """How many of a prompt's ``length`` tokens the first prefill chunk takes; the rest (half a
    ``config.prompt_length``, at least one token) runs as a second prefill on top of the first's KV cache.
    ``length`` when the prompt is too short to split.

    A prompt after cached tokens (past > 0, more than one token) is its own kernel path: ONNX Runtime's
    GroupQueryAttention with past length > 0 and sequence length > 1 (neither its first prompt nor a decode
    step), and in the standard graph position ids and the causal mask offset by the past length
    (export/llama_graph.py, ``Range(past, past + seq)``). llama-server takes it on every turn (``n_past`` of
    the reused prompt cache) and so does this runtime (edgesdk/runtime/ort_backend.py ``prefill`` "after the
    cache"). The first chunk keeps everything but the tail, so the prompt that runs past a sliding window
    (:func:`prompt_lengths`) crosses it in both chunks."""
    tail = max(1, config.prompt_length // 2)
    return length - tail if length > tail else length


def empty_past(spec: GraphSpec, batch: int = 1) -> dict[str, np.ndarray]:
    past = {}
    for i, kv in enumerate(spec.kv_heads):
        for kind in ("key", "value"):
            past[f"past_key_values.{i}.{kind}"] = np.zeros((batch, kv, 0, spec.head_dim), np.float32)
    return past


def validate_export(model, onnx_path: Path, spec: GraphSpec, config: ValidationConfig = ValidationConfig(),
                    progress: bool = False) -> ValidationReport:
    """Compare logits and KV cache of ONNX Runtime and PyTorch over prefill + decode steps.

    A QDQ graph (``spec.dtype == "int8-qdq"``) is checked by :func:`validate_qdq` instead.
    """
    from edgesdk.export.qdq_graph import DTYPE as QDQ_DTYPE

    check_fits_context(config, spec.max_context)
    if spec.dtype == QDQ_DTYPE:
        return validate_qdq(model, onnx_path, spec, config, progress)
    session = _standard_session(onnx_path)
    diffs, agree, scale = _compare_standard(session, model, spec, config, progress)
    report = ValidationReport(max_abs_diff=diffs, top1_agree=agree)
    atol = scaled_atol(config, scale)
    bad = {name: diff for name, diff in diffs.items() if name.startswith("logits") and diff > atol}
    if bad or not np.isfinite(list(diffs.values())).all():
        raise ExportMismatchError(diffs, atol)
    return report


def _standard_session(onnx_path: Path, optimize: bool = True):
    """An ONNX Runtime CPU session; ``optimize=False`` runs the graph node by node as written
    (``ORT_DISABLE_ALL``: no QDQ fusion into integer kernels, no constant folding)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry(*EXACT_INT8_QDQ)
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])


def _compare_standard(session, model, spec: GraphSpec, config: ValidationConfig, progress: bool
                      ) -> tuple[dict[str, float], float | None, float]:
    """(max abs diffs, top-1 agreement (:func:`top1_agreement`), max |reference logit|) of a standard-form
    session against ``model`` over random prompts: prefill in two chunks (:func:`chunk_split`; ``logits/prefill``
    covers both, against the model's logits of the whole prompt at the same positions), then greedy decode steps
    feeding the KV cache back."""
    import torch
    from tqdm import tqdm

    rng = np.random.default_rng(config.seed)
    diffs: dict[str, float] = {"logits/prefill": 0.0, "logits/decode": 0.0, "present/kv": 0.0}
    agree, total, scale = 0, 0, 0.0
    lengths = prompt_lengths(model, spec.max_context, config)
    for length in tqdm(lengths, desc="validate export", disable=not progress, unit="prompt"):
        ids = rng.integers(0, spec.vocab_size, size=(1, length), dtype=np.int64)
        names = [o.name for o in session.get_outputs()]
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), use_cache=True)
        reference = ref.logits.numpy()
        scale = max(scale, float(ref.logits.abs().max()))
        cache = _returned_cache(ref)
        present = empty_past(spec)  # the first chunk's past (already named as inputs)
        start = 0
        for end in sorted({chunk_split(length, config), length}):  # the prompt, then its tail on the cache
            feeds = {"input_ids": ids[:, start:end], "num_logits_to_keep": np.array([end - start], np.int64)}
            for name, value in present.items():
                feeds[name.replace("present", "past_key_values")] = value
            ort_out = session.run(None, feeds)
            present = _presents(names, ort_out)
            _update(diffs, "logits/prefill", ort_out[0], reference[:, start:end])
            start = end
        for _step in range(config.decode_steps):
            token = ref.logits[:, -1:].argmax(-1)
            agree += int(np.argmax(ort_out[0][0, -1]) == int(token))
            total += 1
            feeds = {"input_ids": token.numpy(), "num_logits_to_keep": np.array([1], np.int64)}
            for name, value in present.items():
                feeds[name.replace("present", "past_key_values")] = value
            ort_out = session.run(None, feeds)
            present = _presents(names, ort_out)
            with torch.no_grad():
                ref = model(token, use_cache=True, **{_cache_kwarg(model): cache})
            cache = _returned_cache(ref)
            _update(diffs, "logits/decode", ort_out[0], ref.logits.numpy())
            scale = max(scale, float(ref.logits.abs().max()))
        for i in range(spec.num_layers):
            layer = cache.layers[i]
            for kind, reference in (("key", layer.keys.numpy()), ("value", layer.values.numpy())):
                _update(diffs, "present/kv", _cached_part(present[f"present.{i}.{kind}"], reference, model), reference)
    return _measured(diffs, total), top1_agreement(agree, total), scale


def _measured(diffs: dict[str, float], steps_run: int) -> dict[str, float]:
    """``diffs`` without ``logits/decode`` where no decode step ran (``steps_run`` 0): its 0.0 would read as a
    measured perfect match."""
    return diffs if steps_run else {name: diff for name, diff in diffs.items() if name != "logits/decode"}


def top1_agreement(agree: int, total: int) -> float | None:
    """The share of ``total`` greedy decode steps whose top-1 token agreed; None where no step ran
    (``decode_steps`` 0): nothing was measured, which 0 / 1 = 0% agreement would misstate."""
    return agree / total if total else None


def _presents(names: list[str], outputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The session's ``present.*`` outputs by name (the next step's past), without the hidden states."""
    return {name: value for name, value in zip(names, outputs, strict=True) if name.startswith("present.")}


def _cached_part(present: np.ndarray, reference: np.ndarray, model) -> np.ndarray:
    """The positions of the graph's ``present`` (B, H, S, hd) that the PyTorch cache layer holds: all of them,
    or for a sliding-window model (the graph attends over the whole context, export checks it is within the
    window) the last ones, as transformers' sliding-window cache keeps only its last ``window - 1`` tokens."""
    from edgesdk.export.onnx_export import sliding_window

    kept = reference.shape[2]
    windowed = sliding_window(model.config) is not None or model.config.model_type == "gemma3_text"  # Gemma 3's
    if 0 < kept < present.shape[2] and windowed:  # local layers: the graph masks old keys, transformers drops them
        return present[:, :, -kept:]
    return present


def qdq_reference(model, head_quantized: bool, activations: bool = True):
    """A copy of ``model`` computing what its QDQ graph does, in PyTorch fake quantization.

    The scheme recorded by the qat stage (or, without one, INT8 per-channel weights and float
    activations: post-training quantization) is attached to a deep copy (``fake_quant.attach``);
    activations other than per-tensor stay float, as in the graph, and all do when
    ``activations`` is False (the weights-only twin of :func:`_weights_only_copy`).
    ``head_quantized``: the graph stores the LM head (the tied embedding too) INT8 per row, and
    the copy's head gets the same codes (``quantize_weight(w, 8, "channel", …)`` on the (V, D) rows).
    """
    import copy

    import torch

    from edgesdk.compress import fake_quant
    from edgesdk.export.qdq_graph import qdq_scheme

    scheme = qdq_scheme(model)
    mode = "tensor" if activations and scheme.activations == "tensor" else "none"
    clone = copy.deepcopy(model)
    fake_quant.attach(clone, fake_quant.QuantScheme(**{**scheme.to_json(), "activations": mode, "embedding_bits": None}))
    if head_quantized:
        head = clone.lm_head.weight  # (V, D); tied: the embedding table as well
        with torch.no_grad():
            head.copy_(fake_quant.quantize_weight(head, 8, "channel", scheme.block_size))
    return clone


def _weights_only_copy(onnx_path: Path) -> tuple[Path, dict[str, float], bool]:
    """The QDQ graph with every activation QuantizeLinear -> DequantizeLinear pair bypassed, saved
    next to the original (it reads the same external weights); also the graph's per-tensor input
    scales by linear name, and whether its LM head is INT8."""
    import onnx

    from edgesdk.export.qdq_graph import INPUT_SCALE

    proto = onnx.load(str(onnx_path), load_external_data=False)
    graph = proto.graph
    scales = {t.name.removesuffix(INPUT_SCALE): float(onnx.numpy_helper.to_array(t))
              for t in graph.initializer if t.name.endswith(INPUT_SCALE)}
    quantize = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    bypass = {n.output[0]: quantize[n.input[0]] for n in graph.node
              if n.op_type == "DequantizeLinear" and n.input[0] in quantize}  # DQ output -> float input
    kept = [n for n in graph.node if n.output[0] not in bypass and n.output[0] not in quantize]
    for node in kept:
        for index, name in enumerate(node.input):
            node.input[index] = bypass.get(name, name)
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in kept for name in node.input}
    unused = [t for t in graph.initializer if t.name not in used]
    for tensor in unused:
        graph.initializer.remove(tensor)
    names = {t.name for t in graph.initializer}
    head_quantized = bool(names & {"embed_tokens.weight_quantized", "lm_head.weight_quantized"})
    twin = onnx_path.with_name("validate-weights-only.onnx")
    onnx.save_model(proto, str(twin))
    return twin, scales, head_quantized


def validate_qdq(model, onnx_path: Path, spec: GraphSpec, config: ValidationConfig = ValidationConfig(),
                 progress: bool = False) -> ValidationReport:
    """Check an INT8 QDQ graph (export/qdq_graph.py) against fake quantization in PyTorch.

    1. Weights (gated): the graph with its activation Q/DQ pairs bypassed, run as written (ONNX
       Runtime, graph optimizations off: DequantizeLinear computed in float32), must equal the
       model with fake-quantized weights (:func:`qdq_reference`, float activations) within ``atol``
       per 10 units of logit range (~1e-4 of the range): codes, scales, axes, head. Keys
       ``logits/*``, ``present/kv``.
    2. Activation scales (gated): each per-tensor input scale in the graph is the one the model's
       scheme recorded for that linear, and every linear the scheme records one for has its input
       quantized with it (:func:`_unquantized_inputs`; a linear of a fused group, q/k/v or gate/up, whose
       scale equals another's in its group counts as read through their shared QuantizeLinear, so a graph
       that feeds one of such a group in float while the others read the shared one is not caught here).
    3. Measured, reported: the whole graph unfused against the fully fake-quantized model
       (``qdq/*``; equal to float32 rounding on small models, but one activation landing on the
       other side of a rounding boundary, ORT and PyTorch summing in different orders, can cascade
       through later static-scale layers on a large model, so this is not gated), the graph as
       ONNX Runtime ships it (QDQ fused into integer kernels) against the same (``shipped/*``),
       and against the float model (``quantization/*``: the quantization error; ``top1_agree``
       is its greedy agreement). Quality is perplexity (``edgesdk eval``).
    """
    from edgesdk.export.qdq_graph import qdq_scheme

    check_fits_context(config, spec.max_context)
    twin, graph_scales, head_quantized = _weights_only_copy(onnx_path)
    try:
        weights_reference = qdq_reference(model, head_quantized, activations=False)
        exact, _, scale = _compare_standard(_standard_session(twin, optimize=False), weights_reference, spec,
                                            config, progress)
    finally:
        twin.unlink(missing_ok=True)
    atol = scaled_atol(config, scale)
    if any(v > atol for k, v in exact.items() if k.startswith("logits")) or not np.isfinite(list(exact.values())).all():
        raise ExportMismatchError({f"{k} (QDQ weights, unfused, vs fake-quantized weights)": v
                                   for k, v in exact.items()}, atol)
    scheme = qdq_scheme(model)
    recorded = scheme.activation_scales if scheme.activations == "tensor" else {}
    wrong = {f"input scale of {name} (graph {value:.6g}, recorded {recorded.get(name, float('nan')):.6g})":
             abs(value - recorded.get(name, float("inf")))
             for name, value in graph_scales.items() if value != float(np.float32(recorded.get(name, np.nan)))}
    wrong.update(_unquantized_inputs(recorded, graph_scales))
    if wrong or (recorded and not graph_scales):
        raise ExportMismatchError(wrong or {"input scales: none in the graph, the scheme records some": 1.0}, 0.0)

    reference = qdq_reference(model, head_quantized) if graph_scales else weights_reference
    diffs = dict(exact)
    if graph_scales:
        qdq, _, _ = _compare_standard(_standard_session(onnx_path, optimize=False), reference, spec, config, progress)
        diffs.update({f"qdq/{k.split('/')[1]}": v for k, v in qdq.items() if k.startswith("logits")})
    shipped_session = _standard_session(onnx_path)
    shipped, _, _ = _compare_standard(shipped_session, reference, spec, config, progress)
    quantization, agree, _ = _compare_standard(shipped_session, model, spec, config, progress)
    diffs.update({f"shipped/{k.split('/')[1]}": v for k, v in shipped.items() if k.startswith("logits")})
    diffs.update({f"quantization/{k.split('/')[1]}": v for k, v in quantization.items() if k.startswith("logits")})
    return ValidationReport(max_abs_diff=diffs, top1_agree=agree)


def _unquantized_inputs(recorded: dict[str, float], graph_scales: dict[str, float]) -> dict[str, float]:
    """The recorded per-tensor input scales the graph quantizes no input with, each named with its value.

    export/qdq_graph.py quantizes an input once per scale: where q, k and v (or gate and up) record equal
    scales, the one QuantizeLinear is named after the first of them, so a linear without an ``.input_scale`` of
    its own is covered when a linear of its fused unit (fused_graph.UNIT_LINEARS) has one of the same value.
    Any other is a linear the graph runs on a float input while the model quantizes it."""
    from edgesdk.export.fused_graph import UNIT_LINEARS

    missing = {}
    for name, value in recorded.items():
        if name in graph_scales:
            continue
        layer, _, module = name.removeprefix("model.layers.").partition(".")  # "0", "self_attn.k_proj"
        unit = next((linears for linears in UNIT_LINEARS.values() if module in linears), ())
        stored = float(np.float32(value))
        if not any(graph_scales.get(f"model.layers.{layer}.{sibling}") == stored for sibling in unit):
            missing[f"input scale of {name} (recorded {value:.6g}): the graph quantizes no input with it"] = stored
    return missing


def fake_quantized_copy(model, bits: int, block_size: int, head_bits: int | None = None,
                        eight_bit_linears: tuple[str, ...] = ()):
    """A copy of ``model`` whose decoder linears (``eight_bit_linears`` at 8 bits, the rest at
    ``bits``; the embedding and LM head, tied or not, at ``head_bits``, None keeps them in float) carry the exported
    block-quantized weights, dequantized: what the fused graph multiplies by."""
    import copy

    import torch

    from edgesdk.compress.fake_quant import decoder_linears
    from edgesdk.export.blockwise import quantize_blockwise

    def requantize(weight: torch.Tensor, bits: int = bits) -> torch.Tensor:  # (out, in) as torch stores it
        q = quantize_blockwise(weight.detach().float().numpy().T.copy(), bits, block_size)
        return torch.from_numpy(q.dequantize().T.copy())

    clone = copy.deepcopy(model)
    with torch.no_grad():
        for name, linear in decoder_linears(clone).items():
            linear.weight.copy_(requantize(linear.weight, 8 if name in eight_bit_linears else bits))
        tied = clone.lm_head.weight.data_ptr() == clone.model.embed_tokens.weight.data_ptr()
        if head_bits is not None:  # rows of the (V, D) table, blocks along D: the same as the head's layout
            embed = clone.model.embed_tokens.weight
            embed.copy_(requantize(embed, head_bits))
            if not tied:  # an untied LM head: the same bits and layout (fused_graph ``head``)
                clone.lm_head.weight.copy_(requantize(clone.lm_head.weight, head_bits))
    return clone


def compare_backend(backend, reference, spec: GraphSpec, config: ValidationConfig, progress: bool
                   ) -> tuple[dict[str, float], float | None, float]:
    """(max abs diffs, top-1 agreement (:func:`top1_agreement`), max |reference logit|) over random prompts, each
    prefilled in two chunks (:func:`chunk_split`: the tail on top of the head's KV cache; ``logits/prefill`` covers
    both), then decode steps, against the reference's logits of the whole sequence at the same positions."""
    import torch
    from tqdm import tqdm

    rng = np.random.default_rng(config.seed)
    diffs = {"logits/prefill": 0.0, "logits/decode": 0.0}
    agree, total, scale = 0, 0, 0.0
    lengths = prompt_lengths(reference, getattr(backend, "max_context", None), config)
    for length in tqdm(lengths, desc="validate export", disable=not progress, unit="prompt"):
        ids = rng.integers(0, spec.vocab_size, size=length + config.decode_steps, dtype=np.int64)
        with torch.no_grad():
            ref = reference(torch.from_numpy(ids)[None], use_cache=False).logits[0].numpy()  # (T, V)
        scale = max(scale, float(np.abs(ref).max()))
        backend.reset()
        split = chunk_split(length, config)  # the prompt's tail runs on top of its head's KV cache
        prefill = np.concatenate([backend.prefill(ids[:split], keep_logits=split)]
                                 + ([backend.prefill(ids[split:length], keep_logits=length - split)]
                                    if split < length else []))
        _update(diffs, "logits/prefill", prefill, ref[:length])
        if config.decode_steps:
            steps = np.stack([backend.decode(int(t)) for t in ids[length:]])  # (decode_steps, V)
            _update(diffs, "logits/decode", steps, ref[length:])
            agree += int((steps.argmax(-1) == ref[length:].argmax(-1)).sum())
            total += len(steps)
    return _measured(diffs, total), top1_agreement(agree, total), scale


def _exact_compute_copy(onnx_path: Path) -> Path:
    """The same graph with MatMulNBits computing in float32 (accuracy_level 1), next to the original
    so it reads the same external weights: isolates layout from activation rounding."""
    import onnx

    proto = onnx.load(str(onnx_path), load_external_data=False)

    def exact(graph) -> None:  # subgraphs too: the gated form runs each FFN inside an If
        for node in graph.node:
            for attribute in node.attribute:
                if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                    attribute.i = 1
                if attribute.type == onnx.AttributeProto.GRAPH:
                    exact(attribute.g)

    exact(proto.graph)
    exact = onnx_path.with_name("validate-exact.onnx")
    onnx.save_model(proto, str(exact))
    return exact


def validate_fused(model, onnx_path: Path, spec: GraphSpec, fused_config, config: ValidationConfig = ValidationConfig(),
                   progress: bool = False) -> ValidationReport:
    """Run the fused graph through its runtime backend (shared KV buffers, prefill then decode).

    Float32 weights: held to the PyTorch model within :func:`scaled_atol`. Quantized weights: the graph with
    float32 compute must equal the model carrying the same block-quantized weights (layout and
    packing exact); then the shipped graph (int8 activations per block) is measured against the
    float model and reported (random-token prompts are harsh on 4-bit weights; perplexity on
    real text, ``edgesdk eval``, is the quality measure).
    """
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    check_fits_context(config, spec.max_context)
    if fused_config.bits is None:
        backend = OrtFusedBackend(onnx_path, spec.to_json(), threads=1)
        diffs, agree, scale = compare_backend(backend, model, spec, config, progress)
        atol = scaled_atol(config, scale)
        if any(diff > atol for diff in diffs.values()) or not np.isfinite(list(diffs.values())).all():
            raise ExportMismatchError(diffs, atol)
        return ValidationReport(max_abs_diff=diffs, top1_agree=agree)

    exact_path = _exact_compute_copy(onnx_path)
    try:
        exact = OrtFusedBackend(exact_path, spec.to_json(), threads=1)
        reference = fake_quantized_copy(model, fused_config.bits, fused_config.block_size, fused_config.head_bits,
                                        fused_config.eight_bit_linears)
        layout, _, scale = compare_backend(exact, reference, spec, config, progress)
    finally:
        exact_path.unlink(missing_ok=True)
    atol = scaled_atol(config, scale)  # float32 sums in another order: ~1e-4 of the logit range
    if any(diff > atol for diff in layout.values()) or not np.isfinite(list(layout.values())).all():
        raise ExportMismatchError({f"{k} (float32 compute vs quantized weights)": v for k, v in layout.items()}, atol)
    shipped = OrtFusedBackend(onnx_path, spec.to_json(), threads=1)
    diffs, agree, _ = compare_backend(shipped, model, spec, config, progress)
    diffs.update({f"layout/{k.split('/')[1]}": v for k, v in layout.items()})
    return ValidationReport(max_abs_diff=diffs, top1_agree=agree)


def _cache_kwarg(model) -> str:
    """transformers >= 5.24 renamed ``past_key_values`` to ``cache``; accept both."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _returned_cache(output):
    """The KV cache a forward with ``use_cache=True`` returned: transformers >= 5.24 names it ``cache`` (reading
    ``past_key_values`` logs a deprecation warning there), older versions ``past_key_values``."""
    return output["cache"] if "cache" in output else output.past_key_values


def _update(diffs: dict[str, float], name: str, ours: np.ndarray, ref: np.ndarray) -> None:
    if ours.shape != ref.shape:
        raise ExportError(
            f"exported output {name} has shape {ours.shape}, PyTorch gives {ref.shape}",
            "this is an exporter bug for this architecture; report it with the model config",
        )
    if not np.isfinite(ref).all():  # max() would drop a NaN difference
        raise ExportError(f"the PyTorch model gives non-finite values (NaN or inf) in {name}",
                          "a stage diverged or was set up to: check its settings (lr, temperature) and its "
                          "training loss in the build log, then rebuild without --resume")
    if not np.isfinite(ours).all():  # the model is finite there: the graph computes something else
        raise ExportError(f"the exported graph gives non-finite values (NaN or inf) in {name}, where the PyTorch "
                          "model's are finite",
                          "this is an exporter bug for this architecture; report it with the model config")
    diffs[name] = max(diffs[name], float(np.max(np.abs(ours - ref))))
