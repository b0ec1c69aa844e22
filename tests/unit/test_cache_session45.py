"""Saved state and special generation modes, review 45: caches, infill, drafts (edgesdk/runtime/cache_file.py,
prompt_cache.py, speculative.py, lookup.py, fim.py)."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache
from tests.unit.test_power_export import power_bundle  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.unit.test_prompt_cache import _gated

    return _gated(tmp_path_factory.mktemp("gated45"))


def _prompt(count: int = 40) -> np.ndarray:
    return np.random.default_rng(45).integers(0, 320, count)


def _fresh_logits(backend, prompt) -> np.ndarray:
    backend.reset()
    return backend.prefill(np.asarray(prompt, np.int64), keep_logits=1)[-1]


def _write(backend, path, prompt) -> None:
    """The prompt cache file an answer to ``prompt`` leaves: its KV cache with the backend's gates as they are."""
    cache = PromptCache(backend)
    backend.reset()
    backend.prefill(np.asarray(prompt, np.int64), keep_logits=1)
    cache.took(prompt)
    cache_file.save(path, cache, "bundle45")


@pytest.mark.parametrize("written", [(True, 0.9), (True, None)], ids=["fixed-tau", "steered"])
def test_a_cache_file_computed_with_the_gates_on_is_not_loaded_with_them_off(gated, tmp_path, written):
    """``edgesdk run --gating --prompt-cache F`` then ``edgesdk run --prompt-cache F``: the file held keys and values
    computed with FFN blocks skipped, and the second run (gates off, the loaded model) reused them, so its answer
    was not the one a fresh run gives (logits off by ~1e-2 on the tiny gated model). A file records its gates now,
    and one of other gates (or steered ones, which no run reuses) is refused by name."""
    prompt = _prompt()
    path = tmp_path / "prompt.cache"
    gated.gating, gated.fixed_tau = written
    try:
        _write(gated, path, prompt[:-1])
    finally:
        gated.gating, gated.fixed_tau = False, None
    cache = PromptCache(gated)
    loaded, why = cache_file.load(path, cache, "bundle45")
    assert loaded == 0
    assert why is not None
    assert "power gates" in why
    # and the answer is the fresh one: nothing of the gated cache is reused
    kept = cache.start(list(prompt))
    assert kept == 0
    got = gated.prefill(np.asarray(prompt, np.int64), keep_logits=1)[-1]
    np.testing.assert_allclose(got, _fresh_logits(gated, prompt), atol=1e-5)


def test_a_cache_file_of_the_same_gates_is_loaded_and_answers_as_a_fresh_run(gated, tmp_path):
    """Gates off (the default) and a fixed threshold give the same keys and values on every run: such a file loads
    where the gates are as they were, and the answer equals a fresh run's."""
    prompt = _prompt()
    for setting in ((False, None), (True, 0.9)):
        gated.gating, gated.fixed_tau = setting
        try:
            path = tmp_path / f"prompt-{setting[1]}.cache"
            _write(gated, path, prompt[:-1])
            cache = PromptCache(gated)
            loaded, why = cache_file.load(path, cache, "bundle45")
            assert (loaded, why) == (len(prompt) - 1, None)
            assert cache.start(list(prompt)) == len(prompt) - 1
            got = gated.prefill(np.asarray(prompt[-1:], np.int64), keep_logits=1)[-1]
            np.testing.assert_allclose(got, _fresh_logits(gated, prompt), atol=1e-4)
        finally:
            gated.gating, gated.fixed_tau = False, None


def test_run_with_gating_does_not_load_a_cache_file_written_with_the_gates_off(power_bundle, tmp_path):  # noqa: F811
    """``edgesdk run`` sets the gates before it loads ``--prompt-cache``: the file of a run with the gates off is
    checked against ``--gating``'s steered gates and refused, not loaded as if this run had them off too."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    cache = tmp_path / "prompt.cache"
    args = ["run", str(power_bundle.path), "--prompt", "hello world, this is a test", "-n", "4",
            "--ignore-target", "--prompt-cache", str(cache), "--stats"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert cache.is_file()
    again = CliRunner().invoke(main, args)  # gates off again: the file is loaded
    assert again.exit_code == 0, again.output
    assert "tokens loaded" in again.output
    steered = CliRunner().invoke(main, [*args, "--gating"])
    assert steered.exit_code == 0, steered.output
    assert "this run computes with them steered" in steered.output
    assert "tokens loaded" not in steered.output
