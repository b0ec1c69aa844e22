"""run --prompt-cache FILE stopped with Ctrl-C: the prefill paid for is kept in the file (as llama-cli keeps it).

The interrupt is a real SIGINT raised in this process during the answer, between decode steps or inside one.
"""

from __future__ import annotations

import re
import signal

import numpy as np
import pytest

from edgesdk.runtime.ort_backend import OrtDecoderBase
from tests.unit.test_cli import assert_ok, invoke

PROMPT = "The tower was built for the fair of 1889 and named after its engineer. " * 3


@pytest.fixture(autouse=True)
def python_handles_sigint():
    """SIGINT raises KeyboardInterrupt, as in a fresh ``edgesdk run`` (an earlier test or library may have
    installed another handler in this process); the handler before is put back after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_at_decode(monkeypatch, step: int, inside: bool) -> None:
    """SIGINT at the ``step``-th decode: before it runs (between steps) or once it has run (inside it)."""
    real_decode = OrtDecoderBase.decode
    calls = {"n": 0}

    def decode(self, token_id):
        calls["n"] += 1
        if calls["n"] == step and not inside:
            signal.raise_signal(signal.SIGINT)
        logits = real_decode(self, token_id)
        if calls["n"] == step and inside:
            signal.raise_signal(signal.SIGINT)
        return logits

    monkeypatch.setattr(OrtDecoderBase, "decode", decode)


def _run(bundle, *extra):
    return invoke("run", bundle.path, "--prompt", PROMPT, "--raw", "-n", 40, "--ignore-eos", "--threads", 1,
                  "--stats", *extra)


def test_ctrl_c_keeps_the_prompt_and_the_answer_so_far_in_the_cache_file(tiny_bundle, tmp_path, monkeypatch):
    path = tmp_path / "prompt.cache"
    _interrupt_at_decode(monkeypatch, step=6, inside=False)
    stopped = _run(tiny_bundle, "--prompt-cache", path, "--prompt-cache-all")  # the default keeps the prompt alone
    assert stopped.exit_code != 0  # the Ctrl-C still ends the run
    assert path.is_file(), stopped.stderr
    monkeypatch.undo()
    with np.load(path) as data:
        kept = data["tokens"].shape[0]
    again = _run(tiny_bundle, "--prompt-cache", path)
    assert_ok(again)
    prompt_tokens = int(re.search(r"prompt (\d+) tok", again.stderr).group(1))
    assert kept == prompt_tokens + 5  # the prompt, the prefill's token and the 5 decode steps taken before Ctrl-C
    assert f"({prompt_tokens - 1} from the cache)" in again.stderr  # the prompt is not prefilled again


def test_ctrl_c_inside_a_step_leaves_the_previous_cache_file_as_it_was(tiny_bundle, tmp_path, monkeypatch):
    path = tmp_path / "prompt.cache"
    assert_ok(invoke("run", tiny_bundle.path, "--prompt", "An earlier prompt", "--raw", "-n", 3,
                     "--prompt-cache", path))
    before = path.read_bytes()
    _interrupt_at_decode(monkeypatch, step=4, inside=True)
    # the default writes the prompt's cache, copied at the first token, whole (test_prompt_cache_modes45.py)
    stopped = _run(tiny_bundle, "--prompt-cache", path, "--prompt-cache-all")
    assert stopped.exit_code != 0
    assert "is not rewritten: the answer was stopped inside a step" in stopped.stderr
    assert path.read_bytes() == before
