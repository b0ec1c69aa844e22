"""One backend pass that yields no token (a perplexity window, an embedding), stepped by a
:class:`~edgesdk.runtime.generate.StepHook` as it steps a prefill."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from edgesdk.runtime.generate import StepHook

T = TypeVar("T")


def hooked_pass(hook: StepHook, prompt_tokens: int, run: Callable[[], T]) -> T:
    """``run()``, a pass over ``prompt_tokens`` tokens, as ``hook`` sees a prefill step that yields no token: begun,
    held back by ``before_step`` (the thermal guard's pacing or pause), then told its compute time. What the hook or
    the pass raises propagates; telling the hook the request's end is the caller's."""
    hook.begin(prompt_tokens, 0)
    hook.before_step("prefill")
    start = time.perf_counter()
    result = run()
    hook.after_step("prefill", 0, time.perf_counter() - start)
    return result


__all__ = ["hooked_pass"]
