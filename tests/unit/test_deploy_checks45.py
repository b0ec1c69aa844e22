"""Deploy checks, review 45: the memory budget of a board smaller than its profile's, the TensorRT engine key
per module, and the target's precisions / sparsity checked before a build.

The board facts go through the same code as a real probe (BoardFacts.from_probe lays the board's files out
and runs edgesdk.board.detect_board on them); nothing is mocked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgesdk.build import pipeline
from edgesdk.build.pipeline import BuildConfig, build, check_max_context, check_sparse_block, recipe_for
from edgesdk.build.recipes import load_recipe
from edgesdk.deploy import engine
from edgesdk.deploy.orchestrate import _budget_mb
from edgesdk.deploy.probe import BoardFacts, check_memory
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError, LocalTransport
from edgesdk.errors import BuildError, EdgeSDKError
from edgesdk.export.onnx_export import ExportConfig
from edgesdk.profile import get_profile, shipped_profiles
from edgesdk.runtime import tensorrt_engine as te

GIB = 1024**3
KIB = 1024
ORIN_TEGRA = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n"


def raw_probe(model, mem_kib, tegra=None, tensorrt=None, engines=None) -> dict:
    """What the board helper returns (deploy/board_transfer.py probe): MemTotal as /proc/meminfo's kB in bytes."""
    raw = {"root": "/home/pi/edgesdk", "arch": "aarch64", "device_tree_model": model, "nv_tegra_release": tegra,
           "cpuinfo": "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0b\n",
           "memory": {"MemTotal": mem_kib * KIB, "MemAvailable": mem_kib * KIB // 2},
           "disk": {"free": 50 * GIB, "total": 100 * GIB}, "python": {"version": [3, 11, 2], "bits": 64},
           "tensorrt": tensorrt, "runtime": {}, "state": {}}
    if engines is not None:
        raw["engines"] = engines
    return raw


def manifest_for(target: str) -> dict:
    return {"target": get_profile(target).summary()}


# --- 1. the memory budget follows the board's RAM ----------------------------------------------

# MemTotal values of the size the kernel reports (a little below the size on the box).
PI5 = "Raspberry Pi 5 Model B Rev 1.0\x00"
PI4 = "Raspberry Pi 4 Model B Rev 1.5\x00"


@pytest.mark.parametrize(("model", "mem_kib", "target", "budget"), [
    (PI5, 2_007_000, "rpi5", 4500 * 2 // 8),     # 2 GB Pi 5: 1125 MB
    (PI5, 4_046_000, "rpi5", 4500 * 4 // 8),     # 4 GB Pi 5: 2250 MB
    (PI5, 8_245_000, "rpi5", 4500),              # the profile's own board
    (PI5, 16_608_000, "rpi5", 4500),             # a larger board keeps the profile's budget
    (PI4, 944_000, "rpi4", 2000 * 1 // 4),       # 1 GB Pi 4: 500 MB
    (PI4, 1_894_000, "rpi4", 2000 * 2 // 4),     # 2 GB Pi 4: 1000 MB
    (PI4, 3_884_000, "rpi4", 2000),
])
def test_the_budget_is_cut_to_the_boards_ram(model, mem_kib, target, budget):
    facts = BoardFacts.from_probe(raw_probe(model, mem_kib))
    assert facts.board.suggested_target == target  # the model alone picks the profile, whatever the RAM
    got, basis = _budget_mb(manifest_for(target), facts)
    assert got == budget
    if budget != get_profile(target).memory_budget_mb:
        assert f"profile '{target}' is made for" in basis


def test_a_jetson_of_its_profiles_size_keeps_the_budget():
    facts = BoardFacts.from_probe(raw_probe("NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00",
                                            15_660_000, ORIN_TEGRA))
    assert facts.board.suggested_target == "orin-nx-16gb"
    assert _budget_mb(manifest_for("orin-nx-16gb"), facts)[0] == 9000


def test_deploy_refuses_a_bundle_too_big_for_a_2gb_pi5_naming_both_figures():
    facts = BoardFacts.from_probe(raw_probe(PI5, 2_007_000))
    bundle = 1_500_000_000  # under the 8 GB profile's 4500 MB budget, and under the 2 GB board's RAM
    budget, basis = _budget_mb(manifest_for("rpi5"), facts)
    with pytest.raises(DeployError) as info:
        check_memory(bundle, budget, facts, "pi@pi5", basis)
    problem = info.value.problem
    assert "takes 1500 MB in memory" in problem
    assert "1125 MB memory budget" in problem
    assert "4500 MB budget" in problem
    assert "1.9 GiB" in problem
    assert "made for 8 GB" in problem
    assert "smaller bundle" in info.value.fix
    # The same bundle fits the 8 GB board.
    big = BoardFacts.from_probe(raw_probe(PI5, 8_245_000))
    assert check_memory(bundle, *_budget_mb(manifest_for("rpi5"), big)[:1], big, "pi@pi5") == []


def test_an_unknown_board_uses_the_bundles_profile_cut_to_its_ram():
    facts = BoardFacts.from_probe(raw_probe("Some ARM board\x00", 2_007_000))
    assert facts.board.suggested_target is None
    budget, basis = _budget_mb(manifest_for("rpi5"), facts)  # deploy --ignore-target
    assert budget == 1125
    assert "'rpi5'" in basis


# --- 2. the TensorRT engine key names the module -----------------------------------------------

NX = "NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00"
NANO = "NVIDIA Jetson Orin Nano Developer Kit\x00"
AGX = "NVIDIA Jetson AGX Orin Developer Kit\x00"
TRT = {"version": "10.3.0", "python": True}


@pytest.mark.parametrize(("model", "mem_kib", "module"), [
    (NX, 15_660_000, "orin-nx-16gb"), (NX, 7_620_000, "orin-nx-8gb"), (NANO, 7_620_000, "orin-nano-8gb"),
    (NANO, 3_600_000, "orin-nano-4gb"), (AGX, 64_000_000, "agx-orin-64gb"),
    ("NVIDIA Jetson AGX Thor Developer Kit\x00", 128_000_000, "NVIDIA-Jetson-AGX-Thor-Developer-Kit"),
    (PI5, 8_245_000, None),
])
def test_the_engine_module_of_a_board(model, mem_kib, module):
    tegra = ORIN_TEGRA if "Jetson" in model else None
    assert te.engine_module(BoardFacts.from_probe(raw_probe(model, mem_kib, tegra)).board) == module


def test_modules_of_one_sm_get_their_own_engine_key(tmp_path):
    board = Board(LocalTransport(str(tmp_path)), "python3", "/root")
    ready = engine.BuilderStatus(True)
    nx = BoardFacts.from_probe(raw_probe(NX, 15_660_000, ORIN_TEGRA, TRT))
    nano = BoardFacts.from_probe(raw_probe(NANO, 7_620_000, ORIN_TEGRA, TRT))
    on_nx, on_nano = (engine.decide(f, 87, "abc", board, ready) for f in (nx, nano))
    assert on_nx.cache_dir == "/root/engines/abc/jp6.2-trt10.3.0-sm87-orin-nx-16gb"
    assert on_nano.cache_dir == "/root/engines/abc/jp6.2-trt10.3.0-sm87-orin-nano-8gb"
    # A root holding the NX's engine, now on the Nano: built again, not taken as cached.
    moved = BoardFacts.from_probe(raw_probe(NANO, 7_620_000, ORIN_TEGRA, TRT,
                                            engines=["jp6.2-trt10.3.0-sm87-orin-nx-16gb"]))
    decision = engine.decide(moved, 87, "abc", board, ready)
    assert decision.build
    assert decision.message.startswith("building")
    # An engine an older edgesdk keyed without the module is not taken for the new key either.
    old = BoardFacts.from_probe(raw_probe(NX, 15_660_000, ORIN_TEGRA, TRT, engines=["jp6.2-trt10.3.0-sm87"]))
    assert engine.decide(old, 87, "abc", board, ready).message.startswith("building")
    same = BoardFacts.from_probe(raw_probe(NX, 15_660_000, ORIN_TEGRA, TRT,
                                           engines=["jp6.2-trt10.3.0-sm87-orin-nx-16gb"]))
    cached = engine.decide(same, 87, "abc", board, ready)
    assert cached.message.startswith("cached:")
    assert "module (orin-nx-16gb)" in cached.message


def _engine(directory: Path, **info) -> Path:
    directory.mkdir(parents=True)
    (directory / te.ENGINE_FILE).write_bytes(b"plan")
    (directory / te.INFO_FILE).write_text(json.dumps(info))
    return directory


@pytest.fixture
def release(tmp_path, monkeypatch):
    """``<root>/releases/<id>`` as deploy lays it out (find_engine reads no bundle file)."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(te.ENGINE_DIR_ENV, raising=False)
    path = tmp_path / "root" / "releases" / "abc"
    path.mkdir(parents=True)
    return path


def test_the_runtime_refuses_an_engine_of_another_module(release):
    engines = release.parent.parent / "engines" / "abc"
    built = {"bundle_id": "abc", "tensorrt": "10.3.0", "sm": 87, "format": 2}
    agx = _engine(engines / te.cache_key("6.2", "10.3.0", 87, "agx-orin-64gb"), **built, module="agx-orin-64gb")
    assert te.find_engine(release, "abc", "10.3.0", 87, "6.2", "agx-orin-64gb")[0] == agx
    with pytest.raises(EdgeSDKError) as info:
        te.find_engine(release, "abc", "10.3.0", 87, "6.2", "orin-nx-16gb")
    assert "orin-nx-16gb" in info.value.problem
    assert "built on agx-orin-64gb, this board is orin-nx-16gb" in info.value.problem
    assert "edgesdk engine build" in info.value.fix


def test_an_engine_without_a_module_is_refused_by_name_not_a_crash(release, monkeypatch):
    engines = release.parent.parent / "engines" / "abc"
    old = _engine(engines / te.cache_key("6.2", "10.3.0", 87), bundle_id="abc", tensorrt="10.3.0", sm=87, format=1)
    with pytest.raises(EdgeSDKError) as info:
        te.find_engine(release, "abc", "10.3.0", 87, "6.2", "orin-nx-16gb")
    assert "does not record the module it was built on" in info.value.problem
    monkeypatch.setenv(te.ENGINE_DIR_ENV, str(old))
    with pytest.raises(EdgeSDKError, match="does not record the module"):
        te.find_engine(release, "abc", "10.3.0", 87, "6.2", "orin-nx-16gb")


def test_the_timing_cache_is_per_module_too(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path))
    assert te._timing_cache_path("10.3.0", 87, "orin-nano-8gb") != te._timing_cache_path("10.3.0", 87, "orin-nx-16gb")


# --- 3. the target's precisions and sparsity ---------------------------------------------------

RECIPES = sorted(p.stem for p in (Path(__file__).parents[2] / "edgesdk" / "recipes").glob("*.yaml"))


def _settings(recipe_name: str, profile):
    recipe = recipe_for(recipe_name, profile)
    return recipe, recipe.validated(), ExportConfig(**{**ExportConfig().__dict__, **recipe.export.model_dump()})


@pytest.mark.parametrize("target", sorted(shipped_profiles()))
@pytest.mark.parametrize("recipe_name", RECIPES)
def test_every_shipped_pairing_valid_today_still_passes(recipe_name, target):
    profile = get_profile(target)
    recipe, stages, export_config = _settings(recipe_name, profile)
    try:  # the checks build() made before this one
        check_max_context(export_config)
        check_sparse_block(stages, export_config, profile)
    except BuildError:
        pytest.skip(f"{recipe_name} x {target} is refused by an earlier check")
    pipeline.check_target_support(recipe, stages, export_config, profile)


def _profile_file(tmp_path: Path, base: str, **changes) -> str:
    data = yaml.safe_load(Path(__file__).parents[2].joinpath("targets", f"{base}.yaml").read_text())
    data.update(changes, name=f"{base}-custom")
    path = tmp_path / f"{base}-custom.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_precision_the_target_lacks_is_refused_before_the_model_loads(tmp_path):
    target = _profile_file(tmp_path, "rpi5", precisions=["fp32", "int8"])
    with pytest.raises(BuildError) as info:  # the model does not exist: the check comes first
        build(BuildConfig(target=target, model=str(tmp_path / "no-such-model"), recipe="int4",
                          out=tmp_path / "out", progress=False))
    problem = info.value.problem
    assert "recipe 'int4' export.weights uses int4 precision" in problem
    assert "target 'rpi5-custom'" in problem
    assert "its precisions: fp32, int8" in problem
    assert "--recipe" in info.value.fix
    assert "add int4 to the profile's precisions" in info.value.fix
    assert not (tmp_path / "out.build").exists()


def test_embedding_bits_and_sparse_weights_are_checked_too(tmp_path):
    int4_head = get_profile(_profile_file(tmp_path, "rpi5", precisions=["fp32", "int8"]))
    recipe, stages, export_config = _settings("int8-only", int4_head)
    pipeline.check_target_support(recipe, stages, export_config, int4_head)  # int8 layers and head: supported
    recipe = load_recipe("int8-only").with_overrides(("export.embedding_bits=4", "qat.embedding_bits=4"))
    export_config = ExportConfig(**{**ExportConfig().__dict__, **recipe.export.model_dump()})
    with pytest.raises(BuildError, match="export.embedding_bits uses int4 precision"):
        pipeline.check_target_support(recipe, recipe.validated(), export_config, int4_head)
    dense_gpu = get_profile(_profile_file(tmp_path, "orin-nano-8gb", sparsity=["2:4"]))
    recipe, stages, export_config = _settings("jetson-sparse", dense_gpu)
    with pytest.raises(BuildError) as info:
        pipeline.check_target_support(recipe, stages, export_config, dense_gpu)
    assert "recipe 'jetson-sparse' export.sparse uses block sparsity" in info.value.problem
    assert "its sparsity: 2:4" in info.value.problem
    assert "without block sparsity" in info.value.fix
