"""The fix named for text that is not UTF-8 where no file holds it (an argument, ``-f -``'s stdin) tells
Windows-1252 text and UTF-8 with a few bad bytes from Latin-1, as a file's does (``errors.utf8_fix``); and an
escape that gives bytes that are not UTF-8 is refused naming its line, not quoting the whole text."""

from __future__ import annotations

import io
import sys

import click
import pytest

from edgesdk import errors
from edgesdk.cli_embed import _inputs
from edgesdk.cli_interactive import process_escapes
from edgesdk.cli_run import _one_prompt, _read_stdin_prompt
from edgesdk.errors import UTF8_SAMPLE, EdgeSDKError, utf8_fix
from edgesdk.runtime import text
from edgesdk.runtime.text import check_utf8

WINDOWS_1252 = "\u201cquoted\u201d \u2014 caf\u00e9".encode("cp1252")  # curly quotes and a dash: 0x93, 0x94, 0x97
DAMAGED_UTF8 = "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e na\u00efve".encode() + b" \xe9"  # one Latin-1 byte pasted in
LATIN1 = "caf\u00e9 au lait".encode("latin1")


def as_argument(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")  # as Python hands over an argument that is not UTF-8


@pytest.mark.parametrize(("data", "command"), [
    (WINDOWS_1252, "iconv -f cp1252 -t utf-8"),
    (DAMAGED_UTF8, "iconv -c -f utf-8 -t utf-8"),
    (LATIN1, "iconv -f latin1 -t utf-8"),
])
def test_check_utf8_names_the_conversion_that_fits_the_bytes(data, command):
    """'iconv -f latin1' turned Windows-1252's curly quotes into invisible C1 controls, and doubled each accented
    letter of UTF-8 with one bad byte into two (é into Ã©)."""
    with pytest.raises(EdgeSDKError) as refused:
        check_utf8(as_argument(data), "the prompt")
    assert refused.value.fix == f"pass UTF-8 text ({command} makes it UTF-8)"


def test_check_utf8_names_the_conversion_beside_a_lone_surrogate_too():
    """A text that also holds a lone surrogate of a JSON escape (which surrogateescape cannot encode) still gets
    its conversion named, not a traceback."""
    with pytest.raises(EdgeSDKError) as refused:
        check_utf8(as_argument(WINDOWS_1252) + "\ud83d", "the prompt")
    assert "iconv -f cp1252 -t utf-8" in refused.value.fix


@pytest.mark.parametrize(("data", "command"), [
    (WINDOWS_1252, "iconv -f cp1252 -t utf-8"),
    (DAMAGED_UTF8, "iconv -c -f utf-8 -t utf-8"),
    (LATIN1, "iconv -f latin1 -t utf-8"),
    ("caf\u00e9\n".encode("utf-16"), "iconv -f utf-16 -t utf-8"),
])
def test_file_dash_names_the_conversion_that_fits_stdin(monkeypatch, data, command):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    with pytest.raises(EdgeSDKError) as refused:
        _read_stdin_prompt()
    assert refused.value.fix == f"convert it first, e.g. ... | {command} | edgesdk run BUNDLE -f -"


def test_an_escape_not_utf8_in_a_file_is_refused_naming_its_line_not_the_whole_file(tmp_path):
    """run -f FILE quoted the whole file in the refusal; it names the line, cut to 80 characters, and
    --no-escape, as embed's -f does."""
    long_line = "x" * 100 + "caf\\xe9"
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("fine line\n" * 500 + long_line + "\nlast line\n", encoding="utf-8")
    with pytest.raises(click.BadParameter) as refused:
        _one_prompt(None, prompt)
    message = refused.value.format_message()
    assert (f"line 501 ('{'x' * 77}...') gives bytes that are not UTF-8 once its escapes are "
                              "processed (unexpected end of data at byte 103); pass --no-escape") in message
    assert "fine line" not in message
    assert len(message) < 400


def test_a_one_line_text_is_quoted_as_it_was_and_cut_to_80_characters():
    with pytest.raises(click.BadParameter) as refused:
        process_escapes("caf\\xe9", "'--in-prefix'")
    assert ("'caf\\xe9' gives bytes that are not UTF-8 once its escapes are processed (unexpected end of data at "
        "byte 3); pass --no-escape to take its backslashes as written") in refused.value.format_message()
    with pytest.raises(click.BadParameter) as refused:
        process_escapes("y" * 200 + "\\xff", "'--prompt' / '-p'")
    assert f"'{'y' * 77}...' gives bytes" in refused.value.format_message()


def test_escapes_that_give_utf8_over_lines_still_read():
    assert process_escapes("caf\\xc3\\xa9\\n\nnext\\tline", "'--file' / '-f'") == "caf\u00e9\n\nnext\tline"


# UTF-8 text larger than the sample, cut inside its last character (a copy or a download that stopped): its head
# holds no bad byte, and its 0x80-0x9F continuation bytes (of é, è, ï, —) are everywhere in the file
CUT_UTF8 = "caf\u00e9 cr\u00e8me \u2014 na\u00efve\n".encode() * 80000 + b"\xe2\x82"


def test_a_large_utf8_file_cut_inside_its_last_character_is_told_to_drop_the_bad_bytes():
    """Judged on its first 1 MiB, it was named Windows-1252, whose iconv turns every accented letter into two."""
    assert len(CUT_UTF8) > UTF8_SAMPLE
    assert errors.damaged_utf8(CUT_UTF8)
    assert utf8_fix(CUT_UTF8, "corpus.txt") == (
        "it is UTF-8 text but for a few bytes (cut inside a character, or from another encoding): drop them, "
        "e.g. iconv -c -f utf-8 -t utf-8 corpus.txt > corpus.txt.utf8")
    with pytest.raises(EdgeSDKError) as refused:
        check_utf8(as_argument(CUT_UTF8), "the prompt")
    assert refused.value.fix == "pass UTF-8 text (iconv -c -f utf-8 -t utf-8 makes it UTF-8)"


def test_8bit_text_after_a_long_ascii_head_is_still_told_its_encoding():
    """A Windows-1252 file whose first curly quote comes well after its first accented letter is Windows-1252, and
    one whose first non-ASCII byte is past the sample is no damaged UTF-8."""
    late_quote = "caf\u00e9\n".encode("cp1252") + b"plain text\n" * 200000 + "\u201cquoted\u201d".encode("cp1252")
    assert utf8_fix(late_quote, "notes.txt").startswith("convert it first, e.g. iconv -f cp1252 -t utf-8 ")
    late_letter = b"plain text\n" * 200000 + LATIN1
    assert not errors.damaged_utf8(late_letter)
    assert utf8_fix(late_letter, "notes.txt").startswith("convert it first, e.g. iconv -f latin1 -t utf-8 ")


def test_a_file_and_a_text_without_one_are_told_the_conversion_by_the_same_function():
    assert text.iconv_to_utf8 is errors.iconv_to_utf8
    for data in (WINDOWS_1252, DAMAGED_UTF8, LATIN1, CUT_UTF8):
        assert f"e.g. {errors.iconv_to_utf8(data)} notes.txt > notes.txt.utf8" in utf8_fix(data, "notes.txt")


def test_the_refused_line_of_a_crlf_text_is_shown_without_its_carriage_return():
    """A CRLF file's line ended in '\\r': on a terminal the rest of the message overwrote 'line 2 ('."""
    with pytest.raises(click.BadParameter) as refused:
        process_escapes("fine line\r\ncaf\\xe9\r\nlast line\r\n", "'--file' / '-f'")
    message = refused.value.format_message()
    assert "line 2 ('caf\\xe9') gives bytes that are not UTF-8" in message
    assert "\r" not in message


def test_control_characters_of_the_refused_line_are_shown_escaped():
    with pytest.raises(click.BadParameter) as refused:
        process_escapes("\x1b[2J\tcaf\\xe9\x85", "'--prompt' / '-p'")
    message = refused.value.format_message()
    assert "'\\x1b[2J\\tcaf\\xe9\\x85' gives bytes" in message
    assert not any(char in message for char in "\x1b\t\x85")


def test_embed_file_escapes_follow_no_escape(tmp_path):
    text_file = tmp_path / "notes.txt"
    text_file.write_text("caf\\xc3\\xa9\nprintf \"\\xe9\"\n", encoding="utf-8")
    assert _inputs((), text_file, "\n", escape=False)[1][0] == 'printf "\\xe9"'
    with pytest.raises(click.BadParameter) as refused:
        _inputs((), text_file, "\n")
    assert "line 2 ('printf \"\\xe9\"')" in refused.value.format_message()
