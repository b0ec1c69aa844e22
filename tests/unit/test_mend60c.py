"""Whether an answer ended at end-of-generation is one test (``llama_native.ended_at_eos``), and ``edgesdk export``
prints every note of a GGUF export (a Gemma 3 bundle's unrecorded window, end tokens llama.cpp does not stop at) as
its own ``edgesdk: note:`` line, not as a Python warning with a source line."""

from __future__ import annotations

import warnings

import pytest

from edgesdk.serve import llama_native
from edgesdk.serve.completion import Completion
from tests.unit.test_small_leads60 import CONTEXT, _with_model_facts, long_window_bundle  # noqa: F401


@pytest.mark.parametrize(("completion", "ended"), [
    (Completion("fox", "stop", 3, 5), True),  # the end-of-text token
    (Completion("fox", "stop", 3, 5, stop_string="</s>"), False),
    (Completion("fox", "length", 3, 5), False),  # the token limit or a full context
])
def test_ended_at_eos_is_llama_server_s_stop_type_eos(completion, ended):
    assert llama_native.ended_at_eos(completion) is ended
    assert ended == (llama_native.stop_type(completion) == "eos")


def _with_end_ids(source, destination, ids):
    """``source``'s files in a new bundle whose manifest's tokenizer stops at ``ids`` too."""
    from edgesdk.bundle import BundleWriter

    writer = BundleWriter(destination)
    for name in source.manifest["files"]:
        writer.add_file(source.path / name, name)
    body = {key: value for key, value in source.manifest.items()
            if key not in ("schema_version", "edgesdk_version", "created", "files", "bundle_id")}
    tokenizer = body["tokenizer"]
    body["tokenizer"] = {**tokenizer, "eos_token_ids": [*(tokenizer.get("eos_token_ids") or ()), *ids]}
    return writer.commit(body)


@pytest.fixture(scope="module")
def older_bundle(long_window_bundle, tmp_path_factory):  # noqa: F811
    """An older Gemma 3 bundle (no 'model.after.sliding_window') that stops at three tokens llama.cpp does not end
    generation at (its EOT and EOM keys hold two)."""
    pytest.importorskip("gguf")
    root = tmp_path_factory.mktemp("older")
    return _with_end_ids(_with_model_facts(long_window_bundle, root / "older", sliding_window=None), root / "ends",
                         [100, 101, 102])


def test_export_prints_the_window_and_end_token_notes_as_its_own_lines(older_bundle, tmp_path):
    """Both notes come out as 'edgesdk: note:' lines on stderr, not as a UserWarning naming cli_build.py and its
    source line."""
    from tests.unit.test_cli import assert_ok, invoke

    with warnings.catch_warnings(record=True) as caught:  # what Python would print on stderr outside pytest
        warnings.simplefilter("always")
        result = invoke("export", older_bundle.path, tmp_path / "cli.gguf")
    assert_ok(result)
    assert not [w for w in caught if "cli_build.py" in w.filename or "cli.gguf" in str(w.message)], \
        [f"{w.filename}: {w.message}" for w in caught]
    assert "UserWarning" not in result.stderr
    notes = [line.removeprefix("edgesdk: note: ") for line in result.stderr.splitlines()
             if line.startswith("edgesdk: note: ")]
    window = [note for note in notes if "does not record its model's sliding window" in note]
    assert len(window) == 1, result.stderr
    assert f"gemma3.attention.sliding_window is written as {CONTEXT}" in window[0]
    assert f"run llama.cpp with -c {CONTEXT} at most" in window[0]
    ends = [note for note in notes if "which llama.cpp does not end generation at" in note]
    assert len(ends) == 1, result.stderr
    assert "102" in ends[0]
    assert "pass them to llama.cpp as stop strings" in ends[0]


def test_export_gguf_still_warns_and_reports_the_notes(older_bundle, tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = export_gguf(older_bundle.path, tmp_path / "api.gguf")
    shown = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    for note in report.file_notes:
        assert f"{report.path}: {note}" in shown
    assert [("sliding window" in note, "does not end generation" in note) for note in report.file_notes] == \
        [(True, False), (False, True)]
