"""``edgesdk thermal report``: a PNG of temperature, guard level and tok/s over time, and the compute budget where
a run's budget dropped below 1 (a power-gated run under the guard).

matplotlib is imported here only (extra ``[report]``); the board runtime never imports this module.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.thermal.telemetry import records

LEVELS = ["unguarded", "normal", "warm", "hot", "critical"]


LARGEST = 1e12  # past any run's seconds, a step's tokens or a temperature; matplotlib cannot scale an axis to 1e308


def _number(value: object) -> float | None:
    """``value`` as a finite float, or None (a missing, string, bool, NaN, infinite or absurdly large field)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= LARGEST:
        return None
    return float(value)


# A lone UTF-16 surrogate: how Python holds a byte of a file name that is not UTF-8 (os.fsdecode: surrogateescape)
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _plain(text: str) -> str:
    """``text`` shown as written: matplotlib reads text between two ``$`` as math, and raises on bad math. A lone
    surrogate is shown as U+FFFD, the replacement character: one comes from a file name that is not
    UTF-8 (``r\\xe9sultat.jsonl`` written on a Latin-1 system, whose stem is the run's label) or a ``\\udce9`` escape
    in a label, and FreeType refused the whole figure over it (a TypeError from ``FT2Font.set_text``)."""
    return LONE_SURROGATE.sub("\ufffd", text).replace("$", r"\$")


def _plotted(record: dict) -> dict | None:
    """The fields of one step record a plot uses (``t``, ``tokens``, ``temp_c``, ``level``, ``budget``), or None where
    ``t`` or ``tokens`` is not a finite, non-negative number (a garbled or hand-edited line is skipped, as
    :func:`~edgesdk.thermal.telemetry.records` skips torn ones). Only
    these are kept: a whole record (its zones, guard state ...) held for each of a long run's million
    steps took over ten times the file's size in memory."""
    t, tokens = _number(record.get("t")), _number(record.get("tokens"))
    if t is None or tokens is None or t < 0 or tokens < 0:
        return None
    level = record.get("level")
    return {"t": t, "tokens": tokens, "temp_c": _number(record.get("temp_c")),
            "level": level if level in LEVELS else None, "budget": _number(record.get("budget"))}


def _by_time(steps: list[dict]) -> list[dict]:
    """``steps`` sorted by ``t`` in place (stable: records of one instant keep their order)."""
    steps.sort(key=lambda step: step["t"])
    return steps


def _read_runs(path: str | Path) -> list[tuple[dict, list[dict]]]:
    """The runs of one telemetry file: (meta, usable step records) each, read a line at a time.

    Lines are read as :func:`~edgesdk.thermal.telemetry.records` reads them (a torn, non-JSON or non-object
    line is skipped), one at a time, keeping only what is plotted (:func:`_plotted`): ``load`` holds the whole
    text and every whole record, about 11 times the file's size (a day of decode steps is a GB file). A
    meta record after step records begins another run: files joined with ``cat`` (a board's runs gathered
    in one log) restart their time at 0, and read as one run, their lines went back in time and two runs'
    tokens were summed into each rate bin (twice the tok/s). A run with no usable step record before the next meta
    record (a run stopped before its first step, then one restarted on the same file) is a run of its own: folded into
    the next, it vanished from the legend and every later run took its number."""
    runs: list[tuple[dict, list[dict]]] = []
    meta: dict = {}
    steps: list[dict] = []
    for record in records(path):
        if record.get("type") == "meta":
            if meta or steps:  # a run began before this one: it ends here, with or without step records
                runs.append((meta, _by_time(steps)))
                steps = []
            meta = record
        elif record.get("type") == "step" and (step := _plotted(record)) is not None:
            steps.append(step)
    runs.append((meta, _by_time(steps)))
    return runs


