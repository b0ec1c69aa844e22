""":func:`edgesdk.runtime.hooked_pass.hooked_pass`, the one place a perplexity window (``bundle_scorer``) and an
embedding (``Completer._embed_one``) are stepped by the thermal hook as a prefill that yields no token."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.evaluate import bundle_scorer
from edgesdk.runtime.hooked_pass import hooked_pass


class Recorder:
    """A StepHook that writes down what it is told."""

    def __init__(self):
        self.calls: list[tuple] = []

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        self.calls.append(("begin", prompt_tokens, max_new_tokens))

    def before_step(self, kind: str) -> float:
        self.calls.append(("before_step", kind))
        return 0.0

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        assert compute_s >= 0.0
        self.calls.append(("after_step", kind, tokens))

    def end(self, stats) -> None:
        self.calls.append(("end", stats))


def test_a_pass_is_a_prefill_step_that_yields_no_token_and_its_end_is_the_caller_s():
    hook = Recorder()
    assert hooked_pass(hook, 5, lambda: "result") == "result"
    assert hook.calls == [("begin", 5, 0), ("before_step", "prefill"), ("after_step", "prefill", 0)]

    def fails() -> None:
        raise RuntimeError("the backend failed")

    hook.calls.clear()
    with pytest.raises(RuntimeError, match="the backend failed"):
        hooked_pass(hook, 3, fails)
    assert hook.calls == [("begin", 3, 0), ("before_step", "prefill")]  # no compute time told, no end


def test_bundle_scorer_steps_each_window_through_it(runtime):
    hook = Recorder()
    window = np.asarray(runtime.tokenizer.encode("The quick brown fox"), np.int64)
    logits = bundle_scorer(runtime, hook)(window)
    assert np.array_equal(logits, bundle_scorer(runtime)(window))
    assert hook.calls == [("begin", len(window), 0), ("before_step", "prefill"), ("after_step", "prefill", 0)]
