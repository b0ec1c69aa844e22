"""``edgesdk thermal report``: a PNG of temperature, guard level and tok/s over time.

matplotlib is imported here only (extra ``[report]``); the board runtime never imports this module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.thermal.telemetry import load

LEVELS = ["unguarded", "normal", "warm", "hot", "critical"]


def _rate_series(steps: list[dict], bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per second in bins of ``bin_s`` seconds (time in minutes, rate)."""
    if not steps:
        return np.zeros(0), np.zeros(0)
    end = steps[-1]["t"]
    edges = np.arange(0.0, end + bin_s, bin_s)
    tokens = np.zeros(len(edges))
    for record in steps:
        tokens[min(int(record["t"] // bin_s), len(edges) - 1)] += record["tokens"]
    return (edges + bin_s / 2) / 60.0, tokens / bin_s


def render(paths: list[str | Path], out: str | Path, bin_s: float | None = None, title: str | None = None) -> Path:
    """Plot one or more telemetry files (e.g. a guarded and an unguarded run) into ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise EdgeSDKError(f"thermal report needs matplotlib ({exc})",
                           "pip install 'edgesdk[report]'") from exc
    runs = [(Path(p), *load(p)) for p in paths]
    if not any(steps for _, _, steps in runs):
        raise EdgeSDKError(f"no step records in {', '.join(map(str, paths))}",
                           "record one with 'edgesdk run ... --telemetry FILE' or 'edgesdk thermal plan --telemetry-dir'")
    fig, (ax_t, ax_l, ax_r) = plt.subplots(3, 1, figsize=(11, 8), sharex=True,
                                           gridspec_kw={"height_ratios": [3, 1.2, 2]})
    meta0 = runs[0][1]
    for path, meta, steps in runs:
        label = meta.get("label") or path.stem
        t = np.array([r["t"] for r in steps]) / 60.0
        temp = np.array([np.nan if r.get("temp_c") is None else r["temp_c"] for r in steps])
        (line,) = ax_t.plot(t, temp, lw=1.2, label=label)
        ax_l.step(t, [LEVELS.index(r.get("level", "normal")) if r.get("level") in LEVELS else 0 for r in steps],
                  where="post", color=line.get_color(), lw=1.2)
        span = steps[-1]["t"] if steps else 1.0
        centers, rate = _rate_series(steps, bin_s or max(span / 150.0, 1.0))
        ax_r.plot(centers, rate, color=line.get_color(), lw=1.2, label=label)
    limits = meta0.get("limits") or {}
    for key, name, style in (("throttle_c", "firmware throttle", "r--"), ("hard_c", "hard (pause)", "m:"),
                             ("soft_c", "soft limit", "k--")):
        if key in limits:
            ax_t.axhline(limits[key], color=style[0], ls=style[1:], lw=0.9, label=f"{name} {limits[key]:g} °C")
    ax_t.set_ylabel("temperature (°C)")
    ax_t.legend(loc="lower right", fontsize=8)
    ax_t.grid(alpha=0.3)
    ax_l.set_yticks(range(len(LEVELS)), LEVELS, fontsize=8)
    ax_l.set_ylabel("level")
    ax_l.grid(alpha=0.3)
    ax_r.set_ylabel("tokens / s")
    ax_r.set_xlabel("time (min)")
    ax_r.grid(alpha=0.3)
    ambient = meta0.get("ambient_c")
    heading = title or (f"{meta0.get('profile', '?')} ({meta0.get('mode', '?')}"
                        + (f", ambient {ambient:g} °C" if ambient is not None else "") + ")")
    fig.suptitle(heading)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