def telemetry_files(paths: list[str | Path]) -> list[Path]:
    """``paths`` with each directory replaced by the telemetry files in it, its ``*.jsonl`` files by name (as
    ``thermal plan --telemetry-dir`` leaves a guarded and an unguarded run there), for ``thermal report DIR`` and
    :func:`render`; a directory holding none is an EdgeSDKError naming it."""
    files: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(child for child in path.glob("*.jsonl") if child.is_file())
        if not found:
            raise EdgeSDKError(f"{path} is a directory with no telemetry file (*.jsonl) in it",
                               "pass the JSONL files that 'edgesdk run --telemetry FILE' or 'edgesdk thermal plan "
                               "--telemetry-dir DIR' wrote, or the directory they are in, e.g. edgesdk thermal "
                               "report telemetry/run.jsonl")
        files.extend(found)
    return files


def _rate_series(steps: list[dict], bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per second in bins of ``bin_s`` seconds up to the last record (each bin's middle in seconds, rate).

    A record's tokens count in the bin its ``t`` (the step's end) closes, ``(start, end]``. The last
    bin ends at the last record: shorter than ``bin_s`` by a half or more, it joins the bin before;
    every bin is divided by its real width (a full width would show a false drop at the end).
    """
    times = np.array([r["t"] for r in steps], dtype=float)
    end = float(times.max()) if len(times) else 0.0
    if end <= 0.0:
        return np.zeros(0), np.zeros(0)
    count = max(int(np.ceil(end / bin_s - 1e-9)), 1)
    edges = np.minimum(np.arange(count + 1) * bin_s, end)
    edges[-1] = end
    if count > 1 and edges[-1] - edges[-2] < bin_s / 2:
        edges = np.delete(edges, -2)
    index = np.clip(np.searchsorted(edges, times, side="left") - 1, 0, len(edges) - 2)
    tokens = np.bincount(index, weights=[r["tokens"] for r in steps], minlength=len(edges) - 1)
    return (edges[:-1] + edges[1:]) / 2, tokens / np.diff(edges)


def _level_steps(steps: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """The guard level (index in ``LEVELS``) to draw with ``where="pre"``: each record's level over the
    interval it books, from the record before it (the run's start for the first) up to its ``t``, as
    :func:`~edgesdk.thermal.telemetry.summarize` charges it; NaN (drawn as a gap) where the level is not
    one of ``LEVELS``. Times in seconds."""
    # a level this code does not know (a newer edgesdk's, a garbled field) is a gap, not "unguarded"
    return _interval_steps(steps, [LEVELS.index(r["level"]) if r.get("level") in LEVELS else np.nan for r in steps])


def _budget_steps(steps: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """The compute budget in force (the largest mean fraction of FFN blocks the power gates may run), drawn as
    :func:`_level_steps` draws the level: each record's over the interval it books; NaN (a gap) where a record has
    none."""
    return _interval_steps(steps, [np.nan if r.get("budget") is None else r["budget"] for r in steps])


def _interval_steps(steps: list[dict], values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Times and ``values`` (one per record) to draw with ``where="pre"``, the first record's value from the run's
    start."""
    times = [r["t"] for r in steps]
    if times and times[0] > 0:  # the first record's interval starts with the run
        times, values = [0.0, *times], [values[0], *values]
    return np.array(times, dtype=float), np.array(values, dtype=float)


def _budget_dropped(runs: list[tuple[tuple[str, str], dict, list[dict]]]) -> bool:
    """Whether any record of ``runs`` holds a compute budget other than 1: a power-gated run whose budget the guard
    (or --compute-budget) lowered. Every record carries one, 1.0 where no gate is in use, so a panel of it is drawn
    only then."""
    return any(step.get("budget") is not None and step["budget"] != 1.0 for _, _, steps in runs for step in steps)


def _output_path(out: str | Path, formats: dict[str, str], texsystem: str = "xelatex") -> Path:
    """``--out`` checked before plotting (its directory is made later, :func:`_make_parent`): ``.png`` added when it
    has no suffix; a format matplotlib cannot write, or a directory, is an EdgeSDKError. So is ``.pgf`` where
    ``texsystem`` (matplotlib's ``pgf.texsystem``) is not on PATH: the pgf backend runs it to measure every text, and raised a
    RuntimeError once the whole figure was drawn."""
    out = Path(out)
    if out.is_dir():
        raise EdgeSDKError(f"--out {out} is a directory", f"pass a file path, e.g. -o {out / 'run.png'}")
    if not out.suffix:
        out = out.with_name(out.name + ".png")
        if out.is_dir():
            raise EdgeSDKError(f"--out {out} is a directory", f"pass a file path, e.g. -o {out / 'run.png'}")
    if out.suffix[1:].lower() not in formats:
        raise EdgeSDKError(f"--out {out}: matplotlib cannot write {out.suffix!r} files",
                           f"use .png (or one of {', '.join('.' + f for f in sorted(formats))}), e.g. -o run.png")
    if out.suffix[1:].lower() == "pgf" and shutil.which(texsystem) is None:
        raise EdgeSDKError(f"--out {out}: matplotlib writes '.pgf' files with {texsystem} (its pgf.texsystem), "
                           "which is not on PATH",
                           f"install a TeX distribution that provides {texsystem}, or use .png, .pdf or .svg, "
                           "e.g. -o run.png")
    return out


def _refuse_overwriting_an_input(out: Path, paths: list[str | Path]) -> None:
    """Refuse an ``out`` that is one of the telemetry files read: a telemetry file named with an image suffix
    (``run.png``) is its own default ``--out``, and the figure was written over the records it was drawn from."""
    if not out.exists():
        return
    for path in paths:
        if Path(path).exists() and out.samefile(path):  # a missing input is named where it is read
            raise EdgeSDKError(f"--out {out} is the telemetry file {path} itself, which the figure would overwrite",
                               f"pass another path, e.g. -o {out.with_name(out.stem + '-report.png')}")


def _make_parent(out: Path) -> None:
    """Create ``--out``'s directory, once there is a figure to write in it: made while ``--out`` was checked, it was
    left behind, empty, by a report refused for want of step records."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EdgeSDKError(f"--out {out}: cannot create the directory {out.parent} ({error.strerror or error})",
                           "pass a path whose parents are directories (or can be created), not files") from error


def _labels(runs: list[tuple[tuple[str, str], dict, list[dict]]]) -> list[str]:
    """Each run's legend label: its meta ``label``, else its name's stem (the file's stem, and "run N" for
    each run of a file that holds several: :func:`_read_runs`). A label two runs share (two plans'
    "guarded" runs at different ambients) gets the stem, or the file's path, so the lines can be told
    apart."""
    labels = [str(meta.get("label") or stem) for (stem, _), meta, _ in runs]
    stems = [stem for (stem, _), _, _ in runs]
    return [f"{label} ({stem if stems.count(stem) == 1 else where})" if labels.count(label) > 1 else label
            for label, stem, ((_, where), _, _) in zip(labels, stems, runs, strict=True)]


def matplotlib_fix() -> str:
    """How to add matplotlib to the Python that runs edgesdk, named by its path: on a board the runtime is a venv of
    its own, made from a wheel the deploy sent, where ``pip install 'edgesdk[report]'`` asked the index for an
    edgesdk it does not hold."""
    return f"{shlex.quote(sys.executable or 'python3')} -m pip install matplotlib"


def _first_json_line(path: str | Path) -> tuple[int, str, bool] | None:
    """(number, text, parses) of the first non-blank line of ``path`` when no line of it is a JSON object (what a
    telemetry record is), read as :func:`~edgesdk.thermal.telemetry.records` reads them; None where one is, where the
    file holds no non-blank line, or where it cannot be read (``records`` names that)."""
    first = None
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                text = line.removeprefix("\ufeff").strip()
                if not text:
                    continue
                try:
                    value, parses = json.loads(text), True
                except (ValueError, RecursionError):
                    value, parses = None, False
                if isinstance(value, dict):
                    return None
                first = first or (number, text, parses)
    except OSError:
        return None
    return first


def _refuse_non_telemetry(path: str | Path) -> None:
    """Refuse a file none of whose lines is a JSON object, that is no telemetry file (a prompt file, a PNG): it read as
    one with "no step records (with a numeric t and tokens)", which sent its user to look for a missing field. A file
    whose only line is a record torn where a run was killed (it starts with '{') is a telemetry file, and left to that
    message."""
    first = _first_json_line(path)
    if first is None or first[1].startswith("{"):
        return
    number, text, parses = first
    shown = text if len(text) <= 40 else text[:37] + "..."
    raise EdgeSDKError(f"{path} is not a telemetry file: line {number} ({shown!r}) is "
                       f"{'JSON but not an object' if parses else 'not JSON'}, and no line is a JSON record; "
                       "telemetry is JSON lines, one object per line",
                       "pass the JSONL file that 'edgesdk run ... --telemetry FILE' wrote, or the directory "
                       "'edgesdk thermal plan --telemetry-dir DIR' wrote its runs in")


def _named_runs(path: str | Path) -> list[tuple[tuple[str, str], dict, list[dict]]]:
    """:func:`_read_runs` of one file, each run named (stem, path) for :func:`_labels`: a file of one run by
    the file, each run of a file of several (joined with ``cat``) as "run N" of it."""
    path = Path(path)
    runs = _read_runs(path)
    if len(runs) == 1:
        return [((path.stem, str(path)), *runs[0])]
    return [((f"{path.stem} run {n}", f"{path} run {n}"), meta, steps) for n, (meta, steps) in enumerate(runs, 1)]


def _heading(metas: list[dict]) -> str:
    """The figure's title from the plotted runs' meta records: a profile, mode or ambient they do not
    share is listed ("ambient 25 / 35 °C"), not taken from the first file alone."""
    def shared(values: list) -> str:
        return " / ".join(dict.fromkeys(values))

    ambients = [f"{value:g}" for value in (_number(meta.get("ambient_c")) for meta in metas) if value is not None]
    return (f"{shared([str(meta.get('profile', '?')) for meta in metas])} "
            f"({shared([str(meta.get('mode', '?')) for meta in metas])}"
            + (f", ambient {shared(ambients)} °C" if ambients else "") + ")")


# The time axis's unit by the longest run's span: below TIME_UNITS[i]'s limit, its unit (seconds, minutes, hours)
TIME_UNITS = ((120.0, "s", 1.0), (7200.0, "min", 60.0), (float("inf"), "h", 3600.0))


def _time_unit(runs: list[tuple[tuple[str, str], dict, list[dict]]]) -> tuple[str, float]:
    """The time axis's unit and its seconds, picked by the longest run's span: a sub-second run (a first
    'run -n 8' of a tiny model) drawn in minutes had ticks of 0.000025 min (or a 1e-5 multiplier), a day's in hours."""
    span = max((step["t"] for _, _, steps in runs for step in steps), default=0.0)
    return next((unit, seconds) for limit, unit, seconds in TIME_UNITS if span < limit)


def render(paths: list[str | Path], out: str | Path, bin_s: float | None = None, title: str | None = None) -> Path:
    """Plot one or more telemetry files (e.g. a guarded and an unguarded run) into ``out``; returns the
    path written (``out`` with ``.png`` added when it has no suffix). A directory stands for the telemetry files in
    it (:func:`telemetry_files`), as in ``thermal report DIR``. Drawn on a bare ``Figure``, without pyplot:
    a caller in Python (a notebook) keeps its process's backend and open figures, which ``matplotlib.use`` would
    switch to Agg."""
    paths = telemetry_files(paths)
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise EdgeSDKError(f"thermal report needs matplotlib ({exc})", matplotlib_fix()) from exc
    out = _output_path(out, FigureCanvasAgg.get_supported_filetypes(), matplotlib.rcParams["pgf.texsystem"])
    _refuse_overwriting_an_input(out, paths)
    per_file = [(p, _named_runs(p)) for p in paths]
    for p, file_runs in per_file:
        if not any(steps for _, _, steps in file_runs):
            _refuse_non_telemetry(p)
    runs = [run for _, file_runs in per_file for run in file_runs]
    if not any(steps for _, _, steps in runs):
        raise EdgeSDKError(f"no step records (with a numeric t and tokens) in {', '.join(map(str, paths))}",
                           "record one with 'edgesdk run ... --telemetry FILE' or 'edgesdk thermal plan --telemetry-dir'")
    _make_parent(out)
    budgets = _budget_dropped(runs)
    fig = Figure(figsize=(11, 9.5 if budgets else 8))
    if budgets:
        ax_t, ax_l, ax_b, ax_r = fig.subplots(4, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.2, 1.2, 2]})
    else:
        ax_t, ax_l, ax_r = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.2, 2]})
    # A file with no usable step record (a run stopped before its first step) draws nothing, but keeps a legend
    # entry that says so: dropped without a word, an overlay of a guarded and an unguarded run looked like two
    # runs whose lines coincide. Labels are chosen over every file given, so they match the files named.
    every_label = list(map(_plain, _labels(runs)))
    empty = [label for (_, _, steps), label in zip(runs, every_label, strict=True) if not steps]
    labels = [label for (_, _, steps), label in zip(runs, every_label, strict=True) if steps]
    runs = [run for run in runs if run[2]]
    unit, unit_s = _time_unit(runs)
    colors = []
    for (_, _, steps), label in zip(runs, labels, strict=True):
        t = np.array([r["t"] for r in steps]) / unit_s
        temp = np.array([np.nan if _number(r.get("temp_c")) is None else r["temp_c"] for r in steps], dtype=float)
        # a run with no sensor (or one that never answered) draws no line: its legend entry says why
        unread = " (no temperature recorded)" if np.isnan(temp).all() else ""
        (line,) = ax_t.plot(t, temp, lw=1.2, label=label + unread, **_lone_markers(temp))
        colors.append(line.get_color())
        level_t, level = _level_steps(steps)
        ax_l.step(level_t / unit_s, level, where="pre", color=line.get_color(), lw=1.2)
        if budgets:
            budget_t, budget = _budget_steps(steps)
            ax_b.step(budget_t / unit_s, budget, where="pre", color=line.get_color(), lw=1.2)
        span = max((r["t"] for r in steps), default=1.0)
        centers, rate = _rate_series(steps, bin_s or max(span / 150.0, 1.0))
        # a run shorter than two bins (a first 'run -n 8') has one rate: a line of one point draws nothing
        ax_r.plot(centers / unit_s, rate, color=line.get_color(), lw=1.2, label=label,
                  marker="o" if len(rate) == 1 else None)
    for label in empty:
        ax_t.plot([], [], lw=1.2, label=label + " (no step records)")
    _limit_lines(ax_t, [meta for _, meta, _ in runs], labels, colors)
    ax_t.set_ylabel("temperature (°C)")
    _legend(ax_t)
    ax_t.grid(alpha=0.3)
    ax_l.set_yticks(range(len(LEVELS)), LEVELS, fontsize=8)
    ax_l.set_ylabel("level")
    ax_l.grid(alpha=0.3)
    if budgets:
        ax_b.set_ylim(0, 1.05)
        ax_b.set_ylabel("compute budget\n(FFN blocks)", fontsize=9)
        ax_b.grid(alpha=0.3)
    ax_r.set_ylabel("tokens / s")
    ax_r.set_xlabel(f"time ({unit})")
    ax_r.ticklabel_format(axis="x", style="plain", useOffset=False)  # no "1e-5" or "+1.2e3" beside the ticks
    ax_r.grid(alpha=0.3)
    fig.suptitle(_plain(title or _heading([meta for _, meta, _ in runs])))
    fig.tight_layout()
    try:
        _save_atomically(fig, out)
    except OSError as error:
        raise EdgeSDKError(f"--out {out}: cannot write the figure ({error.strerror or error}); "
                           + ("the file there is left as it was" if out.exists() else "no file was written"),
                           "pass a path in a writable directory with free space, e.g. -o run.png") from error
    return out


