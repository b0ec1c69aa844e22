"""The Python API's streams, close() and perplexity on a board that must not run unattended: a stream nobody reads
stops generating (as llama-cpp-python's generator does) instead of running to max_tokens, close() ends the thermal
guard's waits at once, and watch_thermal guards perplexity window by window. Real tiny bundles, real threads, a
real ONNX Runtime session; the hot boards are a thermal zone on disk that never cools (the wall clock) and the
simulated board of edgesdk.thermal.simulator (its own clock, which a pause advances without sleeping)."""

from __future__ import annotations

import gc
import json
import sys
import threading
import time

import pytest

import edgesdk
from edgesdk.api import RequestError

HANG_S = 120.0  # a call that has not returned by then never will: the test fails instead of hanging


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        yield loaded


def worker_waits_for_its_reader(model) -> bool:
    """Whether the stream's worker thread came to wait for its reader (True), rather than end its answer (False)."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        workers = [thread for thread in threading.enumerate() if thread.name == "edgesdk-answer"]
        frames = sys._current_frames()
        for worker in workers:
            frame = frames.get(worker.ident)
            while frame is not None:
                if frame.f_code.co_name == "put" and type(frame.f_locals.get("self")).__name__ == "_Chunks":
                    return True
                frame = frame.f_back
        if not model._completer.busy and not workers:
            return False
        time.sleep(0.01)
    raise AssertionError("the stream's worker neither waited nor ended")


def decoded(model) -> int:
    slot = model._completer.slot
    return slot.decoded if slot is not None else -1


def test_a_stream_nobody_reads_stops_generating_and_closing_it_frees_the_model(model):
    metrics = model._completer.metrics
    cancelled = metrics.finished["cancelled"]
    stream = model("The sea", stream=True, max_tokens=200, ignore_eos=True)
    next(stream)
    assert worker_waits_for_its_reader(model), "the unread stream ran to max_tokens"
    assert 0 < decoded(model) < 200
    assert model._completer.busy  # it holds the model's turn until read, closed or collected
    stream.close()
    assert not model._completer.busy
    assert metrics.finished["cancelled"] == cancelled + 1
    assert model("The sea", max_tokens=2)["usage"]["completion_tokens"] <= 2


def test_ctrl_c_in_the_loops_body_with_the_stream_in_a_variable_stops_it_until_the_traceback_goes(model):
    """At a REPL, Ctrl-C in a function's loop body leaves the traceback (sys.last_value) holding the function's frame
    and the stream in its variable: the answer stops generating there; once the traceback is gone (the next error
    replaces it, or `del`), the stream is collected, its answer ends and the model answers again."""
    metrics = model._completer.metrics
    cancelled, generated = metrics.finished["cancelled"], metrics.predicted_tokens

    def chat() -> None:
        stream = model("The sea", stream=True, max_tokens=200, ignore_eos=True)
        for read, _ in enumerate(stream):
            if read == 1:
                raise KeyboardInterrupt  # lands in the loop's body, not in the stream's __next__

    try:
        chat()
    except KeyboardInterrupt as exc:
        last_value = exc  # the REPL's sys.last_value
    assert worker_waits_for_its_reader(model), "the interrupted stream ran to max_tokens"
    assert model._completer.busy
    del last_value
    gc.collect()
    assert not model._completer.busy
    assert metrics.finished["cancelled"] == cancelled + 1
    assert metrics.predicted_tokens - generated < 200
    assert model("The sea", max_tokens=2)["usage"]["completion_tokens"] <= 2


def test_a_call_while_a_kept_stream_waits_for_its_reader_runs_and_the_stream_stays_whole(model):
    """The reader's own thread calls the model again without reading its stream: the stream generates on to its end
    (an iterator kept in a variable does) rather than hold the turn that call waits for, and later reads whole."""
    whole = model("The sea", max_tokens=40, ignore_eos=True)
    text = " ".join(["the sea is blue and the sky is wide"] * 8)
    outcome = {}

    def same_thread() -> None:
        stream = model("The sea", stream=True, max_tokens=40, ignore_eos=True)
        first = next(stream)
        outcome["stalled"] = worker_waits_for_its_reader(model)
        outcome["answer"] = model("The sea", max_tokens=3)
        outcome["perplexity"] = model.perplexity(text, context=32)
        outcome["chunks"] = [first, *stream]

    caller = threading.Thread(target=same_thread)
    caller.start()
    caller.join(HANG_S)
    assert not caller.is_alive(), "the call waited for a stream only its own thread could read"
    assert outcome["stalled"]
    assert outcome["answer"]["usage"]["completion_tokens"] <= 3
    assert outcome["perplexity"] == pytest.approx(model.perplexity(text, context=32), rel=1e-9)
    chunks = outcome["chunks"]
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_close_while_a_stream_waits_for_its_reader(tiny_bundle):
    """close() from the reader's thread (after a Ctrl-C at a REPL) returns; the stream then gives what it had made
    and the model's closing, as a stream read in another thread does."""
    loaded = edgesdk.load(tiny_bundle.path, threads=1)
    stream = loaded("The sea", stream=True, max_tokens=200, ignore_eos=True)
    next(stream)
    assert worker_waits_for_its_reader(loaded)
    closer = threading.Thread(target=loaded.close)
    closer.start()
    closer.join(HANG_S)
    assert not closer.is_alive()
    assert not loaded._completer.busy
    with pytest.raises(RequestError, match="the model was closed while this request waited or generated"):
        list(stream)


