"""The compression part of a bundle's ``report.md``: per stage the parameters, weight bytes and
held-out perplexity, per layer the heads and FFN channels kept, and a PNG plot of both; for a
power-gated bundle also the power distribution of a sample text and the quality / compute curve
over the gate threshold (issue: "the bundle report plots the power distribution of a sample text and
the quality/speed curve")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgesdk.build.recipes import ExportSection


def finite_json(value):
    """``value`` with every float that is not finite (a diverged stage's perplexity of inf or NaN) as None:
    JSON has no NaN or Infinity, and Python's json would write them as such."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value


def figure(value, spec: str) -> str:
    """A measured number for a table: '-' where nothing was measured, 'not finite' for inf or NaN."""
    if value is None:
        return "-"
    return f"{value:{spec}}" if math.isfinite(value) else "not finite"


def stage_rows(baseline: dict | None, stages: list[dict]) -> list[dict]:
    """One row per measured point: the loaded model, then each stage."""
    rows = [{"stage": "loaded", **baseline}] if baseline else []
    rows += [{"stage": s["stage"], **s.get("metrics", {})} for s in stages if "parameters" in s.get("metrics", {})]
    return rows


def head_words(export: ExportSection | None = None) -> str:
    """The LM head as the export with settings ``export`` (the recipe's export section) stores it, which the held-out
    perplexity measures with the head on (recipes.py ``_check_qat_matches_export`` makes QAT train that grid;
    compress/measure.py ``qdq_head_perplexity`` puts a standard-form head on its INT8 rows): the fused graph's at
    ``embedding_bits``, else the layers' bits, the standard form's INT8 with ``embedding_bits: 8``, else float32.
    The report said "an INT8 LM head" of every bundle, of the default recipe's INT4 one too."""
    if export is None:
        return "the LM head as the export stores it"
    if export.weights == "fp32" or (export.form == "standard" and export.embedding_bits != 8):
        return "the LM head in float32, as the export stores it"
    bits = export.embedding_bits or (4 if export.weights == "int4" else 8)
    return f"the LM head at INT{bits}, as the export stores it"


def markdown(rows: list[dict], plot_name: str | None, plot_left_out: str | None = None,
             export: ExportSection | None = None) -> list[str]:
    """The report's stage section; ``plot_left_out`` says why there is no plot (from :func:`plot`); ``export``: the
    recipe's export section, whose LM head the perplexity sentence names (:func:`head_words`)."""
    if not rows:
        return []
    lines = ["", "## Compression stages", "",
             "| after | parameters | weight bytes | held-out perplexity | training tokens |", "|---|---|---|---|---|"]
    for row in rows:
        ppl = row.get("heldout_perplexity")
        tokens = row.get("training", {}).get("tokens")
        lines.append(f"| {row['stage']} | {row['parameters']:,} | {row['weight_bytes'] / 1e6:.1f} MB | "
                     f"{figure(ppl, '.3f')} | {f'{tokens:,}' if tokens else '-'} |")
    # what BuildContext.eval_ids() and compress/measure.py score: at most 8,192 tokens, whole windows only; a short
    # --data-skip-chars slice gives fewer, so the sentence states the bound, not a count the rows do not carry
    # compress/measure.py stage_metrics: the fake quantization a stage has recorded (QuantScheme.of) is switched on;
    # the loaded model and a stage before QAT (smooth, prune without QAT, power alone) record none and run in float
    # pipeline.py: a standard-form export's INT8 LM head (export.embedding_bits 8) is measured on its codes too
    lines += ["", "Held-out perplexity: PyTorch, with the fake quantization recorded by then on (the weights, "
              f"{head_words(export)}, and the activations where the recipe quantizes them, as the exported graph "
              "does; the loaded model and any stage "
              "before QAT in float), in whole windows of 256 over at most the first 8,192 tokens of the "
              "evaluation slice left out of training (`--data-skip-chars`; a shorter slice is scored up to its last "
              "whole window); `edgesdk eval` measures the bundle itself.", "",
              # pipeline.py counts each stage's row with compress/measure.py exported_weight_bytes
              "Weight bytes: the loaded model's in float32; after a stage, that model's weights as the recipe's "
              "export stores them (its weights and embedding_bits settings, quantization scales included), before "
              "any entropy coding of the weights file (`weights_codec`).", ""]
    for row in rows:  # the power stage's row is with gating off; its gated point follows
        gated = (row.get("heldout") or {}).get("at_tau_train")
        if gated:
            lines += [f"After {row['stage']}, with the FFN gates skipping below tau {gated['tau']:g}: held-out "
                      f"perplexity {figure(gated['perplexity'], '.3f')}, {gated['executed_fraction']:.1%} of the FFN "
                      "blocks run.",
                      ""]
        lines += _power_lines(row)
    last = rows[-1].get("layers") or []
    if last:  # layers numbered as in the model as loaded (as the plot draws them): depth pruning leaves gaps
        numbers = [int(layer.get("layer", i)) for i, layer in enumerate(last)]
        loaded = {int(layer.get("layer", i)) for i, layer in enumerate(rows[0].get("layers") or last)}
        lines += ["### Kept per layer", "", "| layer | query heads | KV heads | FFN channels |", "|---|---|---|---|"]
        lines += [f"| {number} | {layer['heads']} | {layer['kv_heads']} | {layer['ffn']} |"
                  for number, layer in zip(numbers, last, strict=True)]
        removed = sorted(loaded - set(numbers))
        if removed:
            lines += ["", f"Removed by depth pruning: layer{'s' if len(removed) > 1 else ''} "
                      f"{', '.join(map(str, removed))} of the model as loaded."]
    if plot_name:
        lines += ["", f"![compression stages]({plot_name})", ""]
    elif plot_left_out:
        lines += ["", f"No plot of these figures: {plot_left_out}.", ""]
    return lines


def _power_lines(row: dict) -> list[str]:
    """A power stage's quality / compute curve as a table and its sample text's windowed entropy."""
    lines = []
    curve = row.get("curve") or []
    if curve:
        lines += ["Quality against compute (PyTorch, the held-out tokens above; the speed follows the FFN blocks "
                  "run, `edgesdk eval --budgets` measures the bundle):", "",
                  "| gate threshold tau | FFN blocks run | held-out perplexity |", "|---|---|---|"]
        lines += [f"| {point['tau']:g} | {point['executed_fraction']:.1%} | {figure(point['perplexity'], '.3f')} |"
                  for point in curve]
        lines.append("")
    sample = row.get("sample_power")
    if sample and sample.get("entropy"):
        entropy = [h for h in sample["entropy"] if h is not None]
        if entropy:  # P (and the entropies) cover whole windows only: a slice's last part window has none
            lines += [f"Power distribution of the first {len(sample['P'])} held-out tokens (every FFN running): "
                      f"entropy per window of {sample['window']} tokens {min(entropy):.3f} to {max(entropy):.3f} "
                      f"nats, mean {sum(entropy) / len(entropy):.3f}.", ""]
    return lines


# The least span of the per-stage perplexity axis, as a fraction of the largest perplexity drawn
PERPLEXITY_MIN_SPAN = 0.05


def perplexity_limits(perplexities: list) -> tuple[float, float] | None:
    """The per-stage perplexity axis's limits where the finite perplexities lie closer together than
    :data:`PERPLEXITY_MIN_SPAN` of the largest: scaled to their own span, stages 1e-4 apart (668.3892 and 668.3891,
    a stage that left the model as it was) drew a steep line. None where they span more (matplotlib's own limits
    then), or where none is finite."""
    finite = [p for p in perplexities if isinstance(p, (int, float)) and math.isfinite(p)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    span = PERPLEXITY_MIN_SPAN * abs(high)
    if high - low >= span or span == 0:
        return None
    middle = (low + high) / 2
    return middle - span / 2, middle + span / 2


def plot(rows: list[dict], path: Path) -> str | None:
    """Write the PNG; where matplotlib cannot be imported, write nothing and return why (the report then
    has the tables only, and says so). Drawn on a bare ``Figure``, without pyplot: a build run from Python
    (build_bundle() in a notebook) keeps its process's backend and open figures, which ``matplotlib.use``
    would switch to Agg."""
    try:
        import matplotlib  # noqa: F401  (first: a matplotlib.figure already imported would not say it is gone)
        from matplotlib.figure import Figure
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "matplotlib":
            return "matplotlib is not installed (`pip install edgesdk[report]` adds it)"
        return f"matplotlib could not be imported ({exc})"
    power = next((row for row in reversed(rows) if row.get("curve") or row.get("sample_power")), None)
    if power is None:
        fig = Figure(figsize=(11, 4))
        left, right = fig.subplots(1, 2)
    else:
        fig = Figure(figsize=(11, 8))
        (left, right), (tokens, curve) = fig.subplots(2, 2)
        _plot_power(tokens, curve, power)
    names = [row["stage"] for row in rows]
    sizes = [row["weight_bytes"] / 1e6 for row in rows]
    left.bar(names, sizes, color="tab:blue")
    left.set_ylabel("weight MB")
    ppl = [row.get("heldout_perplexity") for row in rows]
    if any(ppl):
        twin = left.twinx()
        twin.plot(names, [p if p else float("nan") for p in ppl], "o-", color="tab:red")
        twin.set_ylabel("held-out perplexity", color="tab:red")
        twin.ticklabel_format(axis="y", style="plain", useOffset=False)  # no "+6.68389e2" over the title
        limits = perplexity_limits(ppl)
        if limits:
            twin.set_ylim(*limits)
    left.set_title("per stage: weight bytes and perplexity")
    layers = rows[-1].get("layers") or []
    if layers:
        first = {int(lay.get("layer", i)): lay for i, lay in enumerate(rows[0].get("layers") or layers)}
        last = {int(lay.get("layer", i)): lay for i, lay in enumerate(layers)}
        index = sorted(set(first) | set(last))  # a layer that depth pruning removed keeps nothing
        for key, marker, label in (("ffn", "o-", "FFN channels kept"), ("heads", "s-", "query heads kept")):
            right.plot(index, [last[i][key] / max(1, first.get(i, last[i])[key]) if i in last else 0.0
                               for i in index], marker, label=label)
        right.set_ylim(0, 1.05)
        right.set_xlabel("layer")
        right.set_ylabel("fraction kept")
        right.legend()
        right.set_title("per layer")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return None


def _plot_power(tokens, curve, row: dict) -> None:
    """The sample text's power distribution P (per token, within its window) and the quality / compute curve."""
    sample = row.get("sample_power") or {}
    probabilities = [p if p is not None else float("nan") for p in sample.get("P") or []]
    if probabilities:
        window = sample["window"]
        tokens.bar(range(len(probabilities)), probabilities, width=1.0, color="tab:purple")
        for edge in range(window, len(probabilities), window):
            tokens.axvline(edge - 0.5, color="grey", linewidth=0.5)
        tokens.set_xlabel(f"held-out token (windows of {window})")
        tokens.set_ylabel("P (share of the window's power)")
        tokens.set_title("power distribution of a sample text")
    points = [point for point in row.get("curve") or [] if point.get("perplexity") is not None
              and math.isfinite(point["perplexity"])]
    if points:
        curve.plot([p["executed_fraction"] for p in points], [p["perplexity"] for p in points], "o-", color="tab:green")
        labels: dict[tuple, list[str]] = {}  # thresholds that gave the same point share one label
        for point in points:
            labels.setdefault((point["executed_fraction"], point["perplexity"]), []).append(f"{point['tau']:g}")
        for at, taus in labels.items():
            curve.annotate(f"tau {', '.join(taus)}", at, textcoords="offset points", xytext=(4, 4), fontsize=8)
        curve.set_yscale("log")  # skipping every FFN costs orders of magnitude: a linear axis flattens the rest
        curve.set_xlabel("FFN blocks run (compute)")
        curve.set_ylabel("held-out perplexity (log scale)")
        curve.set_title("quality against compute")
