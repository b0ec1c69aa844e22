"""Second reading of this session's non-serve changes: the unit-bind comparison and likely_encoding's UTF-16 rule."""

from __future__ import annotations

import pytest

from edgesdk.deploy.board_service import render_unit, unit_answers_on
from edgesdk.errors import EdgeSDKError, likely_encoding, read_utf8


def _unit(tmp_path, host: str, port: int = 8080):
    path = tmp_path / "edgesdk-serve.service"
    path.write_text(render_unit(["/usr/bin/edgesdk", "serve", "/srv/edgesdk/current", "--host", host, "--port",
                                 str(port), "--watch-thermal"], "user"), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("bound", "url"), [
    # a unit on --host localhost listens on 127.0.0.1 (serve binds the name's IPv4 address): the default health
    # URL of the next deploy asks that very address
    ("localhost", "http://127.0.0.1:8080/health"),
    ("127.0.0.1", "http://localhost:8080/health"),
    # IPv6 addresses written otherwise are the same address; 0::0 is the wildcard ::
    ("0::0", "http://192.168.1.20:8080/health"),
    ("0:0:0:0:0:0:0:0", "http://127.0.0.1:8080/health"),
    ("::1", "http://[0:0::1]:8080/health"),
    # host names are compared without case (RFC 4343); urlsplit lowers the URL's
    ("Orin.local", "http://orin.local:8080/health"),
])
def test_unit_answers_on_compares_addresses_not_spellings(tmp_path, bound, url):
    assert unit_answers_on(_unit(tmp_path, bound), url)


@pytest.mark.parametrize(("bound", "url"), [
    ("0.0.0.0", "http://[::1]:8080/health"),  # an IPv4 wildcard takes no IPv6 connection
    ("192.168.1.20", "http://127.0.0.1:8080/health"),
    ("127.0.0.1", "http://127.0.0.1:8081/health"),  # another port
    ("localhost", "http://localhost:8081/health"),
])
def test_unit_answers_on_still_tells_other_addresses(tmp_path, bound, url):
    assert not unit_answers_on(_unit(tmp_path, bound), url)


def test_unit_answers_on_wildcards_as_before(tmp_path):
    assert unit_answers_on(_unit(tmp_path, "0.0.0.0"), "http://192.168.1.20:8080/health")
    assert unit_answers_on(_unit(tmp_path, "[::]"), "http://192.168.1.20:8080/health")


# no byte 0xD8-0xDF (Ø, Ü, ß ...), which as a UTF-16 high byte is a lone surrogate: such text decodes as UTF-16
LATIN1 = ("Le café était très agréable, la façade naïve;\nà Noël, crème brûlée et thé.\n" * 40).encode("cp1252")


def test_latin1_with_a_zero_filled_tail_is_named_latin1():
    # the zero-filled tail a crash or a preallocation leaves: iconv -f UTF-16LE turned the text into CJK garbage
    assert likely_encoding(LATIN1 + b"\x00" * 64) == "latin1"


def test_latin1_with_a_few_stray_nuls_is_named_latin1():
    data = LATIN1[:101] + b"\x00" + LATIN1[101:501] + b"\x00" + LATIN1[501:1001] + b"\x00" + LATIN1[1001:]
    assert likely_encoding(data) == "latin1"


@pytest.mark.parametrize("encoding", ["utf-16le", "utf-16be", "utf-32le", "utf-32be"])
def test_markless_wide_text_is_still_named(encoding):
    cjk = "日本語のテキストです。これは一行目。\n第二行：数字 123 と English words.\n" * 40
    pure = "一二三四五六七八九十天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往秋收冬藏\r\n" * 60
    assert likely_encoding(cjk.encode(encoding)) == encoding
    assert likely_encoding(pure.encode(encoding)) == encoding
    assert likely_encoding(("plain english text\n" * 100).encode(encoding)) == encoding


def test_read_utf8_does_not_call_a_zero_padded_utf8_file_wide(tmp_path):
    path = tmp_path / "train.txt"
    text = "Hello world, plain training text.\n" * 30
    path.write_bytes(text.encode("utf-8") + b"\x00" * 3096)
    assert read_utf8(path, "the training data").startswith(text)  # read as it was before the UTF-16 rule
    path.write_bytes(text.encode("utf-8") + b"\x00" * 400)
    assert read_utf8(path, "the training data").startswith(text)


def test_read_utf8_still_refuses_markless_utf16(tmp_path):
    path = tmp_path / "train.txt"
    path.write_bytes(("plain english text\n" * 100).encode("utf-16le"))
    with pytest.raises(EdgeSDKError) as caught:
        read_utf8(path, "the training data")
    assert "iconv -f utf-16le -t utf-8" in caught.value.fix
