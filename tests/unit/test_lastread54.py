"""What the last read of this change found: an earlier error line put before the tail's own, a tuple of text
taken for text, and a hung vcgencmd given the group advice."""

from __future__ import annotations

import shutil

import pytest

from edgesdk.deploy.session import stderr_tail
from edgesdk.errors import ProfileError
from edgesdk.profile import get_profile
from edgesdk.thermal.sensors import detect_sensors
from tests.unit.test_sensors54 import _pi_tree, _script


def test_a_tail_that_holds_its_error_line_gets_no_earlier_one_put_before_it():
    stderr = "\n".join(["error: old", "a", "b", "c", "error: real", "fix: x", *(f"l{i}" for i in range(7))])
    tail = stderr_tail(stderr, lines=10)
    assert tail[0] == "c"
    assert "error: real" in tail
    assert "error: old" not in tail
    cut = stderr_tail("\n".join(["error: only", *(f"l{i}" for i in range(12))]), lines=10)
    assert cut[:2] == ["error: only", "  ... (2 more lines)"]


def test_a_number_for_a_tuple_of_text_is_not_told_to_quote_a_version(tmp_path):
    profile = get_profile("rpi5").model_dump(mode="json")
    profile["thermal"]["zones"] = 5
    path = tmp_path / "board.yaml"
    path.write_text(__import__("yaml").safe_dump(profile))
    with pytest.raises(ProfileError, match="zones") as refused:
        get_profile(str(path))
    assert "3.10" not in str(refused.value)


def test_a_hung_vcgencmd_is_not_given_the_group_advice(tmp_path):
    bin_dir = tmp_path / "bin"
    _script(bin_dir, "sleep 30\n")
    _, _, notes = detect_sensors(["cpu-thermal"], _pi_tree(tmp_path / "thermal"), use_jtop=False,
                                 which=lambda name: shutil.which(name, path=str(bin_dir)))
    assert len(notes) == 1
    assert "did not answer within its timeout" in notes[0]
    assert "usermod" not in notes[0]
