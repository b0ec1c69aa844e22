"""Board facts, the target / memory / disk checks, the engine decision, the runtime key."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from edgesdk.deploy import engine, install
from edgesdk.deploy.probe import BoardFacts, check_disk, check_memory, check_target
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import fmt_bytes
from edgesdk.deploy.transfer import make_plan
from edgesdk.deploy.transport import DeployError, LocalTransport

GB = 1024**3


def raw_probe(model=None, tegra=None, arch="aarch64", mem=16 * GB, free=50 * GB, tensorrt=None) -> dict:
    return {"root": "/home/nvidia/edgesdk", "arch": arch, "device_tree_model": model, "nv_tegra_release": tegra,
            "cpuinfo": "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd42\n",
            "memory": {"MemTotal": mem, "MemAvailable": mem // 2}, "disk": {"free": free, "total": free * 2},
            "python": {"version": [3, 10, 12]}, "tensorrt": tensorrt, "runtime": {}, "state": {}}


ORIN = raw_probe("NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00",
                 "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n",
                 tensorrt={"version": "10.3.0", "python": True})


def test_a_jetson_is_recognised_from_its_files():
    facts = BoardFacts.from_probe(ORIN)
    assert facts.board.family == "jetson"
    assert facts.board.l4t == "36.4.3"
    assert facts.board.jetpack == "6.2"
    assert facts.board.suggested_target == "orin-nx-16gb"
    assert facts.tensorrt == "10.3.0"
    text = facts.describe()
    assert "JetPack 6.2" in text
    assert "TensorRT 10.3.0" in text


def test_a_pi_and_an_unknown_board():
    pi = BoardFacts.from_probe(raw_probe("Raspberry Pi 5 Model B Rev 1.0\x00", mem=8 * GB))
    assert pi.board.suggested_target == "rpi5"
    unknown = BoardFacts.from_probe(raw_probe("Some ARM board"))
    assert unknown.board.suggested_target is None
    with pytest.raises(DeployError) as info:
        check_target("rpi5", unknown, "pi@x", ignore=False)
    assert "cannot tell" in info.value.problem
    assert "--ignore-target" in info.value.fix


def test_target_check():
    facts = BoardFacts.from_probe(ORIN)
    assert "matches" in check_target("orin-nx-16gb", facts, "nvidia@orin", ignore=False)
    with pytest.raises(DeployError) as info:
        check_target("rpi5", facts, "nvidia@orin", ignore=False)
    assert "built for target 'rpi5'" in info.value.problem
    assert "is 'orin-nx-16gb'" in info.value.problem
    assert "edgesdk build --target orin-nx-16gb" in info.value.fix
    assert "skipped" in check_target("rpi5", facts, "nvidia@orin", ignore=True)


def test_memory_check():
    facts = BoardFacts.from_probe(ORIN)
    assert check_memory(1_000_000_000, 9000, facts, "b") == []
    with pytest.raises(DeployError) as info:
        check_memory(10_000_000_000, 9000, facts, "b")
    assert "9000 MB memory budget" in info.value.problem
    small = BoardFacts.from_probe(raw_probe(mem=2 * GB))
    with pytest.raises(DeployError) as info:
        check_memory(3_000_000_000, 9000, small, "b")
    assert "of RAM" in info.value.problem
    assert "warning" in check_memory(1_500_000_000, 9000, small, "b")[0]


def test_disk_check_names_the_numbers_and_the_fix():
    facts = BoardFacts.from_probe(raw_probe(free=100_000_000))
    assert "MB needed" in check_disk(10_000_000, 0, facts, "pi@x")
    with pytest.raises(DeployError) as info:
        check_disk(50_000_000, 40_000_000, facts, "pi@x")
    assert "100.0 MB free" in info.value.problem
    assert "154.0 MB" in info.value.problem
    assert "--remote-root" in info.value.fix


def test_plan_from_the_boards_answer():
    files = {"a": {"size": 10, "sha256": "x"}, "b": {"size": 20, "sha256": "y"}, "c": {"size": 30, "sha256": "z"},
             "d": {"size": 40, "sha256": "w"}}
    plan = make_plan(files, {"a": {"state": "staging"}, "b": {"state": "link", "from": "r1"},
                             "c": {"state": "partial", "offset": 12}, "d": {"state": "send", "offset": 0}})
    assert plan.send == [("c", 12), ("d", 0)]
    assert plan.links == {"b": "r1"}
    assert (plan.send_bytes, plan.resumed_bytes, plan.reused_bytes) == (58, 12, 30)
    assert "resuming" in plan.describe(files)


def test_engine_decisions(tmp_path):
    board = Board(LocalTransport(str(tmp_path)), "python3", "/root")
    ready_builder = engine.BuilderStatus(True)
    host = BoardFacts.from_probe(raw_probe(arch="x86_64"))
    assert engine.decide(host, None, "id", board, engine.NO_BUILDER).message.startswith("skipped: not a Jetson")
    no_trt = BoardFacts.from_probe({**ORIN, "tensorrt": None})
    assert "TensorRT was not found" in engine.decide(no_trt, 87, "id", board, engine.NO_BUILDER).message
    facts = BoardFacts.from_probe(ORIN)
    fused = engine.decide(facts, 87, "abc", board, ready_builder, graph_form="ort-fused")
    assert not fused.build
    assert "this bundle's graph is 'ort-fused'" in fused.message
    waiting = engine.decide(facts, 87, "abc", board, engine.NO_BUILDER)
    assert not waiting.build
    assert "no TensorRT engine builder yet" in waiting.message
    assert "engines/abc/jp6.2-trt10.3.0-sm87" in waiting.message
    isolated = engine.decide(facts, 87, "abc", board, engine.BuilderStatus(False, "the runtime cannot import it"))
    assert not isolated.build
    assert "present, but the runtime cannot import it" in isolated.message
    ready = engine.decide(facts, 87, "abc", board, ready_builder)
    assert ready.build
    assert ready.cache_dir == "/root/engines/abc/jp6.2-trt10.3.0-sm87-orin-nx-16gb"  # keyed by module too
    cached = BoardFacts.from_probe({**ORIN, "engines": ["jp6.2-trt10.3.0-sm87-orin-nx-16gb"]})
    checked = engine.decide(cached, 87, "abc", board, ready_builder)
    assert checked.message.startswith("cached:")
    assert checked.build  # the builder checks a cached engine (a damaged one is rebuilt) instead of trusting its name
    unchecked = engine.decide(cached, 87, "abc", board, engine.NO_BUILDER)
    assert not unchecked.build
    assert "not checked" in unchecked.message
    assert engine.cache_key("6.0 DP", "8.6.2.3", 87) == "jp6.0_DP-trt8.6.2.3-sm87"


def test_builder_status_asks_the_boards_own_edgesdk(tmp_path):
    """``edgesdk engine check`` run by the runtime that would build: here, this edgesdk on this host."""
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    status = engine.builder_status(board, [sys.executable, "-m", "edgesdk.cli"])
    if importlib.util.find_spec("tensorrt") is not None:
        assert status.available
    else:
        assert not status.available
        assert "TensorRT's Python module 'tensorrt' cannot be imported" in status.reason
        # this edgesdk is no runtime of a deploy root (runtime_key None): the board's own fix, not the venv flag
        assert "--runtime-venv-system-site-packages" not in status.reason
        keyed = engine.builder_status(board, [sys.executable, "-m", "edgesdk.cli"], "0.1.0-abc-py311")
        assert "--runtime-venv-system-site-packages" in keyed.reason
    old = engine.builder_status(board, [sys.executable, "-c", "import sys; sys.stderr.write(\"Error: No such "
                                                              "command 'check'.\\n\"); sys.exit(2)"])
    assert old == engine.NO_BUILDER


def test_a_failed_engine_build_names_its_exit_status(tmp_path):
    """A builder that dies without a word (stderr empty) still says how it ended."""
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    decision = engine.EngineDecision(True, "building", str(tmp_path / "engines" / "abc" / "key"))
    with pytest.raises(DeployError, match=r"the TensorRT engine build failed on .* \(exit 3\)"):
        engine.build_engine(board, [sys.executable, "-c", "import sys; sys.exit(3)"], "releases/abc", decision)

def test_runtime_key_follows_the_source_files(tmp_path):
    root = tmp_path / "checkout"
    (root / "edgesdk" / "__pycache__").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text('name = "edgesdk"\n')
    (root / "edgesdk" / "a.py").write_text("x = 1\n")
    (root / "edgesdk" / "__pycache__" / "a.pyc").write_bytes(b"junk")
    (root / "tests" / "t.py").write_text("")
    names = [p.relative_to(root).as_posix() for p in install.source_files(root)]
    assert names == ["edgesdk/a.py", "pyproject.toml"]
    before = install.source_digest(root)
    (root / "tests" / "t.py").write_text("changed")
    assert install.source_digest(root) == before
    (root / "edgesdk" / "a.py").write_text("x = 2\n")
    assert install.source_digest(root) != before
    found = install.checkout_root()
    assert found is None or (Path(found) / "pyproject.toml").is_file()


def test_fmt_bytes():
    assert [fmt_bytes(n) for n in (0, 999, 1000, 413_216, 12_400_000, 1_200_000_000)] == \
        ["0 B", "999 B", "1.0 kB", "413.2 kB", "12.4 MB", "1.20 GB"]
    assert [fmt_bytes(n) for n in (999_950, 999_960_000)] == ["1.0 MB", "1.00 GB"]  # the unit follows the rounding