def _lone_markers(values: np.ndarray) -> dict:
    """Line options that mark the readings with no reading beside them (a run of one step record, a sensor
    that answered once between failures): a line needs two points, so such a reading drew nothing at all,
    and a run with one reading showed in the legend with no temperature drawn."""
    known = ~np.isnan(values)
    before, after = np.r_[False, known[:-1]], np.r_[known[1:], False]
    lone = np.flatnonzero(known & ~before & ~after)
    return {"marker": "o", "markersize": 4, "markevery": lone.tolist()} if len(lone) else {}


def _legend(ax) -> None:
    """The temperature axis's legend: every line drawn on it, by the label it was given.

    The lines are passed to :meth:`~matplotlib.axes.Axes.legend` by hand: left to pick them itself,
    matplotlib leaves out every artist whose label starts with an underscore (its documented way to hide
    one), so a run read from ``_warm.jsonl`` (its file's stem is its label) was drawn with no legend entry.

    Placed where it covers the fewest points (``loc="best"``) up to :data:`LEGEND_BEST_POINTS` points drawn;
    above, in the lower right corner (a run's end, where the board is warm): matplotlib's search tests every
    point against each place it tries, 3.9 s of a million-point run's 4.3 s render.
    """
    lines = ax.get_lines()
    points = sum(len(line.get_xdata()) for line in lines)
    ax.legend(lines, [line.get_label() for line in lines], fontsize=8,
              loc="best" if points <= LEGEND_BEST_POINTS else "lower right")


