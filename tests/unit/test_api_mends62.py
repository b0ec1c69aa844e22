"""Mends from a last read: a prompt past a bundle's context refused by the Python API in its own terms alone
(edgesdk/api.py, ``_too_long``: the message named 'edgesdk build --max-context N', the fix build_bundle); a
completion-method field of the chat method whose fix names the completion method's own way (edgesdk/api_checks.py);
a prompt cache run that waits behind another run's lock says so (edgesdk/runtime/cache_file.py); the per-request
draft settings' refusal worded without "from 0" (edgesdk/serve/api.py); and bench's throttle warning for bits set
only as the run began (edgesdk/runtime/bench_conditions.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.runtime import cache_file
from edgesdk.runtime.bench_conditions import warnings
from edgesdk.runtime.prompt_cache import PromptCache
from tests.unit.test_cache_writers62 import _no_room_beside
from tests.unit.test_prompt_cache61 import BUNDLE_ID, _filled, backend  # noqa: F401 - backend: the fixture

WAIT_S = 120.0  # a bound on each wait for the other process, so a broken order fails the test rather than hangs it
LONG = "hello world " * 300  # past the tiny bundle's context of 256, and past its model's 512 positions


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=2) as loaded:
        yield loaded


@pytest.mark.parametrize(("call", "param"), [
    (lambda model: model.create_completion(LONG), "prompt"),
    (lambda model: next(iter(model.create_completion(LONG, stream=True))), "prompt"),
    (lambda model: model.create_chat_completion([{"role": "user", "content": LONG}]), "messages"),
])
def test_a_prompt_past_the_context_is_refused_in_the_python_apis_terms_alone(model, call, param):
    with pytest.raises(RequestError) as refused:
        call(model)
    error = refused.value
    assert error.param == param
    assert error.problem.startswith(f"{error.method} ({param}): This model's maximum context length is 256 tokens. "
                                    f"However, your {param} resulted in ")
    assert "build_bundle(..., max_context=512) gives the most" in error.problem
    assert error.problem.endswith(f": {error.fix}")  # the route's headline, then the Python API's fix
    assert not [words for words in ("edgesdk build", "--max-context", "POST /tokenize") if words in str(error)]
    assert "model.tokenize(text) counts" in error.fix


@pytest.mark.parametrize(("field", "value", "fix"), [
    ("top_logprobs", 2, "pass logprobs=N to create_completion, or send top_logprobs to create_chat_completion"),
    ("max_completion_tokens", 2, "pass max_tokens=N to create_completion, or send max_completion_tokens to "
                                 "create_chat_completion"),
])
def test_a_chat_field_create_completion_has_its_own_way_for_names_that_way_in_the_fix(model, field, value, fix):
    with pytest.raises(RequestError) as refused:
        model.create_completion("Once", **{field: value})
    assert refused.value.param == field
    assert refused.value.fix == fix
    assert "leave" not in refused.value.fix


HOLDER = """
import fcntl, sys
handle = open(sys.argv[1], "rb")
fcntl.flock(handle.fileno(), fcntl.LOCK_SH if sys.argv[2] == "shared" else fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


class _Told:
    """sys.stderr while a run waits: what is written is kept, and ``seen`` is set once ``words`` are among it."""

    def __init__(self, words: str):
        self.words, self.text, self.seen = words, "", threading.Event()

    def write(self, text: str) -> int:
        self.text += text
        if self.words in self.text:
            self.seen.set()
        return len(text)

    def flush(self) -> None:
        pass


def _held_while(path: Path, kind: str, run, monkeypatch, words: str):
    """``run()`` in a thread while another process holds a ``kind`` flock on ``path``; the lock is let go once
    ``words`` are said on stderr (or the wait for them gives up). Returns (what run returned, what was said, whether
    it was said while the lock was held)."""
    told = _Told(words)
    monkeypatch.setattr(sys, "stderr", told)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), kind], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    result = {}
    try:
        assert holder.stdout.readline() == "held\n"
        worker = threading.Thread(target=lambda: result.setdefault("value", run()), daemon=True)
        worker.start()
        said = told.seen.wait(WAIT_S)
    finally:
        holder.stdin.write("\n")  # let go of the lock
        holder.stdin.close()
        holder.wait(WAIT_S)
    worker.join(WAIT_S)
    assert not worker.is_alive()
    return result.get("value"), told.text, said


