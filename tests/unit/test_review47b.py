"""Second reading of the day's changes (review 47b): the defects found, each with a test that failed before its fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# ----------------------------------------------------------------- serve -n -1: the default limit as clients read it


@pytest.fixture(scope="module")
def unlimited(tiny_bundle):
    """A completer whose default limit is ``serve -n -1``'s (no limit but the context)."""
    from edgesdk.cli_serve import _token_limit
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import Completer, ServeDefaults

    return Completer(open_runtime(tiny_bundle.path, threads=1), ServeDefaults(max_tokens=_token_limit(-1)))


def test_props_reports_n_predict_minus_one_for_serve_n_minus_one(unlimited):
    """llama-server's /props gives ``n_predict`` -1 for ``-n -1`` (its "-1 = infinity"); the internal limit 2**31 - 1
    that ``serve -n -1`` now stands for was shown there as it is, a number no llama-server reports."""
    assert unlimited.props("tiny-host")["default_generation_settings"]["params"]["n_predict"] == -1


def test_ollama_show_reports_num_predict_minus_one_for_serve_n_minus_one(unlimited):
    """Ollama's num_predict -1 is "no limit" (docs/modelfile.md); /api/show's parameters and Modelfile said
    2147483647."""
    from edgesdk.serve.ollama import show

    shown = show(unlimited, "tiny-host", {"model": "tiny-host"})
    assert "PARAMETER num_predict -1\n" in shown["modelfile"]
    assert "2147483647" not in shown["parameters"]


# ------------------------------------------------------------------- a build stopped by SIGTERM, through the Python API

CALLER = textwrap.dedent("""
    import os, signal, sys, time
    from edgesdk.build import pipeline
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    def steps(*args):  # the build's steps, stopped by a service manager while they run
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs at the next bytecode; this only bounds a broken one
            time.sleep(0.01)
        raise AssertionError("SIGTERM did not stop the build")

    pipeline._run_steps = steps
    try:
        build(BuildConfig(target="host", model=sys.argv[1], out=sys.argv[2], export=ExportConfig(max_context=64),
                          progress=False))
    except Exception as exc:  # a caller's handler of a failed build
        print(f"caller: the build failed ({exc})")
    print("caller: went on after SIGTERM")
""")


def test_a_python_api_caller_stopped_by_sigterm_ends_as_sigterm_ends_it(tiny_model_dir, tmp_path):
    """d70ba7e turned SIGTERM during ``build()`` into ``SystemExit(143)`` for every caller in the main thread, not only
    ``edgesdk build``: a program calling the Python API no longer ended by the signal (its parent saw exit 143, not
    SIGTERM; systemd counts exit 143 a failure where SIGTERM is a clean stop), its ``except BaseException`` went on,
    and one with a non-daemon thread did not end at all. Now the build unwinds (the staged copy and a work directory
    with no finished step removed, the stop said), then the signal ends the process at its default action, as it did
    before the handler."""
    from tests._utils.signals import default_signals

    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    out = tmp_path / "b"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    def signals_at_default() -> None:  # as a caller started normally has them (a test run may inherit others)
        default_signals()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    done = subprocess.run([sys.executable, str(script), str(tiny_model_dir), str(out)], env=env, capture_output=True,
                          text=True, timeout=300, preexec_fn=signals_at_default)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr)
    assert "caller:" not in done.stdout
    assert "edgesdk build: stopped (SIGTERM)" in done.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["caller.py"]  # no b.build left



# ------------------------------------------------------------------- int4 export: the refused weight's shape as given


@pytest.mark.parametrize(("bits", "row", "bad"), [(4, 37, float("nan")), (8, 39, float("inf")), (4, 35, 5.0e5)])
def test_a_refused_block_weight_is_named_by_its_own_shape_not_the_padded_one(bits, row, bad):
    """39d705f named the weight by its zero-padded shape: a (40, 3) weight in 32-row blocks was "the (64, 3)
    weight", a shape the model has nowhere."""
    import numpy as np

    from edgesdk.errors import ExportError
    from edgesdk.export.blockwise import quantize_blockwise

    weights = np.full((40, 3), 0.5, np.float32)
    weights[row, 2] = bad
    with pytest.raises(ExportError) as refused:
        quantize_blockwise(weights, bits, 32)
    assert "the (40, 3) weight" in str(refused.value), refused.value
    assert "(64, 3)" not in str(refused.value)
