"""Deploy 55: the disk check before the transfer asks the board's engine builder which engine it builds."""

from __future__ import annotations

import sys

import pytest

from edgesdk.deploy import engine, orchestrate
from edgesdk.deploy.probe import DISK_MARGIN_BYTES, BoardFacts, memory_bytes
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transfer import bundle_files
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils.deploy import tree_state
from tests.unit.test_deploy49b import standard_graph_bundle
from tests.unit.test_deploy_checks import ORIN, raw_probe

BUILDER_SAYS = "10.7.0 sm87"  # the runtime's own TensorRT, not the 10.3.0 the probe found in the system Python
CANNOT_BUILD = ("import sys; sys.stderr.write(\"error: TensorRT's Python module 'tensorrt' cannot be imported\\n\"); "
                "sys.exit(1)")


def _jetson_deploy(tiny_bundle, tmp_path, monkeypatch, builder: str,
                   cached: bool) -> tuple[int, DeployError | None, list[str]]:
    """Deploy a standard-graph bundle to a stand-in Jetson whose board edgesdk is the Python program ``builder``:
    the real probe's answers with a Jetson's files, where ``cached`` an engine under the probe's key (its
    system-Python TensorRT, the bundle naming no SM), and room for the bundle and the margin but not the engine as well. Returns the
    engine's size, the error the deploy stopped on (None where it finished) and the lines it printed."""
    bundle = standard_graph_bundle(tiny_bundle.path, tmp_path / "bundle")
    files = bundle_files(bundle)
    send, engine_bytes = sum(f["size"] for f in files.values()), memory_bytes(bundle.manifest, files)
    real_probe = orchestrate.probe

    def jetson_probe(board, params=None):
        raw = dict(real_probe(board, params).raw)
        raw.update({key: ORIN[key] for key in ("arch", "device_tree_model", "nv_tegra_release", "cpuinfo", "memory",
                                               "tensorrt")})
        raw["disk"] = {**raw["disk"], "free": send + DISK_MARGIN_BYTES + engine_bytes // 2}
        facts = BoardFacts.from_probe(raw)
        facts.raw["engines"] = [engine.cache_key(facts.board.jetpack, facts.tensorrt, None,
                                                 engine.engine_module(facts.board))] if cached else []
        return facts

    monkeypatch.setattr(orchestrate, "probe", jetson_probe)
    monkeypatch.setattr(orchestrate, "board_edgesdk", lambda board, facts, local: [sys.executable, "-c", builder])
    lines: list[str] = []
    try:
        orchestrate.deploy(bundle.path, DeployOptions(to=tmp_path / "board", ignore_target=True),
                           Reporter(8, lines.append))
    except DeployError as stopped:
        return engine_bytes, stopped, lines
    return engine_bytes, None, lines


def test_the_disk_check_counts_the_engine_under_the_name_the_boards_builder_gives_it(tiny_bundle, tmp_path,
                                                                                    monkeypatch):
    """The engine step names the engine directory after what the board's builder says ('edgesdk engine check'); the
    disk check before the transfer named it after the probe's system-Python TensorRT and the bundle's SM. Where an
    engine sits under that name and the builder imports another TensorRT, the check counted no engine and let the
    deploy through, to run out of space in the engine build. A builder already on the board is asked first now."""
    root = tmp_path / "board"
    before = tree_state(root)
    engine_bytes, stopped, _ = _jetson_deploy(tiny_bundle, tmp_path, monkeypatch, f"print({BUILDER_SAYS!r})",
                                            cached=True)
    assert stopped is not None
    assert stopped.problem.startswith("not enough disk space"), stopped.problem
    assert f"about {engine_bytes / 1e6:.1f} MB for the TensorRT engine it builds" in stopped.problem
    assert tree_state(root) == before  # refused before the transfer: nothing written


def test_the_disk_check_counts_no_engine_a_builder_that_cannot_build_skips(tiny_bundle, tmp_path, monkeypatch):
    """A board edgesdk that cannot import TensorRT skips the engine step, so no engine takes space: the check
    counted one after the probe's system-Python TensorRT all the same and refused a deploy that fits."""
    _, stopped, lines = _jetson_deploy(tiny_bundle, tmp_path, monkeypatch, CANNOT_BUILD, cached=False)
    assert stopped is None or not stopped.problem.startswith("not enough disk space"), stopped.problem
    assert any(line.endswith("MB needed") for line in lines), lines
    assert any("skipped: TensorRT 10.3.0 is present, but the board's edgesdk cannot use it (TensorRT's" in line
               for line in lines), lines


def test_the_builder_is_asked_only_where_the_engine_step_may_build(tmp_path):
    """Off a Jetson the engine step builds nothing, and its builder is not run; on one, its answer names the key."""
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    marker = tmp_path / "asked"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x'); print({BUILDER_SAYS!r})"]
    pi = BoardFacts.from_probe(raw_probe("Raspberry Pi 5 Model B Rev 1.0\x00"))
    assert orchestrate.engine_builder(board, pi, {"graph": {"form": "standard"}}, argv, None) is engine.NO_BUILDER
    assert not marker.exists()
    jetson = orchestrate.engine_builder(board, BoardFacts.from_probe(ORIN), {"graph": {}}, argv, None)
    assert (jetson.available, jetson.tensorrt, jetson.sm) == (True, "10.7.0", 87)
    assert marker.exists()


def test_a_board_that_matches_no_profile_is_held_to_the_bundles_budget_and_told_so():
    """A board the probe matches to no shipped profile is held to the bundle's own profile's budget; the refusal said
    it was 'the board's profile', naming a profile the board does not match."""
    from edgesdk.deploy.probe import check_memory
    from edgesdk.profile import get_profile

    unknown = BoardFacts.from_probe(raw_probe("Some ARM board", mem=16 * 2**30))
    assert unknown.board.suggested_target is None
    budget, basis = orchestrate._budget_mb({"target": get_profile("rpi5").summary()}, unknown)
    assert budget == get_profile("rpi5").memory_budget_mb
    with pytest.raises(DeployError) as refused:
        check_memory((budget + 1) * 1_000_000, budget, unknown, "pi@board", basis)
    assert f"more than the {budget} MB memory budget of the bundle's target profile 'rpi5' (the board matches no " \
           "shipped profile)" in refused.value.problem
    assert "the board's profile" not in refused.value.problem
    orin = BoardFacts.from_probe(ORIN)  # a board that matches one keeps the words that say so
    assert orchestrate._budget_mb({"target": get_profile("rpi5").summary()}, orin)[1] == \
        "the 9000 MB memory budget of the board's profile 'orin-nx-16gb'"
