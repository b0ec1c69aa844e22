"""Mark-less UTF-16 text of a script without NULs of its own (CJK) is named UTF-16 by every caller of
``utf8_fix``, not Latin-1: its only NULs are its ASCII characters', fewer than the quarter the wide-encoding check
looked for, and iconv from Latin-1 turned it into UTF-8 full of NULs."""

from __future__ import annotations

import pytest

from edgesdk.errors import EdgeSDKError, likely_encoding, utf8_fix

CJK = "中文文本，第一行。\n第二行有更多的字：模型、数据、评估。\n" * 40


@pytest.mark.parametrize("encoding", ["utf-16le", "utf-16be"])
def test_markless_utf16_cjk_is_named_utf16_with_its_byte_order(encoding):
    data = CJK.encode(encoding)
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")
    assert likely_encoding(data) == encoding
    assert f"iconv -f {encoding} -t utf-8" in utf8_fix(data, "tasks.jsonl")


def test_a_hellaswag_file_in_markless_utf16_gets_the_utf16_fix(tmp_path):
    from edgesdk.accuracy import HELLASWAG, read_task_file

    path = tmp_path / "hellaswag.jsonl"
    path.write_bytes(('{"ctx": "' + CJK.replace("\n", " ") + '"}\n').encode("utf-16le"))
    with pytest.raises(EdgeSDKError) as caught:
        read_task_file(HELLASWAG, path)
    assert "iconv -f utf-16le -t utf-8" in str(caught.value)


@pytest.mark.parametrize("data", [b"caf\xe9 cr\xe8me br\xfbl\xe9e\n" * 20, b"caf\xe9\x00 one stray NUL\n"])
def test_latin1_text_is_still_named_latin1(data):
    assert likely_encoding(data) == "latin1"
