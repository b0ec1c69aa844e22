"""Thermal telemetry: one JSONL record per step, a live status line, and run summaries.

File format (one JSON object per line): first a ``{"type": "meta", ...}`` record (profile, limits,
ambient, mode, and ``started``: the wall-clock time the run started, ISO-8601 in UTC, e.g.
``"2026-05-04T13:12:09.512+00:00"``, so that a board run's record lines up with other logs at ``started + t``
(a simulated run's ``t`` is simulated time); files written before it have none, :func:`started_at` reads them
as None), then ``{"type": "step", ...}`` records with ``t`` (s since start), ``kind``
(``prefill`` | ``decode`` | ``wait``), ``tokens``, ``duration_s`` (compute), ``wait_s`` (guard wait
before it), ``tok_s``, ``temp_c``, ``zones``, ``level``, ``budget``, ``rate_limit_tok_s``,
``sensor_ok``, ``firmware_limited`` (guarded: the firmware reports under-voltage or throttling now),
``throttled``, ``clock`` (simulated clock fraction) and ``power_w`` when known, and ``nvpmodel`` (a Jetson's power
mode, from jetson-stats or ``/var/lib/nvpmodel/status``: in the meta record as the run starts, in a step record where
it changed since; the mode sets the clocks, so a run slowed by ``nvpmodel -m`` is told from one slowed by heat); a
prefill record (and an embedding or perplexity pass) also ``prompt_tokens`` (the prompt tokens it computed, those
the cache held left out) and ``prompt_tok_s`` (their rate over its compute time). Every line is strict
JSON: a number that is not finite (NaN, an infinity) is written as ``null``.

``budget`` is the compute budget in force, the largest mean fraction of FFN blocks the power gates may run: the lower
of the one set with ``--compute-budget`` (1 when none is) and the guard's (1 in normal, ``warm_budget`` 0.75 in warm,
``hot_budget`` 0.5 in hot and critical and with a failed sensor; an unguarded run has none); 1.0 where no power gate is
in use (a bundle without gates, or gating off): every FFN block then runs, whatever the guard's level. Older files held
the guard's budget alone, also where no gate was in use.

A step record books the interval since the record before it (the run's start for the first), up to
its ``t``: its tokens, compute and wait, and the guard state that interval passed in (``level``,
``paused``, ``budget``, ``rate_limit_tok_s`` ...: for a prefill or decode record the state read
before the step, for a "wait" record the state of the chunks it books); ``temp_c``, ``zones`` and
``throttled`` are the last reading (for a prefill or decode, the one taken after the step).
:func:`summarize` charges each interval to its record's level and ``thermal report`` draws the level
the same way (a step drawn back to the record before), as it bins each record's tokens ``(start,
end]``. Meta ``version`` 2; version 1 files wrote a prefill or decode record's guard state read after
the step, so their time at level is off by that step where the level changed during it (a long
prefill counted at the level it led to), and they read as they did before.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import numpy as np

from edgesdk.errors import EdgeSDKError

# The guard-state fields of a step record whose change makes the file durable (Telemetry._sync).
DURABLE_KEYS = ("level", "paused", "sensor_ok", "firmware_limited")


class TelemetryWriteError(EdgeSDKError):
    """A step record could not be written (a full disk, a file-size limit): the file keeps the records
    written before it, and no further ones are written."""


def _finite(value: object) -> object:
    """``value`` with every NaN or infinite float (in dicts, lists and tuples) written as None (null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


class Telemetry:
    """Collects step records in memory and, with a path, writes them to a JSONL file: a new one, or with
    ``append`` after the runs already in it (each run starts with its meta record, and the report draws each).

    A file that cannot be created, or whose meta record cannot be written, raises the OSError (the
    caller names its option); a step record that cannot be written later (a disk that filled up during the run)
    is a :class:`TelemetryWriteError`, once, and the file is closed, keeping every whole record before it. The
    error is raised, or with ``on_write_error`` handed to it and the step goes on: a run or a server whose records
    are a side line (``run`` / ``serve --telemetry``) keeps generating, and keeps the guard, without them.
    """

    def __init__(self, path: str | Path | None = None, meta: dict | None = None, keep: bool = True,
                 append: bool = False, on_write_error: Callable[[TelemetryWriteError], None] | None = None):
        self.path = Path(path) if path else None
        self.keep = keep
        self.on_write_error = on_write_error
        self.records: list[dict] = []
        self._file: IO[str] | None = None
        self.meta = {"type": "meta", "version": 2, "started": _utc_now(), **(meta or {})}
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # line-buffered: a killed run (SIGKILL, power cut) keeps every record it wrote
            self._file = open(self.path, "a" if append else "w", encoding="utf-8", buffering=1)  # closed in close()
            try:
                if append:
                    self._end_last_line()
                self._write(self.meta)
            except OSError:
                self._drop()
                raise
        self._written = 0  # step records in the file
        self._state: tuple | None = None  # the guard state (DURABLE_KEYS) of the last step record written

    def _write(self, record: dict) -> None:
        if self._file is not None:
            try:
                line = json.dumps(record, separators=(",", ":"), allow_nan=False)
            except ValueError:  # NaN or an infinity: JSON (RFC 8259) has no such number; jq and others refuse the line
                line = json.dumps(_finite(record), separators=(",", ":"))
            self._file.write(line + "\n")

    def _end_last_line(self) -> None:
        """Before a run appended to a file: end a last line a killed run left cut (its meta record would otherwise
        join it, and both would be lost to the report, which skips a line it cannot read)."""
        size = self.path.stat().st_size
        if size:
            with open(self.path, "rb") as handle:
                handle.seek(size - 1)
                if handle.read(1) != b"\n":
                    self._file.write("\n")

    def _drop(self) -> None:
        """Close a file that failed a write; its buffer cannot be written either (close raises again)."""
        file, self._file = self._file, None
        try:
            file.close()
        except OSError:
            pass

    def step(self, **record) -> dict:
        record = {"type": "step", **record}
        if self.keep:
            self.records.append(record)
        try:
            self._write(record)
        except OSError as error:
            self._drop()
            failed = TelemetryWriteError(
                f"telemetry file {self.path}: cannot write step record {self._written + 1} "
                f"({error.strerror or error}); it keeps the meta record and the {self._written} step records "
                "before it, and no further ones are written",
                "free space on that disk (or raise the file-size limit, ulimit -f), or record to a file on "
                "another disk (--telemetry FILE, --telemetry-dir DIR)")
            failed.__cause__ = error
            if self.on_write_error is None:
                raise failed from error
            self.on_write_error(failed)
            return record
        self._written += 1
        state = tuple(record.get(key) for key in DURABLE_KEYS)
        if state != self._state:
            self._state = state
            self._sync()
        return record

    def _sync(self) -> None:
        """Make the records written so far durable (``fsync(2)``): a record written line-buffered reaches the
        kernel at once, so a killed run keeps it, but a power cut (where a board's thermal trouble ends: the
        supply's brown-out, the critical trip's shutdown) loses what the page cache has not written back, up to
        ~30 s on Linux (``vm.dirty_expire_centisecs`` 3000), the very records that show how it got there. Synced
        on every change of the guard's state (level, pause, sensor, firmware flags: at most one per ``min_dwell_s``,
        10 s, for the level) and at close, not per record: an fsync costs 0.5 ms on a virtio disk and 5-50 ms on
        an SD card, 1-100 % of a 30 ms decode step, against ~15 µs for a line-buffered write. Best effort: a file
        that cannot be synced (a pipe, ``/dev/stdout``: EINVAL) keeps its records as written."""
        if self._file is None:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        if self._file is not None:
            self._sync()
            self._file.close()
            self._file = None


def _utc_now() -> str:
    """The wall-clock time now, ISO-8601 in UTC to the millisecond (``2026-05-04T13:12:09.512+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def started_at(meta: dict) -> datetime | None:
    """When a run started (its meta record's ``started``, in UTC), or None for a file written before the field
    existed, or one whose field is not an ISO-8601 time with a UTC offset (a hand-edited line)."""
    text = meta.get("started")
    if not isinstance(text, str):
        return None
    if text.endswith(("Z", "z")):  # Python 3.10's fromisoformat takes only the +00:00 form
        text = text[:-1] + "+00:00"
    try:
        started = datetime.fromisoformat(text)
    except ValueError:
        return None
    return started.astimezone(timezone.utc) if started.tzinfo is not None else None


def records(path: str | Path) -> Iterator[dict]:
    """The JSON-object records of a telemetry file, read a line at a time: unparsable lines, and lines that
    are not a JSON object, are skipped (a killed run can leave a torn, even non-UTF-8, last line). A byte order
    mark before a line is ignored, as RFC 8259 lets a reader do (a file saved by a Windows editor starts with one,
    and files joined with ``cat`` keep each one's): Python's json refuses it, and the run's meta record was lost. A file
    that cannot be read (permissions, a directory, gone) is an EdgeSDKError naming it."""
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    record = json.loads(line.removeprefix("\ufeff"))
                except (ValueError, RecursionError):  # JSONDecodeError, an integer past 4,300 digits, deep nesting
                    continue
                if isinstance(record, dict):
                    yield record
    except OSError as error:
        raise EdgeSDKError(f"telemetry file {path} cannot be read ({error.strerror or error})",
                           f"pass a telemetry JSONL file this user may read (check that {path} exists and "
                           "its permissions), as written by 'edgesdk run --telemetry FILE'") from error


def load(path: str | Path) -> tuple[dict, list[dict]]:
    """(meta, step records) of a telemetry file's last run (a run appends after the runs before it, each from its
    meta record on), its lines read as :func:`records` reads them."""
    meta, steps = {}, []
    for record in records(path):
        if record.get("type") == "meta":
            meta, steps = record, []
        elif record.get("type") == "step":
            steps.append(record)
    return meta, steps


@dataclass
class RunSummary:
    """What a run did, from its step records (times in the run's clock, simulated or real)."""

    seconds: float
    tokens: int
    requests: int
    max_temp_c: float | None
    throttle_s: float
    # Over each decoded token's gap, a multi-token step's time shared by its tokens (_inter_token_gaps); None: no
    # decode step (nothing to time)
    p95_inter_token_ms: float | None
    mean_inter_token_ms: float | None
    # Over the requests that reached their first token (a prompt abandoned, or cut by the horizon, inside its prefill
    # steps is a request with none); None: no request did
    mean_ttft_s: float | None
    mean_tok_s: float
    sustained_tok_s: float  # over the last third of the run
    paused_s: float
    levels_s: dict[str, float]

    def to_json(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def _prompts(work: list[dict]) -> list[tuple[float, bool]]:
    """Each request's prompt: (the compute and wait of its prefill records, whether it reached its first token). A
    prompt the guard prefills in steps (:meth:`~edgesdk.thermal.guard.Guard.prefill_chunk`) writes several records,
    each but the last with the ``prompt_left`` it leaves (> 0); one record a request where it has none (an unguarded
    run, older files). A prompt whose last step ran (``prompt_left`` 0, or none) has its first token where that step
    yielded one (``tokens`` 1): a pass that yields none (an embedding, a perplexity window, a completion of
    ``max_tokens`` 0, a first pick that failed) is a request without a first token, left out of ``mean_ttft_s``.

    A step goes on the prompt of the step before it where it is one of a prompt's steps (has ``prompt_left``), not its
    first (``prompt_step`` 1), and takes what that one left (its ``prompt_tokens`` plus its own ``prompt_left`` are
    the ``prompt_left`` before it). A prefill record that does not is the next request's: the steps before it were a
    prompt abandoned between its steps (serve's client gone, or a board that never cooled, which serve answers 503
    and goes on from), a request of its own with no first token, as a run cut inside a prompt's steps is, not summed
    into the next request's first-token time (a retry whose abandoned steps the prompt cache serves takes exactly
    the tokens they left)."""
    prompts, pending, expected = [], None, None  # the open prompt's time so far, and the prompt_left its last step left
    for r in work:
        if r["kind"] != "prefill":
            continue
        left = r.get("prompt_left")
        if pending is not None and (left is None or r.get("prompt_step") == 1
                                    or r.get("prompt_tokens", 0) + left != expected):
            prompts.append((pending, False))  # an abandoned prompt's steps
            pending = None
        pending = (pending or 0.0) + r["duration_s"] + r["wait_s"]
        expected = left
        if not expected:
            prompts.append((pending, r["tokens"] > 0))
            pending = None
    if pending is not None:  # a run cut inside a prompt's steps: no first token
        prompts.append((pending, False))
    return prompts


def _inter_token_gaps(work: list[dict]) -> np.ndarray:
    """The gap before each decoded token: a decode record's compute and wait shared evenly by the ``tokens`` it
    yielded (a prompt-lookup or draft-model pass yields several at once: 3 tokens in 60 ms are three 20 ms gaps,
    as llama.cpp's ``eval time = ... ms per token`` divides its decode time by the tokens), one gap each. A
    decode record of no token (none is written, but a hand-made file may have one) is one gap of its time."""
    decodes = [r for r in work if r["kind"] == "decode"]
    counts = np.array([max(r["tokens"], 1) for r in decodes], dtype=np.int64)  # (records,)
    per_token = np.array([r["duration_s"] + r["wait_s"] for r in decodes], dtype=np.float64) / counts
    return np.repeat(per_token, counts)  # (decoded tokens,)


def summarize(records: list[dict], horizon_s: float | None = None, throttle_s: float | None = None,
              max_temp_c: float | None = None) -> RunSummary:
    """Summary of step records up to ``horizon_s`` (default: the last record).

    ``throttle_s`` and ``max_temp_c``, when given, are the board's own (a simulated board's), in place of what the
    records read: a record reads the board at its step's end only, and a step the horizon cut short has none (a long
    prompt's prefill could heat a board past its shutdown point with no record to say so).

    ``levels_s``: each record's interval (from the record before it) at the record's level (see the
    module docstring); time past the last record up to the horizon at the last record's level. An idle
    gap between requests, when the hook reads nothing, counts at the level of the next request's first
    record."""
    steps = [r for r in records if r.get("type", "step") == "step"]
    end = horizon_s if horizon_s is not None else (steps[-1]["t"] if steps else 0.0)
    inside = [r for r in steps if r["t"] <= end + 1e-9]
    work = [r for r in inside if r["kind"] in ("prefill", "decode")]
    gaps = _inter_token_gaps(work)
    prompts = _prompts(work)
    ttft = [seconds for seconds, answered in prompts if answered]
    temps = [r["temp_c"] for r in inside if r.get("temp_c") is not None]
    tokens = sum(r["tokens"] for r in work)
    late = sum(r["tokens"] for r in work if r["t"] >= end * 2 / 3)
    levels: dict[str, float] = {}
    previous_t = 0.0
    for r in inside:
        levels[r["level"]] = levels.get(r["level"], 0.0) + r["t"] - previous_t
        previous_t = r["t"]
    if inside and end > previous_t:  # idle after the last step (--think-s) up to the horizon: its level held
        levels[inside[-1]["level"]] += end - previous_t
    if throttle_s is None:
        throttle_s, previous_t = 0.0, 0.0
        for r in inside:
            throttle_s += (r["t"] - previous_t) if r.get("throttled") else 0.0
            previous_t = r["t"]
    # A pause is booked in its "wait" records; the step after it carries the same wait again. Critical with a failed
    # sensor paces instead of pausing (records without "paused", older ones, read it from level and sensor).
    paused = sum(r["wait_s"] for r in inside if r["kind"] == "wait"
                 and r.get("paused", r["level"] == "critical" and r.get("sensor_ok", True)))
    return RunSummary(
        seconds=end, tokens=tokens, requests=len(prompts),
        max_temp_c=max_temp_c if max_temp_c is not None else max(temps) if temps else None,
        throttle_s=throttle_s,
        p95_inter_token_ms=float(np.percentile(gaps, 95) * 1e3) if gaps.size else None,
        mean_inter_token_ms=float(np.mean(gaps) * 1e3) if gaps.size else None,
        mean_ttft_s=float(np.mean(ttft)) if ttft else None,
        mean_tok_s=tokens / end if end else 0.0, sustained_tok_s=late / (end / 3) if end else 0.0,
        paused_s=paused, levels_s={k: round(v, 2) for k, v in levels.items()},
    )


class StatusLine:
    """A live thermal status on stderr that never mixes into the text streamed on stdout.

    * stderr not a terminal (a log file): a plain line when the level changes and every 10 s; when
      stdout goes to the very same file or pipe (``run ... 2>&1 | tee log``), "between": between answers, and as
      whole lines where they cannot split a line of text: before an answer's first streamed byte (when the level
      changes, and every 10 s while the guard holds it back) and when a pause starts or ends (mid-answer after a line
      break: a pause of minutes must show, where before the pipe got nothing until the answer ended).
    * stderr a terminal, stdout elsewhere: one line redrawn in place with ``\\r``; with ``TERM=dumb`` or
      ``unknown`` (Emacs' shell, CI logs), a terminal without cursor control, the plain lines of a log instead,
      as Rich's ``Console.is_dumb_terminal`` falls back (``NO_COLOR`` is about colour, not cursor control,
      and the status has no colour to drop).
    * both on the same terminal: the bottom row is reserved with a scroll region (DECSTBM) and the
      status is drawn there with the cursor saved and restored, so streamed text scrolls above it.
      With no usable terminal size (a serial console reports 0 rows), "between" as for a shared pipe: a line redrawn
      in place would wipe the row the answer streams on. The size is read again at
      every draw: after the terminal is resized, the scroll region is set again for its new bottom row.
    * no stderr (closed: ``2>&-``, a daemon's), or one that refuses a write (a full disk under ``2> run.log``, a
      pipe whose reader left): no status line, from the start or from the write refused on ("off"); the run goes on,
      as it does without ``--watch-thermal``'s status (the line only shows what the guard does; before, the
      refused write ended the run, a closed stderr at its first step).

    On a terminal the live line is cut to the terminal's width - 1: a longer one would wrap, and
    each redraw would leave a copy of its first row behind.
    """

    def __init__(self, stream: IO[str] | None = None, stdout: IO[str] | None = None, min_interval_s: float = 0.25):
        self.stream = stream or sys.stderr
        self.stdout = stdout or sys.stdout
        self.min_interval_s = min_interval_s
        self._last_draw = 0.0
        self._last_level = None
        self._last_log = 0.0
        self._text = ""
        self._warnings: list[str] = []
        self._answering = False  # a step ran since the last between_answers: stdout may be mid-line
        self._streamed = False  # "between": a step whose tokens are streamed ran since the last between_answers
        self._paused = False  # the guard's pause as the last update said it
        self._line_at: float | None = None  # "between": when the answer's last whole status line (or first update) was
        self.mode = self._pick_mode()
        self._rows = 0
        if self.mode == "bar":
            self._rows = self._lines()
            if self._rows < 3:
                self.mode = "between"
            else:
                self._emit(f"\n\x1b7\x1b[1;{self._rows - 1}r\x1b8\x1b[1A")

    def _same_target(self) -> bool | None:
        """Do stderr and stdout lead to the same terminal, file or pipe? None when unknown."""
        try:
            err, out = os.fstat(self.stream.fileno()), os.fstat(self.stdout.fileno())
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return None
        return (err.st_dev, err.st_ino) == (out.st_dev, out.st_ino)

    def _pick_mode(self) -> str:
        if self.stream is None:  # stderr closed (sys.stderr is None)
            return "off"
        try:
            err_tty = self.stream.isatty()
            out_tty = self.stdout.isatty()
        except (AttributeError, ValueError):
            return "log"
        same = self._same_target()
        term = os.environ.get("TERM", "")
        dumb = term.lower() in ("dumb", "unknown")  # no cursor control: \x1b[2K shows as junk
        if not err_tty:
            return "between" if same else "log"  # one log file for both: never split a line of text
        if not out_tty or same is False:
            return "log" if dumb else "inplace"
        return "bar" if term and not dumb else "between"

    def _emit(self, text: str) -> None:
        """Write ``text`` to stderr; one it refuses (OSError: a full disk, a closed pipe; ValueError: a closed file)
        turns the status line off."""
        if self.mode == "off":
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.mode = "off"

    def _columns(self) -> int:
        """The terminal's width in columns (0 when unknown): stderr's own, else $COLUMNS or stdout's."""
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return shutil.get_terminal_size((0, 0)).columns

    def _lines(self) -> int:
        """The terminal's height in rows (0 when unknown): stderr's own, else $LINES or stdout's."""
        try:
            return os.get_terminal_size(self.stream.fileno()).lines
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return shutil.get_terminal_size((0, 0)).lines

    def _follow_resize(self) -> None:
        """Bar mode: when the terminal's height changed since the last draw (SIGWINCH), clear the old status row
        where it is still on screen and set the scroll region (DECSTBM) for the new bottom row; kept from the
        start, the region left streamed text scrolling over the status, or a blank row under it."""
        rows = self._lines()
        if rows == self._rows or rows < 3:
            return
        old, self._rows = self._rows, rows
        clear = f"\x1b[{old};1H\x1b[2K" if old < rows else ""
        self._emit(f"\x1b7{clear}\x1b[1;{rows - 1}r\x1b8")

    def _fit(self, text: str) -> str:
        """``text`` cut to the terminal's width - 1, so the live line never wraps."""
        columns = self._columns()
        return text[:columns - 1] if columns > 1 else text

    def update(self, text: str, level: str | None = None, force: bool = False, paused: bool | None = None,
               streams: bool = False) -> None:
        """Show ``text``, the status after a step; ``level`` and ``paused`` are the guard's now (None: unknown), and
        ``streams`` says that the step's tokens go to stdout right after this call."""
        if self.mode == "off":
            return
        now = time.monotonic()
        self._text = text
        self._answering = True
        known = self._last_level is not None
        changed = level is not None and level != self._last_level
        self._last_level = level if level is not None else self._last_level
        pause_changed = paused is not None and paused != self._paused
        self._paused = paused if paused is not None else self._paused
        if self.mode == "between":
            self._between_update(text, now, pause_changed, changed and known)
            self._streamed = self._streamed or streams
            return
        if self.mode == "log":
            if changed or force or now - self._last_log >= 10.0:
                self._last_log = now
                self._emit(f"edgesdk thermal: {text}\n")
            return
        if not force and not changed and now - self._last_draw < self.min_interval_s:
            return
        self._last_draw = now
        self.stdout.flush()
        if self.mode == "inplace":
            self._emit(f"\r\x1b[2K{self._fit(text)}")
        else:
            self._follow_resize()
            self._emit(f"\x1b7\x1b[{self._rows};1H\x1b[2K{self._fit(text)}\x1b8")

    def _between_update(self, text: str, now: float, pause_changed: bool, level_changed: bool) -> None:
        """"between" (stdout shares stderr's pipe or a terminal without a size): a whole status line, with the
        warnings pending, where no answer's text is split by it. Before the answer's first streamed byte, when the
        level changes and every 10 s (the guard holding the first token back); a pause that starts or ends, also
        mid-answer, after a line break: the guard's longest wait, minutes, was silent till the answer ended."""
        if self._line_at is None:
            self._line_at = now
        early = not self._streamed and (level_changed or now - self._line_at >= 10.0)
        if not (pause_changed or early):
            return
        self._line_at = now
        if self._streamed:  # stdout may be mid-line: end it first, so the status stays a line of its own
            self.stdout.flush()
            self._emit("\n")
        self._print_warnings()
        self._emit(f"edgesdk thermal: {text}\n")

    def warn(self, message: str) -> None:
        """A warning: printed at once in a log, else shown in the live line and printed between answers
        (once: "between" has no live line, and the status it prints there stays the thermal status)."""
        if self.mode == "off":  # stderr refused a write or is closed: the warning has nowhere to go
            return
        if self.mode == "log":
            self._emit(f"edgesdk thermal: warning: {message}\n")
            return
        self._warnings.append(message)
        if self.mode == "between":
            return
        answering = self._answering  # a warning is not streamed text
        self.update(f"warning: {message}", force=True)
        self._answering = answering

    def between_answers(self) -> None:
        """Called after an answer's closing newline: pending warnings (and the 'between' status) print
        here. In place, the live line is cleared first: what follows (warnings, --stats, the next
        prompt) starts on a clean row instead of after the status."""
        if self.mode == "inplace":
            self._emit("\r\x1b[2K")
        self._print_warnings()
        if self.mode == "between" and self._text:
            self._emit(f"edgesdk thermal: {self._text}\n")
        self._answering = self._streamed = False
        self._line_at = None

    def _print_warnings(self) -> None:
        """Print the warnings not printed yet, each on its own line."""
        for message in self._warnings:
            self._emit(f"edgesdk thermal: warning: {message}\n")
        self._warnings.clear()

    def close(self) -> None:
        """Clear the live line, then print the warnings still pending: a run stopped mid-answer
        (Ctrl-C, SIGTERM, an error) never reached :meth:`between_answers`. When stdout shares the
        target, the cursor may be mid-way through streamed text: the warnings start on a new line."""
        if self.mode == "inplace":
            self._emit("\r\x1b[2K")
        elif self.mode == "bar":
            rows = self._lines()
            self._emit(f"\x1b7\x1b[{rows if rows >= 3 else self._rows};1H\x1b[2K\x1b[r\x1b8")
        if self._warnings and self.mode in ("bar", "between") and self._answering:
            self.stdout.flush()
            self._emit("\n")
        self._print_warnings()