def test_a_read_behind_another_runs_write_says_it_waits_then_loads(backend, tmp_path, monkeypatch):  # noqa: F811
    """A run writing the cache in place (or stopped with Ctrl-Z mid-write) holds its exclusive lock: a run that
    loads the file waited for it without a word, looking hung. It says so on stderr, and loads the cache once the
    write is done."""
    path = tmp_path / "prompt.cache"
    saved = _filled(backend, 30, seed=1)
    cache_file.save(path, saved, BUNDLE_ID)
    loaded = PromptCache(backend)
    count, said, in_time = _held_while(path, "exclusive", lambda: cache_file.load(path, loaded, BUNDLE_ID),
                                       monkeypatch, "another run is writing")
    assert in_time, "nothing was said while the load waited for the lock"
    assert said == (f"edgesdk: another run is writing the prompt cache {path}; waiting for it to finish to read it "
                    "(a run stopped with Ctrl-Z holds it until it is resumed)\n")
    assert count == (30, None)
    assert loaded.tokens == saved.tokens


def test_an_in_place_write_behind_another_runs_read_says_it_waits_then_writes(backend, tmp_path,  # noqa: F811
                                                                            monkeypatch):
    """A write over the old file (no room beside it) waits for a run reading it: said on stderr, then written."""
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 30, seed=2), BUNDLE_ID)
    fresh = _filled(backend, 30, seed=3)
    snapshot = (list(fresh.tokens), backend.save_cache()[0])
    _no_room_beside(lambda name, value: monkeypatch.setattr(cache_file, name, value))  # the write goes in place
    cache = types.SimpleNamespace(tokens=snapshot[0], backend=types.SimpleNamespace(name=backend.name))
    _, said, in_time = _held_while(path, "shared", lambda: cache_file.save(path, cache, BUNDLE_ID, snapshot),
                                   monkeypatch, "another run is reading or writing")
    assert in_time, "nothing was said while the write waited for the lock"
    assert f"another run is reading or writing the prompt cache {os.path.realpath(path)}; waiting for it to finish before writing" \
           in said
    loaded = PromptCache(backend)
    assert cache_file.load(path, loaded, BUNDLE_ID) == (30, None)
    assert loaded.tokens == fresh.tokens


def test_a_lock_no_other_run_holds_is_taken_without_a_word(backend, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 10, seed=4), BUNDLE_ID)
    assert cache_file.load(path, PromptCache(backend), BUNDLE_ID) == (10, None)
    assert capsys.readouterr().err == ""


def test_a_throttle_set_during_the_run_and_one_set_as_it_began_are_told_apart():
    before = {"throttled": {"throttled": True, "under_voltage": False, "throttling_occurred": True,
                            "under_voltage_occurred": False}}
    after = {"throttled": {"throttled": False, "under_voltage": False, "throttling_occurred": True,
                           "under_voltage_occurred": True}}
    found = warnings(before, after, 4)
    assert found == ["the firmware reports under_voltage_occurred, throttled as the run began (vcgencmd "
                     "get_throttled): the board was already throttled as the run began and slowed itself during the "
                     "run, so the figures are low (cool it, check its power supply)"]
    during = warnings({"throttled": {**after["throttled"], "under_voltage_occurred": False}},
                      {"throttled": {**after["throttled"], "throttled": True}}, 4)
    assert "the board slowed itself during the run, so" in during[0]
    assert "already throttled" not in during[0]
