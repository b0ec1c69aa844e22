"""Deploy details, 62: a profile copied from a shipped one that keeps its name, the summary of a redeploy that
switched nothing, and what ``edgesdk env`` says of TensorRT.

A copy of targets/rpi5.yaml with another memory budget and the name 'rpi5' built a bundle with the edited budget,
whose manifest carries that copy; deploy read the board's shipped profile instead: its 4500 MB budget, not the
file's. A redeploy of the release already current printed "current -> releases/<id>" as if it had switched. ``env``
said "tensorrt: yes" where only the Python package was installed, with no library or GPU to build on.

Deploys run into a real board root (``--to DIR``, the real board helper). TensorRT does not run here: its checks
import a stand-in ``tensorrt`` package written to a folder on sys.path, whose Builder fails as TensorRT's does
without a CUDA device (a null builder, which pybind11 raises as TypeError) or succeeds."""

from __future__ import annotations

import json
import sys
from importlib import resources

import pytest

from edgesdk.deploy.orchestrate import DeployResult
from edgesdk.envinfo import collect_env, format_env, tensorrt_check
from edgesdk.profile import get_profile
from tests._utils.deploy import bundle_variant, edgesdk


def _shipped_text(name: str) -> str:
    return (resources.files("edgesdk.targets") / f"{name}.yaml").read_text(encoding="utf-8")


# --- a copy of a shipped profile that keeps its name ----------------------------------------------------------


def test_a_bundle_of_an_edited_copy_keeping_the_boards_name_is_budgeted_by_the_copy(tmp_path):
    """The manifest carries the profile a bundle was built with; deploy took the board's shipped profile's budget
    (4500 MB on a Pi 5) where that copy was edited and kept the name 'rpi5'."""
    from edgesdk.deploy.orchestrate import _budget_mb
    from edgesdk.deploy.probe import BoardFacts
    from tests.unit.test_deploy_checks45 import PI5, raw_probe

    edited = tmp_path / "rpi5-mine.yaml"
    edited.write_text(_shipped_text("rpi5").replace("memory_budget_mb: 4500", "memory_budget_mb: 3000", 1),
                      encoding="utf-8")
    copy = get_profile(str(edited))
    assert (copy.name, copy.memory_budget_mb) == ("rpi5", 3000)
    pi5 = BoardFacts.from_probe(raw_probe(PI5, 8_245_000))
    budget, basis = _budget_mb({"target": copy.summary()}, pi5)
    assert budget == 3000
    assert basis == ("the 3000 MB memory budget of the profile 'rpi5' the bundle was built with (the shipped 'rpi5' "
                     "has 4500 MB)")
    two_gb = BoardFacts.from_probe(raw_probe(PI5, 2_007_000))  # the copy's budget, cut to the board's RAM
    assert _budget_mb({"target": copy.summary()}, two_gb)[0] == 3000 * 2 // 8
    shipped = _budget_mb({"target": get_profile("rpi5").summary()}, pi5)
    assert shipped == (4500, "the 4500 MB memory budget of the board's profile 'rpi5'")


def test_an_unedited_copy_and_a_renamed_one_load(tmp_path):
    same = tmp_path / "rpi5-copy.yaml"
    same.write_text(_shipped_text("rpi5"), encoding="utf-8")
    assert get_profile(str(same)) == get_profile("rpi5")

    renamed = tmp_path / "mine.yaml"
    renamed.write_text(_shipped_text("rpi5").replace("name: rpi5", "name: my-rpi5", 1)
                       .replace("memory_budget_mb: 4500", "memory_budget_mb: 3000", 1), encoding="utf-8")
    profile = get_profile(str(renamed))
    assert (profile.name, profile.memory_budget_mb) == ("my-rpi5", 3000)


# --- the summary of a redeploy that switched nothing ----------------------------------------------------------


