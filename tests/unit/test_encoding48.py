"""A text file that is not UTF-8 is refused with the iconv command that converts it (edgesdk/errors.py
``utf8_fix``): from UTF-16 where its byte-order mark says so, as Windows' "Unicode" text and PowerShell's ``>``
write it. The fix used to name Latin-1 for every file; followed on a UTF-16 file, it gives UTF-8 full of NULs,
which then reads and scores without any error."""

from __future__ import annotations

import pytest

from edgesdk.errors import EdgeSDKError, read_utf8

TEXT = "The quick brown fox.\nJumps over the lazy dog.\n"


@pytest.mark.parametrize(("encoding", "named"), [
    ("utf-16", "utf-16"), ("utf-16-be", "utf-16"), ("utf-32", "utf-32"), ("latin1", "latin1")])
def test_the_fix_names_the_encoding_the_file_is_in(tmp_path, encoding, named):
    path = tmp_path / "text.txt"
    data = TEXT.replace("quick", "quíck").encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    path.write_bytes(data)
    with pytest.raises(EdgeSDKError) as refused:
        read_utf8(path, "evaluation text")
    assert f"iconv -f {named} -t utf-8 " in refused.value.fix
    # converted from what the fix names, the file reads as written
    assert data.decode(named).lstrip("\ufeff") == TEXT.replace("quick", "quíck")


def test_a_task_file_in_utf16_is_told_to_convert_from_utf16(tmp_path):
    from edgesdk.accuracy import HELLASWAG, read_task_file

    path = tmp_path / "hellaswag.txt"
    path.write_bytes("context\n1\nending a\nending b\nending c\nending d\n".encode("utf-16"))
    with pytest.raises(EdgeSDKError) as refused:
        read_task_file(HELLASWAG, path)
    assert "iconv -f utf-16 -t utf-8 " in refused.value.fix
