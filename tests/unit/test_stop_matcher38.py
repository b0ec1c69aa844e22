"""StopMatcher: overlapping and nested stop strings, and the work per delta does not grow with the square of a stop
string's length (test_serve63 holds it to llama-server's per-token rule on random splits)."""

from __future__ import annotations

import subprocess
import sys

from edgesdk.serve.completion import StopMatcher


def streamed(text: str, stops: list[str], cuts: list[int]) -> tuple[str, StopMatcher]:
    matcher = StopMatcher(tuple(stops))
    bounds = sorted({0, len(text), *[cut for cut in cuts if cut <= len(text)]})
    released = "".join(matcher.push(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    return released + matcher.flush(), matcher


def test_overlapping_and_nested_stops():
    assert streamed("xaab", ["aab"], [2])[0] == "x"  # "a" then "ab": the automaton falls back, not to zero
    assert streamed("abababc", ["ababc"], [1, 3, 5])[0] == "ab"
    released, matcher = streamed("go ab!", ["ab!", "a", "b!"], [4])
    assert (released, matcher.matched) == ("go ", "a")  # "a" starts earliest
    released, matcher = streamed("xab", ["b", "ab"], [2])
    assert (released, matcher.matched) == ("x", "ab")  # "ab" starts earlier than "b"
    assert streamed("ab", ["abc"], [1])[0] == "ab"  # a stop longer than the text: held back, then let out


def test_held_back_text_is_only_a_possible_stop_start():
    matcher = StopMatcher(("aab",))
    assert matcher.push("aaa") == "a"  # "aa" could still become "aab"
    assert matcher.push("c") == "aac"
    assert matcher.push("aa") == ""
    assert matcher.push("b") == ""
    assert matcher.stopped
    assert matcher.matched == "aab"


_TRACE_SCRIPT = """
import sys

import edgesdk.serve.completion as completion
from edgesdk.serve.completion import StopMatcher

stop_length = int(sys.argv[1])
stop = "x" * (stop_length - 1) + "y"
matcher = StopMatcher((stop,))
count = 0


def tracer(frame, event, arg):
    global count
    if frame.f_code.co_filename != completion.__file__:
        return None
    if event == "line":
        count += 1
    return tracer


sys.settrace(tracer)
try:
    for char in stop:
        matcher.push(char)
finally:
    sys.settrace(None)
assert matcher.stopped
print(count)
"""


def _traced_lines(stop_length: int) -> int:
    """Python lines run in edgesdk/serve/completion.py while a stop string of ``stop_length`` characters
    arrives one character at a time (all held back until its last character).

    Counted in a fresh interpreter: at the end of the whole suite, tracing ``push`` after the run had called it
    thousands of times did not finish in 20 minutes (CPython 3.11.7), where the same count in its own process
    takes a second."""
    result = subprocess.run([sys.executable, "-c", _TRACE_SCRIPT, str(stop_length)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_the_work_per_delta_is_linear_in_a_stop_string_s_length():
    """Pushing a stop string character by character: doubling its length doubles the lines run (each prefix
    length checked against the text's end on every delta made it four times). Counted, not timed."""
    short, long = _traced_lines(200), _traced_lines(400)
    assert long < 2.5 * short, (short, long)
