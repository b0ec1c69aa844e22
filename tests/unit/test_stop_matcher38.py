"""StopMatcher: a streamed answer cut at its stop strings equals the whole text cut directly, and the work per
delta does not grow with the square of a stop string's length."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from edgesdk.serve.completion import StopMatcher

ALPHABET = "ab\n"


def reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """The text before the first stop string to complete reading ``text`` character by character (the longest
    of those completing at one character), and that stop string; the whole text and None without one."""
    for end in range(1, len(text) + 1):
        ending = [stop for stop in stops if text[:end].endswith(stop)]
        if ending:
            stop = max(ending, key=len)
            return text[: end - len(stop)], stop
    return text, None


def streamed(text: str, stops: list[str], cuts: list[int]) -> tuple[str, StopMatcher]:
    matcher = StopMatcher(tuple(stops))
    bounds = sorted({0, len(text), *[cut for cut in cuts if cut <= len(text)]})
    released = "".join(matcher.push(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    return released + matcher.flush(), matcher


@st.composite
def cases(draw):
    text = draw(st.text(alphabet=ALPHABET, max_size=40))
    stops = draw(st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=6), max_size=4))
    # stops that overlap themselves ("aa", "aba"), that are prefixes of other stops, and longer than the text
    if stops and draw(st.booleans()):
        stops.append(stops[0] + draw(st.text(alphabet=ALPHABET, min_size=1, max_size=3)))
    if draw(st.booleans()):
        stops.append(draw(st.sampled_from(["aa", "aba", "abab", "a\na"])))
    if draw(st.booleans()):
        stops.append(text + draw(st.text(alphabet=ALPHABET, min_size=1, max_size=3)))
    if text and draw(st.booleans()):  # a stop string taken from the text itself, so it is found
        start = draw(st.integers(0, len(text) - 1))
        stops.append(text[start: start + draw(st.integers(1, 8))])
    cuts = draw(st.lists(st.integers(min_value=0, max_value=len(text)), max_size=12))
    return text, stops, cuts


@settings(max_examples=400, deadline=None)
@given(cases())
def test_a_random_split_of_random_text_releases_the_whole_text_s_cut(case):
    text, stops, cuts = case
    released, matcher = streamed(text, stops, cuts)
    expected, stop = reference(text, stops)
    assert released == expected
    assert matcher.stopped == (stop is not None)
    assert matcher.matched == stop


def test_overlapping_and_nested_stops():
    assert streamed("xaab", ["aab"], [2])[0] == "x"  # "a" then "ab": the automaton falls back, not to zero
    assert streamed("abababc", ["ababc"], [1, 3, 5])[0] == "ab"
    released, matcher = streamed("go ab!", ["ab!", "a", "b!"], [4])
    assert (released, matcher.matched) == ("go ", "a")  # "a" completes first
    released, matcher = streamed("xab", ["b", "ab"], [2])
    assert (released, matcher.matched) == ("x", "ab")  # both complete at "b": the longest is cut whole
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
