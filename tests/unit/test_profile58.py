"""Target profile validation: what a yes/no stands in for, gpu.sm written as nvcc's flag or past any GPU, and a
shipped target's name typed as a YAML file."""

from __future__ import annotations

import pytest
import yaml

from edgesdk.errors import ProfileError
from edgesdk.profile import bundle_profile, get_profile, parse_profile


def _refusal(text: str) -> str:
    with pytest.raises(ProfileError) as info:
        parse_profile(text, "mine.yaml")
    return str(info.value)


def _rpi5_with(key: str, value: str) -> str:
    """rpi5's profile as YAML, with the top-level or one-section ``key`` set to the YAML text ``value``."""
    data = get_profile("rpi5").summary()
    *sections, name = key.split(".")
    place = data
    for section in sections:
        place = place[section]
    place[name] = yaml.safe_load(value)
    return yaml.safe_dump(data, sort_keys=False)


def _jetson_with_sm(sm: str) -> str:
    """orin-nx-16gb's profile as YAML, with ``sm: <sm>`` written as given (quoted or not)."""
    text = yaml.safe_dump(get_profile("orin-nx-16gb").summary(), sort_keys=False)
    assert "  sm: 87\n" in text
    return text.replace("  sm: 87\n", f"  sm: {sm}\n")


@pytest.mark.parametrize(("key", "expected"), [
    ("sparsity", "a list in brackets (for none, write sparsity: [])"),
    ("cpu.isa_features", "a list in brackets (for none, write isa_features: [])"),
    ("precisions", "a list in brackets is expected"),  # at least one precision: no "for none"
    ("thermal", "a section of keys (thermal: followed by its indented keys)"),
])
def test_a_no_where_a_list_or_a_section_is_expected_names_that_form(key: str, expected: str) -> None:
    """'sparsity: no' (no sparsity) or 'thermal: off' was told a number or a name was expected, which none of
    these keys holds: the message names the list or section the key takes, and how to write none."""
    message = _refusal(_rpi5_with(key, "no"))
    assert f"{key}: " in message
    assert f"where {expected}" in message
    assert "where a number or a name is expected" not in message


def test_gpu_no_is_told_to_write_null_for_a_board_without_one() -> None:
    data = get_profile("rpi5").summary()
    data["gpu"] = False  # 'gpu: no', meaning the board has none
    message = _refusal(yaml.safe_dump(data))
    assert "gpu: " in message
    assert "where a section of keys (gpu: followed by its indented keys, or gpu: null for none)" in message


def test_a_yes_for_a_number_is_still_refused_as_one() -> None:
    assert "threads: " in (message := _refusal(_rpi5_with("runtime.threads", "on")))
    assert "where a number or a name is expected" in message


@pytest.mark.parametrize(("written", "fix"), [
    ("sm_87", "write 87"), ("'sm_87'", "write 87"), ("compute_72", "write 72"), ("sm_90a", "write 90"),
    ("'8.7'", "write 87"), ("870", "write 87"), ("870.0", "write 87"), ("'870'", "write 87"),
    ("1000", "write 100"), ("137", "write major * 10 + minor"),
])
def test_sm_as_nvcc_flag_quoted_version_or_past_any_gpu_is_refused_with_the_integer(written: str, fix: str) -> None:
    """'sm: sm_87' and 'sm: "8.7"' met pydantic's bare "unable to parse string as an integer", and 'sm: 870'
    loaded as a GPU that does not exist (the kernels compiled for it failed at build time)."""
    message = _refusal(_jetson_with_sm(written))
    assert "gpu.sm is the CUDA compute capability as an integer" in message
    assert fix in message


@pytest.mark.parametrize(("written", "sm"), [("'87'", 87), ("87", 87), ("110", 110), ("121", 121), ("80.0", 80)])
def test_sm_of_a_real_gpu_still_loads(written: str, sm: int) -> None:
    assert parse_profile(_jetson_with_sm(written), "mine.yaml").gpu.sm == sm


@pytest.mark.parametrize(("typed", "name"), [("rpi5.yaml", "rpi5"), ("targets/rpi5.yaml", "rpi5"),
                                             ("orin-nano.YML", "orin-nano")])
def test_a_shipped_target_typed_as_its_yaml_file_is_told_its_name(tmp_path, monkeypatch, typed: str, name: str):
    """'--target rpi5.yaml' (the repository's file name) away from the repository was told only that the file does
    not exist, and to pass "a shipped target name": the refusal now says which one it is."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProfileError) as info:
        get_profile(typed)
    message = str(info.value)
    assert f"target profile file {typed} does not exist; '{name}' is the name of a shipped target" in message
    assert f"pass the target as {name} for the shipped profile" in message
    with pytest.raises(ProfileError, match=f"pass target='{name}' for the shipped profile"):
        get_profile(typed, terms="python")


def test_a_missing_profile_file_of_no_shipped_name_keeps_its_refusal(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProfileError) as info:
        get_profile("my-board.yaml")
    assert "target profile file my-board.yaml does not exist" in str(info.value)
    assert "shipped target" not in str(info.value).splitlines()[0]


@pytest.mark.parametrize("text", ["", "# my board, to be written\n"])
def test_an_empty_profile_file_is_named_as_empty_not_as_python_none(tmp_path, text: str) -> None:
    """An empty profile (or one of comments only) was refused as "must be a YAML mapping, got NoneType"."""
    path = tmp_path / "board.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ProfileError) as info:
        get_profile(str(path))
    assert "must be a YAML mapping, got nothing (the file is empty, or holds only comments)" in str(info.value)
    assert "NoneType" not in str(info.value)


@pytest.mark.parametrize(("name", "fallbacks", "repeated"), [
    ("rpi5", ["ort-cpu"], "'ort-cpu'"),
    ("agx-orin-64gb", ["tensorrt", "ort-trt", "ort-cuda", "ort-cpu"], "'tensorrt'"),
    ("agx-orin-64gb", ["ort-trt", "ort-cpu", "ort-trt"], "'ort-trt'"),
])
def test_a_backend_listed_twice_is_refused_naming_it(name: str, fallbacks: list[str], repeated: str) -> None:
    """The session tries backend then fallbacks in order: one listed twice (a TensorRT engine that does not build)
    was tried, and failed, twice."""
    data = get_profile(name).summary()
    data["runtime"]["fallbacks"] = fallbacks
    message = _refusal(yaml.safe_dump(data))
    assert f"runtime: Value error, {repeated} listed more than once" in message
    assert "list each once, e.g. backend: " in message


def test_a_bundles_copy_with_a_backend_listed_twice_still_reads() -> None:
    data = get_profile("rpi5").summary()
    data["runtime"]["fallbacks"] = ["ort-cpu"]
    assert bundle_profile(data, "bundles/old").runtime.fallbacks == ("ort-cpu",)