def test_a_redeploy_of_the_current_release_says_nothing_was_switched(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    older = bundle_variant(tiny_bundle.path, tmp_path / "older", "older")
    for bundle in (older, tiny_bundle):
        first = edgesdk("deploy", bundle.path, "--to", root)
        assert first.returncode == 0, first.stderr
    assert "nothing was switched" not in first.stdout
    assert f"; current -> releases/{tiny_bundle.bundle_id} (previous: {older.bundle_id}" in first.stdout

    again = edgesdk("deploy", tiny_bundle.path, "--to", root)
    as_json = edgesdk("deploy", tiny_bundle.path, "--to", root, "--json")

    assert again.returncode == 0, again.stderr
    assert (f"releases/{tiny_bundle.bundle_id} already was current, so nothing was switched: current -> "
            f"releases/{tiny_bundle.bundle_id} (previous: {older.bundle_id}") in again.stdout, again.stdout
    result = json.loads(as_json.stdout)
    assert (result["switched"], result["runtime_switched_to"]) == (False, "")


def test_a_redeploy_that_moved_only_the_runtime_says_so():
    result = DeployResult(bundle_id="abc", where="pi@board:/opt/edgesdk", root="/opt/edgesdk", bytes_sent=0,
                          files_sent=0, bytes_reused=10, runtime_bytes_sent=0, seconds=1.0, previous=None,
                          engine="", generated="", switched=False, runtime_switched_to="py3.10-venv")
    assert ("releases/abc already was current, so only runtime/current was switched (to py3.10-venv): current -> "
            "releases/abc (no previous release") in result.summary()


# --- what env says of TensorRT ----------------------------------------------------------------------------------

STAND_IN = '''\
__version__ = "10.3.0"


class ILogger:
    class Severity:
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self):
        pass


class Builder:
    def __init__(self, logger):
        if {fails}:
            logger.log(ILogger.Severity.ERROR, "CUDA initialization failure with error: 100")
            logger.log(ILogger.Severity.INFO, "not an error")
            raise TypeError("pybind11::init(): factory function returned nullptr")
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    def write(fails: bool):
        folder = tmp_path / ("failing" if fails else "working")
        (folder / "tensorrt").mkdir(parents=True)
        (folder / "tensorrt" / "__init__.py").write_text(STAND_IN.format(fails=fails), encoding="utf-8")
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
        return folder / "tensorrt" / "__init__.py"
    yield write
    sys.modules.pop("tensorrt", None)


def test_env_does_not_say_tensorrt_yes_for_a_package_that_creates_no_builder(stand_in, tmp_path):
    module = stand_in(fails=True)
    info = collect_env(tmp_path)
    gpu = info["gpu"]

    assert gpu["tensorrt"] is False
    assert gpu["tensorrt_found"].startswith(f"Python module 10.3.0 ({module}), but no builder could be created")
    assert "CUDA initialization failure with error: 100" in gpu["tensorrt_found"]
    assert "TypeError: pybind11::init(): factory function returned nullptr" in gpu["tensorrt_found"]
    assert "not an error" not in gpu["tensorrt_found"]
    lines = format_env(info).splitlines()
    gpu_lines = lines[lines.index("gpu:") + 1:lines.index("board:")]
    row = next(line for line in gpu_lines if line.strip().startswith("tensorrt "))
    assert row.split(" : ", 1)[1].startswith("Python module 10.3.0")
    assert not any(line.strip().startswith("tensorrt_found") for line in gpu_lines)


def test_env_says_tensorrt_runs_where_a_builder_is_created(stand_in):
    module = stand_in(fails=False)
    assert tensorrt_check("10.3.0", None) == (True, f"Python module 10.3.0 ({module}); a builder was created")


def test_env_says_what_was_found_where_tensorrt_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    assert tensorrt_check("not installed", None) == (False, "not found: no tensorrt Python package, no libnvinfer")
    usable, said = tensorrt_check("10.3.0 (tensorrt-cu12)", "libnvinfer.so.10")
    assert usable is False
    assert said.startswith("not usable: package 10.3.0 (tensorrt-cu12), libnvinfer found (libnvinfer.so.10), but "
                           "TensorRT's Python module 'tensorrt' cannot be imported")
    assert "pip install tensorrt" in said
