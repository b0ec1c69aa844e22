"""A user's profile with temperatures in the kernel's millidegrees, kelvin or °F, and ``edgesdk env`` on a machine
with a broken package install or only nvgpu's newer device node."""

from __future__ import annotations

import pytest
import yaml

from edgesdk.envinfo import collect_env, format_env, package_version
from edgesdk.errors import BundleError, ProfileError
from edgesdk.profile import bundle_profile, get_profile, parse_profile

LIMITS = ("resume_c", "soft_limit_c", "hard_limit_c", "firmware_throttle_c", "shutdown_c")


def _rpi5(change) -> dict:
    data = get_profile("rpi5").summary()
    change(data)
    return data


def _refusal(data: dict) -> str:
    with pytest.raises(ProfileError) as info:
        parse_profile(yaml.safe_dump(data, sort_keys=False), "my-board.yaml")
    return str(info.value)


def _in_millidegrees(data: dict) -> None:
    for key in LIMITS:
        data["thermal"][key] = int(data["thermal"][key] * 1000)


def test_limits_in_millidegrees_are_refused_naming_the_degrees_to_write():
    """thermal_zone*/temp and trip_point_*_temp read millidegrees: limits copied from them rose strictly and
    loaded, so the guard paced from 75000 °C and never acted before the firmware throttled the board."""
    message = _refusal(_rpi5(_in_millidegrees))
    assert "thermal.soft_limit_c" in message
    assert "75000" in message
    assert "millidegrees" in message
    assert "write 75" in message
    assert "thermal.shutdown_c" in message
    assert "write 110" in message


def test_ambient_in_millidegrees_is_refused():
    message = _refusal(_rpi5(lambda data: data["thermal_model"].update(ambient_c=25000)))
    assert "thermal_model.ambient_c" in message
    assert "25000" in message
    assert "write 25" in message


@pytest.mark.parametrize(("key", "value", "hint"), [
    ("resume_c", 343.15, "343.15 K is 70.0 °C"),  # 70 °C in kelvin
    ("resume_c", 158, "158 °F is 70.0 °C"),  # 70 °C in °F
    ("shutdown_c", 230, "230 °F is 110.0 °C"),
    ("resume_c", -300, "absolute zero"),
])
def test_limits_in_kelvin_or_fahrenheit_or_below_absolute_zero_are_refused(key, value, hint):
    message = _refusal(_rpi5(lambda data: data["thermal"].update({key: value})))
    assert f"thermal.{key}" in message
    assert hint in message


def test_shipped_limits_still_load():
    for name in ("rpi5", "rpi4", "orin-nx-16gb", "xavier-nx", "host"):
        assert get_profile(name).thermal.shutdown_c <= 150


def test_a_bundle_whose_profile_holds_millidegrees_is_refused():
    with pytest.raises(BundleError, match="millidegrees"):
        bundle_profile(_rpi5(_in_millidegrees), "bundles/x")


def _broken_dist_info(site, name: str, version: str, metadata: str | None) -> None:
    folder = site / f"{name}-{version}.dist-info"
    folder.mkdir(parents=True)
    if metadata is not None:
        (folder / "METADATA").write_text(metadata, encoding="utf-8")


def test_a_dist_info_without_a_version_is_not_shown_as_missing(tmp_path, monkeypatch):
    """A .dist-info left without METADATA: metadata.version() gave None, which env printed as "-" (not installed)
    beside gpu.tensorrt "yes", and --json as null."""
    _broken_dist_info(tmp_path, "tensorrt", "10.3.0", None)
    monkeypatch.syspath_prepend(str(tmp_path))
    shown = package_version("tensorrt", "tensorrt-cu12")
    assert shown is not None
    assert shown.startswith("installed, version unknown")
    assert "pip install --force-reinstall tensorrt" in shown
    info = collect_env(tmp_path)
    assert info["packages"]["tensorrt"] == shown
    assert "version unknown" in format_env(info)


def test_a_broken_copy_does_not_hide_an_installed_one(tmp_path, monkeypatch):
    """The first copy on sys.path without a version hid the installed numpy's version."""
    import numpy

    _broken_dist_info(tmp_path, "numpy", "0.0.1", "Name: numpy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_version("numpy") == numpy.__version__


def test_nvgpu_new_hierarchy_node_is_a_gpu(tmp_path):
    """nvgpu's uapi names /dev/nvhost-ctrl-gpu the legacy node and /dev/nvgpu/igpu0/ctrl the new one; a Jetson kernel
    with only the new one was reported as having no CUDA device."""
    node = tmp_path / "dev/nvgpu/igpu0/ctrl"
    node.parent.mkdir(parents=True)
    node.write_bytes(b"")
    gpu = collect_env(tmp_path)["gpu"]
    assert gpu["device_nodes"] == ["/dev/nvgpu/igpu0/ctrl"]
    assert gpu["cuda_device"] is True
