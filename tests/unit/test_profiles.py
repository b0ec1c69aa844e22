"""Shipped target profiles (targets/*.yaml) and the strict profile schema (edgesdk.profile)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import yaml

from edgesdk.errors import ProfileError
from edgesdk.profile import BACKENDS, TargetProfile, get_profile, parse_profile, shipped_profiles

SHIPPED = {
    "orin-nx-16gb",
    "orin-nx-8gb",
    "orin-nano-8gb",
    "orin-nano-4gb",
    "agx-orin-64gb",
    "agx-orin-32gb",
    "xavier-nx",
    "rpi5",
    "rpi4",
    "host",
}
ALIASES = {"orin-nx": "orin-nx-16gb", "orin-nano": "orin-nano-8gb", "agx-orin": "agx-orin-64gb"}
JETSON_SM = {
    "orin-nx-16gb": 87,
    "orin-nx-8gb": 87,
    "orin-nano-8gb": 87,
    "orin-nano-4gb": 87,
    "agx-orin-64gb": 87,
    "agx-orin-32gb": 87,
    "xavier-nx": 72,
}
RPI = {"rpi5", "rpi4"}

# Keys whose value is a hardware (or derived/estimated physical) number: their line must carry a source comment.
HARDWARE_KEYS = {
    "cores",
    "max_ghz",
    "sm",
    "cuda_cores",
    "tensor_cores",
    "total_gb",
    "bandwidth_gbps",
    "python",
    "jetpack",
    "cuda",
    "tensorrt",
    "threads",
    "memory_budget_mb",
    "entropy_target",
    "zones",
    "resistance_c_per_w",
    "capacity_j_per_c",
}
HARDWARE_SUFFIXES = ("_c", "_w")
KEY_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*):\s*(.*)$")


def _yaml_text(name: str) -> str:
    return resources.files("edgesdk.targets").joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def _shipped_data(name: str) -> dict:
    return yaml.safe_load(_yaml_text(name))


def _write(tmp_path: Path, data: dict, file_name: str = "my-board.yaml") -> Path:
    path = tmp_path / file_name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _is_hardware_key(key: str) -> bool:
    return key in HARDWARE_KEYS or key.endswith(HARDWARE_SUFFIXES)


# --- shipped profiles ---------------------------------------------------------------------------------------


def test_shipped_profiles_are_exactly_the_ten_boards() -> None:
    profiles = shipped_profiles()
    assert set(profiles) == SHIPPED
    assert len(profiles) == 10
    assert all(isinstance(p, TargetProfile) for p in profiles.values())


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_shipped_profile_loads_by_name(name: str) -> None:
    profile = get_profile(name)
    assert profile.name == name
    assert profile.description
    assert "\n" not in profile.description
    assert parse_profile(_yaml_text(name), f"{name}.yaml") == profile


@pytest.mark.parametrize(("alias", "canonical"), sorted(ALIASES.items()))
def test_aliases_resolve(alias: str, canonical: str) -> None:
    assert get_profile(alias).name == canonical
    assert get_profile(alias) is get_profile(canonical)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_entropy_target(name: str) -> None:
    expected = 1.2 if name == "host" else 1.5
    assert get_profile(name).power.entropy_target == expected


@pytest.mark.parametrize(("name", "sm"), sorted(JETSON_SM.items()))
def test_jetson_sm_and_backends(name: str, sm: int) -> None:
    profile = get_profile(name)
    assert profile.family == "jetson"
    assert profile.gpu is not None
    assert profile.gpu.sm == sm
    assert profile.runtime.backend == "tensorrt"
    assert "ort-cpu" in profile.runtime.fallbacks
    assert profile.sparsity_block == 32
    if sm == 87:
        assert profile.software.jetpack == "6.2"
        assert profile.software.cuda == "12.6"
        assert profile.software.tensorrt == "10.3"
        assert profile.software.python == "3.10"
        assert set(profile.sparsity) == {"block", "2:4"}
        assert set(profile.precisions) == {"fp32", "fp16", "int8", "int4"}
        assert profile.thermal.firmware_throttle_c == 99
        assert profile.thermal.shutdown_c == 104.5
        assert "tj-thermal" in profile.thermal.zones
    else:  # Xavier NX, Volta: no 2:4 sparsity, JetPack 5.1, triton not verified
        assert profile.software.jetpack.startswith("5.1")
        assert profile.software.cuda == "11.4"
        assert profile.software.tensorrt == "8.5.2"
        assert profile.sparsity == ("block",)
        assert "triton" not in profile.runtime.fallbacks


@pytest.mark.parametrize("name", sorted(RPI))
def test_raspberry_pi_is_cpu_only(name: str) -> None:
    profile = get_profile(name)
    assert profile.family == "rpi"
    assert profile.gpu is None
    assert profile.runtime.backend == "ort-cpu"
    assert profile.runtime.fallbacks == ()
    assert profile.runtime.threads == 4
    assert profile.precisions == ("fp32", "int8", "int4")
    assert profile.sparsity == ("block",)
    assert profile.thermal.zones == ("cpu-thermal",)
    assert profile.thermal.firmware_throttle_c == 80
    assert (profile.thermal.resume_c, profile.thermal.soft_limit_c, profile.thermal.hard_limit_c) == (
        70,
        75,
        78,
    )


def test_pi_isa_features() -> None:
    pi5 = get_profile("rpi5").cpu.isa_features
    assert "asimddp" in pi5
    assert "i8mm" not in pi5
    assert "asimddp" not in get_profile("rpi4").cpu.isa_features


def test_host_profile() -> None:
    host = get_profile("host")
    assert host.family == "host"
    assert host.gpu is None
    assert host.cpu.cores == 2
    assert host.runtime.backend == "ort-cpu"
    assert host.runtime.threads == 2
    assert "avx2" in host.cpu.isa_features  # both measured hosts; only one had AVX-512 VNNI
    assert host.software.python == "3.11"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_runtime_and_thermal_model_are_plausible(name: str) -> None:
    profile = get_profile(name)
    assert 0 < profile.runtime.threads <= profile.cpu.cores
    if profile.cpu.cores > 4:
        assert profile.runtime.threads >= 2
    assert profile.memory_budget_mb < profile.memory.total_gb * 1024
    model = profile.thermal_model
    assert model.ambient_c == 25
    assert model.idle_w < model.active_w
    steady_state = model.ambient_c + model.resistance_c_per_w * model.active_w
    if profile.family == "rpi":
        # bare boards throttle under sustained full load, within a few minutes
        assert steady_state > profile.thermal.firmware_throttle_c
        assert 100 <= model.resistance_c_per_w * model.capacity_j_per_c <= 600
    else:
        # with the devkit fan (or server cooling) a decode load stays below the soft limit
        assert steady_state < profile.thermal.soft_limit_c


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_hardware_number_has_a_source_comment(name: str) -> None:
    checked = []
    for number, line in enumerate(_yaml_text(name).splitlines(), start=1):
        if line.lstrip().startswith("#"):
            continue
        match = KEY_LINE.match(line)
        if not match or not _is_hardware_key(match.group(1)) or not match.group(2).strip():
            continue
        value, _, comment = match.group(2).partition("#")
        checked.append(match.group(1))
        assert value.strip(), f"{name}.yaml:{number}: no value before the comment: {line!r}"
        assert len(comment.strip()) >= 5, (
            f"{name}.yaml:{number}: hardware line without a source comment: {line!r}"
        )
    # not vacuous: the thermal limits and the thermal model alone are 10 such lines
    assert len(checked) >= 15, checked


# --- schema errors ------------------------------------------------------------------------------------------


def test_unknown_top_level_key_lists_allowed_keys(tmp_path: Path) -> None:
    data = _shipped_data("rpi5")
    data["overclock"] = True
    with pytest.raises(
        ProfileError, match=r"unknown key 'overclock'; allowed keys here: aliases, cpu, .*thermal_model"
    ):
        get_profile(str(_write(tmp_path, data)))


def test_unknown_nested_key_lists_allowed_keys_of_that_section(tmp_path: Path) -> None:
    data = _shipped_data("orin-nx-16gb")
    data["gpu"]["clock_mhz"] = 918
    with pytest.raises(
        ProfileError,
        match=re.escape("unknown key 'gpu.clock_mhz'; allowed keys here: arch, cuda_cores, sm, tensor_cores"),
    ):
        get_profile(str(_write(tmp_path, data)))


def test_unknown_key_in_thermal_lists_thermal_keys() -> None:
    data = _shipped_data("rpi4")
    data["thermal"]["trip_c"] = 85
    expected = "unknown key 'thermal.trip_c'; allowed keys here: firmware_throttle_c, hard_limit_c, resume_c, shutdown_c, soft_limit_c, zones"
    with pytest.raises(ProfileError, match=re.escape(expected)):
        parse_profile(yaml.safe_dump(data))


def test_unknown_backend_lists_allowed_values(tmp_path: Path) -> None:
    data = _shipped_data("orin-nx-16gb")
    data["runtime"]["backend"] = "vulkan"
    with pytest.raises(ProfileError, match=r"runtime\.backend: .*'vulkan'") as info:
        get_profile(str(_write(tmp_path, data)))
    for backend in BACKENDS:
        assert f"'{backend}'" in str(info.value)


def test_unknown_fallback_backend_is_rejected() -> None:
    data = _shipped_data("rpi5")
    data["runtime"]["fallbacks"] = ["opencl"]
    with pytest.raises(ProfileError, match=r"runtime\.fallbacks\.0: .*'ort-cpu'.*'opencl'"):
        parse_profile(yaml.safe_dump(data))


def test_gpu_backend_without_gpu_is_rejected() -> None:
    data = _shipped_data("rpi5")
    data["runtime"]["fallbacks"] = ["ort-cuda"]
    with pytest.raises(ProfileError, match="has no gpu but lists GPU backends"):
        parse_profile(yaml.safe_dump(data))


def test_a_sparsity_block_that_is_not_a_power_of_two_is_rejected() -> None:
    data = _shipped_data("orin-nx-16gb")
    data["sparsity_block"] = 48
    with pytest.raises(ProfileError, match="sparsity_block must be a power of two"):
        parse_profile(yaml.safe_dump(data))


def test_an_entropy_target_no_window_can_hold_is_rejected() -> None:
    data = _shipped_data("rpi5")
    data["power"]["entropy_target"] = 2.5  # above ln 8, the most an 8-token window holds
    with pytest.raises(ProfileError, match="power.entropy_target"):
        parse_profile(yaml.safe_dump(data))


def test_missing_ort_cpu_is_rejected() -> None:
    data = _shipped_data("orin-nx-16gb")
    data["runtime"]["fallbacks"] = ["ort-trt"]
    with pytest.raises(ProfileError, match="must list 'ort-cpu'"):
        parse_profile(yaml.safe_dump(data))


def test_bad_yaml_syntax_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ncpu: {cores: 4\nthermal: [\n", encoding="utf-8")
    with pytest.raises(ProfileError, match="is not valid YAML"):
        get_profile(str(path))


def test_profile_that_is_not_utf8_is_rejected_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ProfileError, match=r"target profile .*latin.yaml is not UTF-8 text .*\n  fix: .*iconv"):
        get_profile(str(path))


def test_yaml_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(ProfileError, match="must be a YAML mapping, got list"):
        parse_profile("- rpi5\n- rpi4\n")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("soft_limit_c", 79),  # above hard_limit_c
        ("resume_c", 75),  # equal to soft_limit_c
        ("shutdown_c", 80),  # equal to firmware_throttle_c
        ("hard_limit_c", 81),  # above firmware_throttle_c
    ],
)
def test_unordered_thermal_limits_are_rejected(field: str, value: float) -> None:
    data = _shipped_data("rpi5")
    data["thermal"][field] = value
    with pytest.raises(ProfileError, match=re.escape("thermal limits must rise strictly")):
        parse_profile(yaml.safe_dump(data))


def test_unknown_target_name_lists_known_targets() -> None:
    with pytest.raises(
        ProfileError, match=r"unknown target 'jetson-tx2'; known targets: .*agx-orin.*orin-nx-16gb.*rpi5"
    ) as info:
        get_profile("jetson-tx2")
    for name in SHIPPED | set(ALIASES):
        assert name in str(info.value)


def test_missing_profile_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        get_profile(str(tmp_path / "nope.yaml"))


def test_a_profile_path_that_is_a_directory_is_named_as_one(tmp_path: Path) -> None:
    """It was reported as not existing."""
    with pytest.raises(ProfileError, match=r"target profile file .* is a directory, not a file"):
        get_profile(str(tmp_path))


def test_user_profile_path_loads(tmp_path: Path) -> None:
    data = _shipped_data("rpi5")
    data["name"] = "my-pi5-16gb"
    data["memory"]["total_gb"] = 16
    data["memory_budget_mb"] = 9000
    path = _write(tmp_path, data, "my-pi5-16gb.yml")
    profile = get_profile(str(path))
    assert profile.name == "my-pi5-16gb"
    assert profile.memory.total_gb == 16
    assert profile.family == "rpi"
    assert "my-pi5-16gb" not in shipped_profiles()


def test_profile_is_frozen() -> None:
    profile = get_profile("rpi5")
    with pytest.raises(Exception, match="frozen"):
        profile.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(("key", "value", "match"), [
    ("active_w", 1.0, r"active_w \(1.0 W\) must be at least idle_w"),  # the board would cool while computing
    ("resistance_c_per_w", float("inf"), "finite number"),  # the simulated temperature turned NaN
    ("capacity_j_per_c", float("nan"), "finite number"),
])
def test_a_thermal_model_that_cannot_be_simulated_is_rejected(key: str, value: float, match: str) -> None:
    data = _shipped_data("rpi5")
    data["thermal_model"][key] = value
    with pytest.raises(ProfileError, match=match):
        parse_profile(yaml.safe_dump(data))