# The most points the temperature axis draws for which its legend's place is searched (see :func:`_legend`)
LEGEND_BEST_POINTS = 10_000


LIMIT_LINES = (("throttle_c", "firmware throttle", "r", "--"), ("hard_c", "hard (pause)", "m", ":"),
               ("soft_c", "soft limit", "k", "--"))


def _limit_lines(ax, metas: list[dict], labels: list[str], colors: list[str]) -> None:
    """Each run's limits (its meta ``limits``) as horizontal lines. A limit every run shares is one line
    in its own colour; where the runs' limits differ (two boards' profiles, a board whose trips lowered
    the profile's), each run's line is drawn in that run's colour and named after it: the first file's
    limits are not those of the others."""
    for key, name, color, style in LIMIT_LINES:
        values = [_number(meta["limits"].get(key)) if isinstance(meta.get("limits"), dict) else None
                  for meta in metas]
        if all(value is None for value in values):
            continue
        if len(set(values)) == 1:
            ax.axhline(values[0], color=color, ls=style, lw=0.9, label=f"{name} {values[0]:g} °C")
            continue
        for value, label, run_color in zip(values, labels, colors, strict=True):
            if value is not None:
                ax.axhline(value, color=run_color, ls=style, lw=0.9, label=f"{label}: {name} {value:g} °C")


