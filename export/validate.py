"""Re-run an exported decoder in ONNX Runtime against the PyTorch model it came from.

Random prompts go through prefill and then several greedy decode steps; at every step the
logits of both are compared. A difference above the tolerance raises ExportMismatchError
listing each output's max absolute difference (the optimum exporter's AtolError idea).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from edgesdk.export.llama_graph import GraphSpec

from edgesdk.errors import ExportError


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
    prompt_length: int = 12  # tokens per random prompt
    decode_steps: int = 4  # greedy decode steps after each prefill
    atol: float = 1e-3  # max abs logit difference allowed (fp32)
    seed: int = 0


@dataclass
class ValidationReport:
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    top1_agree: float = 1.0

    def to_json(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "top1_agree": self.top1_agree}


def empty_past(spec: GraphSpec, batch: int = 1) -> dict[str, np.ndarray]:
    past = {}
    for i, kv in enumerate(spec.kv_heads):
        for kind in ("key", "value"):
            past[f"past_key_values.{i}.{kind}"] = np.zeros((batch, kv, 0, spec.head_dim), np.float32)
    return past


def validate_export(model, onnx_path: Path, spec: GraphSpec, config: ValidationConfig = ValidationConfig(),
                    progress: bool = False) -> ValidationReport:
    """Compare logits and KV cache of ONNX Runtime and PyTorch over prefill + decode steps."""
    import onnxruntime as ort
    import torch
    from tqdm import tqdm

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(config.seed)
    diffs: dict[str, float] = {"logits/prefill": 0.0, "logits/decode": 0.0, "present/kv": 0.0}
    agree, total = 0, 0
    for _ in tqdm(range(config.prompts), desc="validate export", disable=not progress, unit="prompt"):
        ids = rng.integers(0, spec.vocab_size, size=(1, config.prompt_length), dtype=np.int64)
        feeds = {"input_ids": ids, "num_logits_to_keep": np.array([ids.shape[1]], np.int64), **empty_past(spec)}
        ort_out = session.run(None, feeds)
        names = [o.name for o in session.get_outputs()]
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), use_cache=True)
        _update(diffs, "logits/prefill", ort_out[0], ref.logits.numpy())
        cache = ref.past_key_values
        present = dict(zip(names[1:], ort_out[1:], strict=False))
        for _step in range(config.decode_steps):
            token = ref.logits[:, -1:].argmax(-1)
            agree += int(np.argmax(ort_out[0][0, -1]) == int(token))
            total += 1
            feeds = {"input_ids": token.numpy(), "num_logits_to_keep": np.array([1], np.int64)}
            for name, value in present.items():
                feeds[name.replace("present", "past_key_values")] = value
            ort_out = session.run(None, feeds)
            present = dict(zip(names[1:], ort_out[1:], strict=False))
            with torch.no_grad():
                ref = model(token, use_cache=True, **{_cache_kwarg(model): cache})
            cache = ref.past_key_values
            _update(diffs, "logits/decode", ort_out[0], ref.logits.numpy())
        for i in range(spec.num_layers):
            layer = cache.layers[i]
            _update(diffs, "present/kv", present[f"present.{i}.key"], layer.keys.numpy())
            _update(diffs, "present/kv", present[f"present.{i}.value"], layer.values.numpy())
    report = ValidationReport(max_abs_diff=diffs, top1_agree=agree / max(total, 1))
    bad = {name: diff for name, diff in diffs.items() if name.startswith("logits") and diff > config.atol}
    if bad or not np.isfinite(list(diffs.values())).all():
        raise ExportMismatchError(diffs, config.atol)
    return report


def _cache_kwarg(model) -> str:
    """transformers >= 5.24 renamed ``past_key_values`` to ``cache``; accept both."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _update(diffs: dict[str, float], name: str, ours: np.ndarray, ref: np.ndarray) -> None:
    if ours.shape != ref.shape:
        raise ExportError(
            f"exported output {name} has shape {ours.shape}, PyTorch gives {ref.shape}",
            "this is an exporter bug for this architecture; report it with the model config",
        )
    diffs[name] = max(diffs[name], float(np.max(np.abs(ours - ref))))
