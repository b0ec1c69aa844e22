"""A draft bundle's refusal names both bundles, and the draft runtime's notes (the backend it opened on, its threads,
why the bundle's backend could not open it) are kept on the draft model and printed under --stats, as the bundle's
own are, instead of being dropped."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgesdk.runtime.backend import close_backend
from edgesdk.runtime.speculative import DraftConfig, DraftError, open_draft_model
from tests._utils.builds import build_lively_bundle


@pytest.fixture(scope="module")
def target_bundle(tmp_path_factory):
    return build_lively_bundle(tmp_path_factory.mktemp("target63"), 11)


@pytest.fixture(scope="module")
def target(target_bundle):
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(target_bundle.path, threads=1)
    yield runtime
    close_backend(runtime.backend)


def test_a_draft_with_another_tokenizer_is_refused_naming_the_draft_and_the_bundle(target, tmp_path):
    """The refusal named the draft bundle and "the bundle", never which bundle that was."""
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model", tokenizer="gemma", vocab_size=384, hidden=64, heads=4,
                                    kv_heads=2)
    other = build_tiny_bundle(tmp_path, "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                              model_dir=model_dir)
    with pytest.raises(DraftError) as caught:
        open_draft_model(target, other.path, DraftConfig(), threads=1)
    problem = caught.value.problem
    assert problem.startswith(f"{other.path} has another tokenizer than the bundle (")
    assert f"so its token ids mean other text than those of {target.bundle.path}" in problem


def test_the_draft_runtime_s_notes_are_kept_and_printed_under_stats(target, target_bundle, capsys):
    """Its backend's line and thread count went nowhere: not to --stats, not to Model.notes."""
    capsys.readouterr()
    quiet = open_draft_model(target, target_bundle.path, DraftConfig(), threads=1)
    try:
        assert "ort-cpu: used" in quiet.notes
        assert capsys.readouterr().err == ""  # without --stats nothing is said of a draft on the bundle's backend
    finally:
        close_backend(quiet.backend)
    told = open_draft_model(target, target_bundle.path, DraftConfig(), threads=1, verbose=True)
    try:
        assert f"edgesdk: draft {target_bundle.path}: ort-cpu: used" in capsys.readouterr().err.splitlines()
        assert told.notes == quiet.notes
    finally:
        close_backend(told.backend)


def test_why_the_bundle_s_backend_could_not_open_the_draft_is_a_note(target, target_bundle, capsys):
    """A bundle on tensorrt (which cannot run this ort-fused draft, on any machine): the draft opens on its own
    ort-cpu, and the note says why it is not on the bundle's backend, also under --stats."""
    on_tensorrt = SimpleNamespace(backend=SimpleNamespace(name="tensorrt", vocab_size=target.backend.vocab_size),
                                  tokenizer=target.tokenizer, bundle=target.bundle)
    capsys.readouterr()
    model = open_draft_model(on_tensorrt, target_bundle.path, DraftConfig(), threads=1, verbose=True)
    try:
        assert model.backend.name == "ort-cpu"
        assert model.notes[0].startswith("not on the bundle's tensorrt backend: no backend could run bundle")
        assert "ort-cpu: used" in model.notes
        said = capsys.readouterr().err
        assert f"edgesdk: draft {target_bundle.path}: not on the bundle's tensorrt backend: " in said
        assert f"edgesdk: draft {target_bundle.path}: ort-cpu: used" in said
    finally:
        close_backend(model.backend)


def test_run_stats_and_the_python_api_carry_the_draft_s_notes(target_bundle):
    """``run --stats --draft`` printed the bundle's backend lines and none of the draft's; ``load(draft=...).notes``
    had nothing of the draft."""
    import edgesdk
    from tests.unit.test_cli import assert_ok, invoke

    result = invoke("run", target_bundle.path, "--draft", target_bundle.path, "-p", "The", "--raw", "-n", "4",
                    "-t", "1", "--stats")
    assert_ok(result)
    assert f"edgesdk: draft {target_bundle.path}: ort-cpu: used" in result.stderr.splitlines()
    quiet = invoke("run", target_bundle.path, "--draft", target_bundle.path, "-p", "The", "--raw", "-n", "4",
                   "-t", "1")
    assert_ok(quiet)
    assert f"edgesdk: draft {target_bundle.path}: ort-cpu: used" not in quiet.stderr
    with edgesdk.load(target_bundle.path, draft=target_bundle.path, threads=1) as model:
        assert "draft: ort-cpu: used" in model.notes