def _save_atomically(fig, out: Path) -> None:
    """Write the figure to a new file beside ``out`` and rename it over ``out`` once whole (POSIX
    ``rename(2)``, :func:`os.replace`): a full disk, a file-size limit or Ctrl-C while writing leaves
    ``out`` as it was (a report rendered before stays whole), never a truncated image. The new file is
    created as ``open(..., "x")`` creates any file, so it gets the usual permissions (0666 less the umask)."""
    partial = _partial_path(out)
    try:
        with open(partial, "xb") as handle:
            fig.savefig(handle, dpi=110, format=out.suffix[1:].lower())
        os.replace(partial, out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


# Bytes of ``--out``'s name kept in the partial file's name: with the dot, process id, random part and ``.partial`` it
# stays far below NAME_MAX (255 bytes on Linux, macOS and Windows), whatever the length of the name given
PARTIAL_NAME_BYTES = 100


def _partial_path(out: Path) -> Path:
    """The new file :func:`_save_atomically` writes beside ``out``: ``.NAME.PID-RANDOM.partial``, NAME cut to its
    first :data:`PARTIAL_NAME_BYTES` bytes. Whole, a name that ``out`` itself may have (up to NAME_MAX) made this one
    too long, and the figure was refused with "File name too long" though ``out`` could be written."""
    # cut at a whole character: a UTF-8 sequence cut in half is a name APFS refuses and Linux keeps undecodable
    name = out.name.encode("utf-8", "surrogateescape")[:PARTIAL_NAME_BYTES].decode("utf-8", "ignore")
    return out.with_name(f".{name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
