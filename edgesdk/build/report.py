"""The compression part of a bundle's ``report.md``: per stage the parameters, weight bytes and
held-out perplexity, per layer the heads and FFN channels kept, and a PNG plot of both."""

from __future__ import annotations

from pathlib import Path


def stage_rows(baseline: dict | None, stages: list[dict]) -> list[dict]:
    """One row per measured point: the loaded model, then each stage."""
    rows = [{"stage": "loaded", **baseline}] if baseline else []
    rows += [{"stage": s["stage"], **s.get("metrics", {})} for s in stages if "parameters" in s.get("metrics", {})]
    return rows


def markdown(rows: list[dict], plot_name: str | None) -> list[str]:
    if not rows:
        return []
    lines = ["", "## Compression stages", "",
             "| after | parameters | weight bytes | held-out perplexity | training tokens |", "|---|---|---|---|---|"]
    for row in rows:
        ppl = row.get("heldout_perplexity")
        tokens = row.get("training", {}).get("tokens")
        lines.append(f"| {row['stage']} | {row['parameters']:,} | {row['weight_bytes'] / 1e6:.1f} MB | "
                     f"{f'{ppl:.3f}' if ppl else '-'} | {f'{tokens:,}' if tokens else '-'} |")
    lines += ["", "Held-out perplexity: the first 8,192 tokens of the evaluation slice left out of training "
              "(`--data-skip-chars`), PyTorch, windows of 256; `edgesdk eval` measures the bundle itself.", ""]
    for row in rows:  # the power stage's row is with gating off; its gated point follows
        gated = (row.get("heldout") or {}).get("at_tau_train")
        if gated:
            lines += [f"After {row['stage']}, with the FFN gates skipping below tau {gated['tau']:g}: held-out "
                      f"perplexity {gated['perplexity']:.3f}, {gated['executed_fraction']:.1%} of the FFN blocks run.",
                      ""]
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
    return lines


def plot(rows: list[dict], path: Path) -> bool:
    """Write the PNG; False when matplotlib is missing (the report then has the tables only)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [row["stage"] for row in rows]
    sizes = [row["weight_bytes"] / 1e6 for row in rows]
    left.bar(names, sizes, color="tab:blue")
    left.set_ylabel("weight MB")
    ppl = [row.get("heldout_perplexity") for row in rows]
    if any(ppl):
        twin = left.twinx()
        twin.plot(names, [p if p else float("nan") for p in ppl], "o-", color="tab:red")
        twin.set_ylabel("held-out perplexity", color="tab:red")
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
    plt.close(fig)
    return True
