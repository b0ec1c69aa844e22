"""Runtime helpers: JSON string patterns, log-probabilities, prompt lookup, conversations, huge pages and bench
conditions, at their edges."""

from __future__ import annotations

import pytest

from edgesdk.runtime.grammar import GrammarMatcher
from edgesdk.runtime.json_pattern import PatternError, string_matcher


def _matches(pattern: str, text: str) -> bool:
    matcher = string_matcher(pattern)
    state = matcher.feed(matcher.start(), text.encode())
    return state is not None and GrammarMatcher.accepts(state)


def test_pattern_reads_the_u_flags_code_point_escape():
    # JSON Schema reads a pattern with ECMA-262's u flag, where \u{1F600} is one code point (Ajv compiles it so)
    assert _matches("^\\u{1F600}+$", "😀😀")
    assert not _matches("^\\u{1F600}+$", "u")
    assert _matches("^[\\u{1F600}-\\u{1F64F}]$", "🙏")
    assert not _matches("^[\\u{1F600}-\\u{1F64F}]$", "😀🙏")
    assert _matches("^\\u{41}\\u{000062}$", "Ab")


@pytest.mark.parametrize("pattern", ["\\u{110000}", "\\u{}", "\\u{12", "\\u{12g}"])
def test_pattern_refuses_a_bad_code_point_escape_by_name(pattern):
    with pytest.raises(PatternError, match=r"\\u\{\.\.\.\} needs hexadecimal digits of a code point up to 10FFFF"):
        string_matcher(pattern)


SMAPS_ROLLUP = """55d174568000-7fff1fafb000 ---p 00000000 00:00 0                          [rollup]
Rss:              312420 kB
Anonymous:         80236 kB
AnonHugePages:     {thp} kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
Shared_Hugetlb:        0 kB
Private_Hugetlb:  {hugetlb} kB
Swap:                  0 kB
"""


def test_huge_pages_in_use_counts_hugetlb_pages_too(tmp_path):
    # glibc.malloc.hugetlb=2 puts malloc's memory on MAP_HUGETLB pages, which smaps counts in Private_Hugetlb and
    # not in AnonHugePages: the weights lie on huge pages, and the figure must say so
    from edgesdk.runtime.huge_pages import huge_pages_in_use

    rollup = tmp_path / "smaps_rollup"
    rollup.write_text(SMAPS_ROLLUP.format(thp=0, hugetlb=229376))
    assert huge_pages_in_use(rollup) == 229376 * 1024
    rollup.write_text(SMAPS_ROLLUP.format(thp=4096, hugetlb=2048))
    assert huge_pages_in_use(rollup) == 6144 * 1024
    rollup.write_text("Rss: 10 kB\n")  # no AnonHugePages: a kernel that does not say
    assert huge_pages_in_use(rollup) is None
    assert huge_pages_in_use(tmp_path / "missing") is None


@pytest.mark.parametrize(("pattern", "at"), [
    ("ab*+", 3),  # the second quantifier
    ("*a", 0),  # the * that repeats nothing
    ("ab\\q", 2),  # the escape's backslash, not the character after it
    ("a\\u12", 1),
    ("a\\", 1),
    ("a[z-b]", 2),  # the range's first end
    ("a[b-\\d]", 2),
    ("ab[cd", 2),  # the [ that is not closed
    ("a(b", 1),  # the ( that is not closed
    ("a(?=b)", 1),
    ("a(?i)b", 1),
    ("a(?<nb", 1),
    ("a)", 1),
])
def test_pattern_errors_point_at_the_part_at_fault(pattern, at):
    # "at character N" is the 0-based index of the part at fault, as the project's other "at character" errors say
    # (a lone surrogate at character 0 is the first character); these pointed one or two characters past it
    with pytest.raises(PatternError) as caught:
        string_matcher(pattern)
    assert caught.value.problem.endswith(f"(at character {at})"), caught.value.problem