# ---------------------------------------------------------------------------------------------------------------
# A board past its hard limit: close() ends the guard's wait; perplexity is guarded window by window

CHAT = [{"role": "user", "content": "Say something about the sea."}]
TEXT = " ".join(["the sea is blue and the sky is wide"] * 8)


@pytest.fixture
def hot_board(tiny_bundle, tmp_path, monkeypatch):
    """A model whose guard reads a board that never cools: the bundle's thermal zone on disk at 95 °C, past the host
    profile's 85 °C hard limit; the guard pauses every step on the wall clock, in 0.5 s polls (no time limit on a
    real board). ``pausing`` is set once the guard has slept in a pause."""
    from tests._utils.sysfs import make_zone

    zone = tiny_bundle.manifest["target"]["thermal"]["zones"][0]
    make_zone(tmp_path / "thermal", 0, zone, "95000")
    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(tmp_path / "thermal"))
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    loaded = edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True)
    hook, pausing = loaded._thermal.hook, threading.Event()
    sleep = hook.clock.sleep

    def sleeping(seconds: float) -> None:
        if hook.guard.paused:
            pausing.set()
        sleep(seconds)

    monkeypatch.setattr(hook.clock, "sleep", sleeping)
    return loaded, pausing


CALLS = {
    "stream": lambda model: list(model.create_chat_completion(CHAT, stream=True, max_tokens=8)),
    "whole": lambda model: model.create_chat_completion(CHAT, max_tokens=8),
    "perplexity": lambda model: model.perplexity(TEXT, context=32),
}


@pytest.mark.parametrize("call", CALLS)
def test_close_ends_a_thermal_pause_that_would_never_end(hot_board, call):
    model, pausing = hot_board
    outcome = {}

    def ask() -> None:
        try:
            outcome["result"] = CALLS[call](model)
        except RequestError as exc:
            outcome["error"] = exc

    caller = threading.Thread(target=ask, daemon=True)
    caller.start()
    assert pausing.wait(HANG_S), f"the guard never paused the {call}"
    closer = threading.Thread(target=model.close, daemon=True)
    closer.start()
    closer.join(HANG_S)
    assert not closer.is_alive(), f"close() waited for a board that never cools ({call})"
    caller.join(HANG_S)
    assert "result" not in outcome
    error = outcome["error"]
    assert error.status == 503
    assert "the model was closed while this request waited or generated" in str(error)
    assert model._thermal.hook.abandon_wait is None


@pytest.fixture
def simulated_hot_start(monkeypatch, tmp_path):
    """load(watch_thermal=True) gets the guard of a simulated board (edgesdk.thermal.simulator) that starts at 90 °C,
    past the host profile's 85 °C hard limit, in a 25 °C room: the guard pauses until it has cooled below the 75 °C
    resume point, on the board's own clock. Its telemetry file is returned."""
    from edgesdk.thermal import watch

    telemetry = tmp_path / "thermal.jsonl"
    real = watch.open_session

    def open_simulated(profile, **options):
        session = real(profile, **options, simulate=True, ambient_c=25.0, telemetry_path=str(telemetry))
        session.hook.board.temp_c = 90.0
        return session

    monkeypatch.setattr(watch, "open_session", open_simulated)
    return telemetry


def test_watch_thermal_pauses_perplexity_on_a_hot_board_and_the_figure_stays(tiny_bundle, model, simulated_hot_start):
    from edgesdk.evaluate import PerplexityConfig, windows

    with edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True) as guarded:
        assert any("simulated host board" in note for note in guarded.notes), guarded.notes
        value = guarded.perplexity(TEXT, context=32)
        ids = guarded.runtime.tokenizer.encode_plain(TEXT)
    assert value == model.perplexity(TEXT, context=32)
    records = [json.loads(line) for line in simulated_hot_start.read_text().splitlines()]
    steps = [record for record in records if record.get("kind") in ("prefill", "decode")]
    assert [record["kind"] for record in steps] == ["prefill"] * len(windows(ids, PerplexityConfig(32, 32, None)))
    # paused before the first window (the guard's wait records, at its critical level) until the board had cooled
    # below the 75 °C resume point; the windows after it ran unheld
    waits = [record for record in records if record.get("kind") == "wait"]
    assert {record["level"] for record in waits} == {"critical"}
    assert steps[0]["wait_s"] == pytest.approx(sum(record["wait_s"] for record in waits))
    assert steps[0]["wait_s"] > 0
    assert steps[0]["temp_c"] < 75.0
    assert all(record["wait_s"] == 0 for record in steps[1:])
