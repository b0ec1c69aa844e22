"""Review of the runtime's session and generation loop (58th stop)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from edgesdk.bundle import Bundle
from edgesdk.runtime.generate import LogitBiasError, SamplingConfig, StepHook, generate
from edgesdk.runtime.session import ort_trt_options

# ------------------------------------------------------------------ the TensorRT EP's engine cache directory


def _can_write_in(directory: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _unwritable(directory: Path):
    """``directory`` made a place no file can be written in for as long as the block runs: mode 0555, and where this
    runs as root (which mode bits do not stop) the immutable attribute; skipped where neither holds it."""
    directory.chmod(0o555)
    immutable = False
    if _can_write_in(directory) and shutil.which("chattr"):
        immutable = subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0
    try:
        if _can_write_in(directory):
            pytest.skip("no way to make a directory unwritable for this user here")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        directory.chmod(0o755)


def test_the_ort_trt_engine_cache_skips_an_existing_directory_it_cannot_write_in(tiny_bundle, tmp_path, monkeypatch):
    """A deploy root's engines/<id>/ort-trt that exists but is not this user's to write in (deployed by another
    user, a read-only mount) passed mkdir(exist_ok=True) and was given to the TensorRT EP, which rebuilt its engine at
    every start as it could not save it; the user cache, which it can write in, is the place then."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    bundle_id = tiny_bundle.bundle_id
    release = tmp_path / "deploy" / "releases" / bundle_id
    release.mkdir(parents=True)
    deployed = Bundle(path=release, manifest=tiny_bundle.manifest)
    engines = tmp_path / "deploy" / "engines" / bundle_id / "ort-trt"
    engines.mkdir(parents=True)
    assert ort_trt_options(deployed)["trt_engine_cache_path"] == str(engines)  # writable: the deploy root's
    with _unwritable(engines):
        options = ort_trt_options(deployed)
    user_cache = tmp_path / "cache" / "engines" / bundle_id / "ort-trt"
    assert options["trt_engine_cache_path"] == str(user_cache)
    assert options["trt_timing_cache_path"] == str(user_cache)
    assert user_cache.is_dir()


# ------------------------------------------------------------------ a hook whose methods are no-ops


class _QuietHook(StepHook):
    """A hook that overrides nothing: each method is the protocol's own no-op (before_step returns None)."""


class _PassingHook:
    """A hook written with ``pass`` bodies, counting nothing."""

    def begin(self, prompt_tokens, max_new_tokens):
        pass

    def before_step(self, kind):
        pass

    def after_step(self, kind, tokens, compute_s):
        pass

    def end(self, stats):
        pass

    def prefill_chunk(self, prompt_left):
        return 2  # the prompt in steps of two tokens, each held back by before_step


@pytest.mark.parametrize("hook", [_QuietHook, _PassingHook])
def test_a_hook_whose_before_step_returns_nothing_waited_nothing(runtime, hook):
    """The protocol says every method may be a no-op; a before_step that returns None (the protocol's own, a
    ``pass``) failed the first step with a TypeError (float += None) naming no hook."""
    prompt = runtime.tokenizer.encode_plain("Hello there, board")
    plain, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=4), set())
    answer, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=4), set(), hook=hook())
    assert answer == plain
    assert stats.waited_s == 0.0
    assert stats.new_tokens == 4


# ------------------------------------------------------------------ the prefill step's token, told once it is picked


class _StepLog:
    """Records each step the hook is told of: (kind, tokens)."""

    def __init__(self):
        self.steps = []

    def begin(self, prompt_tokens, max_new_tokens):
        pass

    def before_step(self, kind):
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self.steps.append((kind, tokens))

    def end(self, stats):
        pass


def test_a_first_token_the_logit_bias_refuses_is_not_told_to_the_hook(runtime):
    """The prefill's step was told to yield its token before the token was picked: a request whose logit bias
    names an id past the vocabulary (serve answers 400) was counted a generated token (serve's metrics) it never
    had. The step is told now with no token, its compute still counted."""
    vocab = runtime.backend.prefill(np.asarray([1], np.int64)).shape[-1]
    prompt = runtime.tokenizer.encode_plain("Hello")
    log = _StepLog()
    with pytest.raises(LogitBiasError, match=f"token id {vocab}"):
        generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=3, logit_bias=((vocab, 1.0),)), set(),
                 hook=log)
    assert log.steps == [("prefill", 0)]
    log = _StepLog()
    answer, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=3), set(), hook=log)
    assert log.steps == [("prefill", 1), ("decode", 1), ("decode", 1)]
    assert len(answer) == 3
