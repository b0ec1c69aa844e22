"""Second reading of review 48's commits (1af817d..6ccd448): what a fix left reachable by a neighbouring path.

- thermal guard (9b5fe02): the prefill rate that decides whether a long prompt is held was learned from every
  prefill, also a 1-token one (a prompt the cache holds all but its last token of), which takes a decode step's time
  whatever its length; after a few of them a 400-token prompt (4 s) was held as if it took 20 s, for up to RC
  seconds (238 s on a Pi 5).
- the UTF-8 fix (a52f965): a file without a byte-order mark but with NULs was told ``iconv -f utf-16`` whatever its
  width and byte order: UTF-32 converted so gives UTF-8 full of NULs, big-endian UTF-16 CJK text (glibc's iconv
  reads a mark-less "utf-16" as little-endian), both without an error.
"""

from __future__ import annotations

import pytest

from edgesdk.errors import EdgeSDKError, likely_encoding, read_utf8
from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Reading

PROFILE = get_profile("rpi5")  # resume 70 °C, soft 75 °C: a prefill is held while it would end above 74.5 °C
ZONE = PROFILE.thermal.zones[0]


def test_short_prefills_do_not_teach_the_guard_a_prefill_rate_that_holds_an_ordinary_prompt():
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model)
    guard.observe(0.0, Reading(time=0.0, zones={ZONE: 73.0}))
    guard.begin(16, 1000)
    guard.spend("prefill", 1, 10.0)  # 100 tok/s
    guard.spend("decode", 1, 0.1)  # 10 tok/s
    assert guard.prefill_tok_s == 100.0
    for _ in range(3):  # regenerated answers: the cache leaves one token to prefill, a decode step's time
        guard.begin(16, 1)
        guard.spend("prefill", 1, 0.1)
        guard.spend("decode", 1, 0.1)
    assert guard.prefill_tok_s == 100.0  # before the fix: 21 tok/s
    guard.observe(1.0, Reading(time=1.0, zones={ZONE: 73.0}))
    guard.begin(16, 400)  # 4 s at 100 tok/s: 73 °C -> about 73.6 °C, under 74.5 °C
    assert not guard.prefill_held  # before the fix: held, up to 238 s
    guard.begin(16, 2000)  # 20 s: still held
    assert guard.prefill_held


TEXT = "The quíck brown fox.\nJumps over the lazy dog.\n"  # í: not UTF-8 in any of them (ASCII alone would pass)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_a_file_without_a_byte_order_mark_is_told_its_width_and_byte_order(tmp_path, encoding):
    path = tmp_path / "text.txt"
    data = TEXT.encode(encoding)
    path.write_bytes(data)
    with pytest.raises(EdgeSDKError) as refused:
        read_utf8(path, "evaluation text")
    named = likely_encoding(data)
    assert named == encoding.replace("-le", "le").replace("-be", "be")
    assert f"iconv -f {named} -t utf-8 " in refused.value.fix
    assert data.decode(named) == TEXT  # what the fix names reads the file as written, no NULs


def test_latin1_and_marked_files_are_named_as_before():
    assert likely_encoding(TEXT.encode("latin1")) == "latin1"
    assert likely_encoding(TEXT.encode("utf-16")) == "utf-16"
    assert likely_encoding(TEXT.encode("utf-32")) == "utf-32"

