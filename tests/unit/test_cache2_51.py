"""Review 51 of ``edgesdk run --prompt-cache`` and of opening a bundle (edgesdk/cli_prompt_cache.py,
edgesdk/runtime/session.py): a run with the power gates steered leaves the cache file alone, a read-only cache file
is read as --prompt-cache-ro, and a target refused for a Python caller names load()'s arguments."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from edgesdk.errors import BundleError, ProfileError
from tests.unit.test_cli import assert_error, assert_ok, invoke
from tests.unit.test_power_export import power_bundle  # noqa: F401 (a fixture: a tiny gated bundle, target rpi5)


def _run(bundle, cache, *extra, prompt="hello world, this is a test"):
    return invoke("run", bundle.path, "--prompt", prompt, "-n", "4", "--ignore-target", "--prompt-cache", cache,
                  "--stats", *extra)


def _gates(path) -> str:
    with np.load(path) as data:
        return str(data["gates"])


def test_a_steered_run_leaves_the_cache_file_alone_for_the_next_run(power_bundle, tmp_path):  # noqa: F811
    """``edgesdk run --prompt-cache F`` then ``edgesdk run --gating --prompt-cache F``: the gated run replaced the
    file with one computed with the gates steered, which no run loads, so the next run with the gates off
    prefilled its whole prompt again. Its file is left as it is now, and said so; the next run loads it."""
    cache = tmp_path / "prompt.cache"
    assert_ok(_run(power_bundle, cache))
    before = cache.read_bytes()
    steered = _run(power_bundle, cache, "--gating")
    assert_ok(steered)
    assert "is not used, and is left as it is" in steered.stderr
    assert "--gating" in steered.stderr
    assert "tokens loaded" not in steered.stderr
    assert cache.read_bytes() == before
    assert _gates(cache) == "off"
    again = _run(power_bundle, cache)
    assert_ok(again)
    assert "tokens loaded" in again.stderr


def test_a_steered_run_writes_no_cache_file_that_no_run_would_load(power_bundle, tmp_path):  # noqa: F811
    """No file yet: a steered run created one that every later run refused ("reused by no run"). --entropy-target
    alone steers the gates too (cli_options.configure_gates)."""
    cache = tmp_path / "prompt.cache"
    for extra in (("--gating",), ("--gating", "--prompt-cache-all"), ("--entropy-target", "1.2")):
        result = _run(power_bundle, cache, *extra)
        assert_ok(result)
        assert "is not used, and is left as it is" in result.stderr
        assert not cache.exists()


@pytest.mark.parametrize("extra", [(), ("--prompt-cache-all",)], ids=["prompt", "all"])
def test_a_read_only_cache_file_is_loaded_and_not_written(power_bundle, tmp_path, extra):  # noqa: F811
    """``chmod 444`` on the cache file: llama-cli's fopen("wb") fails and leaves it as it was; the run wrote a new
    file renamed over it (only the directory needs to be writable), so a cache the user had frozen was replaced by
    the next prompt's. It is loaded and not written now, as with --prompt-cache-ro, and that is said."""
    cache = tmp_path / "prompt.cache"
    assert_ok(_run(power_bundle, cache))
    before, inode = cache.read_bytes(), os.stat(cache).st_ino
    cache.chmod(0o444)
    try:
        result = _run(power_bundle, cache, *extra, prompt="another prompt entirely, sharing little")
        assert_ok(result)
        assert "is read-only (mode 0444): it is loaded and not written" in result.stderr
        assert ("(--prompt-cache-all too)" in result.stderr) == bool(extra)
        assert "tokens loaded" in result.stderr
        assert os.stat(cache).st_ino == inode
        assert cache.read_bytes() == before
        assert stat.S_IMODE(os.stat(cache).st_mode) == 0o444
    finally:
        cache.chmod(0o644)
    writable = _run(power_bundle, cache, prompt="another prompt entirely, sharing little")
    assert_ok(writable)  # writable again: rewritten as before
    assert "read-only" not in writable.stderr
    assert cache.read_bytes() != before


def test_a_bundle_of_another_target_is_refused_in_load_terms_for_a_python_caller(power_bundle):  # noqa: F811
    """load(target=...) is open_runtime(terms="python"): its refusals named the command line's 'edgesdk build
    --target' and 'edgesdk targets list', which a Python caller has not got in hand."""
    from edgesdk.runtime.session import open_runtime

    with pytest.raises(BundleError) as refused:
        open_runtime(power_bundle.path, expected_target="host", terms="python")
    fix = refused.value.fix
    assert "edgesdk.build_bundle('host', ...)" in fix
    assert "ignore_target=True" in fix
    assert "edgesdk build" not in fix
    assert "--" not in fix
    with pytest.raises(ProfileError) as unknown:
        open_runtime(power_bundle.path, expected_target="no-such-board", terms="python")
    assert "target='rpi5'" in unknown.value.fix
    assert "edgesdk targets list" not in unknown.value.fix
    runtime = open_runtime(power_bundle.path, expected_target="host", ignore_target=True, terms="python")
    assert any("ignore_target=True, so target='host' is not checked" in note for note in runtime.notes)


def test_load_gives_the_target_refusals_in_its_own_terms(power_bundle):  # noqa: F811
    """edgesdk.load passes terms "python" to open_runtime: an unknown target names load()'s ``target``."""
    import edgesdk

    with pytest.raises(ProfileError) as unknown:
        edgesdk.load(power_bundle.path, target="no-such-board")
    assert "target='rpi5'" in unknown.value.fix
    assert "edgesdk targets list" not in unknown.value.fix
    with pytest.raises(BundleError) as refused:
        edgesdk.load(power_bundle.path, target="host")
    assert "edgesdk.build_bundle('host', ...)" in refused.value.fix


def test_run_keeps_the_command_lines_words_for_a_refused_target(power_bundle):  # noqa: F811
    from edgesdk.runtime.session import open_runtime

    with pytest.raises(BundleError) as refused:
        open_runtime(power_bundle.path, expected_target="host")
    assert refused.value.fix == "build it with 'edgesdk build --target host', or pass --ignore-target"
    result = invoke("run", power_bundle.path, "--prompt", "hi", "-n", "1", "--target", "no-such-board")
    assert_error(result, "unknown target 'no-such-board'", "edgesdk targets list")
