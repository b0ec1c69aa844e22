"""Review of the bundle and build pipeline: profiles, the work directory, resuming from checkpoints."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from edgesdk.build.checkpoint import WorkDir
from edgesdk.errors import BuildError, ProfileError
from edgesdk.profile import parse_profile


def _profile_data(name: str = "rpi5") -> dict:
    return yaml.safe_load((resources.files("edgesdk.targets") / f"{name}.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("section", ["thermal", "memory", "cpu"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_profile_number_that_is_not_finite_is_refused_naming_the_key(section, value):
    """NaN passed the thermal order check (NaN compares false with every limit), so a guard built from a NaN
    hard_limit_c never paused and a NaN resume_c ended every pause at once; an infinite DRAM bandwidth made the
    thermal plan's decode rate infinite."""
    keys = {"thermal": ["resume_c", "soft_limit_c", "hard_limit_c", "firmware_throttle_c", "shutdown_c"],
            "memory": ["total_gb", "bandwidth_gbps"], "cpu": ["max_ghz"]}[section]
    for key in keys:
        data = _profile_data()
        data[section][key] = value
        with pytest.raises(ProfileError, match=rf"{section}\.{key}: Input should be a finite number"):
            parse_profile(yaml.safe_dump(data), "my-board.yaml")


@pytest.mark.parametrize("text", ["", '{"build_key": "ab', "[]", '{"done": []}'])
def test_a_damaged_state_file_is_a_build_error_on_resume(tmp_path, text):
    """The state file is replaced in one step, but a disk error or an edit can still leave it unreadable:
    --resume failed with json's JSONDecodeError (or AttributeError on a list) and a traceback."""
    work = tmp_path / "b.build"
    WorkDir(work, {"build": 1}, resume=False).release()
    (work / "state.json").write_text(text)
    with pytest.raises(BuildError, match=r"--resume: the work directory's state file .*state.json cannot be read "
                                         r"\(.*\), so the steps it finished are not known") as refused:
        WorkDir(work, {"build": 1}, resume=True)
    assert refused.value.fix == f"drop --resume to start over (the build replaces {work})"
    WorkDir(work, {"build": 1}, resume=False).release()  # dropping --resume starts over there
