"""ONNX Runtime backends and opening a bundle's runtime (edgesdk/runtime/ort_backend.py, ort_fused_backend.py,
session.py): the intra-op thread count a session is opened with, and the target check on a board that matches no
shipped profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.bundle import Bundle
from edgesdk.errors import BundleError, RuntimeBackendError


def export_both_forms(tmp_path_factory) -> dict:
    """A tiny model exported in both graph forms: form -> (model path, graph facts)."""
    pytest.importorskip("torch")
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from tests._utils.tiny import on_sparse_grid, tiny_llama

    model = on_sparse_grid(tiny_llama(hidden=64, heads=4, kv_heads=2))
    graphs = {}
    for form in ("standard", "ort-fused"):
        out = tmp_path_factory.mktemp(form)
        spec = export_model(model, out, ExportConfig(form=form, weights="fp32", max_context=16))
        graphs[form] = (out / "model.onnx", spec.to_json())
    return graphs


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_both_forms(tmp_path_factory)


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_a_thread_count_below_one_or_not_whole_is_refused_by_name(exported, form, threads):
    """onnxruntime opened a session with intra_op_num_threads 0 or -1 without a word and sized its pool by the
    machine's cores: the power profiler's 'beside another engine' session spun on every core."""
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    backend_class = OrtBackend if form == "standard" else OrtFusedBackend
    path, graph = exported[form]
    with pytest.raises(RuntimeBackendError) as caught:
        backend_class(path, graph, threads=threads)
    assert f"threads={threads!r}" in caught.value.problem
    assert "at least 1" in caught.value.problem
    assert "N >= 1" in caught.value.fix


def test_one_thread_is_what_the_session_runs_with(exported):
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    path, graph = exported["ort-fused"]
    backend = OrtFusedBackend(path, graph, threads=1)
    assert backend.session.get_session_options().intra_op_num_threads == 1


@pytest.fixture
def unknown_jetson(tmp_path, monkeypatch):
    """This machine seen as a Jetson whose model the device tree does not give (a container that hides it): L4T's
    release file and nothing else."""
    import edgesdk.board

    root = tmp_path / "board"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic\n")
    real_detect = edgesdk.board.detect_board
    monkeypatch.setattr(edgesdk.board, "detect_board", lambda root_="/": real_detect(root))
    board = real_detect(root)
    assert (board.family, board.suggested_target) == ("jetson", None)
    return board


@pytest.mark.parametrize(("terms", "target_choice", "skip_choice"), [
    ("cli", "--target rpi5", "--ignore-target"),
    ("python", "target='rpi5'", "ignore_target=True"),
])
def test_a_bundle_on_a_board_matching_no_profile_is_refused_as_deploy_refuses_it(unknown_jetson, terms,
                                                                                  target_choice, skip_choice):
    """A Raspberry Pi bundle opened on a Jetson whose target could not be told ran without a refusal or a note."""
    from edgesdk.runtime.session import check_target

    bundle = Bundle(Path("bundles/pi"), {"target": {"name": "rpi5"}})
    with pytest.raises(BundleError) as caught:
        check_target(bundle, None, False, terms)
    assert "cannot tell which target profile matches this jetson board" in caught.value.problem
    assert "built for 'rpi5'" in caught.value.problem
    assert target_choice in caught.value.fix
    assert skip_choice in caught.value.fix
    assert "skipped" in check_target(bundle, None, True, terms)  # the ways through still open it
    assert check_target(bundle, "rpi5", False, terms) is None


def test_a_bundle_of_an_own_profile_on_such_a_board_is_offered_its_yaml_or_the_skip(unknown_jetson, tmp_path):
    """A profile of the user's own is a YAML file: '--target myboard' would name no profile edgesdk can load, its
    YAML file does (and holds the bundle to that profile's name)."""
    import yaml

    from edgesdk.profile import get_profile
    from edgesdk.runtime.session import check_target

    bundle = Bundle(Path("bundles/mine"), {"target": {"name": "myboard"}})
    with pytest.raises(BundleError) as caught:
        check_target(bundle, None, False)
    assert "built for 'myboard'" in caught.value.problem
    assert "--target PATH/TO/myboard.yaml, the profile 'myboard' the bundle was built from (or --ignore-target)" \
        in caught.value.fix
    own = tmp_path / "myboard.yaml"  # the fix taken: the YAML of the profile the bundle was built from
    own.write_text(yaml.safe_dump({**get_profile("rpi5").model_dump(mode="json"), "name": "myboard"}))
    assert check_target(bundle, str(own), False) is None
