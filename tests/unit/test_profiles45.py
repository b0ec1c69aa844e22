"""Profiles and recipes (review 45): a YAML file that gives a key twice, and profile values that cannot hold on
the board they describe, are refused instead of being loaded silently."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import yaml

from edgesdk.build.recipes import load_recipe, shipped_recipes
from edgesdk.errors import BuildError, ProfileError
from edgesdk.profile import load_yaml_unique, parse_profile, shipped_profiles


def _rpi5_text() -> str:
    return resources.files("edgesdk.targets").joinpath("rpi5.yaml").read_text(encoding="utf-8")


def _rpi5_data() -> dict:
    return yaml.safe_load(_rpi5_text())


# --- duplicate keys (YAML 1.2.2 §3.2.1.1: the keys of a mapping are unique; PyYAML keeps the last silently) -----


def test_a_profile_that_gives_a_thermal_limit_twice_is_refused() -> None:
    # Both values are valid on their own: without the check the second (77) silently replaced the first (75).
    text = _rpi5_text().replace("  soft_limit_c: 75", "  soft_limit_c: 75\n  soft_limit_c: 77", 1)
    assert text.count("soft_limit_c:") == 2
    with pytest.raises(ProfileError) as info:
        parse_profile(text, "targets/my-pi.yaml")
    message = str(info.value)
    assert "targets/my-pi.yaml" in message
    assert "'soft_limit_c' twice" in message
    assert "each key once" in message


def test_a_profile_that_gives_a_section_twice_is_refused() -> None:
    text = _rpi5_text() + "\nmemory:\n  total_gb: 4  # the 4 GB board\n  bandwidth_gbps: 17  # same bus\n"
    with pytest.raises(ProfileError, match="'memory' twice"):
        parse_profile(text)


def test_a_recipe_with_two_export_sections_is_refused(tmp_path: Path) -> None:
    # The first export asks for INT4 in the fused graph; without the check the second silently won (fp32 standard).
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nexport:\n  form: ort-fused\n  weights: int4\nexport:\n  form: standard\n",
                    encoding="utf-8")
    with pytest.raises(BuildError) as info:
        load_recipe(str(path))
    assert "'export' twice" in str(info.value)
    assert str(path) in str(info.value)


def test_a_recipe_stage_option_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nstages:\n  - stage: qat\n    config:\n      weight_bits: 4\n      steps: 64\n"
                    "      weight_bits: 8\nexport:\n  form: ort-fused\n  weights: int4\n", encoding="utf-8")
    with pytest.raises(BuildError, match="'weight_bits' twice"):
        load_recipe(str(path))


def test_a_merge_key_may_still_be_overridden() -> None:
    # YAML's merge-key type lets a mapping override what <<: brings in: not a duplicate.
    assert load_yaml_unique("base: &b {a: 1, b: 2}\nm:\n  <<: *b\n  a: 3\n") == {"base": {"a": 1, "b": 2},
                                                                               "m": {"a": 3, "b": 2}}


def test_every_shipped_profile_and_recipe_still_loads() -> None:
    assert len(shipped_profiles()) == 10
    for name in shipped_recipes():
        assert load_recipe(name).name == name


# --- values that cannot hold on the board ------------------------------------------------------------------------


def test_a_memory_budget_above_the_boards_ram_is_refused() -> None:
    # The rpi5 profile's comment says "copy it for other SKUs": a copy for the 4 GB Pi 5 that keeps the 8 GB
    # board's 4500 MB budget would let deploy accept a bundle the board cannot hold.
    data = _rpi5_data()
    data["memory"]["total_gb"] = 4
    with pytest.raises(ProfileError) as info:
        parse_profile(yaml.safe_dump(data), "my-pi5-4gb.yaml")
    message = str(info.value)
    assert "memory_budget_mb (4500)" in message
    assert "memory.total_gb 4" in message
    assert "2048" in message  # the fix: about half of the RAM
    data["memory_budget_mb"] = 2000
    assert parse_profile(yaml.safe_dump(data)).memory_budget_mb == 2000


def test_more_threads_than_cores_is_refused() -> None:
    data = _rpi5_data()
    data["runtime"]["threads"] = 8
    with pytest.raises(ProfileError) as info:
        parse_profile(yaml.safe_dump(data))
    assert "runtime.threads (8) exceeds cpu.cores (4)" in str(info.value)
    data["runtime"]["threads"] = 4
    assert parse_profile(yaml.safe_dump(data)).runtime.threads == 4
