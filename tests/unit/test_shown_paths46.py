"""Error messages show a path the caller gave whole, however long its directory: ``shown`` cut every repr at 60
characters, so a PEFT adapter under a long temporary directory was named '/tmp/pytest-of-root/pytest-2...'."""

from __future__ import annotations

from edgesdk.api_checks import SHOWN_CHARS, shown


def test_an_existing_path_longer_than_the_cut_is_shown_whole(tmp_path):
    deep = tmp_path / ("adapter-" + "x" * SHOWN_CHARS)
    deep.mkdir()
    assert shown(str(deep)) == repr(str(deep))
    assert shown(deep) == repr(deep)
    assert shown((str(deep),)) == repr((str(deep),))
    assert shown([str(deep), 0.5]) == repr([str(deep), 0.5])


def test_text_that_names_no_file_is_still_cut():
    long_text = "a prompt " * 20
    assert shown(long_text) == repr(long_text)[:SHOWN_CHARS - 3] + "..."
    assert shown((long_text, 1)) == f"({repr(long_text)[:SHOWN_CHARS - 3]}..., 1)"
    assert shown("nul\0" * 30).endswith("...")
    assert len(shown(list(range(100)))) == SHOWN_CHARS


def test_short_values_and_tuple_subclasses_keep_their_repr():
    from collections import namedtuple

    pair = namedtuple("Pair", "path scale")("a", 0.5)
    for value in [(), ("a",), ("a", 0.5), [], [1], [1, 2], pair, "text", 3]:
        assert shown(value) == repr(value)
